package promdeploy

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/util/teststorage"
)

// A scraper in the test's hands: it GETs each target's /metrics, adds job and instance (and
// up) as Prometheus does, and appends every sample to a TSDB the engine queries. The scrape
// times are real, so rates are real.

type target struct {
	job, instance string
	// url is the /metrics address; text, when set instead, produces the exposition (the NATS
	// exporter's, see exporterText).
	url  string
	text func() (string, error)
}

type scraper struct {
	t       *testing.T
	db      *teststorage.TestStorage
	targets []target

	mu     sync.Mutex
	last   time.Time
	texts  map[string]string          // job → the last exposition scraped from it
	labels map[string]map[string]bool // metric name → label names seen on its series (job, instance included)
	bodies map[string][]string        // job → every exposition scraped, for lint
}

func newScraper(t *testing.T, targets ...target) *scraper {
	return &scraper{t: t, db: teststorage.New(t), targets: targets, texts: map[string]string{},
		labels: map[string]map[string]bool{}, bodies: map[string][]string{}}
}

// scrape takes one sample of every target, all with the same timestamp.
func (s *scraper) scrape(ctx context.Context) error {
	now := time.Now()
	ts := now.UnixMilli()
	app := s.db.Appender(ctx)
	for _, tg := range s.targets {
		text, err := tg.fetch(ctx)
		up := 1.0
		if err != nil {
			up = 0
			s.t.Logf("scrape %s %s: %v", tg.job, tg.instance, err)
		}
		target := labels.FromStrings("job", tg.job, "instance", tg.instance)
		if _, aerr := app.Append(0, labels.NewBuilder(target).Set(model.MetricNameLabel, "up").Labels(), ts, up); aerr != nil {
			return aerr
		}
		s.mu.Lock()
		s.labels["up"] = map[string]bool{"job": true, "instance": true}
		s.mu.Unlock()
		if err != nil {
			continue
		}
		n, err := s.appendText(app, text, target, ts)
		if err != nil {
			_ = app.Rollback()
			return fmt.Errorf("%s: %w", tg.job, err)
		}
		if n == 0 {
			return fmt.Errorf("%s served no sample", tg.job)
		}
		s.mu.Lock()
		s.texts[tg.job] = text
		s.bodies[tg.job] = append(s.bodies[tg.job], text)
		s.mu.Unlock()
	}
	if err := app.Commit(); err != nil {
		return err
	}
	s.mu.Lock()
	s.last = now
	s.mu.Unlock()
	return nil
}

func (tg target) fetch(ctx context.Context) (string, error) {
	if tg.text != nil {
		return tg.text()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, tg.url, nil)
	if err != nil {
		return "", err
	}
	// The text format Prometheus falls back to; OpenMetrics would add _created series.
	req.Header.Set("Accept", string(expfmt.NewFormat(expfmt.TypeTextPlain)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("HTTP %d: %s", resp.StatusCode, b)
	}
	return string(b), nil
}

// appendText parses one exposition and appends its samples, named and labelled as Prometheus
// stores them: histograms as _bucket{le}, _sum and _count; summaries as {quantile}, _sum,
// _count; empty label values dropped.
func (s *scraper) appendText(app storage.Appender, text string, target labels.Labels, ts int64) (int, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		return 0, err
	}
	n := 0
	add := func(name string, m *dto.Metric, extra []string, v float64) error {
		b := labels.NewBuilder(target).Set(model.MetricNameLabel, name)
		for _, lp := range m.GetLabel() {
			b.Set(lp.GetName(), lp.GetValue()) // an empty value deletes: as Prometheus stores it
		}
		for i := 0; i+1 < len(extra); i += 2 {
			b.Set(extra[i], extra[i+1])
		}
		l := b.Labels()
		s.mu.Lock()
		if s.labels[name] == nil {
			s.labels[name] = map[string]bool{}
		}
		l.Range(func(lb labels.Label) {
			if lb.Name != model.MetricNameLabel {
				s.labels[name][lb.Name] = true
			}
		})
		s.mu.Unlock()
		n++
		_, err := app.Append(0, l, ts, v)
		return err
	}
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			var err error
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				err = add(name, m, nil, m.GetCounter().GetValue())
			case dto.MetricType_GAUGE:
				err = add(name, m, nil, m.GetGauge().GetValue())
			case dto.MetricType_UNTYPED:
				err = add(name, m, nil, m.GetUntyped().GetValue())
			case dto.MetricType_HISTOGRAM:
				h := m.GetHistogram()
				for _, b := range h.GetBucket() {
					if err = add(name+"_bucket", m, []string{"le", formatLe(b.GetUpperBound())}, float64(b.GetCumulativeCount())); err != nil {
						break
					}
				}
				if err == nil {
					err = add(name+"_bucket", m, []string{"le", "+Inf"}, float64(h.GetSampleCount()))
				}
				if err == nil {
					err = add(name+"_sum", m, nil, h.GetSampleSum())
				}
				if err == nil {
					err = add(name+"_count", m, nil, float64(h.GetSampleCount()))
				}
			case dto.MetricType_SUMMARY:
				sm := m.GetSummary()
				for _, q := range sm.GetQuantile() {
					if err = add(name, m, []string{"quantile", strconv.FormatFloat(q.GetQuantile(), 'g', -1, 64)}, q.GetValue()); err != nil {
						break
					}
				}
				if err == nil {
					err = add(name+"_sum", m, nil, sm.GetSampleSum())
				}
				if err == nil {
					err = add(name+"_count", m, nil, float64(sm.GetSampleCount()))
				}
			default:
				err = fmt.Errorf("%s: type %s is not scraped here", name, f.GetType())
			}
			if err != nil {
				return n, err
			}
		}
	}
	return n, nil
}

