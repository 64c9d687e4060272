package metrics

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// The fits' families: one series per stored fit, only the figures it has.
func TestFitFamilies(t *testing.T) {
	est, lo, hi, cov, abst, ece := 0.031, 0.014, 0.058, 0.84, 0.16, 0.021
	at := time.Unix(1_796_000_000, 0)
	readings := []FitReading{
		{Model: "nimble", Caller: "billing", Question: "label", Temperature: 1.4, TemperatureApplied: true, FitECE: 0.012,
			HasRisk: true, TargetError: 0.05, Threshold: 0.466, FitCoverage: 0.951,
			Evaluated: at, Audits: 209, DecidedError: &est, Lower: &lo, Upper: &hi, Coverage: &cov, AbstentionRate: &abst, RecentLabels: 412, RecentECE: &ece},
		// A fit that abstains on everything, its temperature not applied, never evaluated.
		{Model: "nimble", Caller: "billing", Question: "wrong", Temperature: 1, FitECE: 0.8, HasRisk: true, TargetError: 0.1, AbstainAll: true},
	}
	zero := func() float64 { return 0 }
	reg := prometheus.NewRegistry()
	if _, err := NewWorker(WorkerOptions{Replica: "w", InFlight: zero, ProviderPeak: zero, Redeliveries: zero, Replays: zero, DeadLetters: zero, Orphans: zero, Paused: zero,
		Providers: func() []ProviderState { return nil }, Fits: func() []FitReading { return readings },
		Streams: func() []StreamState { return nil }, QuotaAtLimit: func() map[string]int { return nil }, Queues: func() []QueueState { return nil }}, reg); err != nil {
		t.Fatal(err)
	}
	want := `
# HELP sys1_worker_risk_decided_error Error of the decided answers estimated from audit samples alone at the latest evaluation (weighted by their shares: unbiased).
# TYPE sys1_worker_risk_decided_error gauge
sys1_worker_risk_decided_error{caller="billing",model="nimble",question="label",worker="w"} 0.031
# HELP sys1_worker_risk_threshold The risk fit's threshold for its target (absent when it abstains on every answer).
# TYPE sys1_worker_risk_threshold gauge
sys1_worker_risk_threshold{caller="billing",model="nimble",question="label",worker="w"} 0.466
# HELP sys1_worker_risk_abstain_all 1 when the risk fit found no threshold meeting its target (max_error rules abstain on everything), else 0.
# TYPE sys1_worker_risk_abstain_all gauge
sys1_worker_risk_abstain_all{caller="billing",model="nimble",question="label",worker="w"} 0
sys1_worker_risk_abstain_all{caller="billing",model="nimble",question="wrong",worker="w"} 1
# HELP sys1_worker_calibration_temperature The temperature T this replica applies to the question's answers (absent when it applies none).
# TYPE sys1_worker_calibration_temperature gauge
sys1_worker_calibration_temperature{caller="billing",model="nimble",question="label",worker="w"} 1.4
# HELP sys1_worker_calibration_evaluated_timestamp_seconds When the latest evaluation (sys1 calibrate --report --apply) ran, in Unix seconds.
# TYPE sys1_worker_calibration_evaluated_timestamp_seconds gauge
sys1_worker_calibration_evaluated_timestamp_seconds{caller="billing",model="nimble",question="label",worker="w"} 1.796e+09
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "sys1_worker_risk_decided_error", "sys1_worker_risk_threshold", "sys1_worker_risk_abstain_all",
		"sys1_worker_calibration_temperature", "sys1_worker_calibration_evaluated_timestamp_seconds"); err != nil {
		t.Error(err)
	}
	// Every family of the evaluated fit (15), three of the other (fit ECE, target, abstain
	// all), the seven readings of the replica itself and the three kinds of quota refusals (every
	// kind a series from the start).
	if n, err := testutil.GatherAndCount(reg); err != nil || n != 15+3+7+3 {
		t.Errorf("%d series, want 28 (%v)", n, err)
	}
	for name, want := range map[string]int{"sys1_worker_risk_decided_error_lower": 1, "sys1_worker_risk_fit_coverage": 1, "sys1_worker_calibration_fit_ece": 2, "sys1_worker_risk_target_error": 2, "sys1_worker_calibration_recent_labels": 1} {
		if n, err := testutil.GatherAndCount(reg, name); err != nil || n != want {
			t.Errorf("%s: %d series, want %d (%v)", name, n, want, err)
		}
	}
}
