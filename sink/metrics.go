package sink

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/sys1hq/sys1/worker/metrics"
	"github.com/sys1hq/sys1/worker/tracing"
)

// TracerName is the instrumentation scope of the sink's spans.
const TracerName = "github.com/sys1hq/sys1/sink"

// observers are the sink's histograms and tracer. They exist from New on, so a sink that is
// never instrumented (tests) observes into families nobody gathers.
type observers struct {
	tracer        trace.Tracer
	insertSeconds *prometheus.HistogramVec // lane, result
	batchRecords  *prometheus.HistogramVec // lane
	recordDelay   *prometheus.HistogramVec // lane
	families      []metrics.Family
}

// batchBuckets cover a trickle (one record per BatchAge) to a full default batch and more.
var batchBuckets = []float64{1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000}

func newObservers() *observers {
	o := &observers{tracer: noop.NewTracerProvider().Tracer(TracerName)}
	hist := func(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
		o.families = append(o.families, metrics.Family{Name: name, Type: "histogram", Help: help, Labels: labels})
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, labels)
	}
	o.insertSeconds = hist("sys1_sink_insert_duration_seconds",
		"One insert attempt of one batch into ClickHouse (its dead letters and rows), by lane and result (ok, error).", metrics.StageBuckets, "lane", "result")
	o.batchRecords = hist("sys1_sink_batch_records",
		"Messages per inserted batch, by lane.", batchBuckets, "lane")
	o.recordDelay = hist("sys1_sink_record_delay_seconds",
		"Time from a message's store in its stream (SYS1_RUNS, SYS1_LABELS) to its insert into ClickHouse, by lane: how far ClickHouse is behind.", metrics.QueueBuckets, "lane")
	return o
}

// statsDescs are the families read from Stats at each scrape.
var statsDescs = struct {
	lag, received, inserted, dead, batches, insertFailures, ackFailures, retrying, running, lastInsert, rejected *prometheus.Desc
}{
	lag:            prometheus.NewDesc("sys1_sink_lag_records", "Messages of the lane's stream not yet acknowledged by the sink (pending + ack pending), as of the last lag reading.", []string{"lane"}, nil),
	received:       prometheus.NewDesc("sys1_sink_received_total", "Messages taken from the lane's stream, redeliveries included.", []string{"lane"}, nil),
	inserted:       prometheus.NewDesc("sys1_sink_inserted_total", "Rows inserted into the lane's table (runs, labels).", []string{"lane"}, nil),
	dead:           prometheus.NewDesc("sys1_sink_dead_lettered_total", "Messages parked in the dead-letter table.", []string{"lane"}, nil),
	batches:        prometheus.NewDesc("sys1_sink_batches_total", "Batches inserted and acknowledged.", []string{"lane"}, nil),
	insertFailures: prometheus.NewDesc("sys1_sink_insert_failures_total", "Failed insert attempts (each is retried).", []string{"lane"}, nil),
	ackFailures:    prometheus.NewDesc("sys1_sink_ack_failures_total", "Batches whose acks failed (they are redelivered and deduplicated).", []string{"lane"}, nil),
	retrying:       prometheus.NewDesc("sys1_sink_retrying", "1 while the lane's inserts into ClickHouse are failing.", []string{"lane"}, nil),
	running:        prometheus.NewDesc("sys1_sink_lane_running", "1 once the lane's stream and consumer are set up (the label lane retries in the background until they are).", []string{"lane"}, nil),
	lastInsert:     prometheus.NewDesc("sys1_sink_last_insert_timestamp_seconds", "Unix time of the lane's last successful insert; 0 before the first.", []string{"lane"}, nil),
	rejected:       prometheus.NewDesc("sys1_sink_labels_rejected_total", "Labels the workers refused (sys1.labels.*.rejected), parked in the dead-letter table with their reason.", nil, nil),
}

type statsCollector struct{ s *Sink }

func (c statsCollector) Describe(ch chan<- *prometheus.Desc) {
	d := statsDescs
	for _, x := range []*prometheus.Desc{d.lag, d.received, d.inserted, d.dead, d.batches, d.insertFailures, d.ackFailures, d.retrying, d.running, d.lastInsert, d.rejected} {
		ch <- x
	}
}

func (c statsCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.s.Stats()
	d := statsDescs
	lane := func(name string, lag, received, inserted, dead, batches, insertFailures, ackFailures uint64, retrying, running bool, last time.Time) {
		counter := func(desc *prometheus.Desc, v uint64) {
			ch <- prometheus.MustNewConstMetric(desc, prometheus.CounterValue, float64(v), name)
		}
		gauge := func(desc *prometheus.Desc, v float64) {
			ch <- prometheus.MustNewConstMetric(desc, prometheus.GaugeValue, v, name)
		}
		gauge(d.lag, float64(lag))
		counter(d.received, received)
		counter(d.inserted, inserted)
		counter(d.dead, dead)
		counter(d.batches, batches)
		counter(d.insertFailures, insertFailures)
		counter(d.ackFailures, ackFailures)
		gauge(d.retrying, bool01(retrying))
		gauge(d.running, bool01(running))
		lastUnix := 0.0
		if !last.IsZero() {
			lastUnix = float64(last.UnixNano()) / 1e9
		}
		gauge(d.lastInsert, lastUnix)
	}
	lane(c.s.runs.name, st.Pending+st.AckPending, st.Received, st.Inserted, st.DeadLettered, st.Batches, st.InsertFailures, st.AckFailures,
		st.Retrying, c.s.runs.running.Load(), st.LastInsert)
	l := st.Labels
	lane(c.s.labels.name, l.Pending+l.AckPending, l.Received, l.Inserted, l.DeadLettered, l.Batches, l.InsertFailures, l.AckFailures,
		l.Retrying, l.Running, l.LastInsert)
	ch <- prometheus.MustNewConstMetric(d.rejected, prometheus.CounterValue, float64(l.Rejected))
}

