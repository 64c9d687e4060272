package upstream

import (
	"net/http"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
)

// TracerName is the instrumentation scope of the provider adapters' HTTP spans.
const TracerName = "github.com/sys1hq/sys1/provider"

// traceExchange starts the client span of one HTTP exchange under the span of req's context,
// with that span's own tracer provider (the worker's: providers take no tracing
// configuration), and writes its traceparent into req's headers so the model server, or a
// gateway in front of it, can join the trace. Without a trace in the context (probes, tracing
// off and no caller traceparent) it does nothing. The span's attributes are the method, the
// host and the URL without query (a provider's base URL never has credentials, see
// ParseBaseURL) and the response status: never a header or a body.
func traceExchange(req *http.Request) (*http.Request, func(*http.Response, error)) {
	parent := trace.SpanFromContext(req.Context())
	if !parent.SpanContext().IsValid() {
		return req, func(*http.Response, error) {}
	}
	tracer := parent.TracerProvider().Tracer(TracerName)
	ctx, span := tracer.Start(req.Context(), req.Method+" "+req.URL.Path, trace.WithSpanKind(trace.SpanKindClient))
	if span.IsRecording() {
		attrs := []attribute.KeyValue{
			semconv.HTTPRequestMethodKey.String(req.Method),
			semconv.ServerAddress(req.URL.Hostname()),
			semconv.URLFull(DisplayURL(req.URL)),
		}
		if p, err := strconv.Atoi(req.URL.Port()); err == nil {
			attrs = append(attrs, semconv.ServerPort(p))
		}
		span.SetAttributes(attrs...)
	}
	propagation.TraceContext{}.Inject(ctx, propagation.HeaderCarrier(req.Header))
	return req.WithContext(ctx), func(resp *http.Response, err error) {
		switch {
		case err != nil && resp == nil:
			reason, _ := TransportFailure(err)
			span.SetAttributes(semconv.ErrorTypeKey.String("transport"))
			span.SetStatus(codes.Error, reason)
		case resp != nil:
			span.SetAttributes(semconv.HTTPResponseStatusCode(resp.StatusCode))
			if err != nil {
				span.SetStatus(codes.Error, "the answer could not be read")
			} else if resp.StatusCode >= 400 {
				span.SetAttributes(semconv.ErrorTypeKey.String(strconv.Itoa(resp.StatusCode)))
				span.SetStatus(codes.Error, "HTTP "+strconv.Itoa(resp.StatusCode))
			}
		}
		span.End()
	}
}
