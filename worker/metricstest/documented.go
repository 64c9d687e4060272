package metricstest

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sys1hq/sys1/worker/metrics"
)

// MetricsSection is the heading of deploy/README.md under which every metric is documented.
const MetricsSection = "## Health and metrics"

// Standard prefixes: the client library's Go runtime and process collectors, documented as
// families of their own rather than one by one.
var standardPrefixes = []string{"go_", "process_"}

var documentedName = regexp.MustCompile("`((?:sys1|go|process)_[a-z0-9_]*\\*?)`")

// Documented returns the metric names deploy/README.md's metrics section lists in backticks:
// exact sys1_* names, and the go_* and process_* families (written `go_*`, `process_*`).
func Documented(readme string) (map[string]bool, error) {
	b, err := os.ReadFile(readme)
	if err != nil {
		return nil, err
	}
	_, section, ok := strings.Cut(string(b), MetricsSection+"\n")
	if !ok {
		return nil, fmt.Errorf("%s has no %q section", readme, MetricsSection)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	out := map[string]bool{}
	for _, m := range documentedName.FindAllStringSubmatch(section, -1) {
		out[m[1]] = true
	}
	return out, nil
}

// IsDocumented reports whether family name is in docs: by name, or by its standard prefix.
func IsDocumented(docs map[string]bool, name string) bool {
	if docs[name] {
		return true
	}
	for _, p := range standardPrefixes {
		if strings.HasPrefix(name, p) && docs[p+"*"] {
			return true
		}
	}
	return false
}

// Check gathers g and reports every problem: an exposition that is not strict text format,
// a served family deploy/README.md does not document, a defined family (defined) it does not
// document, a documented sys1 family with prefix that no component defines (stale
// documentation), and what promlint finds in the sys1 families.
func Check(g prometheus.Gatherer, text string, readme, prefix string, defined []metrics.Family) error {
	var problems []string
	fams, err := Parse(text)
	if err != nil {
		problems = append(problems, "exposition: "+err.Error())
	}
	docs, err := Documented(readme)
	if err != nil {
		return err
	}
	for _, f := range fams {
		if !IsDocumented(docs, f.Name) {
			problems = append(problems, fmt.Sprintf("%s is served but not documented in %s", f.Name, readme))
		}
	}
	names := map[string]bool{}
	for _, f := range defined {
		names[f.Name] = true
		if !docs[f.Name] {
			problems = append(problems, fmt.Sprintf("%s is defined but not documented in %s", f.Name, readme))
		}
	}
	var stale []string
	for d := range docs {
		if strings.HasPrefix(d, prefix) && !names[d] {
			stale = append(stale, d)
		}
	}
	slices.Sort(stale)
	for _, d := range stale {
		problems = append(problems, fmt.Sprintf("%s is documented in %s but no longer defined", d, readme))
	}
	lint, err := testutil.GatherAndLint(g)
	if err != nil {
		problems = append(problems, "lint: "+err.Error())
	}
	for _, p := range lint {
		if strings.HasPrefix(p.Metric, "sys1_") {
			problems = append(problems, fmt.Sprintf("promlint: %s: %s", p.Metric, p.Text))
		}
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "\n"))
	}
	return nil
}
