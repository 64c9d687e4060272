package policy

import (
	"strings"
	"testing"

	"github.com/sys1hq/sys1/contract"
)

// fakeRisk is a risk fit certifying threshold t for max_error up to certified (none above).
type fakeRisk struct {
	t, certified            float64
	probability, calibrated bool
}

func (f fakeRisk) RiskThreshold(maxError float64) (float64, bool) {
	if maxError < f.certified {
		return 0, false
	}
	return f.t, true
}
func (f fakeRisk) RiskValue() (bool, bool) { return f.probability, f.calibrated }
func (f fakeRisk) RiskLabel() string       { return "fit of 2026-12-01, n 2,000" }

func withRisk(in *Input, fits ...RiskFit) *Input {
	in.Risk = fits
	return in
}

// A max_error rule decides and abstains by the threshold its fit certified, says which fit in
// its reason, and abstains (fail safe) without a fit or a threshold for its max_error.
func TestMaxError(t *testing.T) {
	p := mustParse(t, "rules:\n  - name: guaranteed\n    max_error: 0.02\n")
	fit := fakeRisk{t: 0.66, certified: 0.02}
	choice := q("label", contract.TypeChoice)
	for _, c := range []struct {
		in   *Input
		want want
	}{
		{withRisk(single(choice, choiceA("label", "a", f64(0.61), pr("a", 0.7), pr("b", 0.3))), fit),
			want{contract.VerdictAbstained, "guaranteed", "confidence 0.61 < 0.66 (max_error 0.02, fit of 2026-12-01, n 2,000)", contract.ReviewNotify}},
		{withRisk(single(choice, choiceA("label", "a", f64(0.71), pr("a", 0.7), pr("b", 0.3))), fit),
			want{contract.VerdictDecided, "guaranteed", "confidence 0.71 >= 0.66 (max_error 0.02, fit of 2026-12-01, n 2,000)", ""}},
		// The threshold itself decides (min semantics); 0.6599 is shown apart from 0.66.
		{withRisk(single(choice, choiceA("label", "a", f64(0.66))), fit),
			want{contract.VerdictDecided, "guaranteed", "confidence 0.66 >= 0.66 (max_error 0.02, fit of 2026-12-01, n 2,000)", ""}},
		{withRisk(single(choice, choiceA("label", "a", f64(0.6599))), fit),
			want{contract.VerdictAbstained, "guaranteed", "confidence 0.6599 < 0.6600 (max_error 0.02, fit of 2026-12-01, n 2,000)", contract.ReviewNotify}},
		// No fit: fail safe.
		{single(choice, choiceA("label", "a", f64(0.99))),
			want{contract.VerdictAbstained, "guaranteed", "no risk fit (max_error 0.02)", contract.ReviewNotify}},
		{withRisk(single(choice, choiceA("label", "a", f64(0.99))), nil),
			want{contract.VerdictAbstained, "guaranteed", "no risk fit (max_error 0.02)", contract.ReviewNotify}},
		// A fit that certified nothing for 0.02 (abstain all, or only looser targets).
		{withRisk(single(choice, choiceA("label", "a", f64(0.99))), fakeRisk{t: 0.5, certified: 0.05}),
			want{contract.VerdictAbstained, "guaranteed", "max_error 0.02 is met at no threshold (fit of 2026-12-01, n 2,000)", contract.ReviewNotify}},
		// On the top probability, and on calibrated values when the fit says so.
		{withRisk(single(choice, choiceA("label", "a", f64(0.99), pr("a", 0.6), pr("b", 0.4))), fakeRisk{t: 0.66, certified: 0.02, probability: true}),
			want{contract.VerdictAbstained, "guaranteed", "probability of the chosen option 0.60 < 0.66 (max_error 0.02, fit of 2026-12-01, n 2,000)", contract.ReviewNotify}},
		{withRisk(single(q("s", contract.TypeScore), scoreA("s", f64(0.9), 0.1, 0.7, 0.2)), fakeRisk{t: 0.66, certified: 0.02, probability: true}),
			want{contract.VerdictDecided, "guaranteed", "probability of the most probable level 0.70 >= 0.66 (max_error 0.02, fit of 2026-12-01, n 2,000)", ""}},
		// Calibrated without calibrated values (no temperature applied to this answer): the
		// figure is missing, so it abstains.
		{withRisk(single(choice, choiceA("label", "a", f64(0.99))), fakeRisk{t: 0.66, certified: 0.02, calibrated: true}),
			want{contract.VerdictAbstained, "guaranteed", "calibrated confidence not reported (threshold 0.66, max_error 0.02, fit of 2026-12-01, n 2,000)", contract.ReviewNotify}},
		// Noul: max(P, 1 − P) against the threshold, either way round.
		{withRisk(single(q("n", contract.TypeNoul), noulA("n", 0.2)), fit),
			want{contract.VerdictDecided, "guaranteed", "max(P(yes), 1 − P(yes)) 0.80 >= 0.66 (max_error 0.02, fit of 2026-12-01, n 2,000)", ""}},
		{withRisk(single(q("n", contract.TypeNoul), noulA("n", 0.6)), fit),
			want{contract.VerdictAbstained, "guaranteed", "max(P(yes), 1 − P(yes)) 0.60 < 0.66 (max_error 0.02, fit of 2026-12-01, n 2,000)", contract.ReviewNotify}},
		{withRisk(single(choice, choiceA("label", "a", nil)), fit),
			want{contract.VerdictAbstained, "guaranteed", "confidence not reported (threshold 0.66, max_error 0.02, fit of 2026-12-01, n 2,000)", contract.ReviewNotify}},
	} {
		check1(t, p.Evaluate(c.in), c.want)
	}

	// With calibrated values, the calibrated figure is compared and named.
	in := withRisk(single(choice, choiceA("label", "a", f64(0.99))), fakeRisk{t: 0.66, certified: 0.02, calibrated: true})
	in.Calibrated = []*contract.Calibrated{{Confidence: f64(0.5), Temperature: 2}}
	check1(t, p.Evaluate(in), want{contract.VerdictAbstained, "guaranteed", "calibrated confidence 0.50 < 0.66 (max_error 0.02, fit of 2026-12-01, n 2,000)", contract.ReviewNotify})

	// Beside min_confidence: both must pass, and an abstention names what failed.
	p = mustParse(t, "rules:\n  - name: both\n    min_confidence: 0.8\n    max_error: 0.02\n    review: hold\n")
	check1(t, p.Evaluate(withRisk(single(choice, choiceA("label", "a", f64(0.7))), fit)),
		want{contract.VerdictAbstained, "both", "confidence 0.70 < 0.80", contract.ReviewHold})
	check1(t, p.Evaluate(withRisk(single(choice, choiceA("label", "a", f64(0.9))), fit)),
		want{contract.VerdictDecided, "both", "confidence 0.90 >= 0.80, confidence 0.90 >= 0.66 (max_error 0.02, fit of 2026-12-01, n 2,000)", ""})
}

