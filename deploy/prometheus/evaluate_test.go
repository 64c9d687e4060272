package promdeploy

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/parser"

	"github.com/sys1hq/sys1/cmd/sys1/review"
	"github.com/sys1hq/sys1/sink"
	"github.com/sys1hq/sys1/worker/metrics"
)

// pendingMetrics are families pinned for changes in flight: the rules use them already and
// their unit tests cover them; here, until a component defines them, their names and labels
// are these, and an expression reading them may evaluate to nothing. Once defined
// (metrics.WorkerFamilies) the definitions apply, and once this load produces samples of them
// every check does. None is pending now: issue 21's route state (sys1_worker_provider_routes)
// and issue 22's stream bytes and quota refusals are defined.
var pendingMetrics = map[string][]string{}

// targetLabels are the labels Prometheus adds to every scraped series.
var targetLabels = []string{"job", "instance"}

// catalogue is every metric the fleet serves or defines, with its label names.
type catalogue struct {
	labels  map[string]map[string]bool
	sampled map[string]bool // has samples in the scrapes
}

func newCatalogue(s *scraper) *catalogue {
	c := &catalogue{labels: map[string]map[string]bool{}, sampled: map[string]bool{}}
	add := func(name string, ls ...string) {
		if c.labels[name] == nil {
			c.labels[name] = map[string]bool{}
		}
		for _, l := range append(ls, targetLabels...) {
			c.labels[name][l] = true
		}
	}
	s.mu.Lock()
	for name, ls := range s.labels {
		add(name, slices.Collect(maps.Keys(ls))...)
		c.sampled[name] = true
	}
	s.mu.Unlock()
	// Families defined but without samples in this load (a vector nobody used yet) keep their
	// labels from their definitions.
	define := func(f metrics.Family, extra ...string) {
		ls := append(slices.Clone(f.Labels), extra...)
		if f.Type == "histogram" {
			add(f.Name+"_bucket", append(ls, "le")...)
			add(f.Name+"_sum", ls...)
			add(f.Name+"_count", ls...)
			return
		}
		add(f.Name, ls...)
	}
	for _, f := range metrics.WorkerFamilies() {
		define(f, "worker", "caller") // caller: SYS1_METRICS_CALLER_LABEL, which the fleet turns on
	}
	for _, f := range sink.MetricFamilies() {
		define(f)
	}
	for _, f := range review.MetricFamilies() {
		define(f)
	}
	for name, ls := range pendingMetrics {
		if c.labels[name] == nil {
			add(name, ls...)
		}
	}
	return c
}

// exprCheck is what an expression's AST says against the catalogue.
type exprCheck struct {
	problems []string
	// unsampled are the metrics it names that have no samples in this load: pinned for a
	// change in flight, or defined by a component but not produced by this load's mix.
	unsampled []string
}

// check walks expr: every selector names a metric of the catalogue and matches only on labels
// its series have; every by, on and ignoring label exists below it (label_replace and
// label_join may create one).
func (c *catalogue) check(expr parser.Expr) exprCheck {
	var out exprCheck
	parser.Inspect(expr, func(node parser.Node, _ []parser.Node) error {
		switch n := node.(type) {
		case *parser.VectorSelector:
			name := selectorName(n)
			ls, ok := c.labels[name]
			if !ok {
				out.problems = append(out.problems, fmt.Sprintf("%s is not a metric any sys1 component or the NATS exporter serves", name))
				return nil
			}
			if !c.sampled[name] && !slices.Contains(out.unsampled, name) {
				out.unsampled = append(out.unsampled, name)
			}
			for _, m := range n.LabelMatchers {
				if m.Name == model.MetricNameLabel || m.Matches("") {
					continue // matching the absence of a label is always meaningful
				}
				if !ls[m.Name] {
					out.problems = append(out.problems, fmt.Sprintf("%s has no label %q", name, m.Name))
				}
			}
		case *parser.AggregateExpr:
			if !n.Without {
				below := c.labelsBelow(n.Expr)
				for _, l := range n.Grouping {
					if !below[l] {
						out.problems = append(out.problems, fmt.Sprintf("%s by (%s): no series below has %q", n.Op, strings.Join(n.Grouping, ", "), l))
					}
				}
			}
		case *parser.BinaryExpr:
			if vm := n.VectorMatching; vm != nil && len(vm.MatchingLabels) > 0 {
				below := c.labelsBelow(n.LHS)
				maps.Copy(below, c.labelsBelow(n.RHS))
				for _, l := range vm.MatchingLabels {
					if !below[l] {
						out.problems = append(out.problems, fmt.Sprintf("on/ignoring (%s): neither side has %q", strings.Join(vm.MatchingLabels, ", "), l))
					}
				}
			}
		}
		return nil
	})
	return out
}

