package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/sink/chtest"
	"github.com/sys1hq/sys1/worker/metricstest"
	"github.com/sys1hq/sys1/worker/natsconn/natstest"
)

func TestMigrateCommand(t *testing.T) {
	db := chtest.New(t)
	t.Setenv("SYS1_CLICKHOUSE_DSN", db.DSN)
	t.Setenv("SYS1_CLICKHOUSE_DATABASE", db.Name)
	ctx := context.Background()

	var out, errOut bytes.Buffer
	if code := run(ctx, []string{"migrate"}, &out, &errOut); code != exitOK {
		t.Fatalf("sys1 migrate = %d, stderr: %s", code, errOut.String())
	}
	if !strings.Contains(out.String(), "schema version 0 -> 6 (applied 0001_init, 0002_runs_v2, 0003_labels, 0004_views, 0005_audit_share, 0006_review_items)") {
		t.Errorf("first migrate said: %q", out.String())
	}
	out.Reset()
	if code := run(ctx, []string{"migrate"}, &out, &errOut); code != exitOK || !strings.Contains(out.String(), "up to date (version 6)") {
		t.Errorf("second migrate = %d: %q", code, out.String())
	}
	out.Reset()
	t.Setenv("SYS1_RETENTION_DAYS", "30")
	if code := run(ctx, []string{"migrate"}, &out, &errOut); code != exitOK || !strings.Contains(out.String(), "retention set to 30 days on runs") {
		t.Errorf("retention change = %d: %q", code, out.String())
	}
	out.Reset()
	if code := run(ctx, []string{"migrate", "-status"}, &out, &errOut); code != exitOK || !strings.Contains(out.String(), "0001_init") {
		t.Errorf("migrate -status = %d: %q", code, out.String())
	}
}

func TestMigrateCommandConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		want []string
	}{
		{"no DSN", map[string]string{"SYS1_CLICKHOUSE_DSN": ""}, []string{"SYS1_CLICKHOUSE_DSN is not set"}},
		{"every bad variable named", map[string]string{
			"SYS1_CLICKHOUSE_DSN": "ftp://x", "SYS1_CLICKHOUSE_DATABASE": "no-dashes",
			"SYS1_RECORD_STATE": "some", "SYS1_RETENTION_DAYS": "0", "SYS1_CLICKHOUSE_CLUSTER": "prod eu; DROP",
		}, []string{"SYS1_CLICKHOUSE_DSN", "SYS1_CLICKHOUSE_DATABASE", "SYS1_RECORD_STATE", "SYS1_RETENTION_DAYS",
			`SYS1_CLICKHOUSE_CLUSTER: "prod eu; DROP" is not a ClickHouse cluster name`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			var out, errOut bytes.Buffer
			if code := run(context.Background(), []string{"migrate"}, &out, &errOut); code != exitUsage {
				t.Fatalf("exit = %d, want %d; stderr: %s", code, exitUsage, errOut.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(errOut.String(), w) {
					t.Errorf("stderr lacks %q: %s", w, errOut.String())
				}
			}
			if strings.Contains(errOut.String(), "hunter2") {
				t.Errorf("stderr leaks the password: %s", errOut.String())
			}
		})
	}
}

// TestMigratePrint: `sys1 migrate -print` prints the DDL for the configuration without a
// ClickHouse, ON CLUSTER when a cluster is set, and refuses a bad cluster name at once.
func TestMigratePrint(t *testing.T) {
	t.Setenv("SYS1_CLICKHOUSE_DSN", "")
	t.Setenv("SYS1_CLICKHOUSE_DATABASE", "analytics_db")
	var out, errOut bytes.Buffer
	if code := run(context.Background(), []string{"migrate", "-print"}, &out, &errOut); code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	if !strings.Contains(out.String(), "CREATE TABLE IF NOT EXISTS `analytics_db`.runs\n") || strings.Contains(out.String(), "ON CLUSTER") {
		t.Errorf("single-server DDL:\n%s", out.String())
	}
	t.Setenv("SYS1_CLICKHOUSE_CLUSTER", "eu_prod")
	out.Reset()
	if code := run(context.Background(), []string{"migrate", "-print"}, &out, &errOut); code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	if !strings.Contains(out.String(), "CREATE TABLE IF NOT EXISTS `analytics_db`.runs_local ON CLUSTER `eu_prod`") ||
		!strings.Contains(out.String(), "ENGINE = Distributed('eu_prod', 'analytics_db', 'runs_local', cityHash64(run_id))") {
		t.Errorf("cluster DDL:\n%s", out.String())
	}
	t.Setenv("SYS1_CLICKHOUSE_CLUSTER", "eu prod")
	out.Reset()
	errOut.Reset()
	if code := run(context.Background(), []string{"migrate", "-print"}, &out, &errOut); code != exitUsage ||
		!strings.Contains(errOut.String(), `SYS1_CLICKHOUSE_CLUSTER: "eu prod" is not a ClickHouse cluster name`) || out.Len() != 0 {
		t.Errorf("bad cluster: exit %d, stderr %s, stdout %d bytes", code, errOut.String(), out.Len())
	}
	if code := run(context.Background(), []string{"migrate", "-print", "-status"}, &out, &errOut); code != exitUsage {
		t.Errorf("-print with -status: exit %d", code)
	}
}

