// Package metrics holds sys1's Prometheus metrics: the process registry (one per process, with
// the Go runtime and process collectors), the handler that serves it, and the worker's metric
// families. Every family a component defines is listed by its Families method, so tests can
// check that each is documented and that dashboards use only families that exist.
//
// Label values are bounded: provider and model come from the deployment's configuration (the
// chain's link names, the policy's models), error codes and outcomes from the contract, and no
// label ever carries a run id. The caller is a label only when asked for (CallerLabel), because
// in auth mode jwt every distinct token subject would become a series.
package metrics

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"
)

// Family is one metric family a component defines.
type Family struct {
	Name string
	// Type is counter, gauge or histogram.
	Type   string
	Help   string
	Labels []string
}

// NewRegistry returns the process's registry: the Go runtime and process collectors, and room
// for the worker's and the sink's families (a worker running the sink in-process serves both
// from this one registry).
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// Handler serves g in the Prometheus text format (or OpenMetrics, when the scraper asks). A
// collector that fails is logged and left out; the rest are still served.
func Handler(g prometheus.Gatherer, log zerolog.Logger) http.Handler {
	return promhttp.HandlerFor(g, promhttp.HandlerOpts{
		ErrorLog:          promLogger{log},
		ErrorHandling:     promhttp.ContinueOnError,
		EnableOpenMetrics: true,
		// A scrape never queues behind a slow one for long.
		MaxRequestsInFlight: 4,
		Timeout:             10 * time.Second,
	})
}

type promLogger struct{ log zerolog.Logger }

func (l promLogger) Println(v ...any) { l.log.Warn().Msgf("metrics: %v", v) }

// Buckets, in seconds.
var (
	// QueueBuckets cover a queue that drains at once to one backed up for an hour.
	QueueBuckets = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600}
	// ProviderBuckets cover a model's answer: milliseconds on a warm GPU to minutes for a big
	// request on a CPU.
	ProviderBuckets = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2, 5, 10, 20, 30, 60, 120, 300}
	// StageBuckets cover the pipeline's own steps (a KV round trip) and the call stage.
	StageBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300}
)

// catalogue builds families and remembers them.
type catalogue struct {
	reg      prometheus.Registerer
	families []Family
	err      error
}

func (c *catalogue) add(f Family, col prometheus.Collector) {
	c.families = append(c.families, f)
	c.register(col)
}

// register registers a collector whose families the caller lists itself.
func (c *catalogue) register(col prometheus.Collector) {
	if c.err == nil {
		c.err = c.reg.Register(col)
	}
}

func (c *catalogue) counterVec(name, help string, labels ...string) *prometheus.CounterVec {
	v := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
	c.add(Family{Name: name, Type: "counter", Help: help, Labels: labels}, v)
	return v
}

func (c *catalogue) histogramVec(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
	v := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, labels)
	c.add(Family{Name: name, Type: "histogram", Help: help, Labels: labels}, v)
	return v
}

func (c *catalogue) gaugeFunc(name, help string, f func() float64) {
	c.add(Family{Name: name, Type: "gauge", Help: help}, prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, f))
}

func (c *catalogue) counterFunc(name, help string, f func() float64) {
	c.add(Family{Name: name, Type: "counter", Help: help}, prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, f))
}

// funcCollector is families whose samples one function produces at each scrape.
type funcCollector struct {
	descs   []*prometheus.Desc
	collect func(ch chan<- prometheus.Metric)
}

func (f *funcCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range f.descs {
		ch <- d
	}
}

func (f *funcCollector) Collect(ch chan<- prometheus.Metric) { f.collect(ch) }
