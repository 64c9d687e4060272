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
	Orphans      func() float64 // requests found below their consumer's floor and answered
	Paused       func() float64 // 1 while interactive requests are paused (sys1 pause)
	// Providers is the chain's links now: their limiter and health.
	Providers func() []ProviderState
	// Fits is the calibration fits the replica holds now (see FitReading).
	Fits func() []FitReading
	// Streams is every stream's and bucket's usage as the replica last read it (its fleet
	// watcher, every few SYS1_STATUS_INTERVALs; never on a run's path).
	Streams func() []StreamState
	// QuotaAtLimit is, per quota kind, the callers at their quota now (JetStream refuses
	// their next publish), as the fleet watcher last counted them.
	QuotaAtLimit func() map[string]int
	// Queues is each lane's queue as the fleet watcher last read it (QueueState).
	Queues func() []QueueState
}

// QueueState is one lane of SYS1_REQUESTS (interactive, batch) as a scrape sees it: summed
// over the lane's consumers (its flows', with fair share).
type QueueState struct {
	Lane       string
	Pending    float64 // messages not yet delivered
	AckPending float64 // delivered and not yet acknowledged (being run, or waiting to come back)
	Callers    float64 // callers with messages waiting or in hand (fair share only)
}

// StreamState is one stream (or a KV bucket's stream, KV_<bucket>) as a scrape sees it.
type StreamState struct {
	Name            string
	Bytes, MaxBytes float64
	Full            bool // refusing new messages now
}

// Quota kinds of sys1_worker_quota_refusals_total.
const (
	QuotaRequests = "requests" // requests refused at admission: the caller holds too many waiting
	QuotaReview   = "review"   // review items not queued: the caller's review quota is reached
	QuotaLabels   = "labels"   // label submissions refused: the caller's label quota is reached
)

// ProviderState is one link of the provider chain as a scrape sees it.
type ProviderState struct {
	Name     string
	Limit    int  // the limiter's current limit (fixed, or an adaptive limiter's estimate)
	InFlight int  // tokens held now: calls running
	Up       bool // last probe healthy and circuit not open
	// Routes counts the provider's routes (a model as sent to it, each with its own circuit)
	// by state: RouteStates, each always present.
	Routes RouteCounts
}

// RouteCounts are a provider's routes by state.
type RouteCounts struct {
	Closed, Open, HalfOpen, Absent int
}

// RouteStates are the values of sys1_worker_provider_routes' state label.
var RouteStates = []string{"closed", "open", "half_open", "absent"}

func (r RouteCounts) byState() [4]int { return [4]int{r.Closed, r.Open, r.HalfOpen, r.Absent} }

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
	quota         *prometheus.CounterVec
}