func formatLe(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }

// exporterText serves what prometheus-nats-exporter 0.20.1 (deploy/compose.yaml runs it with
// -varz -jsz=all) serves for srv, from the same /varz and /jsz figures it reads, with its
// names and labels (collector/jsz.go, collector/collector.go): the series the dashboards and
// alerts use. The exporter's module is not reachable from here, so this is its mapping for
// those series, written down; the grafana package's natsExporterMetrics lists them too.
func exporterText(srv *server.Server) func() (string, error) {
	return func() (string, error) {
		varz, err := srv.Varz(&server.VarzOptions{})
		if err != nil {
			return "", err
		}
		jsz, err := srv.Jsz(&server.JSzOptions{Accounts: true, Streams: true, Consumer: true, Config: true})
		if err != nil {
			return "", err
		}
		series := map[string][]string{} // name → its sample lines
		gauge := func(name string, v float64, kv ...string) {
			var ls []string
			for i := 0; i+1 < len(kv); i += 2 {
				ls = append(ls, fmt.Sprintf("%s=%q", kv[i], kv[i+1]))
			}
			series[name] = append(series[name], fmt.Sprintf("%s{%s} %g\n", name, strings.Join(ls, ","), v))
		}
		id := srv.ID()
		gauge("gnatsd_varz_connections", float64(varz.Connections), "server_id", id)
		gauge("gnatsd_varz_slow_consumers", float64(varz.SlowConsumers), "server_id", id)
		gauge("gnatsd_varz_mem", float64(varz.Mem), "server_id", id)
		serverLabels := []string{"server_id", id, "server_name", varz.Name, "cluster", "", "domain", "", "meta_leader", "", "is_meta_leader", "true"}
		gauge("jetstream_server_total_message_bytes", float64(jsz.Bytes), serverLabels...)
		gauge("jetstream_server_max_storage", float64(jsz.Config.MaxStore), serverLabels...)
		for _, acc := range jsz.AccountDetails {
			for _, st := range acc.Streams {
				sl := append(slices.Clone(serverLabels), "account", acc.Name, "account_name", acc.Name, "account_id", acc.Id,
					"stream_name", st.Name, "stream_leader", "", "is_stream_leader", "true", "stream_raft_group", st.RaftGroup)
				gauge("jetstream_stream_total_messages", float64(st.State.Msgs), sl...)
				gauge("jetstream_stream_total_bytes", float64(st.State.Bytes), sl...)
				if st.Config != nil {
					gauge("jetstream_stream_limit_bytes", float64(st.Config.MaxBytes), sl...)
				}
				for _, c := range st.Consumer {
					desc := ""
					if c.Config != nil {
						desc = c.Config.Description
					}
					cl := append(slices.Clone(sl), "consumer_name", c.Name, "consumer_leader", "", "is_consumer_leader", "true", "consumer_desc", desc)
					gauge("jetstream_consumer_num_pending", float64(c.NumPending), cl...)
					gauge("jetstream_consumer_num_ack_pending", float64(c.NumAckPending), cl...)
					gauge("jetstream_consumer_num_redelivered", float64(c.NumRedelivered), cl...)
				}
			}
		}
		var b strings.Builder
		for _, name := range slices.Sorted(maps.Keys(series)) {
			fmt.Fprintf(&b, "# TYPE %s gauge\n%s", name, strings.Join(series[name], ""))
		}
		return b.String(), nil
	}
}
