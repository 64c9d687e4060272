package worker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/worker/metrics"
	"github.com/sys1hq/sys1/worker/topology"
	"github.com/sys1hq/sys1/worker/tracing"
)

// How a run is observed. The run pipeline calls four hooks, and only these: begin and finish
// around a delivery (handle), stage around each stage (execute, and publish from end), and
// observeFinished when a run is answered (logFinished). Everything else — spans, their
// attributes, the metric families — lives here, so stages stay free of instrumentation.
//
// One delivery is one trace span, "run", a child of the request's traceparent when it carries
// a valid one (a missing or malformed one starts a new trace, silently), with one child span
// per stage; the provider adapters add the HTTP call under the call stage's span and pass
// traceparent upstream. With tracing off the spans are no-ops, but a request's traceparent
// still names the run's trace id in its record.

// TracerName is the instrumentation scope of the worker's spans.
const TracerName = "github.com/sys1hq/sys1/worker"

// observation is one delivery's part of the observing.
type observation struct {
	span    trace.Span
	traceID string // the run's W3C trace id, for its record; "" without one
	// queued is set once the queue wait was considered (first delivery only).
	queued bool
	// answered, status and errorCode are set when the run is answered (observeFinished).
	answered          bool
	status, errorCode string
}

// instrument sets up the replica's metric families and tracer (New calls it).
func (w *Worker) instrument() error {
	w.registry = w.opt.Metrics
	if w.registry == nil {
		w.registry = prometheus.NewRegistry()
	}
	tp := w.opt.TracerProvider
	if tp == nil {
		tp = noop.NewTracerProvider()
	}
	w.tracer = tp.Tracer(TracerName, trace.WithInstrumentationVersion(w.opt.Version))
	m, err := metrics.NewWorker(metrics.WorkerOptions{
		Replica:      w.cfg.ID,
		CallerLabel:  w.opt.MetricsCallerLabel,
		InFlight:     func() float64 { return float64(w.stats.inFlight.Load()) },
		ProviderPeak: func() float64 { return float64(w.stats.providerPeak.Load()) },
		Redeliveries: func() float64 { return float64(w.stats.retried.Load()) },
		Replays:      func() float64 { return float64(w.stats.replayed.Load()) },
		DeadLetters:  func() float64 { return float64(w.stats.deadLetters.Load()) },
		Orphans:      func() float64 { return float64(w.stats.orphans.Load()) },
		Paused:       func() float64 { return float64(w.pausedGauge()) },
		QuotaAtLimit: w.QuotaAtLimit,
		Queues:       w.queueReadings,
		Streams: func() []metrics.StreamState {
			us := w.Streams()
			out := make([]metrics.StreamState, 0, len(us))
			for _, u := range us {
				if u.Error == "" {
					out = append(out, metrics.StreamState{Name: u.Name, Bytes: float64(u.Bytes), MaxBytes: float64(u.MaxBytes), Full: u.Full})
				}
			}
			return out
		},
		Providers: func() []metrics.ProviderState {
			h := w.chain.Health()
			out := make([]metrics.ProviderState, len(h.Providers))
			for i, p := range h.Providers {
				rc := p.Routes.Counts
				out[i] = metrics.ProviderState{Name: p.Name, Limit: p.Limit, InFlight: p.InFlight, Up: p.OK,
					Routes: metrics.RouteCounts{Closed: rc.Closed, Open: rc.Open, HalfOpen: rc.HalfOpen, Absent: rc.Absent}}
			}
			return out
		},
		Fits: w.fitReadings,
	}, w.registry)
	if err != nil {
		return fmt.Errorf("worker metrics: %w", err)
	}
	w.metrics = m
	return nil
}

