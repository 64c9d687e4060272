package otlp

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// The resource names the process (service name, version, replica), and the standard
// variables override the defaults.
func TestResourceFromConfigAndEnvironment(t *testing.T) {
	t.Setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment.name=staging")
	for _, tc := range []struct{ env, want string }{{"", "sys1-worker"}, {"billing-deciders", "billing-deciders"}} {
		t.Setenv("OTEL_SERVICE_NAME", tc.env)
		exp := tracetest.NewInMemoryExporter()
		tr, err := New(context.Background(), Config{ServiceName: "sys1-worker", Version: "1.2.3", Instance: "w-1", Exporter: exp, Sync: true})
		if err != nil {
			t.Fatal(err)
		}
		_, span := tr.TracerProvider().Tracer("t").Start(context.Background(), "x")
		span.End()
		spans := exp.GetSpans() // before Shutdown, which empties the in-memory exporter
		if err := tr.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
		if len(spans) != 1 {
			t.Fatalf("%d spans", len(spans))
		}
		got := map[string]string{}
		for _, kv := range spans[0].Resource.Attributes() {
			got[string(kv.Key)] = kv.Value.String()
		}
		if got["service.name"] != tc.want || got["service.version"] != "1.2.3" || got["service.instance.id"] != "w-1" || got["deployment.environment.name"] != "staging" {
			t.Errorf("OTEL_SERVICE_NAME=%q: resource %v", tc.env, got)
		}
	}
}

// An unreachable collector fails every export: the log gets one line per interval, saying
// how many it left out.
func TestSDKErrorsAreRateLimited(t *testing.T) {
	var buf bytes.Buffer
	h := newLimitedHandler(zerolog.New(&buf), time.Hour)
	for range 50 {
		h.Handle(errors.New("traces export: connection refused"))
	}
	if n := strings.Count(buf.String(), "\n"); n != 1 {
		t.Fatalf("%d lines for 50 errors within the interval:\n%s", n, buf.String())
	}
	h.last = time.Now().Add(-2 * time.Hour) // the interval has passed
	h.Handle(errors.New("again"))
	if !strings.Contains(buf.String(), `"not_logged_since_last":49`) {
		t.Errorf("the second line does not count the 49 left out:\n%s", buf.String())
	}
}
