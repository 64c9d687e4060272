package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sys1hq/sys1/provider/chain"
	"github.com/sys1hq/sys1/worker"
	"github.com/sys1hq/sys1/worker/natsconn/natstest"
)

// startEmbeddedWorker runs `sys1 worker` with the simulator and an embedded NATS, and points
// client commands at it.
func startEmbeddedWorker(t *testing.T, extraEnv ...string) *natstest.Buffer {
	t.Helper()
	port := freePort(t)
	t.Setenv("SYS1_NATS_URL", "")
	t.Setenv("SYS1_NATS_LISTEN", fmt.Sprintf("127.0.0.1:%d", port))
	t.Setenv("SYS1_DATA_DIR", t.TempDir())
	t.Setenv("SYS1_PROVIDER", "simulator")
	t.Setenv("SYS1_WORKER_ID", "cli-replica")
	t.Setenv("SYS1_STATUS_INTERVAL", "50ms")
	for i := 0; i+1 < len(extraEnv); i += 2 {
		t.Setenv(extraEnv[i], extraEnv[i+1])
	}
	ctx, stop := context.WithCancel(context.Background())
	var stderr natstest.Buffer
	exited := make(chan int, 1)
	go func() { exited <- run(ctx, []string{"worker"}, &bytes.Buffer{}, &stderr) }()
	t.Cleanup(func() {
		stop()
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
		}
	})
	natstest.WaitFor(t, 30*time.Second, "the worker to start", func() bool {
		select {
		case c := <-exited:
			t.Fatalf("worker exited with %d:\n%s", c, stderr.String())
		default:
		}
		return strings.Contains(stderr.String(), "worker started")
	})
	t.Setenv("SYS1_NATS_URL", fmt.Sprintf("nats://127.0.0.1:%d", port))
	return &stderr
}

func runCmd(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	// stderr is safe for concurrent writes: a command's NATS connection reports asynchronous
	// errors (a permission refused) from its own goroutine while the command writes too.
	var out bytes.Buffer
	var errOut natstest.Buffer
	code := run(context.Background(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// TestStatusPauseResume: sys1 status lists the replica and the queues; sys1 pause pauses
// the fleet (health says paused, with the reason), sys1 resume ends it.
func TestStatusPauseResume(t *testing.T) {
	startEmbeddedWorker(t)
	natstest.WaitFor(t, 10*time.Second, "the replica in sys1 status", func() bool {
		code, out, _ := runCmd(t, "status")
		return code == exitOK && strings.Contains(out, "cli-replica") && strings.Contains(out, "ok")
	})
	code, out, errOut := runCmd(t, "pause", "--for", "10m", "--reason", "deploying nimble 2")
	if code != exitOK || !strings.Contains(out, "paused interactive requests until") {
		t.Fatalf("pause: %d %s %s", code, out, errOut)
	}
	var st fleetStatus
	natstest.WaitFor(t, 10*time.Second, "the replica to say paused", func() bool {
		code, out, _ := runCmd(t, "status", "--json")
		if code != exitOK || json.Unmarshal([]byte(out), &st) != nil || len(st.Replicas) != 1 {
			return false
		}
		return st.Replicas[0].Status == "paused"
	})
	if st.Paused == nil || st.Paused.Reason != "deploying nimble 2" || st.Paused.Until == nil || time.Until(*st.Paused.Until) < 9*time.Minute {
		t.Errorf("pause state %+v", st.Paused)
	}
	_, out, _ = runCmd(t, "status")
	if !strings.Contains(out, "deploying nimble 2") || !strings.Contains(out, "sys1-worker") {
		t.Errorf("status text:\n%s", out)
	}
	if code, out, errOut := runCmd(t, "resume"); code != exitOK || !strings.Contains(out, "resumed interactive requests") {
		t.Fatalf("resume: %d %s %s", code, out, errOut)
	}
	natstest.WaitFor(t, 10*time.Second, "the replica to say ok again", func() bool {
		code, out, _ := runCmd(t, "status", "--json")
		return code == exitOK && json.Unmarshal([]byte(out), &st) == nil && len(st.Replicas) == 1 && st.Replicas[0].Status == "ok" && st.Paused == nil
	})
	// Without an end, the pause lasts until resumed.
	if code, out, _ := runCmd(t, "pause"); code != exitOK || !strings.Contains(out, "until sys1 resume") {
		t.Fatalf("pause without an end: %d %s", code, out)
	}
	natstest.WaitFor(t, 10*time.Second, "paused until resumed", func() bool {
		code, out, _ := runCmd(t, "status", "--json")
		return code == exitOK && json.Unmarshal([]byte(out), &st) == nil && st.Paused != nil && st.Paused.Until == nil
	})
}

func TestPauseUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"pause", "--for", "-1m"},
		{"pause", "--for", "1m", "--until", "2030-01-01T00:00:00Z"},
		{"pause", "--until", "tomorrow"},
		{"pause", "--until", "2001-01-01T00:00:00Z"},
		{"pause", "extra"},
		{"resume", "extra"},
		{"status", "extra"},
	} {
		if code, _, _ := runCmd(t, args...); code != exitUsage {
			t.Errorf("%v: exit %d, want %d", args, code, exitUsage)
		}
	}
}

