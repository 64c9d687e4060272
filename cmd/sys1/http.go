package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/sys1hq/sys1/worker/metrics"
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

// startingEndpoints are the operational endpoints of a component that is up but not yet
// working — waiting for NATS to elect a leader, for ClickHouse to answer: /healthz says the
// process lives (a liveness probe must not restart it for waiting), /readyz answers 503 with
// what it waits for, and /metrics serves the registry. Once the component works, Serve hands
// every request to its own handler (Ready).
type startingEndpoints struct {
	reg     *prometheus.Registry
	log     zerolog.Logger
	ready   atomic.Pointer[http.Handler]
	mu      sync.Mutex
	waiting string
}

func newStartingEndpoints(reg *prometheus.Registry, log zerolog.Logger) *startingEndpoints {
	return &startingEndpoints{reg: reg, log: log, waiting: "starting"}
}

// Waiting says what the component waits for (shown by /readyz until Ready).
func (s *startingEndpoints) Waiting(why string) {
	s.mu.Lock()
	s.waiting = why
	s.mu.Unlock()
}

// Ready hands every later request to h.
func (s *startingEndpoints) Ready(h http.Handler) { s.ready.Store(&h) }

func (s *startingEndpoints) ServeHTTP(rw http.ResponseWriter, req *http.Request) {
	if h := s.ready.Load(); h != nil {
		(*h).ServeHTTP(rw, req)
		return
	}
	switch req.URL.Path {
	case "/healthz":
		_, _ = rw.Write([]byte("ok\n"))
	case "/readyz":
		s.mu.Lock()
		why := s.waiting
		s.mu.Unlock()
		http.Error(rw, "not ready: "+why, http.StatusServiceUnavailable)
	case "/metrics":
		metrics.Handler(s.reg, s.log).ServeHTTP(rw, req)
	default:
		http.NotFound(rw, req)
	}
}
