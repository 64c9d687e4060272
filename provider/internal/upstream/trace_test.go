package upstream

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// An exchange under a traced context is a client span of that trace, and the request carries
// that span's traceparent; without a trace nothing is added. A 5xx marks the span an error.
func TestExchangeTracesAndPropagates(t *testing.T) {
	var got []string
	status := http.StatusOK
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r.Header.Get("Traceparent"))
		w.WriteHeader(status)
		_, _ = w.Write([]byte(`{}`))
	}))
	defer srv.Close()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	hc := NewHTTPClient(nil, 1)

	call := func(ctx context.Context) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/systemone?x=1", nil)
		if _, _, err := Exchange(hc, req, 1<<20); err != nil {
			t.Fatal(err)
		}
	}
	call(context.Background())
	ctx, parent := tp.Tracer("test").Start(context.Background(), "call")
	call(ctx)
	status = http.StatusServiceUnavailable
	call(ctx)
	parent.End()

	if got[0] != "" {
		t.Errorf("an untraced call sent traceparent %q", got[0])
	}
	spans := exp.GetSpans()
	var client []tracetest.SpanStub
	for _, s := range spans {
		if s.SpanKind == trace.SpanKindClient {
			client = append(client, s)
		}
	}
	if len(client) != 2 {
		t.Fatalf("%d client spans, want 2", len(client))
	}
	for i, s := range client {
		want := "00-" + s.SpanContext.TraceID().String() + "-" + s.SpanContext.SpanID().String() + "-01"
		if s.Name != "POST /v1/systemone" || s.Parent.SpanID() != parent.SpanContext().SpanID() || got[i+1] != want {
			t.Errorf("span %q parent %v sent %q, want %q", s.Name, s.Parent.SpanID(), got[i+1], want)
		}
		for _, a := range s.Attributes {
			if a.Key == "url.full" && a.Value.AsString() != srv.URL+"/v1/systemone" {
				t.Errorf("url.full %q keeps the query", a.Value.AsString())
			}
		}
	}
	if client[0].Status.Code == codes.Error || client[1].Status.Code != codes.Error {
		t.Errorf("statuses %v, %v: want unset then error", client[0].Status, client[1].Status)
	}
}
