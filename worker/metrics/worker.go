package metrics

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// WorkerOptions are the worker's live readings, taken at each scrape, and its label choices.
type WorkerOptions struct {
	// Replica is the replica id (SYS1_WORKER_ID), the worker label of every family.
	Replica string
	// CallerLabel adds the verified caller as a label of sys1_worker_runs_total
	// (SYS1_METRICS_CALLER_LABEL). Off by default: in auth mode jwt every token subject would
	// be a new series.
	CallerLabel bool

	InFlight     func() float64 // messages in hand
	ProviderPeak func() float64 // most provider calls ever running at once
	Redeliveries func() float64 // deliveries nak'ed for a transient error
	Replays      func() float64 // finished runs answered again from their stored outcome
	DeadLetters  func() float64 // dead-lettered requests answered
	Paused       func() float64 // 1 while the interactive consumer is paused
	// Providers is the chain's links now: their limiter and health.
	Providers func() []ProviderState
	// Fits is the calibration fits the replica holds now (see FitReading).
	Fits func() []FitReading
}

// ProviderState is one link of the provider chain as a scrape sees it.
type ProviderState struct {
	Name     string
	Limit    int  // the limiter's current limit (fixed, or an adaptive limiter's estimate)
	InFlight int  // tokens held now: calls running
	Up       bool // last probe healthy and circuit not open
}

// Worker is a replica's metric families.
type Worker struct {
	families      []Family
	callerLabel   bool
	runs          *prometheus.CounterVec
	endToEnd      *prometheus.HistogramVec
	queueWait     *prometheus.HistogramVec
	attempts      *prometheus.CounterVec
	providerCalls *prometheus.CounterVec
	providerTime  *prometheus.HistogramVec
	stages        *prometheus.HistogramVec
}

// NewWorker registers a replica's families on reg, each labelled worker=<Replica>. Every
// reading function must be set.
func NewWorker(reg prometheus.Registerer, o WorkerOptions) (*Worker, error) {
	if o.InFlight == nil || o.ProviderPeak == nil || o.Redeliveries == nil || o.Replays == nil ||
		o.DeadLetters == nil || o.Paused == nil || o.Providers == nil || o.Fits == nil {
		return nil, errors.New("metrics: every WorkerOptions reading is required")
	}
	c := &catalogue{reg: prometheus.WrapRegistererWith(prometheus.Labels{"worker": o.Replica}, reg)}
	w := &Worker{callerLabel: o.CallerLabel}
	runLabels := []string{"status", "error_code", "provider", "model"}
	if o.CallerLabel {
		runLabels = append(runLabels, "caller")
	}
	w.runs = c.counterVec("sys1_worker_runs_total",
		"Runs answered by this replica (replays excluded), by status, error code ('' on success), provider and model.", runLabels...)
	w.endToEnd = c.histogramVec("sys1_worker_run_duration_seconds",
		"A run's time from its request's publish to its answer (queue wait, retries and the call included), by status.", QueueBuckets, "status")
	w.queueWait = c.histogramVec("sys1_worker_queue_wait_seconds",
		"Time a request waited in SYS1_REQUESTS before its first delivery, by consumer (sys1-worker, or dead-letter for requests answered from their advisory).", QueueBuckets, "consumer")
	w.attempts = c.counterVec("sys1_worker_attempts_total",
		"Provider attempts made by this replica, by provider and outcome (ok, timeout, error, malformed, busy, unavailable, skipped).", "provider", "outcome")
	w.providerCalls = c.counterVec("sys1_worker_provider_calls_total",
		"Provider calls made (attempts that reached the provider), by provider.", "provider")
	w.providerTime = c.histogramVec("sys1_worker_provider_latency_seconds",
		"Provider call latency (an attempt's latency_ms), by provider.", ProviderBuckets, "provider")
	w.stages = c.histogramVec("sys1_worker_stage_duration_seconds",
		"Time a delivery spent in each stage of the run (admit, gate, prepare, call, publish, ...).", StageBuckets, "stage")

	c.gaugeFunc("sys1_worker_in_flight", "Messages being processed by this replica.", o.InFlight)
	c.gaugeFunc("sys1_worker_provider_in_flight_peak", "Most provider calls ever running at once in this replica.", o.ProviderPeak)
	c.counterFunc("sys1_worker_redeliveries_total", "Deliveries nak'ed for a transient error (redelivered later).", o.Redeliveries)
	c.counterFunc("sys1_worker_replays_total", "Finished runs answered again from their stored outcome.", o.Replays)
	c.counterFunc("sys1_worker_dead_letters_total", "Requests that ran out of deliveries (SYS1_CONSUMER_MAX_DELIVER) and were answered from their advisory.", o.DeadLetters)
	c.gaugeFunc("sys1_worker_paused", "1 while the fleet's interactive consumer is paused (sys1 pause), else 0.", o.Paused)

	limitDesc := prometheus.NewDesc("sys1_worker_provider_concurrency_limit",
		"The provider's concurrency limit in this replica now (SYS1_CONCURRENCY, or the adaptive limiter's estimate).", []string{"provider"}, nil)
	inFlightDesc := prometheus.NewDesc("sys1_worker_provider_in_flight",
		"Provider calls running now in this replica (limiter tokens held), by provider.", []string{"provider"}, nil)
	upDesc := prometheus.NewDesc("sys1_worker_provider_up",
		"1 when the provider's last probe was healthy and its circuit is not open, else 0.", []string{"provider"}, nil)
	c.families = append(c.families,
		Family{Name: "sys1_worker_provider_concurrency_limit", Type: "gauge", Labels: []string{"provider"}},
		Family{Name: "sys1_worker_provider_in_flight", Type: "gauge", Labels: []string{"provider"}},
		Family{Name: "sys1_worker_provider_up", Type: "gauge", Labels: []string{"provider"}})
	c.register(&funcCollector{
		descs: []*prometheus.Desc{limitDesc, inFlightDesc, upDesc},
		collect: func(ch chan<- prometheus.Metric) {
			for _, p := range o.Providers() {
				up := 0.0
				if p.Up {
					up = 1
				}
				ch <- prometheus.MustNewConstMetric(limitDesc, prometheus.GaugeValue, float64(p.Limit), p.Name)
				ch <- prometheus.MustNewConstMetric(inFlightDesc, prometheus.GaugeValue, float64(p.InFlight), p.Name)
				ch <- prometheus.MustNewConstMetric(upDesc, prometheus.GaugeValue, up, p.Name)
			}
		},
	})
	c.registerFits(o.Fits)
	if c.err != nil {
		return nil, c.err
	}
	w.families = c.families
	return w, nil
}

