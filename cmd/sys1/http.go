package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/rs/zerolog"
)

// HTTPConfig is the operational HTTP endpoint of long-running commands (/healthz, /metrics,
// and for workers /readyz). Empty: no endpoint.
type HTTPConfig struct {
	Addr string `env:"SYS1_HTTP_ADDR"`
}

// MetricsConfig shapes what /metrics serves.
type MetricsConfig struct {
	// CallerLabel labels sys1_worker_runs_total with the verified caller. Off by default:
	// every distinct caller becomes a set of series, and in auth mode jwt callers are token
	// subjects, as many as the identity provider mints (deploy/README.md).
	CallerLabel bool `env:"SYS1_METRICS_CALLER_LABEL" envDefault:"false"`
}

// Validate checks the listen address.
func (c *HTTPConfig) Validate() []error {
	if c.Addr == "" {
		return nil
	}
	if _, _, err := net.SplitHostPort(c.Addr); err != nil {
		return []error{fmt.Errorf("SYS1_HTTP_ADDR: %q is not host:port (e.g. :8080): %v", c.Addr, err)}
	}
	return nil
}

// newHTTPServer is the operational endpoints' server. Every timeout is set: a scraper or a
// probe that opens connections and lets them idle, or sends its headers a byte at a time,
// must not hold connections (and goroutines) for ever.
func newHTTPServer(h http.Handler) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       60 * time.Second,
		MaxHeaderBytes:    64 << 10,
	}
}

// serveHTTP listens on addr and serves h until stop is called. A listen failure is returned
// at once (a port already in use is a configuration error, not something to discover later).
func serveHTTP(addr string, h http.Handler, log zerolog.Logger) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("SYS1_HTTP_ADDR %s: %w", addr, err)
	}
	srv := newHTTPServer(h)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error().Err(err).Msg("HTTP server failed")
		}
	}()
	log.Info().Str("addr", ln.Addr().String()).Msg("serving operational HTTP endpoints")
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
	}, nil
}
