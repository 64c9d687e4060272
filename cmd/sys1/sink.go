package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/rs/zerolog"

	"github.com/sys1hq/sys1/sink"
	"github.com/sys1hq/sys1/worker/metrics"
	"github.com/sys1hq/sys1/worker/natsconn"
	"github.com/sys1hq/sys1/worker/topology"
)

func init() {
	register(command{name: "sink", summary: "drain SYS1_RUNS into ClickHouse (SYS1_CLICKHOUSE_DSN)", run: runSink})
}

// runSink runs a standalone sink: it scales separately from the workers (several sinks share
// the durable consumer). It waits for NATS and ClickHouse to become reachable, applies the
// migrations (idempotent), and drains until SIGINT/SIGTERM.
func runSink(ctx context.Context, args []string, _, stderr io.Writer) int {
	if len(args) > 0 {
		fmt.Fprintln(stderr, "usage: sys1 sink   (configuration is by environment: SYS1_CLICKHOUSE_DSN, SYS1_NATS_URL, SYS1_SINK_*; see deploy/clickhouse/README.md)")
		if args[0] == "-h" || args[0] == "--help" {
			return exitOK
		}
		return exitUsage
	}
	var (
		logCfg  LogConfig
		natsCfg = natsconn.DefaultConfig()
		topo    = topology.Default()
		cfg     = sink.DefaultConfig()
		httpCfg HTTPConfig
		trCfg   TracingConfig
	)
	// The sink is a client of the workers' NATS; it never starts an embedded server. The
	// default URL is in place before validation, so its settings are checked as a client's
	// (creds, nkey and TLS apply; the embedded server's SYS1_NATS_LISTEN and SYS1_DATA_DIR
	// do not).
	natsCfg.URL = defaultClientURL()
	if err := loadConfig(&logCfg, &natsCfg, &topo, &cfg, requireDSN(&cfg), &httpCfg, &trCfg); err != nil {
		fmt.Fprintln(stderr, "sys1 sink:", err)
		return exitUsage
	}
	log := newLogger(stderr, logCfg, "sink")
	host, _ := os.Hostname()
	// The endpoints are up from the start: a sink waiting for NATS or ClickHouse is alive
	// (/healthz) and not ready (/readyz says what it waits for).
	reg := metrics.NewRegistry()
	endpoints := newStartingEndpoints(reg, log)
	endpoints.Waiting("connecting to NATS")
	if httpCfg.Addr != "" {
		stopHTTP, err := serveHTTP(httpCfg.Addr, endpoints, log)
		if err != nil {
			log.Error().Err(err).Msg("cannot serve HTTP")
			return exitUsage
		}
		defer stopHTTP()
	}

	nc, err := natsconn.Connect(ctx, natsCfg, "sys1-sink "+host, log)
	if err != nil {
		if ctx.Err() != nil {
			// SIGTERM/SIGINT while still waiting for NATS: the operator asked for the stop.
			log.Info().Str("nats_url", natsconn.RedactURLs(natsCfg.URL)).Msg("sink stopped before connecting to NATS")
			return exitOK
		}
		log.Error().Err(err).Str("nats_url", natsconn.RedactURLs(natsCfg.URL)).Msg("cannot connect to NATS")
		return exitUsage
	}
	defer nc.Close()

	endpoints.Waiting("waiting for ClickHouse")
	conn, err := openClickHouse(ctx, cfg, log)
	if err != nil {
		if ctx.Err() != nil {
			log.Info().Str("clickhouse", sink.RedactDSN(cfg.DSN)).Msg("sink stopped before ClickHouse was ready")
			return exitOK
		}
		log.Error().Err(err).Msg("cannot use ClickHouse")
		return exitFailed
	}
	defer conn.Close()

	s, err := sink.New(cfg, sink.Deps{JS: nc.JS, ClickHouse: conn, Topology: topo, Log: log})
	if err != nil {
		log.Error().Err(err).Msg("cannot start the sink")
		return exitUsage
	}
	tp, stopTracing, err := setUpTracing(ctx, trCfg, "sys1-sink", host, log)
	if err != nil {
		log.Error().Err(err).Msg("cannot set up tracing")
		return exitUsage
	}
	defer stopTracing()
	if err := s.Instrument(reg, tp); err != nil {
		log.Error().Err(err).Msg("cannot instrument the sink")
		return exitUsage
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(rw http.ResponseWriter, _ *http.Request) { _, _ = rw.Write([]byte("ok\n")) })
	mux.HandleFunc("/readyz", func(rw http.ResponseWriter, _ *http.Request) {
		if !s.Ready() {
			http.Error(rw, "not ready: waiting for JetStream to set up the sink's consumer", http.StatusServiceUnavailable)
			return
		}
		_, _ = rw.Write([]byte("ready\n"))
	})
	mux.Handle("/metrics", metrics.Handler(reg, log))
	endpoints.Ready(mux)
	if err := s.Run(ctx); err != nil {
		if ctx.Err() != nil {
			return exitOK
		}
		// Run waits out passing NATS trouble; what stops it is configuration (a permission).
		log.Error().Err(err).Msg("sink failed")
		return exitUsage
	}
	return exitOK
}

// openClickHouse connects and migrates, retrying with backoff while ClickHouse is unreachable
// (a sink started before its database should wait, not crash-loop). A schema newer than this
// binary, or any other migration error, is returned at once.
func openClickHouse(ctx context.Context, cfg sink.Config, log zerolog.Logger) (driver.Conn, error) {
	conn, _, err := connectClickHouse(ctx, cfg, log, "ClickHouse not reachable yet; the records wait in SYS1_RUNS")
	if err != nil {
		return nil, err
	}
	if err := sink.Migrate(ctx, conn, cfg); err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("migrate %s: %w", cfg.Database, err)
	}
	log.Info().Str("clickhouse", sink.RedactDSN(cfg.DSN)).Str("database", cfg.Database).Msg("ClickHouse ready")
	return conn, nil
}

// connectClickHouse connects to cfg.DSN, retrying with the sink's backoff (SYS1_SINK_RETRY_MIN,
// doubling up to SYS1_SINK_RETRY_MAX) while ClickHouse does not answer, and logging each failed
// try at warn with msg. Once ctx ends it gives up, returning how many tries were made and the
// last try's error (which names the DSN with its password hidden).
func connectClickHouse(ctx context.Context, cfg sink.Config, log zerolog.Logger, msg string) (driver.Conn, int, error) {
	wait := cfg.RetryMin
	for try := 1; ; try++ {
		octx, cancel := context.WithTimeout(ctx, 10*time.Second)
		conn, err := sink.Open(octx, cfg)
		cancel()
		if err == nil {
			return conn, try, nil
		}
		if ctx.Err() != nil {
			return nil, try, err
		}
		log.Warn().Err(err).Int("attempt", try).Dur("retry_in", wait).Msg(msg)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, try, err
		case <-t.C:
		}
		wait = min(wait*2, cfg.RetryMax)
	}
}
