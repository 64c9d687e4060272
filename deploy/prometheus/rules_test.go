package promdeploy

import (
	"bytes"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"go.yaml.in/yaml/v3"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/worker/metrics"
)

// ruleFiles are rules/<name>.yml; testFiles rules/<name>_test.yml. Files added by other
// changes (risk.yml and risk_test.yml, say) are covered by every test here without edits.
func ruleFiles(t *testing.T) (rulesFiles, testFiles []string) {
	t.Helper()
	all, err := filepath.Glob("rules/*.yml")
	if err != nil || len(all) == 0 {
		t.Fatalf("no rule files in rules/: %v", err)
	}
	for _, f := range all {
		if strings.HasSuffix(f, "_test.yml") {
			testFiles = append(testFiles, f)
		} else {
			rulesFiles = append(rulesFiles, f)
		}
	}
	return rulesFiles, testFiles
}

// loadRules parses a rule file exactly as Prometheus loads it: strict YAML, every expression
// parsed, every label and annotation template parsed.
func loadRules(t *testing.T, file string) *rulefmt.RuleGroups {
	t.Helper()
	rgs, errs := rulefmt.ParseFile(file, false, model.UTF8Validation, parser.NewParser(parser.Options{}), slog.New(slog.DiscardHandler))
	for _, err := range errs {
		t.Errorf("%v", err)
	}
	if rgs == nil {
		t.FailNow()
	}
	return rgs
}

// alerts lists the alerting rules of every rule file, by name.
func alerts(t *testing.T) map[string]rulefmt.Rule {
	t.Helper()
	files, _ := ruleFiles(t)
	out := map[string]rulefmt.Rule{}
	for _, f := range files {
		for _, g := range loadRules(t, f).Groups {
			for _, r := range g.Rules {
				if r.Alert == "" {
					continue
				}
				if _, dup := out[r.Alert]; dup {
					t.Errorf("%s: alert %s is defined twice", f, r.Alert)
				}
				out[r.Alert] = r
			}
		}
	}
	return out
}

// TestRuleFilesAreValid: every rule file loads as Prometheus loads it, has its unit tests
// beside it, and every alert has a severity Alertmanager can route on and the two annotations
// the runbooks are written in.
func TestRuleFilesAreValid(t *testing.T) {
	files, tests := ruleFiles(t)
	for _, f := range files {
		if want := strings.TrimSuffix(f, ".yml") + "_test.yml"; !slices.Contains(tests, want) {
			t.Errorf("%s has no unit tests: want %s (promtool test rules format)", f, want)
		}
	}
	for name, r := range alerts(t) {
		if !regexp.MustCompile(`^SYS1[A-Z][A-Za-z]+$`).MatchString(name) {
			t.Errorf("alert %s: names are SYS1 and CamelCase", name)
		}
		if s := r.Labels["severity"]; s != "critical" && s != "warning" && s != "info" {
			t.Errorf("alert %s: severity %q, want critical, warning or info", name, s)
		}
		if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
			t.Errorf("alert %s: wants a summary and a description", name)
		}
	}
}

// TestRuleUnitTests runs every rules/*_test.yml, and checks that each alert of each rule file
// is shown both firing and silent by its tests.
func TestRuleUnitTests(t *testing.T) {
	_, tests := ruleFiles(t)
	shown := map[string]map[bool]bool{} // alert → firing? → seen
	for _, path := range tests {
		f, err := loadUnitTestFile(path)
		if err != nil {
			t.Error(err)
			continue
		}
		for _, tc := range f.Tests {
			t.Run(filepath.Base(path)+"/"+tc.Name, func(t *testing.T) {
				for _, err := range f.run(tc) {
					t.Errorf("%s: %v", path, err)
				}
			})
			for _, at := range tc.AlertRuleTests {
				if shown[at.Alertname] == nil {
					shown[at.Alertname] = map[bool]bool{}
				}
				shown[at.Alertname][len(at.ExpAlerts) > 0] = true
			}
		}
	}
	for name := range alerts(t) {
		if !shown[name][true] {
			t.Errorf("alert %s: no unit test shows it firing", name)
		}
		if !shown[name][false] {
			t.Errorf("alert %s: no unit test shows it silent (exp_alerts: [])", name)
		}
	}
}