// TestStatusWithNoReplica: nobody answering is exit 1 with a clear message, not a hang.
func TestStatusWithNoReplica(t *testing.T) {
	srv := natstest.Start(t)
	t.Setenv("SYS1_NATS_URL", srv.ClientURL())
	code, _, errOut := runCmd(t, "status", "--wait", "300ms")
	if code != exitFailed || !strings.Contains(errOut, "no replica answered") {
		t.Fatalf("exit %d: %s", code, errOut)
	}
}

// TestWorkerRefusesABadPolicyFile: a bad SYS1_POLICY_FILE stops start-up with one error that
// names the variable, the line and the field, alongside any other bad variable.
func TestWorkerRefusesABadPolicyFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(path, []byte("rules:\n  - name: a\n    min_confidence: 2\n  - name: b\n    review: sometimes\n    min_confidence: 0.5\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("SYS1_POLICY_FILE", path)
	t.Setenv("SYS1_CONCURRENCY", "0")
	code, _, errOut := runCmd(t, "worker")
	if code != exitUsage {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{"SYS1_POLICY_FILE", "line 3", "min_confidence", "line 5", "review", "SYS1_CONCURRENCY"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("start-up error lacks %q:\n%s", want, errOut)
		}
	}
}

// TestStatusShowsCallersAgainstTheirLimits: with SYS1_LIMITS_FILE, sys1 status shows each
// caller's use of each limit today, read from the shared counters. The worker runs in the
// default auth mode (none), where the caller is the subject's token (sys1 decide's "cli"), so
// a rule naming that caller applies as it would in production.
func TestStatusShowsCallersAgainstTheirLimits(t *testing.T) {
	dir := t.TempDir()
	lim := filepath.Join(dir, "limits.yaml")
	if err := os.WriteFile(lim, []byte("rules:\n  - caller: cli\n    decisions_per_minute: 100\n    input_tokens_per_day: 100000\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	startEmbeddedWorker(t, "SYS1_LIMITS_FILE", lim)
	ticket := filepath.Join("..", "..", "contract", "examples", "ticket.json")
	before := time.Now()
	if code, out, errOut := decide(t, "--timeout", "20s", ticket); code != exitOK {
		t.Fatalf("decide: %d %s %s", code, out, errOut)
	}
	var st fleetStatus
	natstest.WaitFor(t, 10*time.Second, "the caller's use in sys1 status", func() bool {
		code, out, _ := runCmd(t, "status", "--json")
		return code == exitOK && json.Unmarshal([]byte(out), &st) == nil && len(st.Callers) == 2
	})
	for _, c := range st.Callers {
		// A minute's window that began after the decision was sent may not hold it yet.
		rolledOver := c.Limit == "decisions per minute" && c.ResetsAt != nil && c.ResetsAt.Add(-time.Minute).After(before)
		if c.Caller != "cli" || (c.Used <= 0 && !rolledOver) || c.ResetsAt == nil {
			t.Errorf("caller use %+v", c)
		}
	}
	_, out, _ := runCmd(t, "status")
	if !strings.Contains(out, "decisions per minute") || !strings.Contains(out, "cli ") {
		t.Errorf("status text:\n%s", out)
	}
}

// TestOperationalHTTPServerBoundsEveryConnection: read-header, read, write and idle timeouts
// are all set, so idle keep-alive connections and slow clients are dropped.
func TestOperationalHTTPServerBoundsEveryConnection(t *testing.T) {
	srv := newHTTPServer(nil)
	if srv.ReadHeaderTimeout <= 0 || srv.ReadTimeout <= 0 || srv.WriteTimeout <= 0 || srv.IdleTimeout <= 0 || srv.MaxHeaderBytes <= 0 {
		t.Fatalf("timeouts %+v", srv)
	}
}

// TestEmbeddedWorkerLogLinesHaveEachKeyOnce: every log line is a JSON object with each key
// once (the embedded nats-server's lines used to carry "component" twice).
func TestEmbeddedWorkerLogLinesHaveEachKeyOnce(t *testing.T) {
	logs := startEmbeddedWorker(t, "SYS1_LOG_LEVEL", "debug")
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	var nats int
	for _, line := range lines {
		dec := json.NewDecoder(strings.NewReader(line))
		if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
			t.Fatalf("not a JSON object: %s", line)
		}
		seen := map[string]bool{}
		for dec.More() {
			tok, err := dec.Token()
			if err != nil {
				t.Fatalf("%v in %s", err, line)
			}
			key := tok.(string)
			if seen[key] {
				t.Errorf("key %q twice in %s", key, line)
			}
			seen[key] = true
			var v json.RawMessage
			if err := dec.Decode(&v); err != nil {
				t.Fatalf("%v in %s", err, line)
			}
		}
		if strings.Contains(line, "nats-server") {
			nats++
		}
	}
	if nats == 0 {
		t.Errorf("no embedded nats-server log line to check among %d lines", len(lines))
	}
}

// TestOneVersionAndCountsThatMove: a development build says 0.0.0-dev in sys1 version, micro
// info, health (and so sys1 status) and its run records alike; sys1 status counts the runs and
// provider calls a replica made since it started, so an idle fleet that answered something
// does not show only zeros, and it says what its columns mean.
func TestOneVersionAndCountsThatMove(t *testing.T) {
	startEmbeddedWorker(t)
	if code, out, _ := runCmd(t, "version"); code != exitOK || out != "sys1 0.0.0-dev\n" {
		t.Fatalf("sys1 version: %d %q", code, out)
	}
	ticket := filepath.Join("..", "..", "contract", "examples", "ticket.json")
	if code, out, errOut := decide(t, "--run-id", "version-1", "--timeout", "20s", ticket); code != exitOK {
		t.Fatalf("decide: %d %s %s", code, out, errOut)
	}
	nc, err := nats.Connect(os.Getenv("SYS1_NATS_URL"))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	info, err := nc.Request("$SRV.INFO.sys1", nil, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var micro struct{ Version string }
	if err := json.Unmarshal(info.Data, &micro); err != nil || micro.Version != "0.0.0-dev" {
		t.Errorf("micro info version %q (%v)", micro.Version, err)
	}
	js, _ := jetstream.New(nc)
	s, err := js.Stream(context.Background(), "SYS1_RUNS")
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetLastMsgForSubject(context.Background(), "sys1.runs.success")
	if err != nil {
		t.Fatal(err)
	}
	var rec struct{ Version string }
	if err := json.Unmarshal(m.Data, &rec); err != nil || rec.Version != "0.0.0-dev" {
		t.Errorf("record version %q (%v)", rec.Version, err)
	}
	var st fleetStatus
	natstest.WaitFor(t, 10*time.Second, "the run counted in sys1 status", func() bool {
		code, out, _ := runCmd(t, "status", "--json")
		return code == exitOK && json.Unmarshal([]byte(out), &st) == nil && len(st.Replicas) == 1 && st.Replicas[0].Totals.Runs == 1
	})
	if h := st.Replicas[0]; h.Version != "0.0.0-dev" || h.Totals.ProviderCalls != 1 || h.InFlight.Messages != 0 {
		t.Errorf("health: version %q, totals %+v, in flight %+v", h.Version, h.Totals, h.InFlight)
	}
	_, out, _ := runCmd(t, "status")
	row := regexp.MustCompile(`(?m)^cli-replica +ok +0\.0\.0-dev +simulator up +0 +0 +1 +1$`)
	if !strings.Contains(out, "RUNNING  CALLING  RUNS  CALLS") || !row.MatchString(out) || !strings.Contains(out, "since the replica started") {
		t.Errorf("sys1 status:\n%s", out)
	}
}

func TestProductVersion(t *testing.T) {
	for in, want := range map[string]string{"": "0.0.0-dev", "dev": "0.0.0-dev", "0.0.0-dev": "0.0.0-dev", "v1.2.3": "1.2.3", "1.4.0-rc.1": "1.4.0-rc.1", "main@abc123": "0.0.0-main-abc123"} {
		if got := worker.ProductVersion(in); got != want {
			t.Errorf("ProductVersion(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestStatusNamesFullStreams: a stream a replica finds full is named under the replicas, with
// the variable to raise.
func TestStatusNamesFullStreams(t *testing.T) {
	var out bytes.Buffer
	printStatus(&out, fleetStatus{Replicas: []worker.Health{{Replica: "a", Status: worker.HealthDegraded, Full: []string{"SYS1_REVIEW"},
		Storage: []worker.StreamUsage{{Name: "SYS1_REVIEW", Bytes: 10, MaxBytes: 10, Full: true, Variable: "SYS1_REVIEW_MAX_BYTES"}}}}})
	if !strings.Contains(out.String(), "FULL, refusing new messages: SYS1_REVIEW (raise SYS1_REVIEW_MAX_BYTES)") {
		t.Errorf("status:\n%s", out.String())
	}
}

// TestStatusCountsRoutesNotClosed: a provider whose routes (models on it) are open or absent
// says how many beside its state; one with every route closed says nothing more.
func TestStatusCountsRoutesNotClosed(t *testing.T) {
	var out bytes.Buffer
	printStatus(&out, fleetStatus{Replicas: []worker.Health{{Replica: "a", Status: worker.HealthOK, Providers: []chain.LinkHealth{
		{Name: "ollama", OK: true, Breaker: chain.BreakerClosed, Routes: chain.RouteSummary{Counts: chain.RouteCounts{Closed: 7, Open: 1, Absent: 2}}},
		{Name: "systemone", OK: true, Breaker: chain.BreakerClosed, Routes: chain.RouteSummary{Counts: chain.RouteCounts{Closed: 3}}},
	}}}})
	if !strings.Contains(out.String(), "ollama up (routes: 1 open, 2 absent), systemone up ") {
		t.Errorf("status:\n%s", out.String())
	}
}

// TestLimitsRulesThatCannotMatchAreWarnedAtStartUp: in auth mode none (the Quick start's),
// a limits rule naming a caller is said at start-up, naming the rule, and so is a rule behind
// a catch-all.
func TestLimitsRulesThatCannotMatchAreWarnedAtStartUp(t *testing.T) {
	file := filepath.Join(t.TempDir(), "limits.yaml")
	if err := os.WriteFile(file, []byte("rules:\n  - caller: billing\n    usd_per_day: 5\n  - caller: \"*\"\n    weight: 1\n  - caller: late\n    in_flight: 2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	logs := startEmbeddedWorker(t, "SYS1_LIMITS_FILE", file)
	out := logs.String()
	for _, want := range []string{`rule \"billing\" (line 2) names callers`, `rule \"late\" (line 6) can never match`} {
		if !strings.Contains(out, want) {
			t.Errorf("start-up log lacks %s:\n%s", want, out)
		}
	}
}
