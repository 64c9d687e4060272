package worker_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/sys1hq/sys1/cmd/sys1/loadtest"
	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/provider"
	"github.com/sys1hq/sys1/provider/ollama"
	"github.com/sys1hq/sys1/provider/ollamatest"
	"github.com/sys1hq/sys1/provider/simulator"
	"github.com/sys1hq/sys1/worker"
	"github.com/sys1hq/sys1/worker/auth"
	"github.com/sys1hq/sys1/worker/client"
	"github.com/sys1hq/sys1/worker/metrics"
	"github.com/sys1hq/sys1/worker/natsconn"
	"github.com/sys1hq/sys1/worker/topology"
)

// BenchmarkPipeline measures decisions end to end through a real in-process nats-server: a
// producer publishes b.N requests (ticket.json, 3 questions) and awaits every reply while one
// worker replica runs them against a zero-latency provider. Each decision is the request
// publish, the gate's create and outcome update, the record publish, the reply and the ack,
// so this is the worker's own ceiling on this machine (figure 2 of deploy/performance.md).
//
//	go test -run '^$' -bench Pipeline -benchtime 5000x ./worker/
func BenchmarkPipeline(b *testing.B) {
	for _, bc := range []struct {
		name     string
		provider func(b *testing.B) provider.Provider
	}{
		// In-memory answers: NATS, the gate, encoding and the pipeline only.
		{"simulator", func(*testing.B) provider.Provider { return simulator.New(0) }},
		// The real Ollama adapter over loopback HTTP to the fake: adds the HTTP round trip.
		{"ollama-fake", func(b *testing.B) provider.Provider {
			fake := ollamatest.New(b, ollamatest.WithRecordLimit(0))
			p, err := ollama.New(ollama.Config{BaseURL: fake.URL(), TimeoutMS: "30000", MaxConns: 64}, ollama.Deps{Log: zerolog.Nop()})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(p.Close)
			return p
		}},
	} {
		for _, concurrency := range []int{16, 64} {
			b.Run(fmt.Sprintf("%s/concurrency=%d", bc.name, concurrency), func(b *testing.B) {
				benchPipeline(b, bc.provider(b), concurrency)
			})
		}
	}
}

func benchPipeline(b *testing.B, prov provider.Provider, concurrency int) {
	benchPipelineWith(b, prov, concurrency, nil)
}

// BenchmarkObservability is the cost of metrics and tracing: the pipeline of BenchmarkPipeline
// (the Ollama adapter over loopback to the fake, so the provider's HTTP span and its
// traceparent are in) with tracing off — the worker's metrics are always on, into a registry
// nobody scrapes — and on: every run sampled, its spans batched to an exporter that discards
// them (what the SDK does before the network), and the process registry with the Go and
// process collectors. Sub-benchmarks alternate with -count, so the two are measured side by
// side on the same machine:
//
//	go test -run '^$' -bench Observability -benchtime 3000x -count 5 ./worker/
func BenchmarkObservability(b *testing.B) {
	for _, bc := range []struct {
		name string
		mod  func(b *testing.B, o *worker.Options)
	}{
		{"off", nil},
		{"on", func(b *testing.B, o *worker.Options) {
			tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()), sdktrace.WithSampler(sdktrace.AlwaysSample()))
			b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
			o.TracerProvider, o.Metrics = tp, metrics.NewRegistry()
		}},
	} {
		b.Run("tracing="+bc.name, func(b *testing.B) {
			fake := ollamatest.New(b, ollamatest.WithRecordLimit(0))
			p, err := ollama.New(ollama.Config{BaseURL: fake.URL(), TimeoutMS: "30000", MaxConns: 64}, ollama.Deps{Log: zerolog.Nop()})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(p.Close)
			var mod func(*worker.Options)
			if bc.mod != nil {
				mod = func(o *worker.Options) { bc.mod(b, o) }
			}
			benchPipelineWith(b, p, 16, mod)
		})
	}
}

