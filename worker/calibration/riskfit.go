package calibration

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/worker/calibration/risk"
)

// LabelKind is how a labelled answer came to be labelled, which sets its weight in a risk fit:
// the inverse of its chance of being labelled.
type LabelKind string

// The kinds.
const (
	// KindAbstention: an abstained answer, reviewed (every abstention under review notify or
	// hold goes to review): weight 1.
	KindAbstention LabelKind = "abstention"
	// KindAudit: a decided answer sampled for review with its rule's audit share s: weight 1/s.
	KindAudit LabelKind = "audit"
	// KindProducer: a producer's label (sys1.labels.<caller>), whose sampling sys1 does not
	// know: weight 1, as if producers labelled every kind of answer alike.
	KindProducer LabelKind = "producer"
)

// The reasons a labelled row is left out of a risk fit (it may still serve the temperature).
const (
	RiskSkipProducer     SkipReason = "producer label (--labels producer uses them)"
	RiskSkipReview       SkipReason = "review label (--labels review uses them)"
	RiskSkipNoVerdict    SkipReason = "review label of an answer without a verdict"
	RiskSkipNoAuditShare SkipReason = "audit label without its share (recorded before run records carried audit_share)"
	RiskSkipSource       SkipReason = "label of an unknown source"
)

// Sources chooses the labels a risk fit uses.
type Sources struct{ Review, Producer bool }

func (s Sources) String() string {
	switch {
	case s.Review && s.Producer:
		return "review,producer"
	case s.Producer:
		return "producer"
	}
	return "review"
}

// ParseSources reads --labels: a comma list of review and producer.
func ParseSources(v string) (Sources, error) {
	var s Sources
	for _, part := range splitList(v) {
		switch part {
		case "review":
			s.Review = true
		case "producer":
			s.Producer = true
		default:
			return Sources{}, fmt.Errorf("%q is not review or producer (a comma list of them)", part)
		}
	}
	if !s.Review && !s.Producer {
		return Sources{}, errors.New("empty: give review, producer or review,producer")
	}
	return s, nil
}

func splitList(v string) []string {
	parts := strings.Split(v, ",")
	for i := range parts {
		parts[i] = strings.TrimSpace(parts[i])
	}
	return parts
}

// RiskLabel classifies one labelled row for a risk fit from its label's source, the answer's
// verdict and its audit share, and returns its kind and weight; a row the fit cannot weigh
// is a SkipReason.
func RiskLabel(src Sources, source, verdict string, auditShare float64) (LabelKind, float64, SkipReason) {
	switch source {
	case contract.LabelSourceProducer:
		if !src.Producer {
			return "", 0, RiskSkipProducer
		}
		return KindProducer, 1, ""
	case contract.LabelSourceReview:
		if !src.Review {
			return "", 0, RiskSkipReview
		}
	default:
		return "", 0, RiskSkipSource
	}
	switch contract.VerdictStatus(verdict) {
	case contract.VerdictAbstained, contract.VerdictReviewed:
		return KindAbstention, 1, ""
	case contract.VerdictDecided:
		// Review items exist only for abstentions and audit samples: a reviewed decided
		// answer was an audit sample.
		if !(auditShare > 0 && auditShare <= 1) {
			return "", 0, RiskSkipNoAuditShare
		}
		return KindAudit, 1 / auditShare, ""
	}
	return "", 0, RiskSkipNoVerdict
}

// RiskSample is one labelled answer of a risk fit: the sample (its distribution and label),
// whether the answer was wrong, and its kind and weight.
type RiskSample struct {
	Sample
	Wrong  bool
	Kind   LabelKind
	Weight float64
}

// Risk is a risk fit (sys1 calibrate --target-error), stored in its Fit beside the temperature:
// the threshold with the largest coverage whose upper confidence bound on the error among the
// answers it decides is at most TargetError with probability at least 1 − Delta (see package
// risk for the method and what it guarantees). It implements policy.RiskFit.
type Risk struct {
	TargetError float64 `json:"target_error"`
	Delta       float64 `json:"delta"`
	// ThresholdOn is what the thresholds compare; Calibrated whether on calibrated values
	// (the fit's temperature applied) or raw ones.
	ThresholdOn ThresholdOn `json:"threshold_on"`
	Calibrated  bool        `json:"calibrated"`
	// AbstainAll: no threshold met TargetError; a max_error rule then abstains on everything.
	AbstainAll bool `json:"abstain_all"`
	// Threshold is the chosen threshold (0 when AbstainAll); Coverage the estimated share of
	// the traffic it decides, Error the estimated error among those, Bound its upper bound.
	Threshold float64 `json:"threshold"`
	Coverage  float64 `json:"coverage"`
	Error     float64 `json:"error"`
	Bound     float64 `json:"bound"`
	// Start and StartBound: the strictest threshold tested, and its bound.
	Start      float64 `json:"start"`
	StartBound float64 `json:"start_bound"`
	// N is the number of labels fitted, Labels their count per kind, Strata per weight.
	N      int            `json:"n"`
	Labels map[string]int `json:"labels"`
	Strata []risk.Stratum `json:"strata"`
	Curve  []risk.Point   `json:"curve,omitempty"`
	Notes  []string       `json:"notes,omitempty"`
	Skips  map[string]int `json:"skipped,omitempty"`
	At     time.Time      `json:"fitted_at"`
	// label is RiskLabel's text, prepared when the fit is made or decoded.
	label string
}

