package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/trace"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/provider/backend"
	"github.com/sys1hq/sys1/sink"
	"github.com/sys1hq/sys1/worker"
	"github.com/sys1hq/sys1/worker/auth"
	"github.com/sys1hq/sys1/worker/metrics"
	"github.com/sys1hq/sys1/worker/natsconn"
	"github.com/sys1hq/sys1/worker/topology"
)

func init() {
	register(command{name: "worker", summary: "run a worker replica (embedded NATS when SYS1_NATS_URL is unset)", run: runWorker})
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
	metrics  MetricsConfig
	tracing  TracingConfig
	sink     sink.Config
}

func loadWorkerSettings() (*workerSettings, error) {
	s := &workerSettings{nats: natsconn.DefaultConfig(), auth: auth.DefaultConfig(), sink: sink.DefaultConfig()}
	targets := []any{&s.log, &s.nats, &s.topo, &s.worker, &s.contract, &s.provider, &s.auth, &s.http, &s.metrics, &s.tracing,
		// Every allowed model must be served by some provider of the chain.
		check(func() []error { return s.provider.CheckModels(s.contract.Model, s.contract.AllowedModels) })}
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

	// The replica's id in the connection name tells replicas apart in `nats server report
	// connections`.
	conn, err := natsconn.Connect(ctx, s.nats, "sys1-worker "+s.worker.ReplicaID(), log)
	if err != nil {
		if ctx.Err() != nil {
			// SIGTERM/SIGINT while still waiting for NATS: the operator asked for the stop.
			log.Info().Str("nats_url", natsconn.RedactURLs(s.nats.URL)).Msg("worker stopped before connecting to NATS")
			return exitOK
		}
		log.Error().Err(err).Msg("cannot connect to NATS")
		return exitUsage
	}
	defer conn.Close()

	policy := s.contract.Policy()
	links, chainCfg, err := backend.Links(s.provider, backend.Deps{
		DefaultModel: policy.DefaultModel, AllowedModels: policy.AllowedModels,
		Concurrency: s.worker.Concurrency, Logger: log,
	})
	if err != nil {
		log.Error().Err(err).Msg("cannot build the providers")
		return exitUsage
	}
	for _, l := range links {
		probeCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		probe := l.Provider.Probe(probeCtx)
		cancel()
		if probe.Healthy() {
			log.Info().Str("provider", l.Name).Str("endpoint", probe.Endpoint).Str("version", probe.Version).Str("model", policy.DefaultModel).Msg("provider ready")
		} else {
			// Not fatal: the model server may start after us, and requests wait in the queue
			// (or go to the next provider of the chain) meanwhile.
			log.Warn().Str("provider", l.Name).Str("endpoint", probe.Endpoint).Strs("problems", probe.Problems).Msg("provider is not ready; runs fall back or are retried while it is down")
		}
	}

	authn, err := auth.New(ctx, s.auth, log)
	if err != nil {
		log.Error().Err(err).Msg("cannot set up caller authentication")
		return exitUsage
	}
	tp, stopTracing, err := setUpTracing(ctx, s.tracing, "sys1-worker", s.worker.ReplicaID(), log)
	if err != nil {
		log.Error().Err(err).Msg("cannot set up tracing")
		return exitUsage
	}
	defer stopTracing()
	// One registry for the process: the worker's families, the in-process sink's, Go's.
	reg := metrics.NewRegistry()
	w, err := worker.New(ctx, s.worker, worker.Options{
		NC: conn.NC, JS: conn.JS, Topology: s.topo, Links: links, ChainConfig: chainCfg, Policy: policy, Auth: authn,
		Logger: log, Version: version, Metrics: reg, MetricsCallerLabel: s.metrics.CallerLabel, TracerProvider: tp,
	})
	if err != nil {
		log.Error().Err(err).Msg("cannot start the worker")
		return exitUsage
	}

	var bg sync.WaitGroup
	if s.http.Addr != "" {
		// /metrics serves reg: the in-process sink's families join it once ClickHouse answers.
		stopHTTP, err := serveHTTP(s.http.Addr, w.Handler(), log)
		if err != nil {
			log.Error().Err(err).Msg("cannot serve HTTP")
			return exitUsage
		}
		defer stopHTTP()
	}

	exit := exitOK
	if s.sink.DSN != "" {
		// The in-process sink waits for ClickHouse in the background: decisions do not depend
		// on it, and records wait in SYS1_RUNS meanwhile.
		slog := log.With().Str("component", "sink").Logger()
		bg.Go(func() { runInProcessSink(ctx, s, conn, slog, reg, tp) })
	}

	if err := w.Run(ctx); err != nil {
		log.Error().Err(err).Msg("worker failed")
		exit = exitFailed
	}
	bg.Wait()
	return exit
}

// runInProcessSink connects to ClickHouse (retrying), migrates and drains SYS1_RUNS until ctx
// ends, so a small deployment is one process.
func runInProcessSink(ctx context.Context, s *workerSettings, conn *natsconn.Conn, log zerolog.Logger, reg prometheus.Registerer, tp trace.TracerProvider) {
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
	if err := sk.Instrument(reg, tp); err != nil {
		log.Error().Err(err).Msg("cannot instrument the in-process sink")
		return
	}
	if err := sk.Run(ctx); err != nil {
		log.Error().Err(err).Msg("in-process sink stopped")
	}
}
