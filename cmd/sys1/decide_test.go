package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/provider/simulator"
	"github.com/sys1hq/sys1/worker"
	"github.com/sys1hq/sys1/worker/auth"
	"github.com/sys1hq/sys1/worker/natsconn/natstest"
	"github.com/sys1hq/sys1/worker/topology"
	"github.com/sys1hq/sys1/worker/tracing"
)

// startDeployment runs a nats-server and, when withWorker, one worker on the simulator.
func startDeployment(t *testing.T, withWorker bool) string {
	t.Helper()
	srv := natstest.Start(t)
	nc, js := natstest.Connect(t, srv)
	ctx, cancel := context.WithCancel(context.Background())
	topo := topology.Default()
	if !withWorker {
		// The streams exist (a worker ran once) but nobody consumes.
		if _, err := topology.Ensure(ctx, js, topo); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cancel)
		return srv.ClientURL()
	}
	a, _ := auth.New(ctx, auth.DefaultConfig(), zerolog.Nop())
	w, err := worker.New(ctx, worker.Config{Concurrency: 2, ConcurrencyMode: "fixed", MaxDeliver: 2, ShutdownGrace: time.Second, FetchBatch: 2, RetryBase: 10 * time.Millisecond, RetryMax: 50 * time.Millisecond},
		worker.Options{NC: nc, JS: js, Topology: topo, Provider: simulator.New(0), ModelPolicy: contract.Policy{DefaultModel: "nimble"}, Auth: a, Logger: zerolog.Nop(), FetchWait: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = w.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return srv.ClientURL()
}

func decide(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), append([]string{"decide"}, args...), &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

func TestDecideExitStatus(t *testing.T) {
	url := startDeployment(t, true)
	t.Setenv("SYS1_NATS_URL", url)
	ticket := filepath.Join("..", "..", "contract", "examples", "ticket.json")

	code, out, errOut := decide(t, "--caller", "cli-test", ticket)
	if code != exitOK {
		t.Fatalf("success: exit %d, stderr %s", code, errOut)
	}
	var rep contract.Reply
	if err := json.Unmarshal([]byte(out), &rep); err != nil || rep.Status != contract.StatusSuccess || rep.Result.Provider != "simulator" {
		t.Fatalf("printed reply: %v\n%s", err, out)
	}

	// Flags may follow the file, as most CLIs allow; and - reads standard input.
	code, out, errOut = decide(t, ticket, "--caller", "cli-test", "--run-id", "flags-after-file")
	if code != exitOK || !strings.Contains(out, `"run_id": "flags-after-file"`) {
		t.Fatalf("flags after FILE: exit %d, stderr %s\n%s", code, errOut, out)
	}
	f, err := os.Open(ticket)
	if err != nil {
		t.Fatal(err)
	}
	stdin := os.Stdin
	os.Stdin = f
	code, out, errOut = decide(t, "-", "--run-id", "from-stdin")
	os.Stdin = stdin
	f.Close()
	if code != exitOK || !strings.Contains(out, `"run_id": "from-stdin"`) {
		t.Fatalf("- with flags after it: exit %d, stderr %s\n%s", code, errOut, out)
	}

	// --model applies and is checked by the worker: a model outside the allow-list fails.
	code, out, _ = decide(t, "--model", "not-allowed", ticket)
	if code != exitFailed || !strings.Contains(out, "SYS1_MODEL_NOT_ALLOWED") {
		t.Fatalf("failed run: exit %d\n%s", code, out)
	}

	bad := filepath.Join(t.TempDir(), "bad.json")
	if err := os.WriteFile(bad, []byte(`{"state":"x","questions":{}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, _ = decide(t, bad)
	if code != exitFailed || !strings.Contains(out, "SYS1_INVALID_INPUT") {
		t.Fatalf("invalid request: exit %d\n%s", code, out)
	}
	// --model does not hide what the worker would refuse: an unknown field is still reported.
	unknown := filepath.Join(t.TempDir(), "unknown.json")
	if err := os.WriteFile(unknown, []byte(`{"state":"x","questions":{"q":{"type":"noul","instructions":"x"}},"temperature":0.2}`), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, _ = decide(t, "--model", "nimble", unknown)
	if code != exitFailed || !strings.Contains(out, "SYS1_INVALID_INPUT") || !strings.Contains(out, "temperature") {
		t.Fatalf("unknown field with --model: exit %d\n%s", code, out)
	}

	// A run id the worker refuses is answered (under the id it derived): a failed run, not a
	// wait for a reply that never comes.
	code, out, errOut = decide(t, "--run-id", "has space", "--timeout", "20s", ticket)
	if code != exitFailed || !strings.Contains(out, "SYS1_INVALID_INPUT") || !strings.Contains(out, "Sys1-Run-Id") {
		t.Fatalf("invalid run id: exit %d\n%s\n%s", code, out, errOut)
	}

	code, _, _ = decide(t, "--deadline", "-5s", ticket)
	if code != exitUsage {
		t.Errorf("past relative deadline: exit %d", code)
	}
	code, out, _ = decide(t, "--deadline", time.Now().Add(-time.Minute).Format(time.RFC3339), ticket)
	if code != exitFailed || !strings.Contains(out, "SYS1_EXPIRED") {
		t.Errorf("expired deadline: exit %d\n%s", code, out)
	}

	code, out, _ = decide(t, "--no-wait", "--run-id", "nowait-1", ticket)
	if code != exitOK || strings.TrimSpace(out) != "nowait-1" {
		t.Errorf("--no-wait: exit %d, out %q", code, out)
	}

	for name, args := range map[string][]string{
		"unknown flag":             {"--nope", ticket},
		"missing file":             {filepath.Join(t.TempDir(), "absent.json")},
		"two files":                {ticket, ticket},
		"two files, flags between": {ticket, "--caller", "x", ticket},
		"file after --":            {"--", ticket, ticket},
		"bad caller":               {"--caller", "a b", ticket},
		"bad deadline":             {"--deadline", "soon", ticket},
		"model on junk":            {"--model", "x", bad + ".missing"},
	} {
		if code, _, _ := decide(t, args...); code != exitUsage {
			t.Errorf("%s: exit %d, want %d", name, code, exitUsage)
		}
	}
	// A timeout of zero is a usage error said as such, not a request published and then
	// "no reply within 0s".
	if code, _, errOut := decide(t, "--timeout", "0s", "--run-id", "zero-timeout", ticket); code != exitUsage || !strings.Contains(errOut, "--timeout must be positive") {
		t.Errorf("--timeout 0s: exit %d, %q", code, errOut)
	}
}

func TestDecideConnectionErrors(t *testing.T) {
	ticket := filepath.Join("..", "..", "contract", "examples", "ticket.json")
	// Nothing listens here.
	t.Setenv("SYS1_NATS_URL", "nats://127.0.0.1:1")
	if code, _, errOut := decide(t, ticket); code != exitUsage || !strings.Contains(errOut, "connect to NATS") {
		t.Errorf("no NATS: exit %d, stderr %s", code, errOut)
	}
	// NATS without any worker ever: no stream stores the request.
	t.Setenv("SYS1_NATS_URL", natstest.Start(t).ClientURL())
	if code, _, errOut := decide(t, ticket); code != exitUsage || !strings.Contains(errOut, "worker running") {
		t.Errorf("no stream: exit %d, stderr %s", code, errOut)
	}
	// Streams but no worker: the wait times out.
	t.Setenv("SYS1_NATS_URL", startDeployment(t, false))
	if code, _, errOut := decide(t, "--timeout", "300ms", ticket); code != exitUsage || !strings.Contains(errOut, "no reply within") {
		t.Errorf("no worker: exit %d, stderr %s", code, errOut)
	}
}

// TestWithModelSplicesTheModelIn: --model changes the model and nothing else; fields the
// worker would refuse (unknown, duplicated) still reach it.
func TestWithModelSplicesTheModelIn(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{"model":"a","state":{"z":1,"a":2},"questions":{}}`, `{"model":"tev1","state":{"z":1,"a":2},"questions":{}}`},
		{`{"state":"x","questions":{"b":{},"a":{}}}`, `{"model":"tev1","state":"x","questions":{"b":{},"a":{}}}`},
		{` { "state" : "x", "temperature": 0.2, "model": "a" } `, `{"state":"x","temperature":0.2,"model":"tev1"}`},
		{`{"state":"x","state":"y"}`, `{"model":"tev1","state":"x","state":"y"}`},
		{`{}`, `{"model":"tev1"}`},
	} {
		got, err := withModel([]byte(tc.in), "tev1")
		if err != nil || string(got) != tc.want {
			t.Errorf("withModel(%s) = %s, %v; want %s", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{`[]`, `"x"`, `{"state":`, `{} {}`, ``} {
		if got, err := withModel([]byte(bad), "tev1"); err == nil {
			t.Errorf("withModel(%q) = %s, want an error", bad, got)
		}
	}
}

// TestDecideValidatesAsAClient: without SYS1_NATS_URL a client command connects to
// nats://127.0.0.1:4222; it never embeds a server, so settings for a remote server (creds,
// nkey, TLS) are not "embedded-server" errors, and the embedded server's settings are not its
// business.
func TestDecideValidatesAsAClient(t *testing.T) {
	ticket := filepath.Join("..", "..", "contract", "examples", "ticket.json")
	checkValidatesNATSAsAClient(t, func() (int, string) {
		code, _, errOut := decide(t, ticket)
		return code, errOut
	})
}

// checkValidatesNATSAsAClient runs a client command (decide, sink, …) without SYS1_NATS_URL and
// with NATS settings only an embedded server would refuse: TLS applies to a client, the embedded
// server's SYS1_NATS_LISTEN does not. The one real error, a password without a user, must be
// the only one named, and the password never printed.
func checkValidatesNATSAsAClient(t *testing.T, runCommand func() (code int, stderr string)) {
	t.Helper()
	t.Setenv("SYS1_NATS_URL", "")
	t.Setenv("SYS1_NATS_TLS_CA", filepath.Join("..", "..", "contract", "examples", "ticket.json")) // readable; its content does not matter here
	t.Setenv("SYS1_NATS_LISTEN", "not-an-address")
	t.Setenv("SYS1_NATS_PASSWORD", "pw-that-must-not-leak")
	code, errOut := runCommand()
	if code != exitUsage || !strings.Contains(errOut, "SYS1_NATS_USER") {
		t.Fatalf("exit %d, stderr %s", code, errOut)
	}
	for _, bad := range []string{"applies to a remote server", "SYS1_NATS_LISTEN", "pw-that-must-not-leak"} {
		if strings.Contains(errOut, bad) {
			t.Errorf("stderr mentions %q:\n%s", bad, errOut)
		}
	}
}

// sys1 decide sends a traceparent: the trace in TRACEPARENT, or a new one when it is unset or
// malformed (which it says, and which is no error).
func TestDecideSendsTraceparent(t *testing.T) {
	url := startDeployment(t, false)
	t.Setenv("SYS1_NATS_URL", url)
	ticket := filepath.Join("..", "..", "contract", "examples", "ticket.json")
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	sent := func(runID string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s, err := js.Stream(ctx, "SYS1_REQUESTS")
		if err != nil {
			t.Fatal(err)
		}
		info, _ := s.Info(ctx)
		for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
			if m, err := s.GetMsg(ctx, seq); err == nil && m.Header.Get("Sys1-Run-Id") == runID {
				return m.Header.Get("traceparent")
			}
		}
		t.Fatalf("request %s not in the stream", runID)
		return ""
	}
	parent := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	for _, tc := range []struct{ env, runID, wantTrace, wantStderr string }{
		{"", "tp-none", "", ""},
		{parent, "tp-env", "4bf92f3577b34da6a3ce929d0e0e4736", ""},
		{"00-zz", "tp-bad", "", "TRACEPARENT is not a W3C traceparent"},
	} {
		t.Setenv("TRACEPARENT", tc.env)
		code, _, errOut := decide(t, "--no-wait", "--run-id", tc.runID, ticket)
		if code != exitOK || !strings.Contains(errOut, tc.wantStderr) {
			t.Fatalf("TRACEPARENT=%q: exit %d, stderr %q", tc.env, code, errOut)
		}
		tp := sent(tc.runID)
		sc := tracing.SpanContextOf(nats.Header{"traceparent": []string{tp}})
		if !sc.IsValid() || (tc.wantTrace != "" && sc.TraceID().String() != tc.wantTrace) || (tc.wantTrace == "" && strings.Contains(tp, "4bf92f35")) {
			t.Errorf("TRACEPARENT=%q: sent traceparent %q", tc.env, tp)
		}
		if tc.env == parent && tp != parent {
			// The command records no span of its own: the run is the caller's span's child.
			t.Errorf("sent %q, want the caller's traceparent %q as is", tp, parent)
		}
	}
}

// TestDecideExplainsARefusal: when JetStream refuses the request — the caller already has its
// SYS1_REQUESTS_MAX_PER_CALLER requests waiting, or the stream is full — sys1 decide says so
// in words, names the variable, and exits 1: the request was refused, not mistyped.
func TestDecideExplainsARefusal(t *testing.T) {
	ticket := filepath.Join("..", "..", "contract", "examples", "ticket.json")
	srv := natstest.Start(t)
	_, js := natstest.Connect(t, srv)
	topo := topology.Default()
	topo.RequestsPerCaller = 1
	topo.MaxMsgSize = 64 << 10
	topo.RequestsMaxBytes = 64 << 10
	if _, err := topology.Ensure(context.Background(), js, topo); err != nil {
		t.Fatal(err)
	}
	t.Setenv("SYS1_NATS_URL", srv.ClientURL())
	if code, _, errOut := decide(t, "--no-wait", "--caller", "cli", ticket); code != exitOK {
		t.Fatalf("the first request: exit %d %s", code, errOut)
	}
	code, _, errOut := decide(t, "--no-wait", "--caller", "cli", ticket)
	if code != exitFailed || !strings.Contains(errOut, "refused: this caller already has as many requests waiting as its quota allows (SYS1_REQUESTS_MAX_PER_CALLER)") {
		t.Errorf("over the quota: exit %d, %s", code, errOut)
	}
	// Another caller fills the stream's bytes: the next one is told the stream is full.
	for i, size := range []int{20 << 10, 20 << 10, 20 << 10, 1 << 10, 1 << 10, 1 << 10, 1 << 10} {
		_, _ = js.Publish(context.Background(), fmt.Sprintf("sys1.decide.filler%d", i), bytes.Repeat([]byte("x"), size))
	}
	for i := 0; i < 200; i++ { // what is left, in small pieces
		if _, err := js.Publish(context.Background(), fmt.Sprintf("sys1.decide.crumb%d", i), []byte("x")); err != nil {
			break
		}
	}
	code, _, errOut = decide(t, "--timeout", "5s", "--caller", "other", ticket)
	if code != exitFailed || !strings.Contains(errOut, "refused: the request stream is full (SYS1_REQUESTS_MAX_BYTES") {
		t.Errorf("stream full: exit %d, %s", code, errOut)
	}
}