func selectorName(vs *parser.VectorSelector) string {
	if vs.Name != "" {
		return vs.Name
	}
	for _, m := range vs.LabelMatchers {
		if m.Name == model.MetricNameLabel {
			return m.Value
		}
	}
	return ""
}

// labelsBelow is every label a series under node may carry.
func (c *catalogue) labelsBelow(node parser.Node) map[string]bool {
	out := map[string]bool{}
	parser.Inspect(node, func(n parser.Node, _ []parser.Node) error {
		switch n := n.(type) {
		case *parser.VectorSelector:
			maps.Copy(out, c.labels[selectorName(n)])
		case *parser.Call:
			if (n.Func.Name == "label_replace" || n.Func.Name == "label_join") && len(n.Args) > 1 {
				if s, ok := n.Args[1].(*parser.StringLiteral); ok {
					out[s.Val] = true
				}
			}
		}
		return nil
	})
	return out
}

// measured strips an alert's thresholds: the comparison with a number at its top, and the
// guards after and/unless (recursively), leaving the figure it watches. On a running fleet
// that figure exists even when the alert is silent; if it does not, the alert can never fire.
func measured(e parser.Expr) parser.Expr {
	switch n := e.(type) {
	case *parser.ParenExpr:
		return measured(n.Expr)
	case *parser.BinaryExpr:
		if n.Op.IsComparisonOperator() && !n.ReturnBool {
			if _, ok := n.RHS.(*parser.NumberLiteral); ok {
				return measured(n.LHS)
			}
		}
		if n.Op == parser.LAND || n.Op == parser.LUNLESS {
			return measured(n.LHS)
		}
	}
	return e
}

// grafana's template variables and macros, as the dashboards use them.
var (
	rateInterval = regexp.MustCompile(`\$__rate_interval`)
	workerVar    = regexp.MustCompile(`\$worker\b`)
)

type dashboardQuery struct {
	file, panel, expr string
}

func dashboardQueries(t *testing.T) (queries []dashboardQuery, variables []dashboardQuery) {
	t.Helper()
	files, err := filepath.Glob("../grafana/dashboards/*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no dashboards: %v", err)
	}
	type panel struct {
		Title   string
		Targets []struct {
			Expr       string
			Datasource *struct{ Type string }
		}
		Panels json.RawMessage
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var d struct {
			Panels     []panel
			Templating struct {
				List []struct {
					Name       string
					Datasource struct{ Type string }
					Query      json.RawMessage
				}
			}
		}
		if err := json.Unmarshal(b, &d); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		var walk func([]panel)
		walk = func(ps []panel) {
			for _, p := range ps {
				for _, q := range p.Targets {
					if q.Expr != "" {
						queries = append(queries, dashboardQuery{filepath.Base(f), p.Title, q.Expr})
					}
				}
				var nested []panel
				if len(p.Panels) > 0 && json.Unmarshal(p.Panels, &nested) == nil {
					walk(nested)
				}
			}
		}
		walk(d.Panels)
		for _, v := range d.Templating.List {
			var q struct{ Query string }
			if v.Datasource.Type == "prometheus" && json.Unmarshal(v.Query, &q) == nil && q.Query != "" {
				variables = append(variables, dashboardQuery{filepath.Base(f), "variable " + v.Name, q.Query})
			}
		}
	}
	return queries, variables
}