// The runner is not vacuous: a rule broken on purpose fails its unit tests.
func TestRuleUnitTestsCatchABrokenRule(t *testing.T) {
	b, err := os.ReadFile("rules/worker.yml")
	if err != nil {
		t.Fatal(err)
	}
	for _, mutation := range []struct{ alert, from, to string }{
		{"SYS1ServiceErrorRatioHigh", "      > 0.05\n", "      > 0.5\n"},                                 // never fires
		{"SYS1ProviderDown", "expr: sys1_worker_provider_up == 0", "expr: sys1_worker_provider_up >= 0"}, // always fires
	} {
		if !bytes.Contains(b, []byte(mutation.from)) {
			t.Fatalf("rules/worker.yml no longer contains %q: update this test", mutation.from)
		}
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "worker.yml"), bytes.Replace(b, []byte(mutation.from), []byte(mutation.to), 1), 0o644); err != nil {
			t.Fatal(err)
		}
		tb, _ := os.ReadFile("rules/worker_test.yml")
		if err := os.WriteFile(filepath.Join(dir, "worker_test.yml"), tb, 0o644); err != nil {
			t.Fatal(err)
		}
		f, err := loadUnitTestFile(filepath.Join(dir, "worker_test.yml"))
		if err != nil {
			t.Fatal(err)
		}
		failed := 0
		for _, tc := range f.Tests {
			if slices.ContainsFunc(tc.AlertRuleTests, func(a alertRuleTest) bool { return a.Alertname == mutation.alert }) {
				failed += len(f.run(tc))
			}
		}
		if failed == 0 {
			t.Errorf("replacing %q by %q in worker.yml fails no unit test", mutation.from, mutation.to)
		}
	}
}

// promtool, when it is installed, passes the same files: the runner above and promtool's own
// agree. It is not installed by CI (see unittest_test.go for why).
func TestRulesWithPromtool(t *testing.T) {
	bin, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool is not on PATH (go install github.com/prometheus/prometheus/cmd/promtool@v0.316.0); the library runner covers the same files")
	}
	files, tests := ruleFiles(t)
	for _, args := range [][]string{append([]string{"check", "rules"}, files...), append([]string{"test", "rules"}, tests...)} {
		out, err := exec.Command(bin, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args[:2], " "), err, out)
		}
	}
}

// The error-ratio alerts split the contract's codes in two: the service's (5xx) and the
// caller's (4xx), with a spent budget (429) alerted on by itself. A code added to the contract
// must be put in one of them.
func TestErrorRatioAlertsCoverEveryCode(t *testing.T) {
	all := alerts(t)
	codesOf := func(alert string) []string {
		m := regexp.MustCompile(`error_code=~"SYS1_\(([A-Z_|]+)\)"`).FindStringSubmatch(all[alert].Expr)
		if m == nil {
			t.Fatalf("alert %s: no error_code=~\"SYS1_(A|B|…)\" matcher in %s", alert, all[alert].Expr)
		}
		var out []string
		for _, c := range strings.Split(m[1], "|") {
			out = append(out, "SYS1_"+c)
		}
		return out
	}
	service, caller := codesOf("SYS1ServiceErrorRatioHigh"), codesOf("SYS1CallerErrorRatioHigh")
	for _, c := range contract.Codes() {
		in := map[bool]bool{true: slices.Contains(service, string(c)), false: slices.Contains(caller, string(c))}
		switch {
		case c == contract.CodeBudgetExceeded:
			if in[true] || in[false] || !strings.Contains(all["SYS1BudgetExhausted"].Expr, string(c)) {
				t.Errorf("%s belongs to SYS1BudgetExhausted only", c)
			}
		case c.Status() >= 500 && (!in[true] || in[false]):
			t.Errorf("%s (%d) belongs to SYS1ServiceErrorRatioHigh only", c, c.Status())
		case c.Status() < 500 && (in[true] || !in[false]):
			t.Errorf("%s (%d) belongs to SYS1CallerErrorRatioHigh only", c, c.Status())
		}
	}
}

