package sink

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/sys1hq/sys1/worker/metricstest"
)

// TestMetricsAreValidExpositionAndDocumented: the sink's /metrics part is strict Prometheus
// text format and serves exactly the families deploy/README.md documents.
func TestMetricsAreValidExpositionAndDocumented(t *testing.T) {
	s := &Sink{runs: &lane{}, labels: &lane{}}
	s.runs.inserted.Add(3)
	var out strings.Builder
	s.WriteMetrics(&out)
	fams, err := metricstest.Parse(out.String())
	if err != nil {
		t.Fatalf("/metrics is not valid Prometheus text:\n%v\n%s", err, out.String())
	}
	var served []string
	for _, f := range fams {
		served = append(served, f.Name)
	}
	slices.Sort(served)

	b, err := os.ReadFile(filepath.Join("..", "deploy", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, _ := strings.Cut(string(b), "## Health and metrics")
	section, _, _ = strings.Cut(section, "\n## ")
	docs := regexp.MustCompile(`sys1_sink_[a-z_]+`).FindAllString(section, -1)
	slices.Sort(docs)
	docs = slices.Compact(docs)
	if !slices.Equal(served, docs) {
		t.Errorf("served families %v\ndeploy/README.md documents %v", served, docs)
	}
}