// NewWorker registers a replica's families (o says which and how to read them) on reg, each labelled worker=<Replica>. Every
// reading function must be set.
func NewWorker(o WorkerOptions, reg prometheus.Registerer) (*Worker, error) {
	if o.InFlight == nil || o.ProviderPeak == nil || o.Redeliveries == nil || o.Replays == nil ||
		o.DeadLetters == nil || o.Orphans == nil || o.Paused == nil || o.Providers == nil || o.Fits == nil || o.Streams == nil || o.QuotaAtLimit == nil || o.Queues == nil {
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

	w.quota = c.counterVec("sys1_worker_quota_refusals_total",
		"Refusals this replica made for a caller's quota, by kind: requests (refused at admission: the caller holds more than SYS1_REQUESTS_MAX_PER_CALLER waiting on its further subjects), review (review items not queued: the caller has SYS1_REVIEW_MAX_PER_CALLER), labels (always 0: label submissions over SYS1_LABELS_MAX_PER_CALLER are refused by JetStream at publish, before any worker sees them; see sys1_worker_quota_callers_at_limit). Refusals at publish are the producer's error; sys1_worker_quota_callers_at_limit counts the callers getting them.", "kind")
	for _, k := range []string{QuotaRequests, QuotaReview, QuotaLabels} {
		w.quota.WithLabelValues(k) // every kind is a series from the start, at 0
	}

	c.gaugeFunc("sys1_worker_in_flight", "Messages being processed by this replica.", o.InFlight)
	c.gaugeFunc("sys1_worker_provider_in_flight_peak", "Most provider calls ever running at once in this replica.", o.ProviderPeak)
	c.counterFunc("sys1_worker_redeliveries_total", "Deliveries nak'ed for a transient error (redelivered later).", o.Redeliveries)
	c.counterFunc("sys1_worker_replays_total", "Finished runs answered again from their stored outcome.", o.Replays)
	c.counterFunc("sys1_worker_dead_letters_total", "Requests that ran out of deliveries (SYS1_CONSUMER_MAX_DELIVER) and were answered from their advisory.", o.DeadLetters)
	c.counterFunc("sys1_worker_orphans_answered_total", "Requests found below their consumer's acknowledgement floor, never answered, and answered by the orphan sweep.", o.Orphans)
	c.gaugeFunc("sys1_worker_paused", "1 while the fleet's interactive requests are paused (sys1 pause), else 0.", o.Paused)

	limitDesc := prometheus.NewDesc("sys1_worker_provider_concurrency_limit",
		"The provider's concurrency limit in this replica now (SYS1_CONCURRENCY, or the adaptive limiter's estimate).", []string{"provider"}, nil)
	inFlightDesc := prometheus.NewDesc("sys1_worker_provider_in_flight",
		"Provider calls running now in this replica (limiter tokens held), by provider.", []string{"provider"}, nil)
	upDesc := prometheus.NewDesc("sys1_worker_provider_up",
		"1 when the provider's last probe was healthy and its circuit is not open, else 0.", []string{"provider"}, nil)
	// Routes are counted by state, never labelled by model: requests name arbitrary models,
	// and sys1.svc.health lists the routes that are not closed.
	routesDesc := prometheus.NewDesc("sys1_worker_provider_routes",
		"The provider's routes (a model as sent to it, each with its own circuit breaker) in this replica, by state: closed, open (the model's failures opened it), half_open (the next call is its trial), absent (the provider answered 404 for the model; asked again after the absence TTL).",
		[]string{"provider", "state"}, nil)
	c.families = append(c.families,
		Family{Name: "sys1_worker_provider_concurrency_limit", Type: "gauge", Labels: []string{"provider"}},
		Family{Name: "sys1_worker_provider_in_flight", Type: "gauge", Labels: []string{"provider"}},
		Family{Name: "sys1_worker_provider_up", Type: "gauge", Labels: []string{"provider"}},
		Family{Name: "sys1_worker_provider_routes", Type: "gauge", Labels: []string{"provider", "state"}})
	c.register(&funcCollector{
		descs: []*prometheus.Desc{limitDesc, inFlightDesc, upDesc, routesDesc},
		collect: func(ch chan<- prometheus.Metric) {
			for _, p := range o.Providers() {
				up := 0.0
				if p.Up {
					up = 1
				}
				ch <- prometheus.MustNewConstMetric(limitDesc, prometheus.GaugeValue, float64(p.Limit), p.Name)
				ch <- prometheus.MustNewConstMetric(inFlightDesc, prometheus.GaugeValue, float64(p.InFlight), p.Name)
				ch <- prometheus.MustNewConstMetric(upDesc, prometheus.GaugeValue, up, p.Name)
				for i, n := range p.Routes.byState() {
					ch <- prometheus.MustNewConstMetric(routesDesc, prometheus.GaugeValue, float64(n), p.Name, RouteStates[i])
				}
			}
		},
	})
	c.registerFits(o.Fits)
	bytesDesc := prometheus.NewDesc("sys1_worker_stream_bytes",
		"Bytes a stream (or a KV bucket's stream, KV_<bucket>) holds, as this replica's fleet watcher last read it.", []string{"stream"}, nil)
	maxBytesDesc := prometheus.NewDesc("sys1_worker_stream_max_bytes",
		"A stream's byte limit (SYS1_*_MAX_BYTES); at it, a stream of records, labels, requests or review items refuses new messages.", []string{"stream"}, nil)
	fullDesc := prometheus.NewDesc("sys1_worker_stream_full",
		"1 while a stream refuses new messages for want of room (its byte limit, or the NATS server's storage), else 0.", []string{"stream"}, nil)
	atLimitDesc := prometheus.NewDesc("sys1_worker_quota_callers_at_limit",
		"Callers at their quota now, by kind (requests: SYS1_REQUESTS_MAX_PER_CALLER waiting on sys1.decide.<caller>; review: SYS1_REVIEW_MAX_PER_CALLER items; labels: SYS1_LABELS_MAX_PER_CALLER submissions waiting). JetStream refuses their next publish.", []string{"kind"}, nil)
	c.families = append(c.families,
		Family{Name: "sys1_worker_quota_callers_at_limit", Type: "gauge", Labels: []string{"kind"}},
		Family{Name: "sys1_worker_stream_bytes", Type: "gauge", Labels: []string{"stream"}},
		Family{Name: "sys1_worker_stream_max_bytes", Type: "gauge", Labels: []string{"stream"}},
		Family{Name: "sys1_worker_stream_full", Type: "gauge", Labels: []string{"stream"}})
	c.register(&funcCollector{
		descs: []*prometheus.Desc{bytesDesc, maxBytesDesc, fullDesc, atLimitDesc},
		collect: func(ch chan<- prometheus.Metric) {
			for kind, n := range o.QuotaAtLimit() {
				ch <- prometheus.MustNewConstMetric(atLimitDesc, prometheus.GaugeValue, float64(n), kind)
			}
			for _, s := range o.Streams() {
				full := 0.0
				if s.Full {
					full = 1
				}
				ch <- prometheus.MustNewConstMetric(bytesDesc, prometheus.GaugeValue, s.Bytes, s.Name)
				ch <- prometheus.MustNewConstMetric(maxBytesDesc, prometheus.GaugeValue, s.MaxBytes, s.Name)
				ch <- prometheus.MustNewConstMetric(fullDesc, prometheus.GaugeValue, full, s.Name)
			}
		},
	})
	pendingDesc := prometheus.NewDesc("sys1_worker_queue_pending",
		"Requests waiting in SYS1_REQUESTS, not yet delivered, by lane (interactive, batch), as this replica's fleet watcher last read them: the queue depth to scale replicas on (every replica reports the same figure; take the max).", []string{"lane"}, nil)
	ackPendingDesc := prometheus.NewDesc("sys1_worker_queue_ack_pending",
		"Requests delivered and not yet acknowledged, by lane: being run, or handed back to come again later.", []string{"lane"}, nil)
	callersDesc := prometheus.NewDesc("sys1_worker_queue_callers",
		"Callers with requests waiting or in hand, by lane (fair share: each has a consumer of its own).", []string{"lane"}, nil)
	c.families = append(c.families,
		Family{Name: "sys1_worker_queue_pending", Type: "gauge", Labels: []string{"lane"}},
		Family{Name: "sys1_worker_queue_ack_pending", Type: "gauge", Labels: []string{"lane"}},
		Family{Name: "sys1_worker_queue_callers", Type: "gauge", Labels: []string{"lane"}})
	c.register(&funcCollector{
		descs: []*prometheus.Desc{pendingDesc, ackPendingDesc, callersDesc},
		collect: func(ch chan<- prometheus.Metric) {
			for _, q := range o.Queues() {
				ch <- prometheus.MustNewConstMetric(pendingDesc, prometheus.GaugeValue, q.Pending, q.Lane)
				ch <- prometheus.MustNewConstMetric(ackPendingDesc, prometheus.GaugeValue, q.AckPending, q.Lane)
				ch <- prometheus.MustNewConstMetric(callersDesc, prometheus.GaugeValue, q.Callers, q.Lane)
			}
		},
	})
	if c.err != nil {
		return nil, c.err
	}
	w.families = c.families
	return w, nil
}

// QuotaRefused counts one refusal for a caller's quota of the given kind (QuotaRequests, …).
func (w *Worker) QuotaRefused(kind string) { w.quota.WithLabelValues(kind).Inc() }

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
	w, err := NewWorker(WorkerOptions{
		Replica: "catalogue", InFlight: zero, ProviderPeak: zero, Redeliveries: zero, Replays: zero, DeadLetters: zero, Orphans: zero, Paused: zero,
		Providers: func() []ProviderState { return nil }, Fits: func() []FitReading { return nil },
		Streams: func() []StreamState { return nil }, QuotaAtLimit: func() map[string]int { return nil }, Queues: func() []QueueState { return nil },
	}, prometheus.NewRegistry())
	if err != nil {
		panic(err) // a fresh registry cannot refuse them
	}
	return w.Families()
}
