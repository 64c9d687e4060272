package tracing

import (
	"context"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/trace"
)

const parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

func TestCarrierReadsAnyCaseAndWritesW3CNames(t *testing.T) {
	for _, key := range []string{"traceparent", "Traceparent", "TRACEPARENT"} {
		sc := SpanContextOf(nats.Header{key: []string{parent}})
		if sc.TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" || !sc.IsRemote() || !sc.IsSampled() {
			t.Errorf("header %s: span context %v", key, sc)
		}
	}
	hdr := nats.Header{"Traceparent": []string{"stale"}}
	Inject(trace.ContextWithSpanContext(context.Background(), SpanContextOf(nats.Header{"traceparent": []string{parent}})), hdr)
	if len(hdr) != 1 || hdr.Get("traceparent") != parent {
		t.Errorf("headers after Inject: %v", hdr)
	}
}

func TestInjectOrStart(t *testing.T) {
	// No trace in ctx: a new, sampled one, different every time.
	a, b := nats.Header{}, nats.Header{}
	sa, sb := InjectOrStart(context.Background(), a), InjectOrStart(context.Background(), b)
	if !sa.IsValid() || !sa.IsSampled() || sa.TraceID() == sb.TraceID() || SpanContextOf(a).TraceID() != sa.TraceID() {
		t.Errorf("new traces %v %v, headers %v %v", sa, sb, a, b)
	}
	// A trace in ctx is passed on as is.
	ctx := trace.ContextWithSpanContext(context.Background(), SpanContextOf(nats.Header{"traceparent": []string{parent}}))
	h := nats.Header{}
	if sc := InjectOrStart(ctx, h); sc.TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" || h.Get("traceparent") != parent {
		t.Errorf("got %v, header %q", sc, h.Get("traceparent"))
	}
	// Inject without a trace writes nothing.
	empty := nats.Header{}
	Inject(context.Background(), empty)
	if len(empty) != 0 {
		t.Errorf("Inject without a trace wrote %v", empty)
	}
}

// FuzzExtract: no traceparent value, however malformed, panics or yields a half-valid span
// context; what is accepted is written back with the same ids.
func FuzzExtract(f *testing.F) {
	for _, s := range []string{parent, "", "garbage", "00-" + strings.Repeat("0", 32) + "-" + strings.Repeat("0", 16) + "-01",
		"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra"} {
		f.Add(s, "")
	}
	f.Add(parent, "vendor=value,other=x")
	f.Fuzz(func(t *testing.T, tp, ts string) {
		hdr := nats.Header{"traceparent": []string{tp}, "tracestate": []string{ts}}
		ctx := Extract(context.Background(), hdr)
		sc := trace.SpanContextFromContext(ctx)
		if !sc.IsValid() {
			if sc.TraceID().IsValid() && sc.SpanID().IsValid() {
				t.Fatalf("invalid span context with valid ids from %q", tp)
			}
			return
		}
		out := nats.Header{}
		Inject(ctx, out)
		back := SpanContextOf(out)
		if back.TraceID() != sc.TraceID() || back.SpanID() != sc.SpanID() || back.TraceFlags() != sc.TraceFlags() {
			t.Fatalf("%q → %v → %q → %v", tp, sc, out.Get("traceparent"), back)
		}
	})
}
