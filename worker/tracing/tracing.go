// Package tracing carries W3C trace context (traceparent, tracestate) over NATS headers, for
// producers (worker/client, sys1 decide), the worker and the sink. It uses the OpenTelemetry
// API only: it records nothing by itself, and costs next to nothing while tracing is off. The
// SDK and its OTLP exporter are set up by package worker/tracing/otlp.
package tracing

import (
	"context"
	"crypto/rand"
	"strings"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Header names of W3C Trace Context.
const (
	HeaderTraceParent = "traceparent"
	HeaderTraceState  = "tracestate"
)

// propagator is W3C Trace Context alone: sys1 promises traceparent, nothing else, whatever a
// process's global propagator is.
var propagator = propagation.TraceContext{}

// Carrier adapts NATS headers to the propagation API. NATS header names are case-sensitive;
// Carrier writes the lower-case names W3C specifies and reads any case (a producer going
// through an HTTP library may send Traceparent).
type Carrier nats.Header

// Get returns the first value of key, matched exactly, else case-insensitively.
func (c Carrier) Get(key string) string {
	if v := c[key]; len(v) > 0 {
		return v[0]
	}
	for k, v := range c {
		if len(v) > 0 && strings.EqualFold(k, key) {
			return v[0]
		}
	}
	return ""
}

// Set replaces key (and any differently cased copy of it).
func (c Carrier) Set(key, value string) {
	for k := range c {
		if k != key && strings.EqualFold(k, key) {
			delete(c, k)
		}
	}
	c[key] = []string{value}
}

// Keys lists the header names.
func (c Carrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// Extract returns ctx with the remote span context that hdr's traceparent names. A missing or
// malformed traceparent leaves ctx as it is: the run starts a trace of its own, and nothing
// about the header is an error.
func Extract(ctx context.Context, hdr nats.Header) context.Context {
	if hdr == nil {
		return ctx
	}
	return propagator.Extract(ctx, Carrier(hdr))
}

// SpanContextOf is the span context hdr's traceparent names; invalid when there is none or it
// is malformed.
func SpanContextOf(hdr nats.Header) trace.SpanContext {
	return trace.SpanContextFromContext(Extract(context.Background(), hdr))
}

// Inject writes ctx's span context into hdr as traceparent (and tracestate); nothing when ctx
// carries none.
func Inject(ctx context.Context, hdr nats.Header) {
	propagator.Inject(ctx, Carrier(hdr))
}

// InjectOrStart writes ctx's span context into hdr, or, when ctx carries none, a fresh one of
// a new trace, sampled, so a producer without tracing of its own still hands the worker a
// trace id it knows. It returns what it wrote.
func InjectOrStart(ctx context.Context, hdr nats.Header) trace.SpanContext {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		sc = NewSpanContext()
		ctx = trace.ContextWithSpanContext(ctx, sc)
	}
	Inject(ctx, hdr)
	return sc
}

// NewSpanContext is a random, sampled span context of a new trace.
func NewSpanContext() trace.SpanContext {
	var tid trace.TraceID
	var sid trace.SpanID
	for !tid.IsValid() {
		_, _ = rand.Read(tid[:])
	}
	for !sid.IsValid() {
		_, _ = rand.Read(sid[:])
	}
	return trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, Remote: true})
}
