package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// FitReading is one stored calibration fit as a scrape sees it: its temperature, its risk
// threshold and the figures of its latest scheduled evaluation (sys1 calibrate --report
// --apply). Model, caller and question come from the fits stored in the calibration bucket —
// one per question someone fitted, never one per request — so they are bounded labels.
type FitReading struct {
	Model, Caller, Question string
	// Temperature is exported only when the worker applies it.
	Temperature        float64
	TemperatureApplied bool
	// FitECE is the ECE of the labels the fit learnt from, with the fit applied.
	FitECE float64

	// The risk fit, when HasRisk.
	HasRisk     bool
	TargetError float64
	AbstainAll  bool
	Threshold   float64
	FitCoverage float64

	// The latest evaluation, when Evaluated is not zero.
	Evaluated                  time.Time
	Audits                     int
	DecidedError, Lower, Upper *float64
	Coverage, AbstentionRate   *float64
	RecentLabels               int
	RecentECE                  *float64
}

// fitFamily is one gauge of the fits' families: its value for a reading, or false to leave the
// reading out.
type fitFamily struct {
	name, help string
	value      func(r *FitReading) (float64, bool)
}

var fitLabels = []string{"model", "caller", "question"}

func optional(p *float64) (float64, bool) {
	if p == nil {
		return 0, false
	}
	return *p, true
}

var fitFamilies = []fitFamily{
	{"sys1_worker_calibration_temperature", "The temperature T this replica applies to the question's answers (absent when it applies none).",
		func(r *FitReading) (float64, bool) { return r.Temperature, r.TemperatureApplied }},
	{"sys1_worker_calibration_fit_ece", "ECE (15 bins) of the labels the fit learnt from, with the fit applied.",
		func(r *FitReading) (float64, bool) { return r.FitECE, true }},
	{"sys1_worker_calibration_recent_ece", "ECE of the labels newer than the fit's, with the fit applied, at the latest evaluation (absent without such labels).",
		func(r *FitReading) (float64, bool) { return optional(r.RecentECE) }},
	{"sys1_worker_calibration_recent_labels", "Labels newer than the fit's at the latest evaluation (the recent ECE's sample).",
		func(r *FitReading) (float64, bool) { return float64(r.RecentLabels), !r.Evaluated.IsZero() }},
	{"sys1_worker_calibration_evaluated_timestamp_seconds", "When the latest evaluation (sys1 calibrate --report --apply) ran, in Unix seconds.",
		func(r *FitReading) (float64, bool) {
			return float64(r.Evaluated.UnixNano()) / 1e9, !r.Evaluated.IsZero()
		}},
	{"sys1_worker_risk_target_error", "The error rate among decided answers the risk fit guarantees (its --target-error).",
		func(r *FitReading) (float64, bool) { return r.TargetError, r.HasRisk }},
	{"sys1_worker_risk_threshold", "The risk fit's threshold for its target (absent when it abstains on every answer).",
		func(r *FitReading) (float64, bool) { return r.Threshold, r.HasRisk && !r.AbstainAll }},
	{"sys1_worker_risk_abstain_all", "1 when the risk fit found no threshold meeting its target (max_error rules abstain on everything), else 0.",
		func(r *FitReading) (float64, bool) { return b2f(r.AbstainAll), r.HasRisk }},
	{"sys1_worker_risk_fit_coverage", "The share of answers the risk fit's threshold was estimated to decide, on its labels.",
		func(r *FitReading) (float64, bool) { return r.FitCoverage, r.HasRisk && !r.AbstainAll }},
	{"sys1_worker_risk_decided_error", "Error of the decided answers estimated from audit samples alone at the latest evaluation (weighted by their shares: unbiased).",
		func(r *FitReading) (float64, bool) { return optional(r.DecidedError) }},
	{"sys1_worker_risk_decided_error_lower", "Lower end of the decided answers' error interval (1 - delta) at the latest evaluation.",
		func(r *FitReading) (float64, bool) { return optional(r.Lower) }},
	{"sys1_worker_risk_decided_error_upper", "Upper end of the decided answers' error interval (1 - delta) at the latest evaluation.",
		func(r *FitReading) (float64, bool) { return optional(r.Upper) }},
	{"sys1_worker_risk_audits", "Audit samples labelled in the latest evaluation's window.",
		func(r *FitReading) (float64, bool) { return float64(r.Audits), !r.Evaluated.IsZero() }},
	{"sys1_worker_risk_coverage", "Share of the question's judged answers the policy decided in the latest evaluation's window.",
		func(r *FitReading) (float64, bool) { return optional(r.Coverage) }},
	{"sys1_worker_risk_abstention_rate", "Share of the question's judged answers the policy abstained on in the latest evaluation's window.",
		func(r *FitReading) (float64, bool) { return optional(r.AbstentionRate) }},
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// registerFits adds the fits' families, read from fits at each scrape.
func (c *catalogue) registerFits(fits func() []FitReading) {
	descs := make([]*prometheus.Desc, len(fitFamilies))
	for i, f := range fitFamilies {
		descs[i] = prometheus.NewDesc(f.name, f.help, fitLabels, nil)
		c.families = append(c.families, Family{Name: f.name, Type: "gauge", Help: f.help, Labels: fitLabels})
	}
	c.register(&funcCollector{
		descs: descs,
		collect: func(ch chan<- prometheus.Metric) {
			readings := fits()
			for i := range readings {
				r := &readings[i]
				for j, f := range fitFamilies {
					if v, ok := f.value(r); ok {
						ch <- prometheus.MustNewConstMetric(descs[j], prometheus.GaugeValue, v, r.Model, r.Caller, r.Question)
					}
				}
			}
		},
	})
}