// TestDashboardsAndAlertsOnARunningFleet evaluates every Grafana panel's and every alert
// rule's PromQL with Prometheus's engine on samples scraped from a worker, a sink and the
// review page under load (and the NATS exporter's series from the same server): each parses,
// names only metrics and labels that are served, evaluates without error, and returns
// something (a panel always; an alert's watched figure, without its threshold). The unit
// tests' input series are real series too, and every scraped family passes promlint.
func TestDashboardsAndAlertsOnARunningFleet(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts a fleet under load (CI runs it)")
	}
	f := startFleet(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := time.Now()
	f.load(ctx, t, 100*time.Millisecond)
	t.Logf("load: %d scrapes in %s", f.scraper.scrapes(), time.Since(start).Round(time.Millisecond))

	p := parser.NewParser(parser.Options{})
	ng := promql.NewEngine(promql.EngineOpts{MaxSamples: 10_000_000, Timeout: time.Minute, LookbackDelta: 5 * time.Minute,
		EnableAtModifier: true, EnableNegativeOffset: true, Parser: p})
	t.Cleanup(func() { _ = ng.Close() })
	at := f.scraper.last
	cat := newCatalogue(f.scraper)
	eval := func(expr string) (promql.Vector, error) {
		return instantVector(ctx, ng, f.scraper.db, expr, at)
	}

	t.Run("autoscaling", func(t *testing.T) {
		// KEDA's query (../kubernetes/autoscaling.yaml) scales the workers on queue depth: it
		// parses, names only what the workers serve, and gives a number under load.
		b, err := os.ReadFile("../kubernetes/autoscaling.yaml")
		if err != nil {
			t.Fatal(err)
		}
		m := regexp.MustCompile(`(?m)^\s+query: (.+)$`).FindStringSubmatch(string(b))
		if m == nil {
			t.Fatal("autoscaling.yaml has no prometheus query")
		}
		e, err := p.ParseExpr(m[1])
		if err != nil {
			t.Fatalf("%s does not parse: %v", m[1], err)
		}
		if c := cat.check(e); len(c.problems) > 0 {
			t.Fatalf("%s:\n  %s", m[1], strings.Join(c.problems, "\n  "))
		}
		if vec, err := eval(m[1]); err != nil || len(vec) != 1 {
			t.Fatalf("%s gave %v (%v), want one figure", m[1], vec, err)
		}
	})

	t.Run("dashboards", func(t *testing.T) {
		queries, variables := dashboardQueries(t)
		if len(queries) < 20 {
			t.Fatalf("%d dashboard queries: the dashboards were not read", len(queries))
		}
		// The replica variable: label_values(metric, label) gives the values a person picks.
		replicas := map[string]bool{}
		for _, v := range variables {
			m := regexp.MustCompile(`^label_values\(([a-zA-Z_:][a-zA-Z0-9_:]*),\s*([a-zA-Z_]+)\)$`).FindStringSubmatch(v.expr)
			if m == nil {
				t.Errorf("%s: %s: %q is not label_values(metric, label)", v.file, v.panel, v.expr)
				continue
			}
			vec, err := eval("group by (" + m[2] + ") (" + m[1] + ")")
			if err != nil || len(vec) == 0 {
				t.Errorf("%s: %s: %s offers no value (%v)", v.file, v.panel, v.expr, err)
			}
			for _, s := range vec {
				if v.panel == "variable worker" {
					replicas[s.Metric.Get(m[2])] = true
				}
			}
		}
		if !replicas[fleetReplica] {
			t.Fatalf("the worker variable offers %v, not the replica %s", slices.Collect(maps.Keys(replicas)), fleetReplica)
		}
		for _, q := range queries {
			// All replicas (Grafana's "All" is .*), then the one replica a person picks.
			for _, worker := range []string{".*", fleetReplica} {
				expr := workerVar.ReplaceAllString(rateInterval.ReplaceAllString(q.expr, "1m"), worker)
				e, err := p.ParseExpr(expr)
				if err != nil {
					t.Errorf("%s: %q: %s does not parse: %v", q.file, q.panel, q.expr, err)
					break
				}
				c := cat.check(e)
				if len(c.problems) > 0 {
					t.Errorf("%s: %q: %s:\n  %s", q.file, q.panel, q.expr, strings.Join(c.problems, "\n  "))
				}
				vec, err := eval(expr)
				switch {
				case err != nil:
					t.Errorf("%s: %q: %s: %v", q.file, q.panel, expr, err)
				case len(vec) == 0 && len(c.unsampled) > 0:
					t.Logf("%s: %q: %s returns nothing: %v have no samples in this load", q.file, q.panel, expr, c.unsampled)
				case len(vec) == 0:
					t.Errorf("%s: %q: %s returns nothing on a loaded fleet", q.file, q.panel, expr)
				}
			}
		}
	})

	t.Run("alerts", func(t *testing.T) {
		rules := alerts(t)
		for _, name := range slices.Sorted(maps.Keys(rules)) {
			r := rules[name]
			e, err := p.ParseExpr(r.Expr)
			if err != nil {
				t.Errorf("%s: %v", name, err)
				continue
			}
			c := cat.check(e)
			if len(c.problems) > 0 {
				t.Errorf("%s: %s:\n  %s", name, r.Expr, strings.Join(c.problems, "\n  "))
			}
			firing, err := eval(r.Expr)
			if err != nil {
				t.Errorf("%s: %v", name, err)
				continue
			}
			watched := measured(e).String()
			vec, err := eval(watched)
			switch {
			case err != nil:
				t.Errorf("%s: %s: %v", name, watched, err)
			case len(vec) == 0 && len(c.unsampled) > 0:
				t.Logf("%s: %s returns nothing: it reads %v, which have no samples in this load (pinned for a change in flight, or not produced by this mix)", name, watched, c.unsampled)
			case len(vec) == 0:
				t.Errorf("%s: %s returns nothing on a loaded fleet: the alert could never fire", name, watched)
			default:
				t.Logf("%s: %d series watched, %d over the threshold now", name, len(vec), len(firing))
			}
		}
	})

	t.Run("unit-test series are real", func(t *testing.T) {
		_, tests := ruleFiles(t)
		for _, path := range tests {
			uf, err := loadUnitTestFile(path)
			if err != nil {
				t.Error(err)
				continue
			}
			for _, tc := range uf.Tests {
				for _, s := range tc.InputSeries {
					l, err := p.ParseMetric(s.Series)
					if err != nil {
						t.Errorf("%s: %s: %v", path, s.Series, err)
						continue
					}
					name := l.Get(model.MetricNameLabel)
					have, ok := cat.labels[name]
					if !ok {
						t.Errorf("%s: %q: input series %s is not a metric sys1 or the NATS exporter serves", path, tc.Name, name)
						continue
					}
					l.Range(func(lb labels.Label) {
						if lb.Name != model.MetricNameLabel && !have[lb.Name] {
							t.Errorf("%s: %q: input series %s has label %q, which the served series do not have", path, tc.Name, name, lb.Name)
						}
					})
				}
			}
		}
	})

	t.Run("promlint", func(t *testing.T) {
		for _, job := range []string{"sys1-worker", "sys1-sink", "sys1-review"} {
			f.scraper.mu.Lock()
			bodies := slices.Clone(f.scraper.bodies[job])
			f.scraper.mu.Unlock()
			if len(bodies) == 0 {
				t.Errorf("%s: nothing scraped", job)
				continue
			}
			last := bodies[len(bodies)-1]
			problems, err := promlint.New(strings.NewReader(last)).Lint()
			if err != nil {
				t.Errorf("%s: %v", job, err)
			}
			t.Logf("%s: promlint read %d families", job, strings.Count(last, "# TYPE "))
			for _, pr := range problems {
				t.Errorf("%s: promlint: %s: %s", job, pr.Metric, pr.Text)
			}
		}
	})
}

