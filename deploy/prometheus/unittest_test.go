package promdeploy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/promql/promqltest"
	"github.com/prometheus/prometheus/rules"
	"github.com/prometheus/prometheus/storage"
	"go.yaml.in/yaml/v3"
)

// A runner for rule unit-test files in `promtool test rules` format, built on the packages
// promtool's own runner uses (promqltest's lazy loader for the input series, the rules
// manager to load and evaluate the groups, the engine). promtool's runner lives in its main
// package (cmd/promtool/unittest.go), so it cannot be imported; building promtool instead
// (`go install github.com/prometheus/prometheus/cmd/promtool@v0.316.0`) took 6 min 24 s of
// wall time and 410 s of CPU, 3.3 GB of memory, on this 2-core machine with a cold build cache
// (it compiles every service discovery: Kubernetes, AWS, Azure, GCE…), against a few seconds
// for this file in a test package that links the same Prometheus packages anyway. Where
// promtool is on PATH the tests run it too, on the same files (TestRulesWithPromtool), so
// the two cannot drift apart unnoticed.
//
// Supported: rule_files (relative to the test file; globs), evaluation_interval, and tests
// with name, interval, input_series, alert_rule_test and promql_expr_test. Any other field
// (group_eval_order, external_labels, start_timestamp, fuzzy_compare...) is refused by name
// rather than ignored.

type unitTestFile struct {
	RuleFiles          []string       `yaml:"rule_files"`
	EvaluationInterval model.Duration `yaml:"evaluation_interval"`
	Tests              []unitTest     `yaml:"tests"`
}

type unitTest struct {
	Name        string         `yaml:"name"`
	Interval    model.Duration `yaml:"interval"`
	InputSeries []struct {
		Series string `yaml:"series"`
		Values string `yaml:"values"`
	} `yaml:"input_series"`
	AlertRuleTests  []alertRuleTest `yaml:"alert_rule_test"`
	PromqlExprTests []struct {
		Expr       string         `yaml:"expr"`
		EvalTime   model.Duration `yaml:"eval_time"`
		ExpSamples []struct {
			Labels string  `yaml:"labels"`
			Value  float64 `yaml:"value"`
		} `yaml:"exp_samples"`
	} `yaml:"promql_expr_test"`
}

type alertRuleTest struct {
	EvalTime  model.Duration `yaml:"eval_time"`
	Alertname string         `yaml:"alertname"`
	ExpAlerts []struct {
		ExpLabels      map[string]string `yaml:"exp_labels"`
		ExpAnnotations map[string]string `yaml:"exp_annotations"`
	} `yaml:"exp_alerts"`
}

// loadUnitTestFile reads a test file strictly and resolves its rule files.
func loadUnitTestFile(path string) (*unitTestFile, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	var f unitTestFile
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("%s: %w (this runner supports rule_files, evaluation_interval and tests with name, interval, input_series, alert_rule_test, promql_expr_test)", path, err)
	}
	if f.EvaluationInterval == 0 {
		f.EvaluationInterval = model.Duration(time.Minute)
	}
	var files []string
	for _, rf := range f.RuleFiles {
		if !filepath.IsAbs(rf) {
			rf = filepath.Join(filepath.Dir(path), rf)
		}
		m, err := filepath.Glob(rf)
		if err != nil || len(m) == 0 {
			return nil, fmt.Errorf("%s: rule file %s matches nothing (%v)", path, rf, err)
		}
		files = append(files, m...)
	}
	f.RuleFiles = files
	if len(f.Tests) == 0 {
		return nil, fmt.Errorf("%s: no tests", path)
	}
	return &f, nil
}