func benchPipelineWith(b *testing.B, prov provider.Provider, concurrency int, mod func(*worker.Options)) {
	srv, err := natsconn.StartEmbedded(natsconn.EmbeddedOptions{Port: -1, StoreDir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	connect := func(name string) *nats.Conn {
		nc, err := nats.Connect(srv.ClientURL(), nats.Name(name))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(nc.Close)
		return nc
	}
	wnc := connect("bench-worker")
	js, err := jetstream.New(wnc)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	authn, err := auth.New(ctx, auth.DefaultConfig(), zerolog.Nop())
	if err != nil {
		b.Fatal(err)
	}
	opts := worker.Options{
		NC: wnc, JS: js, Topology: topology.Default(), Provider: prov, ModelPolicy: contract.Policy{DefaultModel: "nimble"},
		Auth: authn, Logger: zerolog.Nop(), Version: "bench", FetchWait: 250 * time.Millisecond,
	}
	if mod != nil {
		mod(&opts)
	}
	w, err := worker.New(ctx, worker.Config{
		Concurrency: concurrency, ConcurrencyMode: "fixed", MaxDeliver: 5, ShutdownGrace: 10 * time.Second, FetchBatch: 16,
		RetryBase: time.Second, RetryMax: time.Minute, ID: "bench-" + strconv.Itoa(concurrency),
	}, opts)
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	b.Cleanup(func() { cancel(); <-done })
	body, err := loadtest.Template("ticket")
	if err != nil {
		b.Fatal(err)
	}
	pnc := connect("bench-producer")

	b.ReportAllocs()
	b.ResetTimer()
	rep, err := loadtest.Run(context.Background(), pnc, loadtest.Options{
		Requests: b.N, Producers: 2 * concurrency, Caller: "bench", Body: body, ReplyTimeout: 30 * time.Second,
	})
	b.StopTimer()
	if err != nil {
		b.Fatal(err)
	}
	if rep.Succeeded != b.N {
		b.Fatalf("%d of %d runs succeeded: %v", rep.Succeeded, b.N, rep.FailedBy)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
	// Process CPU per decision (server, worker, provider and producer together) is steadier
	// than decisions/s on a shared machine.
	b.ReportMetric(rep.CPUPerDecisionMS*1000, "cpu-µs/decision")
	b.ReportMetric(rep.Latency.P50MS, "p50-ms")
	b.ReportMetric(rep.Latency.P99MS, "p99-ms")
}

// The pipeline keeps up to 2×Concurrency messages in hand so that provider slots never wait
// on JetStream round trips, while the provider itself never sees more than Concurrency calls.
func TestProviderSlotsBoundCallsWhileMessagesLookAhead(t *testing.T) {
	h := newHarness(t, ollamatest.WithLatency(300*time.Millisecond), ollamatest.WithRecordLimit(0))
	r := h.start(func(o *replicaOpts) { o.cfg.Concurrency = 2; o.cfg.FetchBatch = 2 })
	const n = 8
	ctx := context.Background()
	for i := range n {
		if _, err := h.cl.Publish(ctx, client.Request{Caller: "svc-a", Body: []byte(ticket), RunID: fmt.Sprintf("look-%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	var maxInFlight int64
	waitFor(t, "four messages in hand (two calling, two waiting for a slot)", 30*time.Second, func() bool {
		maxInFlight = max(maxInFlight, r.w.Stats().InFlight)
		return maxInFlight == 4
	})
	waitFor(t, "every run to finish", 60*time.Second, func() bool {
		maxInFlight = max(maxInFlight, r.w.Stats().InFlight)
		return r.w.Stats().Succeeded == n
	})
	if maxInFlight > 4 {
		t.Errorf("%d messages in hand, want at most 2×concurrency = 4", maxInFlight)
	}
	if got := h.fake.MaxConcurrent(); got != 2 {
		t.Errorf("provider saw %d concurrent calls, want exactly the concurrency, 2", got)
	}
	if s := r.w.Stats(); s.ProviderPeak != 2 || s.ProviderCalls != n {
		t.Errorf("worker stats %+v: want peak 2 and %d calls", s, n)
	}
}

// A run pulled ahead of a free provider slot still honours Sys1-Deadline: if the deadline
// passes while it waits, the provider is never called for it.
func TestDeadlinePassingWhileWaitingForAProviderSlot(t *testing.T) {
	h := newHarness(t, ollamatest.WithLatency(time.Second), ollamatest.WithRecordLimit(0))
	r := h.start(func(o *replicaOpts) { o.cfg.Concurrency = 1; o.cfg.FetchBatch = 1 })
	if _, err := h.cl.Publish(context.Background(), client.Request{Caller: "svc-a", Body: []byte(ticket), RunID: "slot-holder"}); err != nil {
		t.Fatal(err)
	}
	h.awaitInFlight(1)
	rep := h.decide("svc-a", []byte(ticket), func(req *client.Request) {
		req.RunID = "slot-waiter"
		req.Deadline = time.Now().Add(300 * time.Millisecond)
	})
	if rep.Status != contract.StatusFailed || rep.Error == nil || rep.Error.Code != contract.CodeExpired ||
		!strings.Contains(rep.Error.Message, "before the provider was called") || len(rep.Attempts) != 0 {
		t.Fatalf("reply %s: want SYS1_EXPIRED before any provider call", rep.Raw)
	}
	waitFor(t, "the first run to finish", 30*time.Second, func() bool { return r.w.Stats().Succeeded == 1 })
	if calls := h.fake.Calls(); calls != 1 {
		t.Fatalf("provider called %d times, want once (only the run that held the slot)", calls)
	}
}