func bool01(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// Instrument registers the sink's families on reg (the process registry: a worker running
// the sink in-process serves both on one /metrics) and starts its insert spans with tp (nil:
// no tracing). Call it before Run.
func (s *Sink) Instrument(reg prometheus.Registerer, tp trace.TracerProvider) error {
	if tp != nil {
		s.obs.tracer = tp.Tracer(TracerName)
	}
	if reg == nil {
		return nil
	}
	for _, c := range []prometheus.Collector{statsCollector{s}, s.obs.insertSeconds, s.obs.batchRecords, s.obs.recordDelay} {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("sink metrics: %w", err)
		}
	}
	return nil
}

// MetricFamilies lists every family a sink defines, whether or not it has samples yet.
func MetricFamilies() []metrics.Family {
	d := []metrics.Family{
		{Name: "sys1_sink_lag_records", Type: "gauge", Labels: []string{"lane"}},
		{Name: "sys1_sink_received_total", Type: "counter", Labels: []string{"lane"}},
		{Name: "sys1_sink_inserted_total", Type: "counter", Labels: []string{"lane"}},
		{Name: "sys1_sink_dead_lettered_total", Type: "counter", Labels: []string{"lane"}},
		{Name: "sys1_sink_batches_total", Type: "counter", Labels: []string{"lane"}},
		{Name: "sys1_sink_insert_failures_total", Type: "counter", Labels: []string{"lane"}},
		{Name: "sys1_sink_ack_failures_total", Type: "counter", Labels: []string{"lane"}},
		{Name: "sys1_sink_retrying", Type: "gauge", Labels: []string{"lane"}},
		{Name: "sys1_sink_lane_running", Type: "gauge", Labels: []string{"lane"}},
		{Name: "sys1_sink_last_insert_timestamp_seconds", Type: "gauge", Labels: []string{"lane"}},
		{Name: "sys1_sink_labels_rejected_total", Type: "counter"},
	}
	return append(d, newObservers().families...)
}

// startInsert starts the span of one batch's insert, linked to the trace of every run (or
// label) it carries: one insert batches many traces, so they are links, not parents. Links
// beyond OTEL_SPAN_LINK_COUNT_LIMIT (128) are dropped by the SDK.
func (s *Sink) startInsert(ctx context.Context, l *lane, msgs []jetstream.Msg) (context.Context, trace.Span) {
	ctx, span := s.obs.tracer.Start(ctx, "insert "+l.name, trace.WithSpanKind(trace.SpanKindClient))
	if span.IsRecording() {
		span.SetAttributes(attribute.String("sys1.lane", l.name), attribute.Int("sys1.records", len(msgs)),
			attribute.String("db.system.name", "clickhouse"), attribute.String("db.namespace", s.cfg.Database))
		for _, m := range msgs {
			if sc := tracing.SpanContextOf(m.Headers()); sc.IsValid() {
				span.AddLink(trace.Link{SpanContext: sc})
			}
		}
	}
	return ctx, span
}

// timedInsert is one insert attempt, timed, and noted on the batch's span when it fails (with
// ClickHouse's error code only: its message can quote row values).
func (s *Sink) timedInsert(ctx context.Context, l *lane, p *prepared) error {
	start := time.Now()
	err := s.insertOnce(ctx, l, p)
	result := "ok"
	if err != nil {
		result = "error"
		if span := trace.SpanFromContext(ctx); span.IsRecording() {
			attrs := []attribute.KeyValue{}
			var ex *clickhouse.Exception
			if errors.As(err, &ex) {
				attrs = append(attrs, attribute.Int("clickhouse.error_code", int(ex.Code)))
			}
			span.AddEvent("insert failed; retrying", trace.WithAttributes(attrs...))
		}
	}
	s.obs.insertSeconds.WithLabelValues(l.name, result).Observe(time.Since(start).Seconds())
	return err
}

// observeInserted records a batch that was inserted: its size, each message's delay, and the
// span's outcome.
func (s *Sink) observeInserted(ctx context.Context, l *lane, msgs []jetstream.Msg, p *prepared) {
	s.obs.batchRecords.WithLabelValues(l.name).Observe(float64(len(msgs)))
	delay := s.obs.recordDelay.WithLabelValues(l.name)
	now := time.Now()
	for _, m := range msgs {
		if meta, err := m.Metadata(); err == nil && !meta.Timestamp.IsZero() {
			delay.Observe(max(now.Sub(meta.Timestamp), 0).Seconds())
		}
	}
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.SetAttributes(attribute.Int("sys1.rows", len(p.rows)-len(p.rejected)), attribute.Int("sys1.dead_letters", len(p.dead)+len(p.rejected)))
		span.SetStatus(codes.Ok, "")
	}
}
