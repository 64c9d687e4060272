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

	"github.com/sys1hq/sys1/provider/backend"
	"github.com/sys1hq/sys1/sink"
	"github.com/sys1hq/sys1/worker"
	"github.com/sys1hq/sys1/worker/auth"
	"github.com/sys1hq/sys1/worker/limits"
	"github.com/sys1hq/sys1/worker/livefile"
	"github.com/sys1hq/sys1/worker/metrics"
	"github.com/sys1hq/sys1/worker/natsconn"
	abstention "github.com/sys1hq/sys1/worker/policy"
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
	contract modelConfig
	provider backend.Config
	auth     auth.Config
	http     HTTPConfig
	metrics  MetricsConfig
	tracing  TracingConfig
	sink     sink.Config
	files    workerFiles
}

// workerFiles are the configuration files a worker re-reads while it runs.
type workerFiles struct {
	// Policy is the abstention policy (SYS1_POLICY_FILE); empty: no policy.
	Policy string `env:"SYS1_POLICY_FILE"`
	// Limits are the per-caller budgets, rate limits and cache rules; Prices the models'
	// prices. Empty: nobody is limited; every model is unpriced.
	Limits string `env:"SYS1_LIMITS_FILE"`
	Prices string `env:"SYS1_PRICES_FILE"`
	// The loaded files, set by Validate so a bad file is reported with every other bad
	// variable, naming each bad line.
	policy *abstention.Handle
	limits *livefile.File[*limits.Limits]
	prices *livefile.File[*limits.Prices]
}

// Validate loads the files, reporting each bad one under its variable.
func (f *workerFiles) Validate() []error {
	var errs []error
	if f.Policy != "" {
		h, err := abstention.Load(f.Policy)
		if err != nil {
			errs = append(errs, fmt.Errorf("SYS1_POLICY_FILE: %w", err))
		}
		f.policy = h
	}
	if f.Limits != "" {
		l, err := limits.LoadLimits(f.Limits)
		if err != nil {
			errs = append(errs, fmt.Errorf("SYS1_LIMITS_FILE: %w", err))
		}
		f.limits = l
	}
	if f.Prices != "" {
		p, err := limits.LoadPrices(f.Prices)
		if err != nil {
			errs = append(errs, fmt.Errorf("SYS1_PRICES_FILE: %w", err))
		}
		f.prices = p
	}
	return errs
}

// watch re-reads the files as they change until ctx ends, logging each reload and keeping
// the last good version of a file whose edit is bad.
func (f *workerFiles) watch(ctx context.Context, bg *sync.WaitGroup, log zerolog.Logger, authMode string) {
	// Every file is polled like livefile polls (see worker/livefile for why not inotify).
	const every = abstention.PollInterval
	logReload := func(name, path string) { log.Info().Str("file", path).Msg(name + " reloaded") }
	logRefused := func(name, path string) func(error) {
		return func(err error) {
			log.Error().Err(err).Str("file", path).Msg(name + " edit refused; the last good version stays in force")
		}
	}
	if h := f.policy; h != nil {
		log.Info().Str("file", h.Path()).Int("rules", h.Current().Len()).Msg("abstention policy loaded")
		bg.Go(func() {
			h.Watch(ctx, every, func(*abstention.Policy) { logReload("abstention policy", h.Path()) }, logRefused("abstention policy", h.Path()))
		})
	}
	if l := f.limits; l != nil {
		// Rules that cannot do what they appear to (never reached, or naming callers nobody
		// verifies) are said at start-up and after each reload, naming each rule.
		warn := func(lim *limits.Limits) {
			for _, w := range lim.Warnings(authMode) {
				log.Warn().Str("file", l.Path()).Msg("caller limits: " + w)
			}
		}
		log.Info().Str("file", l.Path()).Int("rules", len(l.Current().Rules)).Msg("caller limits loaded")
		warn(l.Current())
		bg.Go(func() {
			l.Watch(ctx, every, func(lim *limits.Limits) { logReload("caller limits", l.Path()); warn(lim) }, logRefused("caller limits", l.Path()))
		})
	}
	if p := f.prices; p != nil {
		log.Info().Str("file", p.Path()).Msg("prices loaded")
		bg.Go(func() {
			p.Watch(ctx, every, func(*limits.Prices) { logReload("prices", p.Path()) }, logRefused("prices", p.Path()))
		})
	}
}

func loadWorkerSettings() (*workerSettings, error) {
	s := &workerSettings{nats: natsconn.DefaultConfig(), auth: auth.DefaultConfig(), sink: sink.DefaultConfig(),
		topo: topology.Default(), worker: worker.DefaultConfig()}
	targets := []any{&s.log, &s.nats, &s.topo, &s.worker, &s.contract, &s.provider, &s.auth, &s.http, &s.files, &s.metrics, &s.tracing,
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
	// The endpoints are up before the topology is: a replica waiting for NATS to elect a
	// leader is alive (/healthz) and not ready (/readyz says what it waits for).
	endpoints := newStartingEndpoints(reg, log)
	endpoints.Waiting("setting up the JetStream topology")
	if s.http.Addr != "" {
		// /metrics serves reg: the in-process sink's families join it once ClickHouse answers.
		stopHTTP, err := serveHTTP(s.http.Addr, endpoints, log)
		if err != nil {
			log.Error().Err(err).Msg("cannot serve HTTP")
			return exitUsage
		}
		defer stopHTTP()
	}
	w, err := worker.New(ctx, s.worker, worker.Options{
		NC: conn.NC, JS: conn.JS, Topology: s.topo, Links: links, ChainConfig: chainCfg, ModelPolicy: policy, Auth: authn,
		Abstention: s.files.policy, Limits: s.files.limits, Prices: s.files.prices,
		Logger: log, Version: version, Metrics: reg, MetricsCallerLabel: s.metrics.CallerLabel, TracerProvider: tp,
		OnSetUpWait: func(err error, wait time.Duration) {
			endpoints.Waiting(fmt.Sprintf("waiting for JetStream (next try in %s): %v", wait.Round(time.Millisecond), err))
		},
	})
	if err != nil {
		if ctx.Err() != nil {
			log.Info().Err(err).Msg("worker stopped before its JetStream topology was set up")
			return exitOK
		}
		// Passing NATS trouble is waited out inside New; what is left is configuration (a
		// permission refused, a stream sys1 cannot reconcile): exit status 2 means exactly that.
		log.Error().Err(err).Msg("cannot start the worker")
		return exitUsage
	}
	endpoints.Ready(w.Handler())

	var bg sync.WaitGroup
	s.files.watch(ctx, &bg, log, authn.Mode())

	exit := exitOK
	if s.sink.DSN != "" {
		// The in-process sink waits for ClickHouse in the background: decisions do not depend
		// on it, and records wait in SYS1_RUNS meanwhile.
		slog := log.With().Str("subsystem", "sink").Logger()
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
	sk, err := sink.New(s.sink, sink.Deps{JS: conn.JS, ClickHouse: ch, Topology: s.topo, Log: log})
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