func TestMaxErrorParse(t *testing.T) {
	p := mustParse(t, "rules:\n  - name: g\n    max_error: 0.02\n    audit_sample: 0.05\n")
	r := p.Rules()[0]
	if r.MaxError == nil || *r.MaxError != 0.02 || !r.forChoiceScore || !r.forNoul {
		t.Errorf("rule %+v", r)
	}
	for src, want := range map[string]string{
		"rules:\n  - name: g\n    max_error: 0\n":                  `max_error: 0 is not in (0, 1)`,
		"rules:\n  - name: g\n    max_error: 1\n":                  `max_error: 1 is not in (0, 1)`,
		"rules:\n  - name: g\n    max_error: 1.5\n":                `max_error: 1.5 is not in [0, 1]`,
		"rules:\n  - name: g\n    max_error: \"0.02\"\n":           `max_error: must be a number in [0, 1]`,
		"rules:\n  - name: g\n    max_error: 0.02\n    use: raw\n": `use: has no effect: max_error compares the values its risk fit was made on`,
		"rules:\n  - name: g\n    max_eror: 0.02\n":                `did you mean max_error?`,
	} {
		_, err := Parse([]byte(src))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", src, err, want)
		}
	}
}

// Decided answers carry the audit share of their rule, sampled or not; abstained ones and
// rules without audit_sample carry none.
func TestAuditShareOnDecidedVerdicts(t *testing.T) {
	p := mustParse(t, "rules:\n  - name: plain\n    question: other\n    min_confidence: 0.5\n  - name: r\n    min_confidence: 0.5\n    audit_sample: 0.05\n")
	decided := p.Evaluate(single(q("label", contract.TypeChoice), choiceA("label", "a", f64(0.9))))
	abstained := p.Evaluate(single(q("label", contract.TypeChoice), choiceA("label", "a", f64(0.1))))
	plain := p.Evaluate(single(q("other", contract.TypeChoice), choiceA("other", "a", f64(0.9))))
	if decided.Verdicts[0].AuditShare != 0.05 || abstained.Verdicts[0].AuditShare != 0 || plain.Verdicts[0].AuditShare != 0 {
		t.Errorf("audit shares: decided %v, abstained %v, rule without audits %v", decided.Verdicts[0].AuditShare, abstained.Verdicts[0].AuditShare, plain.Verdicts[0].AuditShare)
	}
}
