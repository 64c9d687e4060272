package worker_test

import (
	"context"
	"encoding/json"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/contract/wire"
	"github.com/sys1hq/sys1/worker/client"
	"github.com/sys1hq/sys1/worker/tracing/otlp"
)

// recordingTracer is an SDK tracer provider exporting into memory as spans end.
func recordingTracer(t *testing.T) (*sdktrace.TracerProvider, *tracetest.InMemoryExporter) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp, exp
}

// spansOf waits until the run spans of trace id have ended and returns every span of it.
func spansOf(t *testing.T, exp *tracetest.InMemoryExporter, id trace.TraceID, runs int) []tracetest.SpanStub {
	t.Helper()
	var out []tracetest.SpanStub
	waitFor(t, "the run spans to end", 10*time.Second, func() bool {
		out = out[:0]
		n := 0
		for _, s := range exp.GetSpans() {
			if s.SpanContext.TraceID() == id {
				out = append(out, s)
				if s.Name == "run" {
					n++
				}
			}
		}
		return n >= runs
	})
	return out
}

func byName(spans []tracetest.SpanStub, name string) []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, s := range spans {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

func attr(s tracetest.SpanStub, key string) string {
	for _, a := range s.Attributes {
		if string(a.Key) == key {
			return a.Value.String()
		}
	}
	return ""
}

// TestOneRunIsOneConnectedTrace: the producer's traceparent → the run span → a span per stage
// → the provider's HTTP span, whose request carried a traceparent of that very span upstream;
// and the record's trace_id is the trace.
func TestOneRunIsOneConnectedTrace(t *testing.T) {
	h := newHarness(t)
	tp, exp := recordingTracer(t)
	h.start(func(o *replicaOpts) { o.tracer = tp })

	ctx, producer := tp.Tracer("producer").Start(context.Background(), "produce")
	rep, err := h.cl.Decide(ctx, client.Request{Caller: "svc-a", Body: []byte(ticket), RunID: "traced-1"})
	producer.End()
	if err != nil || rep.Status != contract.StatusSuccess {
		t.Fatalf("decide: %v %s", err, rep.Raw)
	}
	id := producer.SpanContext().TraceID()
	if rep.TraceID != id.String() {
		t.Errorf("reply trace id %s, want the producer's %s", rep.TraceID, id)
	}
	spans := spansOf(t, exp, id, 1)
	runs := byName(spans, "run")
	if len(runs) != 1 {
		t.Fatalf("%d run spans, want 1", len(runs))
	}
	run := runs[0]
	if run.Parent.SpanID() != producer.SpanContext().SpanID() || run.SpanKind != trace.SpanKindConsumer {
		t.Errorf("run span parent %s kind %v, want the producer's span %s, consumer", run.Parent.SpanID(), run.SpanKind, producer.SpanContext().SpanID())
	}
	if attr(run, "sys1.run_id") != "traced-1" || attr(run, "sys1.status") != "success" || attr(run, "sys1.provider") != "ollama" || attr(run, "sys1.model") != "nimble" {
		t.Errorf("run span attributes %v", run.Attributes)
	}
	var call tracetest.SpanStub
	for _, name := range []string{"admit", "gate", "prepare", "call", "publish"} {
		got := byName(spans, name)
		if len(got) != 1 || got[0].Parent.SpanID() != run.SpanContext.SpanID() {
			t.Fatalf("stage %s: %d spans (want 1, a child of the run span)", name, len(got))
		}
		if name == "call" {
			call = got[0]
		}
	}
	httpSpans := byName(spans, "POST /v1/systemone")
	if len(httpSpans) != 1 || httpSpans[0].Parent.SpanID() != call.SpanContext.SpanID() || httpSpans[0].SpanKind != trace.SpanKindClient {
		t.Fatalf("provider span: %+v, want one client span under the call stage", httpSpans)
	}
	if attr(httpSpans[0], "http.response.status_code") != "200" {
		t.Errorf("provider span attributes %v", httpSpans[0].Attributes)
	}
	// Upstream saw a traceparent naming the provider span of this trace.
	want := "00-" + id.String() + "-" + httpSpans[0].SpanContext.SpanID().String() + "-01"
	var sent []string
	for _, r := range h.fake.Requests() {
		if r.Path == "/v1/systemone" {
			sent = append(sent, r.Header.Get("Traceparent"))
		}
	}
	if len(sent) != 1 || sent[0] != want {
		t.Errorf("upstream traceparent %q, want %q", sent, want)
	}
	if rec := h.recordByRun("traced-1"); rec.TraceID != id.String() {
		t.Errorf("record trace_id %q, want %s", rec.TraceID, id)
	}
	// Nothing of the request's content is on any span.
	for _, s := range spans {
		for _, a := range s.Attributes {
			if strings.Contains(a.Value.String(), "Checkout broken") {
				t.Errorf("span %s carries request content in %s", s.Name, a.Key)
			}
		}
	}
}

// publishWithHeaders publishes ticket with hdr (plus a run id and a reply inbox) and returns
// the reply.
func (h *harness) publishWithHeaders(runID string, hdr nats.Header) *client.Reply {
	h.t.Helper()
	inbox := nats.NewInbox()
	sub, err := h.nc.SubscribeSync(inbox)
	if err != nil {
		h.t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	m := &nats.Msg{Subject: "sys1.decide.svc-a", Data: []byte(ticket), Header: hdr}
	m.Header.Set(wire.HeaderRunID, runID)
	m.Header.Set(wire.HeaderReplyTo, inbox)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := h.js.PublishMsg(ctx, m); err != nil {
		h.t.Fatal(err)
	}
	msg, err := sub.NextMsgWithContext(ctx)
	if err != nil {
		h.t.Fatalf("no reply to %s: %v", runID, err)
	}
	rep, err := client.ParseReply(msg)
	if err != nil {
		h.t.Fatal(err)
	}
	return rep
}

// A malformed traceparent is ignored: the run succeeds, starts a trace of its own (a root
// span), and its record names that trace.
func TestMalformedTraceparentStartsANewTrace(t *testing.T) {
	h := newHarness(t)
	tp, exp := recordingTracer(t)
	h.start(func(o *replicaOpts) { o.tracer = tp })
	for i, bad := range []string{
		"garbage",
		"00-00000000000000000000000000000000-0000000000000000-01", // all-zero ids are invalid
		"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", // version ff is forbidden
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",    // no flags
		"00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01", // upper case
		strings.Repeat("0", 10000),
	} {
		runID := "bad-tp-" + string(rune('a'+i))
		hdr := nats.Header{}
		hdr.Set("traceparent", bad)
		if rep := h.publishWithHeaders(runID, hdr); rep.Status != contract.StatusSuccess {
			t.Fatalf("traceparent %.40q: reply %s", bad, rep.Raw)
		}
		rec := h.recordByRun(runID)
		id, err := trace.TraceIDFromHex(rec.TraceID)
		if err != nil || strings.Contains(strings.ToLower(bad), rec.TraceID) {
			t.Fatalf("traceparent %.40q: record trace_id %q, want a new valid trace", bad, rec.TraceID)
		}
		run := byName(spansOf(t, exp, id, 1), "run")[0]
		if run.Parent.IsValid() {
			t.Errorf("traceparent %.40q: the run span has parent %v, want a root", bad, run.Parent)
		}
	}
}

// Without tracing, a request's traceparent still names the record's trace (the producer's);
// without one, trace_id is empty. A producer using HTTP-style header case is understood.
func TestTraceIDWithoutTracing(t *testing.T) {
	h := newHarness(t)
	h.start()
	rep := h.decide("svc-a", []byte(ticket), func(r *client.Request) { r.RunID = "untraced-1" })
	if rec := h.recordByRun("untraced-1"); rec.TraceID == "" || rec.TraceID != rep.TraceID {
		t.Errorf("record trace_id %q, want the client's %q", rec.TraceID, rep.TraceID)
	}
	hdr := nats.Header{}
	hdr["Traceparent"] = []string{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
	h.publishWithHeaders("untraced-2", hdr)
	if rec := h.recordByRun("untraced-2"); rec.TraceID != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Errorf("record trace_id %q, want the header's", rec.TraceID)
	}
	h.publishWithHeaders("untraced-3", nats.Header{})
	if rec := h.recordByRun("untraced-3"); rec.TraceID != "" {
		t.Errorf("record trace_id %q without tracing or traceparent, want empty", rec.TraceID)
	}
	raw := h.rawRecords()
	var last map[string]any
	_ = json.Unmarshal(raw[len(raw)-1], &last)
	if v, ok := last["trace_id"]; !ok || v != "" {
		t.Errorf("record JSON trace_id %v %v, want present and empty", v, ok)
	}
}

// blackhole accepts connections and reads them, never answering: a collector that hangs.
type blackhole struct {
	ln    net.Listener
	bytes atomic.Int64
}

func newBlackhole(t *testing.T) *blackhole {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &blackhole{ln: ln}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				buf := make([]byte, 4096)
				for {
					n, err := c.Read(buf)
					b.bytes.Add(int64(n))
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() { _ = ln.Close() })
	return b
}

// TestUnreachableCollectorNeverDelaysRuns: with the real OTLP exporter pointed at a collector
// that accepts and never answers, and a span queue far smaller than the spans produced, every
// run still answers at once; the exporter's timeout (30 s here) is never felt by a run, and
// shutdown is bounded by its deadline.
func TestUnreachableCollectorNeverDelaysRuns(t *testing.T) {
	hole := newBlackhole(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+hole.ln.Addr().String())
	t.Setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "30000")
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "10")
	t.Setenv("OTEL_BSP_MAX_QUEUE_SIZE", "4")
	t.Setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "2")
	tr, err := otlp.New(context.Background(), otlp.Config{ServiceName: "sys1-worker-test"})
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t)
	otlp.LogErrors(h.logger()) // the export failures go to the test's log, not stderr
	h.start(func(o *replicaOpts) { o.tracer = tr.TracerProvider() })
	if rep := h.decide("svc-a", []byte(ticket)); rep.Status != contract.StatusSuccess {
		t.Fatalf("reply %s", rep.Raw)
	}
	waitFor(t, "an export to reach the collector that never answers", 10*time.Second, func() bool { return hole.bytes.Load() > 0 })
	// The exporter is now stuck for up to 30 s; 20 runs (7 spans each) overflow its queue.
	var slowest time.Duration
	for range 20 {
		start := time.Now()
		if rep := h.decide("svc-a", []byte(ticket)); rep.Status != contract.StatusSuccess {
			t.Fatalf("reply %s", rep.Raw)
		}
		slowest = max(slowest, time.Since(start))
	}
	if slowest > 10*time.Second {
		t.Errorf("a run took %s while the collector hung: runs waited on the exporter", slowest)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	_ = tr.Shutdown(ctx)
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("shutdown took %s with a 500ms deadline", took)
	}
}