// run runs one test of f and returns every mismatch, as promtool reports them.
func (f *unitTestFile) run(tc unitTest) []error {
	interval := time.Duration(tc.Interval)
	if interval == 0 {
		interval = time.Duration(f.EvaluationInterval)
	}
	evalInterval := time.Duration(f.EvaluationInterval)
	var load strings.Builder
	fmt.Fprintf(&load, "load %s\n", model.Duration(interval))
	for _, s := range tc.InputSeries {
		fmt.Fprintf(&load, "  %s %s\n", s.Series, s.Values)
	}
	p := parser.NewParser(parser.Options{})
	suite, err := promqltest.NewLazyLoader(load.String(), promqltest.LazyLoaderOpts{EnableAtModifier: true, EnableNegativeOffset: true, Parser: p})
	if err != nil {
		return []error{fmt.Errorf("input_series: %w", err)}
	}
	defer suite.Close()
	suite.SubqueryInterval = evalInterval

	m := rules.NewManager(&rules.ManagerOptions{
		QueryFunc:    rules.EngineQueryFunc(suite.QueryEngine(), suite.Storage()),
		AppendableV2: suite.Storage(),
		Context:      context.Background(),
		NotifyFunc:   func(context.Context, string, ...*rules.Alert) {},
		Logger:       slog.New(slog.DiscardHandler),
		Parser:       p,
	})
	groupsByName, errs := m.LoadGroups(evalInterval, labels.EmptyLabels(), "", nil, false, f.RuleFiles...)
	if errs != nil {
		return errs
	}
	var groups []*rules.Group
	for _, g := range groupsByName {
		groups = append(groups, g)
		for _, r := range g.Rules() {
			if ar, ok := r.(*rules.AlertingRule); ok {
				ar.SetRestored(true) // as a running Prometheus after its restore: ALERTS series and all
			}
		}
	}
	slices.SortFunc(groups, func(a, b *rules.Group) int { return strings.Compare(a.Name(), b.Name()) })

	type check struct {
		at   time.Duration
		name string
		want []string
	}
	var checks []check
	var end time.Duration
	for _, at := range tc.AlertRuleTests {
		if at.Alertname == "" {
			return []error{fmt.Errorf("an alert_rule_test at %s has no alertname", at.EvalTime)}
		}
		c := check{at: time.Duration(at.EvalTime), name: at.Alertname}
		for _, a := range at.ExpAlerts {
			l := map[string]string{labels.AlertName: at.Alertname}
			for k, v := range a.ExpLabels {
				l[k] = v
			}
			c.want = append(c.want, labels.FromMap(l).String()+" "+labels.FromMap(a.ExpAnnotations).String())
		}
		slices.Sort(c.want)
		checks = append(checks, c)
		end = max(end, c.at)
	}
	slices.SortStableFunc(checks, func(a, b check) int { return int(a.at - b.at) })
	for _, pt := range tc.PromqlExprTests {
		end = max(end, time.Duration(pt.EvalTime))
	}

	start := time.Unix(0, 0).UTC()
	var failures []error
	next := 0
	for ts := start; !ts.After(start.Add(end)); ts = ts.Add(evalInterval) {
		var evalErr error
		suite.WithSamplesTill(ts, func(err error) {
			if err != nil {
				evalErr = err
				return
			}
			for _, g := range groups {
				g.Eval(suite.Context(), ts)
				for _, r := range g.Rules() {
					if r.LastError() != nil {
						evalErr = errors.Join(evalErr, fmt.Errorf("rule %s at %s: %w", r.Name(), ts.Sub(start), r.LastError()))
					}
				}
			}
		})
		if evalErr != nil {
			return append(failures, evalErr)
		}
		// A check at eval_time t compares the evaluation at the last step ≤ t, as promtool does.
		for ; next < len(checks) && checks[next].at < ts.Sub(start)+evalInterval; next++ {
			c := checks[next]
			var got []string
			for _, g := range groups {
				for _, r := range g.Rules() {
					ar, ok := r.(*rules.AlertingRule)
					if !ok || ar.Name() != c.name {
						continue
					}
					for _, a := range ar.ActiveAlerts() {
						if a.State == rules.StateFiring {
							got = append(got, a.Labels.String()+" "+a.Annotations.String())
						}
					}
				}
			}
			slices.Sort(got)
			if !slices.Equal(got, c.want) {
				failures = append(failures, fmt.Errorf("alertname %s, time %s:\n      want %s\n      got  %s",
					c.name, model.Duration(c.at), listOrNone(c.want), listOrNone(got)))
			}
		}
	}

	for _, pt := range tc.PromqlExprTests {
		got, err := instantVector(suite.Context(), suite.QueryEngine(), suite.Queryable(), pt.Expr, start.Add(time.Duration(pt.EvalTime)))
		if err != nil {
			failures = append(failures, fmt.Errorf("expr %q at %s: %w", pt.Expr, pt.EvalTime, err))
			continue
		}
		var want, have []string
		for _, s := range pt.ExpSamples {
			l, err := p.ParseMetric(s.Labels)
			if err != nil {
				failures = append(failures, fmt.Errorf("expr %q: exp_samples labels %q: %w", pt.Expr, s.Labels, err))
				continue
			}
			want = append(want, fmt.Sprintf("%s %g", l, s.Value))
		}
		for _, s := range got {
			have = append(have, fmt.Sprintf("%s %g", s.Metric, s.F))
		}
		slices.Sort(want)
		slices.Sort(have)
		if !slices.Equal(want, have) {
			failures = append(failures, fmt.Errorf("expr %q at %s:\n      want %s\n      got  %s", pt.Expr, pt.EvalTime, listOrNone(want), listOrNone(have)))
		}
	}
	return failures
}

func listOrNone(s []string) string {
	if len(s) == 0 {
		return "(none)"
	}
	return strings.Join(s, "\n           ")
}

// instantVector evaluates q at ts; a scalar becomes a one-sample vector.
func instantVector(ctx context.Context, ng *promql.Engine, q storage.Queryable, qs string, ts time.Time) (promql.Vector, error) {
	query, err := ng.NewInstantQuery(ctx, q, nil, qs, ts)
	if err != nil {
		return nil, err
	}
	defer query.Close()
	res := query.Exec(ctx)
	if res.Err != nil {
		return nil, res.Err
	}
	switch v := res.Value.(type) {
	case promql.Vector:
		return v, nil
	case promql.Scalar:
		return promql.Vector{{T: v.T, F: v.V, Metric: labels.EmptyLabels()}}, nil
	default:
		return nil, fmt.Errorf("%q is a %s, not a vector or scalar", qs, res.Value.Type())
	}
}