// RiskOptions set a risk fit.
type RiskOptions struct {
	TargetError, Delta float64
	Sources            Sources
	ThresholdOn        ThresholdOn
	// MinLabels is the fewest labels a fit is made from (DefaultMinLabels when 0).
	MinLabels int
	// Now is the fit's time (time.Now when zero).
	Now time.Time
}

// The reasons a group gets no risk fit.
const (
	NoFitNoAudits     NoFitReason = "no audit samples"
	NoFitRiskTooFew   NoFitReason = "too few labels to certify the target"
	NoFitNoRiskLabels NoFitReason = "no labels of the chosen sources"
)

// FitRisk fits the risk threshold of one group on the values a policy compares: calibrated
// with temperature T when T > 0 (a converged fit made on the same group), raw otherwise. It
// refuses (a *NoFitError) a group with fewer than MinLabels usable labels, one whose review
// labels hold abstentions but no audit sample (nothing then measures the error of the
// answers the policy decided), and one too small to certify the target at all. A group where
// no threshold meets the target gets a fit with AbstainAll. skipped counts the group's rows
// left out, per reason.
func FitRisk(typ contract.QuestionType, samples []RiskSample, skipped map[SkipReason]int, T float64, o RiskOptions) (*Risk, error) {
	if err := risk.CheckOptions(risk.Options{Target: o.TargetError, Delta: o.Delta}); err != nil {
		return nil, err
	}
	minLabels := o.MinLabels
	if minLabels <= 0 {
		minLabels = DefaultMinLabels
	}
	kinds := map[string]int{}
	for _, s := range samples {
		kinds[string(s.Kind)]++
	}
	switch {
	case len(samples) == 0:
		return nil, &NoFitError{Reason: NoFitNoRiskLabels, Message: fmt.Sprintf("no %s labels to fit a threshold to%s", o.Sources, riskSkippedNote(skipped))}
	case len(samples) < minLabels:
		return nil, &NoFitError{Reason: NoFitTooFewLabels, Message: fmt.Sprintf("%d usable labels for a threshold, at least %d needed (--min-labels)%s", len(samples), minLabels, riskSkippedNote(skipped))}
	case kinds[string(KindAbstention)] > 0 && kinds[string(KindAudit)] == 0 && kinds[string(KindProducer)] == 0:
		return nil, &NoFitError{Reason: NoFitNoAudits, Message: fmt.Sprintf("no audit samples among the %s labels (all are reviewed abstentions): nothing measures the error of the answers the policy decided; give the rule an audit_sample (e.g. 0.05), let the samples be labelled, and fit again%s", thousands(len(samples)), riskSkippedNote(skipped))}
	}
	calibrated := T > 0
	beta := 1.0
	if calibrated {
		beta = 1 / T
	}
	labels := make([]risk.Label, len(samples))
	buf := make([]float64, 0, 32)
	wrong := 0
	for i, s := range samples {
		v := thresholdValue(typ, s.Sample, calibrated, beta, o.ThresholdOn, &buf)
		labels[i] = risk.Label{Value: v, Wrong: s.Wrong, Weight: s.Weight}
		if s.Wrong {
			wrong++
		}
	}
	res, err := risk.Fit(labels, risk.Options{Target: o.TargetError, Delta: o.Delta})
	var re *risk.Error
	if errors.As(err, &re) && re.Reason == risk.ReasonTooFew {
		return nil, &NoFitError{Reason: NoFitRiskTooFew, Message: re.Message}
	}
	if err != nil {
		return nil, err
	}
	now := o.Now
	if now.IsZero() {
		now = time.Now()
	}
	r := &Risk{
		TargetError: o.TargetError, Delta: o.Delta, ThresholdOn: o.ThresholdOn, Calibrated: calibrated,
		AbstainAll: res.AbstainAll, Threshold: res.Threshold, Coverage: res.Coverage, Error: res.Error, Bound: res.Bound,
		Start: res.Start, StartBound: res.StartBound,
		N: res.N, Labels: kinds, Strata: res.Strata, Curve: res.Curve, At: now.UTC(),
	}
	if len(skipped) > 0 {
		r.Skips = map[string]int{}
		for k, n := range skipped {
			r.Skips[string(k)] = n
		}
	}
	switch wrong {
	case 0:
		r.Notes = append(r.Notes, fmt.Sprintf("all %s labels agree with the answers: the bound comes from their number alone; check that reviewers label without being led by the answer shown", thousands(len(samples))))
	case len(samples):
		r.Notes = append(r.Notes, fmt.Sprintf("all %s labels disagree with the answers: check that labels use the question's option keys (or true/false, or level indexes)", thousands(len(samples))))
	}
	if kinds[string(KindProducer)] > 0 {
		r.Notes = append(r.Notes, fmt.Sprintf("%s producer labels weigh 1 each: their sampling is unknown, so the guarantee assumes the producer labels every kind of answer alike", thousands(kinds[string(KindProducer)])))
	}
	r.prepare()
	return r, nil
}