// TestMigrateRetriesAnUnreachableClickHouse: `sys1 migrate` started before ClickHouse answers
// keeps trying with the sink's backoff, logging each failed try, and once -wait has passed
// exits non-zero naming the DSN's host, never its password.
func TestMigrateRetriesAnUnreachableClickHouse(t *testing.T) {
	port := freePort(t) // nothing listens there
	t.Setenv("SYS1_CLICKHOUSE_DSN", fmt.Sprintf("http://user:hunter2@127.0.0.1:%d", port))
	t.Setenv("SYS1_SINK_RETRY_MIN", "10ms")
	t.Setenv("SYS1_SINK_RETRY_MAX", "50ms")
	var out, errOut bytes.Buffer
	if code := run(context.Background(), []string{"migrate", "-wait", "400ms"}, &out, &errOut); code != exitUsage {
		t.Fatalf("exit = %d, want %d; stderr: %s", code, exitUsage, errOut.String())
	}
	stderr := errOut.String()
	if tries := strings.Count(stderr, "ClickHouse does not answer yet; retrying"); tries < 2 {
		t.Errorf("want every failed try logged (at least 2), got %d:\n%s", tries, stderr)
	}
	for _, want := range []string{fmt.Sprintf("ClickHouse at 127.0.0.1:%d did not answer within 400ms", port), "does not answer"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr)
		}
	}
	if strings.Contains(stderr, "hunter2") {
		t.Errorf("stderr leaks the password:\n%s", stderr)
	}
}