// The checker itself: it finds a metric that is not served, a label a selector matches on
// that its series lack, and a grouping label nothing below carries; label_replace's new
// label and matchers on an absent label ("") are fine.
func TestCatalogueCheck(t *testing.T) {
	c := &catalogue{labels: map[string]map[string]bool{
		"a_total": {"worker": true, "job": true, "instance": true},
		"b":       {"lane": true, "job": true, "instance": true},
	}, sampled: map[string]bool{"a_total": true, "b": true}}
	p := parser.NewParser(parser.Options{})
	for expr, want := range map[string]int{
		`sum by (worker) (rate(a_total{worker=~"x"}[5m]))`:                                                                0,
		`max by (lane) (b) / on (lane) group_left sum by (lane) (label_replace(a_total, "lane", "$1", "worker", "(.*)"))`: 0,
		`a_total{caller=""}`:                0,
		`nope_total`:                        1,
		`a_total{lane="runs"}`:              1,
		`sum by (provider) (a_total)`:       1,
		`b / on (stage) a_total`:            1,
		`sum by (lane) (b) and on (lane) b`: 0,
	} {
		e, err := p.ParseExpr(expr)
		if err != nil {
			t.Fatalf("%s: %v", expr, err)
		}
		if got := c.check(e).problems; len(got) != want {
			t.Errorf("%s: problems %v, want %d", expr, got, want)
		}
	}
	for expr, want := range map[string]string{
		`x > 0.5`:                           `x`,
		`(sum(x) / sum(y)) > 1 and on () z`: `sum(x) / sum(y)`,
		`a > 0 unless on (l) b > 0 unless on () c == 1`: `a`,
		`x > bool 1`: `x > bool 1`,
	} {
		e, _ := p.ParseExpr(expr)
		if got := measured(e).String(); got != want {
			t.Errorf("measured(%s) = %s, want %s", expr, got, want)
		}
	}
}
