package worker_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/worker/client"
	"github.com/sys1hq/sys1/worker/metrics"
	"github.com/sys1hq/sys1/worker/metricstest"
)

// scrape GETs /metrics from the replica's handler.
func scrape(t *testing.T, r *replica) string {
	t.Helper()
	srv := httptest.NewServer(r.w.Handler())
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/metrics: HTTP %d\n%s", resp.StatusCode, b)
	}
	return string(b)
}

// value is the sample of name whose labels include want; fails when there is none.
func value(t *testing.T, fams []metricstest.Family, name string, want map[string]string) float64 {
	t.Helper()
	for _, f := range fams {
		for _, s := range f.Samples {
			if s.Name != name {
				continue
			}
			match := true
			for k, v := range want {
				match = match && s.Labels[k] == v
			}
			if match {
				return s.Value
			}
		}
	}
	t.Fatalf("no sample %s%v", name, want)
	return 0
}

// TestMetricsAreValidExpositionAndDocumented: /metrics is strict Prometheus text format (with
// a replica id that needs escaping: SYS1_WORKER_ID is free text), passes promlint, and every
// family it serves or defines is documented in deploy/README.md (and nothing documented is
// gone). One run shows up in the families that count it.
func TestMetricsAreValidExpositionAndDocumented(t *testing.T) {
	h := newHarness(t)
	id := "replica \"a\"\\b\tc"
	r := h.start(func(o *replicaOpts) { o.cfg.ID = id })
	if rep := h.decide("svc-a", []byte(ticket), func(r *client.Request) { r.RunID = "metrics-1" }); rep.Status != contract.StatusSuccess {
		t.Fatalf("reply %s", rep.Raw)
	}
	if rep := h.decide("svc-a", []byte(`{"model":"nimble"}`)); rep.Status != contract.StatusFailed {
		t.Fatalf("reply %s", rep.Raw)
	}
	waitFor(t, "both runs counted", 10*time.Second, func() bool { s := r.w.Stats(); return s.Succeeded+s.Failed == 2 })
	text := scrape(t, r)
	if err := metricstest.Check(r.w.Gatherer(), text, filepath.Join("..", "deploy", "README.md"), "sys1_worker_", r.w.MetricFamilies()); err != nil {
		t.Fatalf("%v\n%s", err, text)
	}
	fams, _ := metricstest.Parse(text)
	for _, f := range fams {
		for _, s := range f.Samples {
			if strings.HasPrefix(f.Name, "sys1_worker_") && s.Labels["worker"] != id {
				t.Errorf("%s: worker label %q, want %q", s.Name, s.Labels["worker"], id)
			}
		}
	}
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"sys1_worker_runs_total", map[string]string{"status": "success", "error_code": "", "provider": "ollama", "model": "nimble"}, 1},
		{"sys1_worker_runs_total", map[string]string{"status": "failed", "error_code": "SYS1_INVALID_INPUT", "provider": "", "model": ""}, 1},
		{"sys1_worker_attempts_total", map[string]string{"provider": "ollama", "outcome": "ok"}, 1},
		{"sys1_worker_provider_calls_total", map[string]string{"provider": "ollama"}, 1},
		{"sys1_worker_provider_latency_seconds_count", map[string]string{"provider": "ollama"}, 1},
		{"sys1_worker_queue_wait_seconds_count", map[string]string{"consumer": "sys1-worker"}, 2},
		{"sys1_worker_run_duration_seconds_count", map[string]string{"status": "success"}, 1},
		{"sys1_worker_stage_duration_seconds_count", map[string]string{"stage": "admit"}, 2},
		{"sys1_worker_stage_duration_seconds_count", map[string]string{"stage": "call"}, 1},
		{"sys1_worker_stage_duration_seconds_count", map[string]string{"stage": "publish"}, 2},
		{"sys1_worker_provider_concurrency_limit", map[string]string{"provider": "ollama"}, 4},
		{"sys1_worker_provider_in_flight", map[string]string{"provider": "ollama"}, 0},
		{"sys1_worker_provider_in_flight_peak", nil, 1},
		{"sys1_worker_provider_routes", map[string]string{"provider": "ollama", "state": "closed"}, 1},
		{"sys1_worker_provider_routes", map[string]string{"provider": "ollama", "state": "open"}, 0},
		{"sys1_worker_provider_routes", map[string]string{"provider": "ollama", "state": "half_open"}, 0},
		{"sys1_worker_provider_routes", map[string]string{"provider": "ollama", "state": "absent"}, 0},
		{"sys1_worker_paused", nil, 0},
		{"sys1_worker_replays_total", nil, 0},
	} {
		if got := value(t, fams, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if strings.Contains(text, "metrics-1") {
		t.Error("a run id is a label value: unbounded cardinality")
	}
}

// The caller becomes a label of runs only when asked for.
func TestMetricsCallerLabel(t *testing.T) {
	h := newHarness(t)
	r := h.start(func(o *replicaOpts) { o.callerLabel = true })
	if rep := h.decide("svc-a", []byte(ticket)); rep.Status != contract.StatusSuccess {
		t.Fatalf("reply %s", rep.Raw)
	}
	waitFor(t, "the run counted", 10*time.Second, func() bool { return r.w.Stats().Succeeded == 1 })
	fams, err := metricstest.Parse(scrape(t, r))
	if err != nil {
		t.Fatal(err)
	}
	if got := value(t, fams, "sys1_worker_runs_total", map[string]string{"status": "success", "caller": "svc-a"}); got != 1 {
		t.Errorf("runs by caller = %v", got)
	}
	// Without the option there is no caller label at all.
	r2 := h.start(func(o *replicaOpts) { o.cfg.ID = "no-caller" })
	_ = r2
	for _, f := range r2.w.MetricFamilies() {
		if f.Name == "sys1_worker_runs_total" && strings.Contains(strings.Join(f.Labels, ","), "caller") {
			t.Errorf("runs_total has a caller label by default: %v", f.Labels)
		}
	}
}

// A second replica on the same process registry is told apart by its worker label.
func TestReplicasShareOneRegistry(t *testing.T) {
	h := newHarness(t)
	reg := metrics.NewRegistry()
	h.start(func(o *replicaOpts) { o.cfg.ID = "a"; o.registry = reg })
	h.start(func(o *replicaOpts) { o.cfg.ID = "b"; o.registry = reg })
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, f := range fams {
		if f.GetName() == "sys1_worker_in_flight" {
			for _, m := range f.GetMetric() {
				for _, l := range m.GetLabel() {
					seen[l.GetValue()] = true
				}
			}
		}
		if strings.HasPrefix(f.GetName(), "go_") {
			seen["go"] = true
		}
	}
	if !seen["a"] || !seen["b"] || !seen["go"] {
		t.Errorf("registry has %v, want replicas a and b and the Go collector", seen)
	}
}