// Families lists the worker's families.
func (w *Worker) Families() []Family { return append([]Family(nil), w.families...) }

// RunFinished counts a run answered now (not a replay) and observes its end-to-end time.
// caller is used only with CallerLabel.
func (w *Worker) RunFinished(status, errorCode, provider, model, caller string, endToEnd time.Duration) {
	if w.callerLabel {
		w.runs.WithLabelValues(status, errorCode, provider, model, caller).Inc()
	} else {
		w.runs.WithLabelValues(status, errorCode, provider, model).Inc()
	}
	if endToEnd >= 0 {
		w.endToEnd.WithLabelValues(status).Observe(endToEnd.Seconds())
	}
}

// QueueWait observes a request's wait before its first delivery.
func (w *Worker) QueueWait(consumer string, d time.Duration) {
	w.queueWait.WithLabelValues(consumer).Observe(max(d, 0).Seconds())
}

// Attempt counts one attempt of this delivery; a call (not a skip) also counts as a provider
// call and its latency is observed.
func (w *Worker) Attempt(provider, outcome string, called bool, latency time.Duration) {
	w.attempts.WithLabelValues(provider, outcome).Inc()
	if called {
		w.providerCalls.WithLabelValues(provider).Inc()
		w.providerTime.WithLabelValues(provider).Observe(max(latency, 0).Seconds())
	}
}

// Stage observes one stage of one delivery.
func (w *Worker) Stage(name string, d time.Duration) {
	w.stages.WithLabelValues(name).Observe(max(d, 0).Seconds())
}

// WorkerFamilies lists the families a replica defines (with the caller label off), without a
// replica: for documentation and dashboard checks.
func WorkerFamilies() []Family {
	zero := func() float64 { return 0 }
	w, err := NewWorker(prometheus.NewRegistry(), WorkerOptions{
		Replica: "catalogue", InFlight: zero, ProviderPeak: zero, Redeliveries: zero, Replays: zero, DeadLetters: zero, Paused: zero,
		Providers: func() []ProviderState { return nil }, Fits: func() []FitReading { return nil },
	})
	if err != nil {
		panic(err) // a fresh registry cannot refuse them
	}
	return w.Families()
}
