package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/provider/backend"
	"github.com/sys1hq/sys1/sink"
	"github.com/sys1hq/sys1/worker"
	"github.com/sys1hq/sys1/worker/auth"
	"github.com/sys1hq/sys1/worker/natsconn"
	"github.com/sys1hq/sys1/worker/topology"
)

func init() {
	register(command{name: "worker", summary: "run a worker replica (embedded NATS when SYS1_NATS_URL is unset)", run: runWorker})
}

// HTTPConfig is the operational HTTP endpoint (/healthz, /readyz, /metrics).
type HTTPConfig struct {
	Addr string `env:"SYS1_HTTP_ADDR"`
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

// workerSettings is every variable `sys1 worker` reads.
type workerSettings struct {
	log      LogConfig
	nats     natsconn.Config
	topo     topology.Config
	worker   worker.Config
	contract contract.Config
	provider backend.Config
	auth     auth.Config
	http     HTTPConfig
	sink     sink.Config
}

func loadWorkerSettings() (*workerSettings, error) {
	s := &workerSettings{nats: natsconn.DefaultConfig(), auth: auth.DefaultConfig(), sink: sink.DefaultConfig()}
	targets := []any{&s.log, &s.nats, &s.topo, &s.worker, &s.contract, &s.provider, &s.auth, &s.http}
	// The in-process sink is optional: its variables are only read (and checked) when a
	// ClickHouse DSN asks for it.
	if os.Getenv("SYS1_CLICKHOUSE_DSN") != "" {
		targets = append(targets, &s.sink)
	}
	if err := loadConfig(targets...); err != nil {
		return nil, err
	}
	return s, nil
}

func runWorker(ctx context.Context, args []string, _, stderr io.Writer) int {
	if len(args) > 0 {
		fmt.Fprintln(stderr, "usage: sys1 worker   (configuration is by environment; see README.md)")
		if args[0] == "-h" || args[0] == "--help" {
			return exitOK
		}
		return exitUsage
	}
	s, err := loadWorkerSettings()
	if err != nil {
		fmt.Fprintf(stderr, "sys1 worker: %v\n", err)
		return exitUsage
	}
	log := newLogger(stderr, s.log, "worker")

	conn, err := natsconn.Connect(ctx, s.nats, "sys1-worker", log)
	if err != nil {
		log.Error().Err(err).Msg("cannot connect to NATS")
		return exitUsage
	}
	defer conn.Close()

	policy := s.contract.Policy()
	prov, err := backend.New(s.provider, backend.Deps{DefaultModel: policy.DefaultModel, Concurrency: s.worker.Concurrency, Logger: log})
	if err != nil {
		log.Error().Err(err).Msg("cannot build the provider")
		return exitUsage
	}
	probeCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	probe := prov.Probe(probeCtx)
	cancel()
	if probe.Healthy() {
		log.Info().Str("provider", prov.Name()).Str("version", probe.Version).Str("model", policy.DefaultModel).Msg("provider ready")
	} else {
		// Not fatal: Ollama may start after us, and requests wait in the queue meanwhile.
		log.Warn().Str("provider", prov.Name()).Strs("problems", probe.Problems).Msg("provider is not ready; runs will be retried while it is down")
	}

	authn, err := auth.New(ctx, s.auth, log)
	if err != nil {
		log.Error().Err(err).Msg("cannot set up caller authentication")
		return exitUsage
	}
	w, err := worker.New(ctx, s.worker, worker.Options{
		NC: conn.NC, JS: conn.JS, Topology: s.topo, Provider: prov, Policy: policy, Auth: authn,
		Logger: log, Version: version,
	})
	if err != nil {
		log.Error().Err(err).Msg("cannot start the worker")
		return exitUsage
	}

	var bg sync.WaitGroup
	var httpSrv *http.Server
	if s.http.Addr != "" {
		httpSrv = &http.Server{Addr: s.http.Addr, Handler: w.Handler(), ReadHeaderTimeout: 5 * time.Second}
		ln, err := net.Listen("tcp", s.http.Addr)
		if err != nil {
			log.Error().Err(err).Str("addr", s.http.Addr).Msg("cannot listen for HTTP")
			return exitUsage
		}
		bg.Go(func() {
			if err := httpSrv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error().Err(err).Msg("HTTP server failed")
			}
		})
		log.Info().Str("addr", ln.Addr().String()).Msg("serving /healthz, /readyz and /metrics")
	}

	exit := exitOK
	if s.sink.DSN != "" {
		// The in-process sink waits for ClickHouse in the background: decisions do not depend
		// on it, and records wait in SYS1_RUNS meanwhile.
		slog := log.With().Str("component", "sink").Logger()
		bg.Go(func() { runInProcessSink(ctx, s, conn, slog) })
	}

	if err := w.Run(ctx); err != nil {
		log.Error().Err(err).Msg("worker failed")
		exit = exitFailed
	}
	if httpSrv != nil {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = httpSrv.Shutdown(sctx)
		cancel()
	}
	bg.Wait()
	return exit
}

// runInProcessSink connects to ClickHouse (retrying), migrates and drains SYS1_RUNS until ctx
// ends, so a small deployment is one process.
func runInProcessSink(ctx context.Context, s *workerSettings, conn *natsconn.Conn, log zerolog.Logger) {
	ch, err := openClickHouse(ctx, s.sink, log)
	if err != nil {
		if ctx.Err() == nil {
			log.Error().Err(err).Msg("in-process sink cannot use ClickHouse; records wait in SYS1_RUNS for a sink")
		}
		return
	}
	defer ch.Close()
	sk, err := sink.New(conn.JS, ch, s.topo, s.sink, log)
	if err != nil {
		log.Error().Err(err).Msg("cannot start the in-process sink")
		return
	}
	if err := sk.Run(ctx); err != nil {
		log.Error().Err(err).Msg("in-process sink stopped")
	}
}