// fitReadings is the calibration fits held now, for the metrics: what each applies and
// guarantees, and its latest evaluation.
func (w *Worker) fitReadings() []metrics.FitReading {
	fits := w.fits.Load()
	if fits == nil {
		return nil
	}
	list := fits.List()
	out := make([]metrics.FitReading, len(list))
	for i, f := range list {
		r := metrics.FitReading{Model: f.Model, Caller: f.Caller, Question: f.Question,
			Temperature: f.Temperature, TemperatureApplied: f.AppliesTemperature(), FitECE: f.Before.ECE}
		if f.AppliesTemperature() {
			r.FitECE = f.After.ECE
		}
		if k := f.Risk; k != nil {
			r.HasRisk, r.TargetError, r.AbstainAll, r.Threshold, r.FitCoverage = true, k.TargetError, k.AbstainAll, k.Threshold, k.Coverage
		}
		if ev := f.Evaluation; ev != nil {
			r.Evaluated, r.Audits, r.RecentLabels, r.RecentECE = ev.At, ev.Audits, ev.RecentLabels, ev.RecentECE
			r.Coverage, r.AbstentionRate = ev.Coverage, ev.AbstentionRate
			if d := ev.DecidedError; d != nil {
				r.DecidedError, r.Lower, r.Upper = &d.Estimate, &d.Lower, &d.Upper
			}
		}
		out[i] = r
	}
	return out
}

// Gatherer is the registry the replica's metric families are on (what /metrics serves).
func (w *Worker) Gatherer() prometheus.Gatherer { return w.registry }

// MetricFamilies lists every family the replica defines, whether or not it has samples yet.
func (w *Worker) MetricFamilies() []metrics.Family { return w.metrics.Families() }

// begin starts the delivery's span, under the request's traceparent when it has a valid one.
func (r *run) begin(ctx context.Context) context.Context {
	ctx = tracing.Extract(ctx, r.msg.Headers())
	ctx, span := r.p.tracer.Start(ctx, "run", trace.WithSpanKind(trace.SpanKindConsumer), trace.WithTimestamp(r.start))
	r.obs.span = span
	if sc := span.SpanContext(); sc.IsValid() {
		r.obs.traceID = sc.TraceID().String()
	}
	if span.IsRecording() {
		span.SetAttributes(semconv.MessagingSystemKey.String("nats"), semconv.MessagingOperationTypeProcess,
			semconv.MessagingDestinationName(r.msg.Subject()))
	}
	return ctx
}

// stage runs one stage under its own span and times it. It also counts the attempts the stage
// made in this delivery and, once the delivery's metadata is known, the queue wait.
func (r *run) stage(ctx context.Context, name string, fn func(*run, context.Context) error) error {
	start := time.Now()
	before := len(r.attempts)
	sctx, span := r.p.tracer.Start(ctx, name)
	defer func() {
		if p := recover(); p != nil {
			// handle recovers it (SYS1_INTERNAL); the span still ends, marked.
			span.SetStatus(codes.Error, "panic")
			span.End()
			panic(p)
		}
	}()
	err := fn(r, sctx)
	r.p.metrics.Stage(name, time.Since(start))
	if r.meta != nil {
		delivery := int(r.meta.NumDelivered)
		for _, a := range r.attempts[min(before, len(r.attempts)):] {
			if a.Delivery == delivery { // not the stored attempts of earlier deliveries
				r.p.metrics.Attempt(a.Provider, string(a.Outcome), a.Outcome != contract.OutcomeSkipped, time.Duration(a.LatencyMS)*time.Millisecond)
			}
		}
		if !r.obs.queued {
			r.obs.queued = true
			if r.meta.NumDelivered == 1 && !r.meta.Timestamp.IsZero() {
				r.p.metrics.QueueWait(topology.SharedName(r.meta.Consumer), r.start.Sub(r.meta.Timestamp))
			}
		}
	}
	if span.IsRecording() {
		markSpan(span, err)
	}
	span.End()
	return err
}

