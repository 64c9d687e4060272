package loadtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/provider/ollama"
	"github.com/sys1hq/sys1/worker"
	"github.com/sys1hq/sys1/worker/auth"
	"github.com/sys1hq/sys1/worker/client"
	"github.com/sys1hq/sys1/worker/natsconn"
	"github.com/sys1hq/sys1/worker/topology"
)

func startSelf(t *testing.T, replicas, concurrency int) *Self {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := StartSelf(ctx, SelfOptions{
		Replicas: replicas, Concurrency: concurrency, ProviderLatency: time.Millisecond,
		Dir: t.TempDir(), Logger: zerolog.Nop(),
	})
	if err != nil {
		t.Fatalf("StartSelf: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

func connect(t *testing.T, s *Self) *nats.Conn {
	t.Helper()
	nc, err := s.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func ticket(t *testing.T) []byte {
	t.Helper()
	b, err := Template("ticket")
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// checkAddsUp asserts the report's own arithmetic, whatever the run's outcome.
func checkAddsUp(t *testing.T, r *Report) {
	t.Helper()
	if r.Sent != r.Succeeded+r.Failed {
		t.Errorf("sent %d != succeeded %d + failed %d", r.Sent, r.Succeeded, r.Failed)
	}
	sum := 0
	for _, n := range r.FailedBy {
		sum += n
	}
	if sum != r.Failed {
		t.Errorf("failed_by_code sums to %d, failed is %d", sum, r.Failed)
	}
	answered := r.Sent - r.FailedBy[CodeNoReply]
	if r.Latency.Count != answered {
		t.Errorf("latency has %d samples for %d answered runs", r.Latency.Count, answered)
	}
}

func TestSelfRunReportAddsUp(t *testing.T) {
	const replicas, concurrency, n = 2, 3, 60
	s := startSelf(t, replicas, concurrency)
	if err := s.StartWorkers(context.Background()); err != nil {
		t.Fatal(err)
	}
	var progressed atomic.Int64
	rep, err := Run(context.Background(), connect(t, s), Options{
		Requests: n, Producers: 4, Caller: "bench", Body: ticket(t), ReplyTimeout: 30 * time.Second,
		Progress: func(Progress) { progressed.Add(1) },
		Sampler:  &MemorySampler{Interval: 10 * time.Millisecond},
	})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	rep.Peak = s.Peak()
	checkAddsUp(t, rep)
	if rep.Sent != n || rep.Succeeded != n || rep.Failed != 0 {
		t.Fatalf("sent %d succeeded %d failed %d (%v), want %d all succeeded", rep.Sent, rep.Succeeded, rep.Failed, rep.FailedBy, n)
	}
	if rep.QueueWait.Count != n || rep.ProviderTime.Count != n {
		t.Errorf("queue wait n=%d, provider n=%d, want %d each (one attempt per run)", rep.QueueWait.Count, rep.ProviderTime.Count, n)
	}
	if rep.Throughput <= 0 || rep.ElapsedMS <= 0 {
		t.Errorf("throughput %g over %gms, want positive", rep.Throughput, rep.ElapsedMS)
	}
	if rep.Peak.Calls < 1 || rep.Peak.Calls > replicas*concurrency {
		t.Errorf("provider peak %d, want 1..%d", rep.Peak.Calls, replicas*concurrency)
	}
	if len(rep.Peak.PerReplica) != replicas {
		t.Fatalf("per-replica peaks %v, want %d", rep.Peak.PerReplica, replicas)
	}
	for i, p := range rep.Peak.PerReplica {
		if p > concurrency {
			t.Errorf("replica %d peak %d exceeds its concurrency %d", i, p, concurrency)
		}
	}
	var calls int64
	for _, st := range s.Stats() {
		calls += st.Succeeded
	}
	if calls != n {
		t.Errorf("replicas report %d succeeded runs, want %d", calls, n)
	}
	if rep.CPUPerDecisionMS <= 0 {
		t.Errorf("process CPU per decision %g, want it measured", rep.CPUPerDecisionMS)
	}
	if rep.Memory == nil || len(rep.Memory.Samples) < 2 || rep.Memory.PeakRSS < rep.Memory.StartRSS || rep.Memory.PeakRSS == 0 {
		t.Errorf("memory report %+v: want samples with peak ≥ start > 0", rep.Memory)
	}
	b, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(b, &back); err != nil || back.Sent != n || back.Peak == nil {
		t.Fatalf("JSON round trip: %v %+v", err, back)
	}
	var text strings.Builder
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{fmt.Sprintf("sent          %d", n), "succeeded     60", "provider peak", "latency       p50"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("text report lacks %q:\n%s", want, text.String())
		}
	}
}

// A preload builds the whole backlog before any worker consumes it.
func TestPreloadPublishesEverythingBeforeTheWorkersStart(t *testing.T) {
	const n = 40
	s := startSelf(t, 1, 4)
	var callsBeforeDrain int64 = -1
	rep, err := Run(context.Background(), connect(t, s), Options{
		Requests: n, Producers: 8, Caller: "bench", Body: ticket(t),
		BeforeDrain: func(ctx context.Context, _ int64) error {
			callsBeforeDrain = s.fake.Calls()
			return s.StartWorkers(ctx)
		},
	})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	checkAddsUp(t, rep)
	if callsBeforeDrain != 0 {
		t.Fatalf("the provider was called %d times before the drain started", callsBeforeDrain)
	}
	if rep.Succeeded != n {
		t.Fatalf("succeeded %d of %d: %v", rep.Succeeded, n, rep.FailedBy)
	}
	// Every run waited in the queue at least until the drain started.
	if rep.QueueWait.Count != n {
		t.Fatalf("queue wait samples %d, want %d", rep.QueueWait.Count, n)
	}
}

// Unanswered runs are failures with their own code, so the report still adds up.
func TestUnansweredRunsAreNoReply(t *testing.T) {
	s := startSelf(t, 1, 2) // workers never started
	rep, err := Run(context.Background(), connect(t, s), Options{
		Requests: 5, Producers: 2, Caller: "bench", Body: ticket(t), ReplyTimeout: 100 * time.Millisecond,
	})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	checkAddsUp(t, rep)
	if rep.Sent != 5 || rep.Failed != 5 || rep.FailedBy[CodeNoReply] != 5 || rep.Throughput != 0 {
		t.Fatalf("report %+v: want 5 sent, 5 failed as %s, no throughput", rep, CodeNoReply)
	}
}

func TestFailuresAreCountedByCode(t *testing.T) {
	s := startSelf(t, 1, 2)
	if err := s.StartWorkers(context.Background()); err != nil {
		t.Fatal(err)
	}
	rep, err := Run(context.Background(), connect(t, s), Options{
		Requests: 6, Producers: 2, Caller: "bench", Body: []byte(`{"state":"x","questions":{},"bogus":1}`),
	})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	checkAddsUp(t, rep)
	if rep.Failed != 6 || rep.FailedBy["SYS1_INVALID_INPUT"] != 6 {
		t.Fatalf("failed %d by %v, want 6 SYS1_INVALID_INPUT", rep.Failed, rep.FailedBy)
	}
}

func TestRunWithoutAStreamFailsClearly(t *testing.T) {
	srv, err := natsconn.StartEmbedded(natsconn.EmbeddedOptions{Port: -1, StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	_, err = Run(context.Background(), nc, Options{Requests: 3, Producers: 2, Caller: "bench", Body: ticket(t)})
	if !errors.Is(err, client.ErrNoStream) {
		t.Fatalf("Run with no SYS1_REQUESTS stream: %v, want ErrNoStream", err)
	}
}

func TestRateSpacesPublishes(t *testing.T) {
	s := startSelf(t, 1, 4)
	if err := s.StartWorkers(context.Background()); err != nil {
		t.Fatal(err)
	}
	// 10 requests at 200/s: the last is scheduled 45 ms after the first. Asserting a lower
	// bound only (a schedule cannot run early) keeps this free of timing flakiness.
	rep, err := Run(context.Background(), connect(t, s), Options{Requests: 10, Rate: 200, Producers: 4, Caller: "bench", Body: ticket(t)})
	if err != nil {
		t.Fatal(err)
	}
	checkAddsUp(t, rep)
	if rep.Succeeded != 10 || rep.PublishMS < 45 {
		t.Fatalf("succeeded %d, publishing took %gms; want 10 and ≥ 45ms at 200/s", rep.Succeeded, rep.PublishMS)
	}
}

func TestDurationBoundsPublishing(t *testing.T) {
	s := startSelf(t, 1, 4)
	if err := s.StartWorkers(context.Background()); err != nil {
		t.Fatal(err)
	}
	rep, err := Run(context.Background(), connect(t, s), Options{Duration: 50 * time.Millisecond, Rate: 100, Producers: 2, Caller: "bench", Body: ticket(t)})
	if err != nil {
		t.Fatal(err)
	}
	checkAddsUp(t, rep)
	// At 100/s the schedule has exactly requests 0..4 due inside 50 ms.
	if rep.Sent != 5 || rep.Failed != 0 {
		t.Fatalf("sent %d failed %d in 50ms at 100/s", rep.Sent, rep.Failed)
	}
}

func TestOptionsCheck(t *testing.T) {
	body := []byte(`{}`)
	for _, tc := range []struct {
		name string
		o    Options
		want string
	}{
		{"no size", Options{Producers: 1, Caller: "c", Body: body}, "set a number of requests or a duration"},
		{"negative", Options{Requests: -1, Producers: 1, Caller: "c", Body: body}, "requests must not be negative"},
		{"producers", Options{Requests: 1, Caller: "c", Body: body}, "producers must be at least 1"},
		{"rate", Options{Requests: 1, Rate: -1, Producers: 1, Caller: "c", Body: body}, "rate must not be negative"},
		{"caller", Options{Requests: 1, Producers: 1, Body: body}, "caller is required"},
		{"callers", Options{Requests: 1, Producers: 1, Callers: -2, Caller: "c", Body: body}, "callers must not be negative"},
		{"body", Options{Requests: 1, Producers: 1, Caller: "c"}, "request body is empty"},
		{"preload by duration", Options{Duration: time.Second, Producers: 1, Caller: "c", Body: body, BeforeDrain: func(context.Context, int64) error { return nil }}, "preload needs a number of requests"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Run(context.Background(), nil, tc.o)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestStartSelfRejectsBadSizes(t *testing.T) {
	for _, o := range []SelfOptions{{Replicas: -1, Concurrency: 1}, {Replicas: 65, Concurrency: 1}, {Replicas: 1, Concurrency: 0}, {Replicas: 1, Concurrency: 1, ProviderLatency: -1},
		{Replicas: 1, Concurrency: 1, ProviderSlots: -1}, {Replicas: 1, Concurrency: 1, ProviderPerQuestion: time.Millisecond},
		{Replicas: 1, Concurrency: 1, ProviderSlots: 1, ProviderPerStateKiB: -1}} {
		if s, err := StartSelf(context.Background(), o); err == nil {
			_ = s.Close()
			t.Errorf("StartSelf(%+v) accepted", o)
		}
	}
}

func TestScrapePeak(t *testing.T) {
	page := func(v string) string {
		return "# HELP sys1_worker_provider_in_flight_peak Most provider calls ever running at once.\n" +
			"# TYPE sys1_worker_provider_in_flight_peak gauge\n" +
			"sys1_worker_provider_in_flight_peak_other 99\n" +
			`sys1_worker_provider_in_flight_peak{worker="w"} ` + v + "\n" +
			`sys1_worker_provider_in_flight{worker="w"} 3` + "\n"
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/a", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, page("12")) })
	mux.HandleFunc("/b", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, page("4")) })
	mux.HandleFunc("/none", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "up 1\n") })
	mux.HandleFunc("/bad", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, page("lots")) })
	// The text format allows a timestamp after the value, and label values with spaces.
	mux.HandleFunc("/stamped", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, `sys1_worker_provider_in_flight_peak{worker="host a"} 7 1700000000000`+"\n")
	})
	mux.HandleFunc("/empty", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, `sys1_worker_provider_in_flight_peak{worker="w"}`+"\n")
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	ctx := context.Background()

	p, err := ScrapePeak(ctx, []string{srv.URL + "/a", srv.URL + "/b"})
	if err != nil {
		t.Fatal(err)
	}
	if p.Calls != 16 || len(p.PerReplica) != 2 || p.PerReplica[0] != 12 || p.PerReplica[1] != 4 {
		t.Fatalf("peak %+v, want 16 = 12 + 4", p)
	}
	if p, err := ScrapePeak(ctx, []string{srv.URL + "/stamped"}); err != nil || p.Calls != 7 {
		t.Fatalf("timestamped sample: peak %+v, %v; want 7", p, err)
	}
	for _, tc := range []struct{ path, want string }{
		{"/empty", "bad sys1_worker_provider_in_flight_peak line"},
		{"/none", "no sys1_worker_provider_in_flight_peak metric"},
		{"/bad", `bad sys1_worker_provider_in_flight_peak value "lots"`},
		{"/missing", "HTTP 404"},
	} {
		if _, err := ScrapePeak(ctx, []string{srv.URL + tc.path}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want %q", tc.path, err, tc.want)
		}
	}
}

// The real worker's /metrics is what ScrapePeak reads.
func TestScrapePeakFromAWorker(t *testing.T) {
	s := startSelf(t, 1, 2)
	if err := s.StartWorkers(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := Run(context.Background(), connect(t, s), Options{Requests: 4, Producers: 2, Caller: "bench", Body: ticket(t)}); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.workers[0].w.Handler())
	t.Cleanup(srv.Close)
	p, err := ScrapePeak(context.Background(), []string{srv.URL + "/metrics"})
	if err != nil {
		t.Fatal(err)
	}
	if want := s.workers[0].w.Stats().ProviderPeak; p.Calls != want || want < 1 {
		t.Fatalf("scraped peak %d, worker's Stats says %d", p.Calls, want)
	}
}

// With no replicas, Self is the server and the fake only; a worker elsewhere (here one
// built like `sys1 worker` from the two URLs) drains a backlog the generator preloaded.
func TestSelfWithoutReplicasServesAnOutsideWorker(t *testing.T) {
	s := startSelf(t, 0, 1)
	const n = 12
	rep, err := Run(context.Background(), connect(t, s), Options{
		Requests: n, Producers: 3, Caller: "bench", Body: ticket(t),
		BeforeDrain: func(ctx context.Context, _ int64) error {
			startOutsideWorker(t, s.URL(), s.ProviderURL(), 3)
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	checkAddsUp(t, rep)
	if rep.Succeeded != n {
		t.Fatalf("succeeded %d of %d: %v", rep.Succeeded, n, rep.FailedBy)
	}
	if p := s.Peak(); p.Calls < 1 || p.Calls > 3 || len(p.PerReplica) != 0 {
		t.Fatalf("peak %+v: want 1..3 from the fake and no in-process replicas", p)
	}
}

func startOutsideWorker(t *testing.T, natsURL, ollamaURL string, concurrency int) {
	t.Helper()
	nc, err := nats.Connect(natsURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	prov, err := ollama.New(ollama.Config{BaseURL: ollamaURL, TimeoutMS: "30000", MaxConns: concurrency}, ollama.Deps{Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(prov.Close)
	ctx, cancel := context.WithCancel(context.Background())
	authn, err := auth.New(ctx, auth.DefaultConfig(), zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	w, err := worker.New(ctx, worker.Config{Concurrency: concurrency, ConcurrencyMode: "fixed", MaxDeliver: 3, ShutdownGrace: 5 * time.Second, FetchBatch: concurrency, RetryBase: time.Second, RetryMax: time.Minute, ID: "outside"},
		worker.Options{NC: nc, JS: js, Topology: topology.Default(), Provider: prov, ModelPolicy: contract.Policy{DefaultModel: "nimble"}, Auth: authn, Logger: zerolog.Nop(), FetchWait: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = w.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

// A request JetStream will not take is a publish error with its reason, never a sent run.
func TestPublishErrorsAreCountedWithTheirReason(t *testing.T) {
	s := startSelf(t, 1, 1)
	huge := []byte(`{"state":"` + strings.Repeat("x", 9<<20) + `","questions":{}}`)
	rep, err := Run(context.Background(), connect(t, s), Options{Requests: 3, Producers: 1, Caller: "bench", Body: huge})
	if err != nil {
		t.Fatal(err)
	}
	checkAddsUp(t, rep)
	if rep.Sent != 0 || rep.PublishErrors != 3 || !strings.Contains(rep.FirstPublishError, "maximum payload") {
		t.Fatalf("sent %d, publish errors %d (%q): want 0 sent, 3 errors about the payload size", rep.Sent, rep.PublishErrors, rep.FirstPublishError)
	}
	var text strings.Builder
	_ = rep.WriteText(&text)
	if !strings.Contains(text.String(), "3 publishes failed") {
		t.Errorf("text report hides the publish errors:\n%s", text.String())
	}
}