// TestMigrateStopsPromptlyWhileWaitingForClickHouse: SIGTERM while migrate waits for ClickHouse
// ends it at once (not at the end of -wait), non-zero: nothing was migrated.
func TestMigrateStopsPromptlyWhileWaitingForClickHouse(t *testing.T) {
	t.Setenv("SYS1_CLICKHOUSE_DSN", fmt.Sprintf("clickhouse://user:hunter2@127.0.0.1:%d", freePort(t)))
	t.Setenv("SYS1_SINK_RETRY_MIN", "10ms")
	t.Setenv("SYS1_SINK_RETRY_MAX", "10ms")
	ctx, stop := context.WithCancel(context.Background())
	t.Cleanup(stop)
	var stderr natstest.Buffer
	exited := make(chan int, 1)
	go func() { exited <- run(ctx, []string{"migrate", "-wait", "10m"}, &bytes.Buffer{}, &stderr) }()
	natstest.WaitFor(t, 30*time.Second, "a failed try", func() bool {
		return strings.Contains(stderr.String(), "ClickHouse does not answer yet; retrying")
	})
	stop() // SIGTERM
	select {
	case code := <-exited:
		if code != exitFailed {
			t.Fatalf("exit = %d, want %d; stderr: %s", code, exitFailed, stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("sys1 migrate did not stop on SIGTERM")
	}
	if s := stderr.String(); !strings.Contains(s, "stopped while waiting for ClickHouse at 127.0.0.1:") || strings.Contains(s, "hunter2") {
		t.Errorf("stderr:\n%s", s)
	}
}

func TestSinkCommand(t *testing.T) {
	db := chtest.New(t)
	srv := natstest.Start(t)
	t.Setenv("SYS1_NATS_URL", srv.ClientURL())
	t.Setenv("SYS1_CLICKHOUSE_DSN", db.DSN)
	t.Setenv("SYS1_CLICKHOUSE_DATABASE", db.Name)
	t.Setenv("SYS1_SINK_BATCH_AGE", "100ms")
	httpAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	t.Setenv("SYS1_HTTP_ADDR", httpAddr)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stderr natstest.Buffer
	done := make(chan int, 1)
	go func() { done <- run(ctx, []string{"sink"}, &bytes.Buffer{}, &stderr) }()

	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	// The sink creates SYS1_RUNS; publish once it exists.
	natstest.WaitFor(t, time.Minute, "the sink to create SYS1_RUNS", func() bool {
		_, err := js.Stream(ctx, "SYS1_RUNS")
		return err == nil
	})
	const n = 20
	for i := range n {
		rec := contract.RunRecord{SchemaVersion: 1, RunID: fmt.Sprintf("cmd-%d", i), Caller: "cli", Status: contract.StatusSuccess,
			Model: "nimble", FinishedAt: time.Now().UTC()}
		b, _ := json.Marshal(&rec)
		if _, err := js.Publish(ctx, "sys1.runs.success", b); err != nil {
			t.Fatal(err)
		}
	}
	natstest.WaitFor(t, time.Minute, "the rows in ClickHouse", func() bool {
		return db.Count(t, "SELECT count() FROM `"+db.Name+"`.runs FINAL") == n
	})
	// The same process drains checked labels: it creates SYS1_LABELS, and an accepted label
	// becomes a row of labels.
	natstest.WaitFor(t, time.Minute, "the sink to create SYS1_LABELS", func() bool {
		_, err := js.Stream(ctx, "SYS1_LABELS")
		return err == nil
	})
	label, _ := contract.Label{RunID: "cmd-0", Question: "q", Value: []byte("true"), Caller: "cli", Source: contract.LabelSourceProducer}.MarshalJSON()
	if _, err := js.Publish(ctx, "sys1.labels.cli.accepted", label); err != nil {
		t.Fatal(err)
	}
	natstest.WaitFor(t, time.Minute, "the label in ClickHouse", func() bool {
		return db.Count(t, "SELECT count() FROM `"+db.Name+"`.labels FINAL WHERE run_id = 'cmd-0' AND label = 'true'") == 1
	})
	// The operational endpoint shows what the sink did (and its lag, for alerting). A row is
	// visible in ClickHouse a moment before the insert returns and is counted: wait for that.
	var metrics string
	natstest.WaitFor(t, 10*time.Second, "the label insert counted", func() bool {
		metrics = httpGet(t, "http://"+httpAddr+"/metrics")
		return strings.Contains(metrics, `sys1_sink_inserted_total{lane="labels"} 1`)
	})
	if _, err := metricstest.Parse(metrics); err != nil {
		t.Errorf("/metrics is not valid Prometheus text: %v\n%s", err, metrics)
	}
	for _, want := range []string{`sys1_sink_inserted_total{lane="runs"} 20`, `sys1_sink_inserted_total{lane="labels"} 1`, `sys1_sink_retrying{lane="runs"} 0`, "# TYPE sys1_sink_lag_records gauge", "go_goroutines "} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %q:\n%s", want, metrics)
		}
	}
	cancel()
	select {
	case code := <-done:
		if code != exitOK {
			t.Fatalf("sys1 sink exited %d; stderr:\n%s", code, stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("sys1 sink did not stop on cancellation")
	}
	if !strings.Contains(stderr.String(), `"sink started"`) || !strings.Contains(stderr.String(), `"sink stopped"`) {
		t.Errorf("sink logs lack start/stop lines:\n%s", stderr.String())
	}
}

func TestSinkCommandNeedsDSN(t *testing.T) {
	t.Setenv("SYS1_CLICKHOUSE_DSN", "")
	var out, errOut bytes.Buffer
	if code := run(context.Background(), []string{"sink"}, &out, &errOut); code != exitUsage || !strings.Contains(errOut.String(), "SYS1_CLICKHOUSE_DSN") {
		t.Fatalf("exit %d, stderr %q", code, errOut.String())
	}
}

// The sink is a NATS client: without SYS1_NATS_URL it connects to the default URL, and its
// settings are checked as a client's.
func TestSinkValidatesNATSAsAClient(t *testing.T) {
	t.Setenv("SYS1_CLICKHOUSE_DSN", "http://127.0.0.1:1")
	checkValidatesNATSAsAClient(t, func() (int, string) {
		var out, errOut bytes.Buffer
		code := run(context.Background(), []string{"sink"}, &out, &errOut)
		return code, errOut.String()
	})
}
