package risk

import (
	"testing"

	"github.com/sys1hq/sys1/worker/calibration/synthetic"
)

// BenchmarkRiskFit2000 is one risk fit of the acceptance scenario's 2,000 labels (two strata),
// the whole curve included: what `sys1 calibrate --target-error` spends per question.
func BenchmarkRiskFit2000(b *testing.B) {
	answers, _ := synthetic.DefaultTraffic.Labels(scenarioLabels, scenarioMinConf, scenarioAuditShare, 1)
	labels := make([]Label, len(answers))
	for i, a := range answers {
		w := 1.0
		if a.Audit {
			w = 1 / scenarioAuditShare
		}
		labels[i] = Label{Value: a.Confidence, Wrong: a.Wrong, Weight: w}
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Fit(labels, Options{Target: scenarioTarget, Delta: scenarioDelta}); err != nil {
			b.Fatal(err)
		}
	}
}
