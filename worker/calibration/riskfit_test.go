package calibration

import (
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/worker/calibration/synthetic"
)

// riskSamples turns synthetic choice answers into labelled samples of a policy that abstains
// below minConf (every abstention reviewed) and audits share of the rest.
func riskSamples(n int, distort, minConf, share float64, seed uint64) []RiskSample {
	var out []RiskSample
	for i, a := range synthetic.Generate(contract.TypeChoice, n, distort, seed) {
		s := Sample{Probs: a.Reported, Label: a.Label, Confidence: math.NaN()}
		c := normalisedConfidence(a.Reported)
		rs := RiskSample{Sample: s, Wrong: argmax(a.Reported) != a.Label, Kind: KindAbstention, Weight: 1}
		if c >= minConf {
			// Decided: only every 1/share-th is labelled (deterministically, for the test).
			if i%int(math.Round(1/share)) != 0 {
				continue
			}
			rs.Kind, rs.Weight = KindAudit, 1/share
		}
		out = append(out, rs)
	}
	return out
}

func TestRiskLabelWeights(t *testing.T) {
	review, both := Sources{Review: true}, Sources{Review: true, Producer: true}
	for _, c := range []struct {
		src             Sources
		source, verdict string
		share           float64
		kind            LabelKind
		weight          float64
		skip            SkipReason
	}{
		{review, "review", "abstained", 0, KindAbstention, 1, ""},
		{review, "review", "reviewed", 0, KindAbstention, 1, ""},
		{review, "review", "decided", 0.05, KindAudit, 20, ""},
		{review, "review", "decided", 0, "", 0, RiskSkipNoAuditShare},
		{review, "review", "", 0, "", 0, RiskSkipNoVerdict},
		{review, "producer", "decided", 0, "", 0, RiskSkipProducer},
		{both, "producer", "decided", 0, KindProducer, 1, ""},
		{Sources{Producer: true}, "review", "abstained", 0, "", 0, RiskSkipReview},
		{review, "robot", "decided", 0.05, "", 0, RiskSkipSource},
	} {
		kind, w, skip := RiskLabel(c.src, c.source, c.verdict, c.share)
		if kind != c.kind || w != c.weight || skip != c.skip {
			t.Errorf("%+v: got %q %v %q", c, kind, w, skip)
		}
	}
	for in, want := range map[string]Sources{"review": {Review: true}, "producer": {Producer: true}, "review, producer": {Review: true, Producer: true}} {
		if got, err := ParseSources(in); err != nil || got != want {
			t.Errorf("ParseSources(%q) = %+v, %v", in, got, err)
		}
	}
	for _, bad := range []string{"", "reviews", "review,", "all"} {
		if _, err := ParseSources(bad); err == nil {
			t.Errorf("ParseSources(%q) accepted", bad)
		}
	}
}