// TestRuleTestsUseTheWorkersQuotaKinds: the unit tests' quota series carry the kind label
// values the workers export (an alert tested on made-up kinds proves nothing about the real
// ones), and SYS1QuotaRefusals is shown firing for a real kind.
func TestRuleTestsUseTheWorkersQuotaKinds(t *testing.T) {
	_, tests := ruleFiles(t)
	kinds := []string{metrics.QuotaRequests, metrics.QuotaReview, metrics.QuotaLabels}
	seen := 0
	for _, path := range tests {
		f, err := loadUnitTestFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, tc := range f.Tests {
			for _, in := range tc.InputSeries {
				m, err := parser.NewParser(parser.Options{}).ParseMetric(in.Series)
				if err != nil {
					t.Fatalf("%s: series %q: %v", path, in.Series, err)
				}
				if !strings.HasPrefix(m.Get(model.MetricNameLabel), "sys1_worker_quota_") {
					continue
				}
				seen++
				if kind := m.Get("kind"); !slices.Contains(kinds, kind) {
					t.Errorf("%s (%s): kind %q is none of the workers' %v", path, tc.Name, kind, kinds)
				}
			}
			for _, at := range tc.AlertRuleTests {
				for _, a := range at.ExpAlerts {
					if kind, ok := a.ExpLabels["kind"]; ok && !slices.Contains(kinds, kind) {
						t.Errorf("%s (%s): %s expected with kind %q, none of the workers' %v", path, tc.Name, at.Alertname, kind, kinds)
					}
				}
			}
		}
	}
	if seen == 0 {
		t.Error("no rule unit test has a sys1_worker_quota_* series")
	}
}

// TestPrometheusLoadsTheRules: prometheus.yml loads every rule file (and no unit-test file,
// which Prometheus would refuse), from where compose.yaml mounts them.
func TestPrometheusLoadsTheRules(t *testing.T) {
	var prom struct {
		RuleFiles []string `yaml:"rule_files"`
	}
	b, err := os.ReadFile("prometheus.yml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &prom); err != nil {
		t.Fatalf("prometheus.yml: %v", err)
	}
	files, _ := ruleFiles(t)
	var want []string
	for _, f := range files {
		want = append(want, filepath.ToSlash(f)) // relative to prometheus.yml, as Prometheus resolves them
	}
	got := slices.Clone(prom.RuleFiles)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("prometheus.yml rule_files %v, want every rule file and nothing else: %v", prom.RuleFiles, want)
	}

	var compose struct {
		Services map[string]struct {
			Volumes []string
		}
	}
	cb, err := os.ReadFile("../compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(cb, &compose); err != nil {
		t.Fatalf("compose.yaml: %v", err)
	}
	mounts := map[string]string{}
	for _, v := range compose.Services["prometheus"].Volumes {
		parts := strings.Split(v, ":")
		if len(parts) >= 2 {
			mounts[parts[1]] = parts[0]
		}
	}
	if mounts["/etc/prometheus/prometheus.yml"] != "./prometheus/prometheus.yml" || mounts["/etc/prometheus/rules"] != "./prometheus/rules" {
		t.Errorf("compose.yaml's prometheus mounts %v: want ./prometheus/prometheus.yml and ./prometheus/rules beside it in /etc/prometheus", mounts)
	}
}

// Every alert is listed where operators look: the README's "Operating it" and
// deploy/README.md's Alerts section.
func TestAlertsAreDocumented(t *testing.T) {
	for file, heading := range map[string]string{"../../README.md": "## Operating it", "../README.md": "## Alerts"} {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		_, section, ok := strings.Cut(string(b), "\n"+heading+"\n")
		if !ok {
			t.Errorf("%s has no %q section", file, heading)
			continue
		}
		section, _, _ = strings.Cut(section, "\n## ")
		for name := range alerts(t) {
			if !strings.Contains(section, "`"+name+"`") {
				t.Errorf("%s, %s: alert %s is not listed", file, heading, name)
			}
		}
	}
}