// thresholdValue is what a policy threshold compares for one answer (see ThresholdOn):
// choice and score confidence or top probability, noul max(P, 1 − P); calibrated with 1/T =
// beta, as Apply computes it, or raw (the reported confidence when there is one).
func thresholdValue(typ contract.QuestionType, s Sample, calibrated bool, beta float64, on ThresholdOn, buf *[]float64) float64 {
	p := s.Probs
	if typ == contract.TypeNoul {
		pt := p[1]
		if calibrated {
			pt = scaleNoul(pt, beta)
		}
		return math.Max(pt, 1-pt)
	}
	if calibrated {
		*buf = append((*buf)[:0], p...)
		scaleInto(*buf, *buf, beta)
		p = *buf
	}
	if on == OnProbability {
		return p[argmax(p)]
	}
	if !calibrated && !math.IsNaN(s.Confidence) {
		return math.Min(1, math.Max(0, s.Confidence))
	}
	return normalisedConfidence(p)
}

func riskSkippedNote(skipped map[SkipReason]int) string {
	if len(skipped) == 0 {
		return ""
	}
	keys := make([]string, 0, len(skipped))
	for k := range skipped {
		keys = append(keys, string(k))
	}
	slices.Sort(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%d %s", skipped[SkipReason(k)], k)
	}
	return "; left out: " + strings.Join(parts, ", ")
}

// Validate checks what a worker relies on.
func (r *Risk) Validate() error {
	var errs []string
	if !(r.TargetError > 0 && r.TargetError < 1) {
		errs = append(errs, fmt.Sprintf("risk target_error %v is not in (0, 1)", r.TargetError))
	}
	if !(r.Delta > 0 && r.Delta < 1) {
		errs = append(errs, fmt.Sprintf("risk delta %v is not in (0, 1)", r.Delta))
	}
	if _, err := ParseThresholdOn(string(r.ThresholdOn)); err != nil {
		errs = append(errs, "risk threshold_on "+err.Error())
	}
	if !(r.Threshold >= 0 && r.Threshold <= 1) {
		errs = append(errs, fmt.Sprintf("risk threshold %v is not in [0, 1]", r.Threshold))
	}
	if !r.AbstainAll && !(r.Bound <= r.TargetError) {
		errs = append(errs, fmt.Sprintf("risk bound %v is above its target %v", r.Bound, r.TargetError))
	}
	for i, p := range r.Curve {
		if !(p.Threshold >= 0 && p.Threshold <= 1) || !(p.Bound > 0 && p.Bound < 1) ||
			(i > 0 && (p.Threshold >= r.Curve[i-1].Threshold || p.Bound <= r.Curve[i-1].Bound)) {
			errs = append(errs, fmt.Sprintf("risk curve point %d (%v, %v) is out of order or range", i, p.Threshold, p.Bound))
			break
		}
	}
	if r.N < 1 {
		errs = append(errs, "risk n is 0")
	}
	if len(errs) > 0 {
		return errors.New(strings.Join(errs, "; "))
	}
	return nil
}

// prepare makes the reason text once: evaluation names the fit in every max_error verdict.
func (r *Risk) prepare() { r.label = r.describe() }

func (r *Risk) describe() string {
	return "fit of " + r.At.UTC().Format("2006-01-02") + ", n " + thousands(r.N)
}

// thousands writes n with commas: 2,000.
func thousands(n int) string {
	s := strconv.Itoa(n)
	if n < 0 {
		return s
	}
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// RiskThreshold is the threshold certified for an error of at most maxError: the fit's own
// for its target, otherwise the lowest point of the curve whose bound is at most maxError.
func (r *Risk) RiskThreshold(maxError float64) (float64, bool) {
	if maxError == r.TargetError {
		return r.Threshold, !r.AbstainAll
	}
	// The curve's bounds rise as its thresholds fall: the last point within maxError.
	i, _ := slices.BinarySearchFunc(r.Curve, maxError, func(p risk.Point, m float64) int {
		if p.Bound <= m {
			return -1
		}
		return 1
	})
	if i == 0 {
		return 0, false
	}
	return r.Curve[i-1].Threshold, true
}

// RiskValue says what the thresholds compare (policy.RiskFit).
func (r *Risk) RiskValue() (probability, calibrated bool) {
	return r.ThresholdOn == OnProbability, r.Calibrated
}

// RiskLabel names the fit in a verdict's reason: "fit of 2026-12-01, n 2,000".
func (r *Risk) RiskLabel() string {
	if r.label == "" {
		return r.describe()
	}
	return r.label
}
