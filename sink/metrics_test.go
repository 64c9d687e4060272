package sink

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/sys1hq/sys1/contract/wire"
	"github.com/sys1hq/sys1/worker/metrics"
	"github.com/sys1hq/sys1/worker/metricstest"
	"github.com/sys1hq/sys1/worker/tracing"
)

// TestSinkMetricsAndInsertSpan: a sink draining records that carry traceparent (as workers
// publish them) serves valid, documented metrics that count them, and its insert span links
// to every run's trace, whose id is also the ClickHouse row's trace_id.
func TestSinkMetricsAndInsertSpan(t *testing.T) {
	e := newEnv(t, nil)
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	reg := metrics.NewRegistry()

	const n = 5
	want := map[trace.TraceID]bool{}
	ctx := context.Background()
	for i := range n {
		sc := tracing.NewSpanContext()
		want[sc.TraceID()] = true
		rec := makeRecord(i)
		rec.TraceID = sc.TraceID().String()
		b, _ := json.Marshal(&rec)
		m := &nats.Msg{Subject: wire.RunsPrefix + string(rec.Status), Data: b, Header: nats.Header{}}
		tracing.Inject(trace.ContextWithSpanContext(ctx, sc), m.Header)
		if _, err := e.js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	s := e.startSink(t, e.cfg, func(s *Sink) {
		if err := s.Instrument(reg, tp); err != nil {
			t.Fatal(err)
		}
	})
	waitFor(t, time.Minute, "the runs inserted", func() bool { return s.Stats().Inserted == n && e.consumerDrained(t) })

	// The rows carry the traces' ids.
	for id := range want {
		if got := e.count(t, "SELECT count() FROM %s.runs FINAL WHERE trace_id = ?", id.String()); got != 1 {
			t.Errorf("rows with trace_id %s: %d", id, got)
		}
	}
	// One insert span linked to all five traces.
	var linked map[trace.TraceID]bool
	for _, sp := range exp.GetSpans() {
		if sp.Name != "insert runs" {
			continue
		}
		linked = map[trace.TraceID]bool{}
		for _, l := range sp.Links {
			linked[l.SpanContext.TraceID()] = true
		}
	}
	if len(linked) != n {
		t.Errorf("insert span links %d traces, want %d: %v", len(linked), n, linked)
	}
	for id := range want {
		if !linked[id] {
			t.Errorf("the insert span does not link trace %s", id)
		}
	}

	srv := httptest.NewServer(metrics.Handler(reg, zerolog.Nop()))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	text := string(body)
	if err := metricstest.Check(reg, text, filepath.Join("..", "deploy", "README.md"), "sys1_sink_", MetricFamilies()); err != nil {
		t.Fatalf("%v\n%s", err, text)
	}
	fams, _ := metricstest.Parse(text)
	for _, c := range []struct {
		name, lane string
		want       float64
	}{
		{"sys1_sink_inserted_total", "runs", n},
		{"sys1_sink_received_total", "runs", n},
		{"sys1_sink_batch_records_sum", "runs", n},
		{"sys1_sink_record_delay_seconds_count", "runs", n},
		{"sys1_sink_retrying", "runs", 0},
		{"sys1_sink_lane_running", "runs", 1},
		{"sys1_sink_inserted_total", "labels", 0},
	} {
		if got := sample(t, fams, c.name, c.lane); got != c.want {
			t.Errorf("%s{lane=%q} = %v, want %v", c.name, c.lane, got, c.want)
		}
	}
	if got := sample(t, fams, "sys1_sink_insert_duration_seconds_count", "runs"); got < 1 {
		t.Errorf("insert attempts observed: %v", got)
	}
}

func sample(t *testing.T, fams []metricstest.Family, name, lane string) float64 {
	t.Helper()
	var sum float64
	found := false
	for _, f := range fams {
		for _, s := range f.Samples {
			if s.Name == name && s.Labels["lane"] == lane {
				sum, found = sum+s.Value, true
			}
		}
	}
	if !found {
		t.Fatalf("no sample %s{lane=%q}", name, lane)
	}
	return sum
}