// A risk fit on synthetic labels: made on calibrated values when a temperature is given, it
// stores and decodes with the fit, and answers max_error lookups from its curve.
func TestFitRiskStoredWithTheFit(t *testing.T) {
	samples := riskSamples(20000, 1, 0.5, 0.05, 4)
	now := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	r, err := FitRisk(contract.TypeChoice, samples, nil, 1.2, RiskOptions{TargetError: 0.2, Delta: 0.1, Sources: Sources{Review: true}, ThresholdOn: OnConfidence, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	if r.AbstainAll || !r.Calibrated || r.Bound > 0.2 || r.Error >= r.Bound || r.Labels["audit"] == 0 || r.Labels["abstention"] == 0 || r.N != len(samples) {
		t.Fatalf("risk %+v", r)
	}
	if got := r.RiskLabel(); got != "fit of 2026-12-01, n "+thousands(len(samples)) {
		t.Errorf("label %q", got)
	}
	if th, ok := r.RiskThreshold(0.2); !ok || th != r.Threshold {
		t.Errorf("RiskThreshold(target) = %v %v", th, ok)
	}
	// Looser targets never get stricter thresholds; a target below every bound gets none.
	prev := r.Threshold
	for _, e := range []float64{0.25, 0.3, 0.4} {
		th, ok := r.RiskThreshold(e)
		if !ok || th > prev {
			t.Errorf("RiskThreshold(%v) = %v %v (after %v)", e, th, ok, prev)
		}
		prev = th
	}
	if _, ok := r.RiskThreshold(0.001); ok {
		t.Error("a threshold for 0.001")
	}
	if p, c := r.RiskValue(); p || !c {
		t.Errorf("RiskValue %v %v", p, c)
	}

	f := Fit{Format: FormatVersion, Model: "m", Caller: "c", Question: "q", Type: contract.TypeChoice, Temperature: 1.2, N: 10, Converged: true,
		ThresholdOn: OnConfidence, FittedAt: now, Risk: r}
	b, err := Encode(&f)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Decode(f.Key(), b)
	if err != nil {
		t.Fatal(err)
	}
	if got.Risk == nil || got.Risk.Threshold != r.Threshold || got.Risk.RiskLabel() != r.RiskLabel() || len(got.Risk.Curve) != len(r.Curve) {
		t.Errorf("decoded risk %+v", got.Risk)
	}
	// A calibrated risk fit whose temperature is not applied is refused.
	f.Converged = false
	if _, err := Encode(&f); err == nil || !strings.Contains(err.Error(), "not converge") {
		t.Errorf("calibrated risk without a converged temperature: %v", err)
	}
	// A fit of the previous format (no risk part) still decodes.
	var old map[string]any
	_ = json.Unmarshal(b, &old)
	delete(old, "risk")
	ob, _ := json.Marshal(old)
	if f, err := Decode(f.Key(), ob); err != nil || f.Risk != nil {
		t.Errorf("a fit without risk: %v", err)
	}
}

// The bad inputs of issue 25, each with its message.
func TestFitRiskBadInput(t *testing.T) {
	o := RiskOptions{TargetError: 0.05, Delta: 0.1, Sources: Sources{Review: true}, ThresholdOn: OnConfidence}
	samples := riskSamples(20000, 1, 0.5, 0.05, 4)
	noFit := func(err error, reason NoFitReason, want string) {
		t.Helper()
		var nf *NoFitError
		if !errors.As(err, &nf) || nf.Reason != reason || !strings.Contains(nf.Message, want) {
			t.Errorf("%v: want %s, %q", err, reason, want)
		}
	}
	_, err := FitRisk(contract.TypeChoice, samples[:30], nil, 0, o)
	noFit(err, NoFitTooFewLabels, "30 usable labels for a threshold, at least 50 needed")
	var abstentions []RiskSample
	for _, s := range samples {
		if s.Kind == KindAbstention {
			abstentions = append(abstentions, s)
		}
	}
	_, err = FitRisk(contract.TypeChoice, abstentions, map[SkipReason]int{RiskSkipProducer: 3}, 0, o)
	noFit(err, NoFitNoAudits, "no audit samples among the")
	noFit(err, NoFitNoAudits, "left out: 3 producer label")
	_, err = FitRisk(contract.TypeChoice, nil, nil, 0, o)
	noFit(err, NoFitNoRiskLabels, "no review labels")
	for _, eps := range []float64{0, 1, -0.1, 1.5} {
		bad := o
		bad.TargetError = eps
		if _, err := FitRisk(contract.TypeChoice, samples, nil, 0, bad); err == nil || !strings.Contains(err.Error(), "must be in (0, 1)") {
			t.Errorf("target %v: %v", eps, err)
		}
	}
	// All correct and all wrong: fits, with a note saying what to check.
	right, wrong := append([]RiskSample(nil), samples...), append([]RiskSample(nil), samples...)
	for i := range right {
		right[i].Wrong, wrong[i].Wrong = false, true
	}
	r, err := FitRisk(contract.TypeChoice, right, nil, 0, o)
	if err != nil || r.AbstainAll || len(r.Notes) != 1 || !strings.Contains(r.Notes[0], "agree with the answers") {
		t.Errorf("all correct: %+v %v", r, err)
	}
	r, err = FitRisk(contract.TypeChoice, wrong, nil, 0, o)
	if err != nil || !r.AbstainAll || len(r.Notes) != 1 || !strings.Contains(r.Notes[0], "disagree with the answers") {
		t.Errorf("all wrong: %+v %v", r, err)
	}
	if _, ok := r.RiskThreshold(0.05); ok {
		t.Error("abstain all gave a threshold")
	}
	// Producer labels only: weighed 1, no audits needed, and said.
	prod := append([]RiskSample(nil), samples...)
	for i := range prod {
		prod[i].Kind, prod[i].Weight = KindProducer, 1
	}
	r, err = FitRisk(contract.TypeChoice, prod, nil, 0, RiskOptions{TargetError: 0.2, Delta: 0.1, Sources: Sources{Producer: true}, ThresholdOn: OnConfidence})
	if err != nil || len(r.Notes) != 1 || !strings.Contains(r.Notes[0], "their sampling is unknown") {
		t.Errorf("producer labels: %+v %v", r, err)
	}
}

// The value a fit thresholds is the one the worker's policy compares: Apply's calibrated
// confidence and probabilities, the reported confidence raw, max(P, 1 − P) for noul.
func TestThresholdValueMatchesApply(t *testing.T) {
	probs := []float64{0.6, 0.3, 0.1}
	a := &contract.Answer{Type: contract.TypeChoice, Choice: "a", Probabilities: []contract.Probability{{Key: "a", P: 0.6}, {Key: "b", P: 0.3}, {Key: "c", P: 0.1}}}
	c, _ := ApplyTemperature(1.7, a)
	var buf []float64
	s := Sample{Probs: probs, Confidence: 0.42}
	if v := thresholdValue(contract.TypeChoice, s, true, 1/1.7, OnConfidence, &buf); v != *c.Confidence {
		t.Errorf("calibrated confidence %v, Apply's %v", v, *c.Confidence)
	}
	if v := thresholdValue(contract.TypeChoice, s, true, 1/1.7, OnProbability, &buf); v != c.Probabilities[0].P {
		t.Errorf("calibrated probability %v, Apply's %v", v, c.Probabilities[0].P)
	}
	if v := thresholdValue(contract.TypeChoice, s, false, 1, OnConfidence, &buf); v != 0.42 {
		t.Errorf("raw confidence %v, want the reported 0.42", v)
	}
	n := &contract.Answer{Type: contract.TypeNoul, Noul: 0.3}
	cn, _ := ApplyTemperature(0.8, n)
	if v := thresholdValue(contract.TypeNoul, Sample{Probs: []float64{0.7, 0.3}}, true, 1/0.8, OnConfidence, &buf); v != math.Max(*cn.Noul, 1-*cn.Noul) {
		t.Errorf("noul %v, Apply's %v", v, *cn.Noul)
	}
}
