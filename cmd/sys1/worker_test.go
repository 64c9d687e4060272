package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sys1hq/sys1/sink/chtest"
	"github.com/sys1hq/sys1/worker/metricstest"
	"github.com/sys1hq/sys1/worker/natsconn/natstest"
)

func httpGet(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func freePort(t *testing.T) int {
	t.Helper()
	return natstest.FreePorts(t, 1)[0]
}

// TestWorkerIsOneProcessDeployment runs the binary's worker exactly as the quick start does
// (embedded NATS, the simulator) with a ClickHouse DSN, so the sink runs in-process: a
// decision made with `sys1 decide` lands in ClickHouse, and SIGTERM exits 0.
func TestWorkerIsOneProcessDeployment(t *testing.T) {
	db := chtest.New(t)
	port := freePort(t)
	t.Setenv("SYS1_NATS_URL", "")
	t.Setenv("SYS1_NATS_LISTEN", fmt.Sprintf("127.0.0.1:%d", port))
	t.Setenv("SYS1_DATA_DIR", t.TempDir())
	t.Setenv("SYS1_PROVIDER", "simulator")
	t.Setenv("SYS1_CLICKHOUSE_DSN", db.DSN)
	t.Setenv("SYS1_CLICKHOUSE_DATABASE", db.Name)
	t.Setenv("SYS1_SINK_BATCH_AGE", "100ms")
	t.Setenv("SYS1_LOG_LEVEL", "debug")
	httpAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	t.Setenv("SYS1_HTTP_ADDR", httpAddr)

	ctx, stop := context.WithCancel(context.Background())
	var stderr natstest.Buffer
	exited := make(chan int, 1)
	go func() { exited <- run(ctx, []string{"worker"}, &bytes.Buffer{}, &stderr) }()
	t.Cleanup(stop)

	// Once the worker has read its environment, point the client at its embedded server.
	natstest.WaitFor(t, 30*time.Second, "the worker to start", func() bool {
		select {
		case c := <-exited:
			t.Fatalf("worker exited with %d:\n%s", c, stderr.String())
		default:
		}
		return strings.Contains(stderr.String(), "worker started")
	})
	t.Setenv("SYS1_NATS_URL", fmt.Sprintf("nats://127.0.0.1:%d", port))
	ticket := filepath.Join("..", "..", "contract", "examples", "ticket.json")
	code, out, errOut := decide(t, "--run-id", "one-process-1", "--timeout", "20s", ticket)
	if code != exitOK {
		t.Fatalf("decide: exit %d\n%s\n%s\nworker:\n%s", code, out, errOut, stderr.String())
	}

	// The in-process sink migrates in the background: until it has, the table is missing.
	natstest.WaitFor(t, 30*time.Second, "the run in ClickHouse", func() bool {
		var n uint64
		err := db.Conn.QueryRow(context.Background(), "SELECT count() FROM `"+db.Name+"`.runs FINAL WHERE run_id = 'one-process-1' AND provider = 'simulator' AND status = 'success'").Scan(&n)
		return err == nil && n == 1
	})

	// One /metrics for the process: the worker's counters and the in-process sink's.
	metrics := httpGet(t, "http://"+httpAddr+"/metrics")
	fams, err := metricstest.Parse(metrics)
	if err != nil {
		t.Errorf("/metrics is not valid Prometheus text: %v\n%s", err, metrics)
	}
	docs, err := metricstest.Documented(filepath.Join("..", "..", "deploy", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if !metricstest.IsDocumented(docs, f.Name) {
			t.Errorf("/metrics serves %s, which deploy/README.md does not document", f.Name)
		}
	}
	for _, want := range []string{`sys1_worker_runs_total{error_code="",model="nimble",provider="simulator",status="success",worker=`, `sys1_sink_inserted_total{lane="runs"} 1`, "go_goroutines ", "process_cpu_seconds_total "} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %q:\n%s", want, metrics)
		}
	}
	if got := httpGet(t, "http://"+httpAddr+"/readyz"); !strings.Contains(got, "ready") {
		t.Errorf("/readyz: %q", got)
	}

	stop()
	select {
	case c := <-exited:
		if c != exitOK {
			t.Fatalf("worker exit %d after SIGTERM:\n%s", c, stderr.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatal("worker did not exit after SIGTERM")
	}
	logs := stderr.String()
	for _, want := range []string{"started an embedded NATS server", `"run_id":"one-process-1"`, "worker stopped"} {
		if !strings.Contains(logs, want) {
			t.Errorf("worker log lacks %q", want)
		}
	}
}

func TestWorkerRejectsBadConfigurationNamingEveryVariable(t *testing.T) {
	t.Setenv("SYS1_CONCURRENCY", "0")
	t.Setenv("SYS1_PROVIDER", "gpt")
	t.Setenv("SYS1_AUTH_MODE", "magic")
	t.Setenv("SYS1_MAX_DELIVER", "many")
	t.Setenv("SYS1_LOG_LEVEL", "loud")
	var stderr bytes.Buffer
	code := run(context.Background(), []string{"worker"}, &bytes.Buffer{}, &stderr)
	if code != exitUsage {
		t.Fatalf("exit %d", code)
	}
	for _, v := range []string{"SYS1_CONCURRENCY", "SYS1_PROVIDER", "SYS1_AUTH_MODE", "SYS1_MAX_DELIVER", "SYS1_LOG_LEVEL"} {
		if !strings.Contains(stderr.String(), v) {
			t.Errorf("the start-up error does not name %s:\n%s", v, stderr.String())
		}
	}
}

// TestStopBeforeNATSConnectsIsNotAnError: SIGTERM/SIGINT while `sys1 worker` or `sys1 sink` is
// still retrying its first NATS connection is the operator's stop, not a connection error: the
// command exits 0 and says it stopped before connecting.
func TestStopBeforeNATSConnectsIsNotAnError(t *testing.T) {
	for _, tc := range []struct{ command, want string }{
		{"worker", "worker stopped before connecting to NATS"},
		{"sink", "sink stopped before connecting to NATS"},
	} {
		t.Run(tc.command, func(t *testing.T) {
			// Nothing listens there: the command keeps retrying until it is stopped.
			t.Setenv("SYS1_NATS_URL", fmt.Sprintf("nats://127.0.0.1:%d", freePort(t)))
			t.Setenv("SYS1_CLICKHOUSE_DSN", "clickhouse://127.0.0.1:9000")
			t.Setenv("SYS1_DATA_DIR", t.TempDir())
			t.Setenv("SYS1_HTTP_ADDR", "")
			t.Setenv("SYS1_PROVIDER", "simulator")

			ctx, stop := context.WithCancel(context.Background())
			t.Cleanup(stop)
			var stderr natstest.Buffer
			exited := make(chan int, 1)
			go func() { exited <- run(ctx, []string{tc.command}, &bytes.Buffer{}, &stderr) }()
			natstest.WaitFor(t, 30*time.Second, "a failed connection attempt", func() bool {
				select {
				case c := <-exited:
					t.Fatalf("%s exited with %d before it was stopped:\n%s", tc.command, c, stderr.String())
				default:
				}
				return strings.Contains(stderr.String(), "cannot reach NATS yet; retrying")
			})

			stop() // SIGTERM
			select {
			case c := <-exited:
				if c != exitOK {
					t.Fatalf("%s exit %d after a stop while connecting, want %d:\n%s", tc.command, c, exitOK, stderr.String())
				}
			case <-time.After(30 * time.Second):
				t.Fatalf("%s did not exit after SIGTERM", tc.command)
			}
			logs := stderr.String()
			if !strings.Contains(logs, tc.want) {
				t.Errorf("%s log lacks %q:\n%s", tc.command, tc.want, logs)
			}
			if strings.Contains(logs, "cannot connect to NATS") {
				t.Errorf("%s logged the stop as a connection error:\n%s", tc.command, logs)
			}
		})
	}
}

// Each replica's NATS connection is named after it, so `nats server report connections` tells
// replicas apart.
func TestWorkerConnectionIsNamedAfterTheReplica(t *testing.T) {
	srv := natstest.Start(t)
	t.Setenv("SYS1_NATS_URL", srv.ClientURL())
	t.Setenv("SYS1_PROVIDER", "simulator")
	t.Setenv("SYS1_WORKER_ID", "replica-7")
	ctx, stop := context.WithCancel(context.Background())
	var stderr natstest.Buffer
	exited := make(chan int, 1)
	go func() { exited <- run(ctx, []string{"worker"}, &bytes.Buffer{}, &stderr) }()
	defer func() {
		stop()
		<-exited
	}()
	natstest.WaitFor(t, 30*time.Second, "the worker's connection", func() bool {
		connz, err := srv.Connz(nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range connz.Conns {
			if c.Name == "sys1-worker replica-7" {
				return true
			}
		}
		return false
	})
}

// Metrics and tracing settings are checked at start-up with the rest: a bad
// SYS1_METRICS_CALLER_LABEL, and OTEL_* values sys1 cannot honour (which the SDK would only
// log and ignore), each named in the one error.
func TestWorkerRejectsBadObservabilitySettings(t *testing.T) {
	t.Setenv("SYS1_METRICS_CALLER_LABEL", "yes please")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4317")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://")
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
	t.Setenv("OTEL_TRACES_EXPORTER", "otlp,zipkin")
	t.Setenv("OTEL_SDK_DISABLED", "maybe")
	t.Setenv("OTEL_TRACES_SAMPLER", "sometimes")
	var stderr bytes.Buffer
	if code := run(context.Background(), []string{"worker"}, &bytes.Buffer{}, &stderr); code != exitUsage {
		t.Fatalf("exit %d:\n%s", code, stderr.String())
	}
	for _, want := range []string{
		`SYS1_METRICS_CALLER_LABEL: "yes please" is not a valid boolean`,
		"OTEL_EXPORTER_OTLP_ENDPOINT: scheme must be http or https",
		"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: the host is missing",
		`OTEL_EXPORTER_OTLP_PROTOCOL: "grpc" is not supported`,
		`OTEL_TRACES_EXPORTER: "zipkin" is not supported`,
		`OTEL_SDK_DISABLED: "maybe"`,
		`OTEL_TRACES_SAMPLER: "sometimes"`,
	} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("the start-up error lacks %q:\n%s", want, stderr.String())
		}
	}
}

func TestTracingIsOffUnlessAnOTLPVariableSaysSo(t *testing.T) {
	for _, tc := range []struct {
		cfg  TracingConfig
		want bool
	}{
		{TracingConfig{}, false},
		{TracingConfig{Endpoint: "http://c:4318"}, true},
		{TracingConfig{TracesEndpoint: "http://c:4318/v1/traces"}, true},
		{TracingConfig{Exporter: "otlp"}, true},
		{TracingConfig{Exporter: "none", Endpoint: "http://c:4318"}, false},
		{TracingConfig{Disabled: "TRUE", Endpoint: "http://c:4318"}, false},
		{TracingConfig{Disabled: "false", Endpoint: "http://c:4318"}, true},
	} {
		if got := tc.cfg.Enabled(); got != tc.want {
			t.Errorf("%+v: Enabled() = %v, want %v", tc.cfg, got, tc.want)
		}
		if errs := tc.cfg.Validate(); len(errs) > 0 {
			t.Errorf("%+v: %v", tc.cfg, errs)
		}
	}
}
