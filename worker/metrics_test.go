package worker_test

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/worker/client"
	"github.com/sys1hq/sys1/worker/metricstest"
)

// documentedMetrics returns the metric names with prefix that deploy/README.md lists under
// "Health and metrics".
func documentedMetrics(t *testing.T, prefix string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "deploy", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "## Health and metrics")
	if !ok {
		t.Fatal("deploy/README.md has no Health and metrics section")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	names := regexp.MustCompile(regexp.QuoteMeta(prefix)+`[a-z_]+`).FindAllString(section, -1)
	slices.Sort(names)
	return slices.Compact(names)
}

// TestMetricsAreValidExpositionAndDocumented: /metrics is strict Prometheus text format (with
// a replica id that needs escaping: SYS1_WORKER_ID is free text) and serves exactly the
// families deploy/README.md documents.
func TestMetricsAreValidExpositionAndDocumented(t *testing.T) {
	h := newHarness(t)
	id := "replica \"a\"\\b\tc"
	r := h.start(func(o *replicaOpts) { o.cfg.ID = id })
	if rep := h.decide("svc-a", []byte(ticket), func(r *client.Request) { r.RunID = "metrics-1" }); rep.Status != contract.StatusSuccess {
		t.Fatalf("reply %s", rep.Raw)
	}
	var out strings.Builder
	r.w.WriteMetrics(&out)
	fams, err := metricstest.Parse(out.String())
	if err != nil {
		t.Fatalf("/metrics is not valid Prometheus text:\n%v\n%s", err, out.String())
	}
	var served []string
	for _, f := range fams {
		served = append(served, f.Name)
		for _, s := range f.Samples {
			if s.Labels["worker"] != id {
				t.Errorf("%s: worker label %q, want %q", f.Name, s.Labels["worker"], id)
			}
		}
		if f.Name == "sys1_worker_provider_calls_total" && f.Samples[0].Value != 1 {
			t.Errorf("provider calls = %v, want 1", f.Samples[0].Value)
		}
	}
	slices.Sort(served)
	if docs := documentedMetrics(t, "sys1_worker_"); !slices.Equal(served, docs) {
		t.Errorf("served families %v\ndeploy/README.md documents %v", served, docs)
	}
}