// publishStage is publish as a stage (end calls it).
func (r *run) publishStage(ctx context.Context, runErr error) error {
	return r.stage(ctx, "publish", func(r *run, ctx context.Context) error { return r.publish(ctx, runErr) })
}

// markSpan records how a stage ended: the code of a contract error (never its message, which
// may quote upstream text), a wait for another message, or an infrastructure error.
func markSpan(span trace.Span, err error) {
	var w *waitError
	switch cerr, isContract := contract.AsError(err); {
	case err == nil:
	case isContract:
		span.SetAttributes(attribute.String("sys1.error_code", string(cerr.Code)))
		span.SetStatus(codes.Error, string(cerr.Code))
	case errors.As(err, &w):
		span.SetAttributes(attribute.Bool("sys1.waits_for_owner", true), attribute.Int64("sys1.owner_seq", int64(w.ownerSeq)))
	case errors.Is(err, ErrShutdown):
		span.SetAttributes(attribute.Bool("sys1.shutdown", true))
	default:
		// NATS or KV trouble: our own words and the client library's, no request content.
		span.SetStatus(codes.Error, err.Error())
	}
}

// observeFinished counts a run answered now (not a replay): by status, error code, the
// provider that answered or was called last (empty when none was), the model, and with
// MetricsCallerLabel the verified caller.
func (r *run) observeFinished(reply *contract.Reply) {
	code := ""
	if reply.Error != nil {
		code = string(reply.Error.Code)
	}
	model := ""
	if reply.Result != nil && reply.Result.Model != "" {
		model = reply.Result.Model
	} else if r.resolved != nil {
		model = r.resolved.Model // the policy's, never a model a refused caller named
	}
	var e2e time.Duration = -1
	if p := r.publishedAt(); !p.IsZero() {
		e2e = time.Since(p)
	}
	r.p.metrics.RunFinished(string(reply.Status), code, r.calledProvider(), model, r.identity.Caller, e2e)
	r.obs.answered, r.obs.status, r.obs.errorCode = true, string(reply.Status), code
}

// calledProvider is the provider that answered, else the last one called, else ”.
func (r *run) calledProvider() string {
	if r.answeredBy != "" {
		return r.answeredBy
	}
	for i := len(r.attempts) - 1; i >= 0; i-- {
		if a := r.attempts[i]; a.Outcome != contract.OutcomeSkipped && a.Provider != "" {
			return a.Provider
		}
	}
	return ""
}

// finish ends the delivery's span with what became of the run.
func (r *run) finish() {
	span := r.obs.span
	if span == nil {
		return
	}
	if span.IsRecording() {
		attrs := []attribute.KeyValue{attribute.String("sys1.run_id", r.runID), attribute.Bool("sys1.answered", r.obs.answered)}
		if r.recordID != "" && r.recordID != r.runID {
			attrs = append(attrs, attribute.String("sys1.record_id", r.recordID))
		}
		if r.meta != nil {
			attrs = append(attrs, attribute.Int64("sys1.delivery", int64(r.meta.NumDelivered)), attribute.Int64("sys1.stream_seq", int64(r.meta.Sequence.Stream)))
		}
		if r.identity.Caller != "" {
			attrs = append(attrs, attribute.String("sys1.caller", r.identity.Caller))
		}
		if r.finished != nil {
			attrs = append(attrs, attribute.Bool("sys1.replay", true))
		}
		if r.obs.answered {
			attrs = append(attrs, attribute.String("sys1.status", r.obs.status))
			if p := r.calledProvider(); p != "" {
				attrs = append(attrs, attribute.String("sys1.provider", p))
			}
		}
		if r.resolved != nil {
			attrs = append(attrs, attribute.String("sys1.model", r.resolved.Model))
		}
		span.SetAttributes(attrs...)
		if r.obs.errorCode != "" {
			span.SetAttributes(attribute.String("sys1.error_code", r.obs.errorCode))
			span.SetStatus(codes.Error, r.obs.errorCode)
		}
	}
	span.End()
}
