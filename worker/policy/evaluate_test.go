package policy

import (
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/sys1hq/sys1/contract"
)

func f64(v float64) *float64 { return &v }

func mustParse(t testing.TB, src string) *Policy {
	t.Helper()
	p, err := Parse([]byte(src))
	if err != nil {
		t.Fatalf("parse: %v\n%s", err, src)
	}
	return p
}

func q(name string, typ contract.QuestionType) contract.Question {
	return contract.Question{Name: name, Type: typ}
}

// choice answers: the chosen key, confidence (nil: none) and the distribution.
func choiceA(name, choice string, conf *float64, probs ...contract.Probability) contract.Answer {
	return contract.Answer{Name: name, Type: contract.TypeChoice, Choice: choice, Confidence: conf, Probabilities: probs}
}

func noulA(name string, p float64) contract.Answer {
	return contract.Answer{Name: name, Type: contract.TypeNoul, Noul: p,
		Probabilities: []contract.Probability{{Key: "false", P: 1 - p}, {Key: "true", P: p}}}
}

func scoreA(name string, conf *float64, probs ...float64) contract.Answer {
	a := contract.Answer{Name: name, Type: contract.TypeScore, Confidence: conf}
	for i, p := range probs {
		a.Probabilities = append(a.Probabilities, contract.Probability{Key: fmt.Sprint(i), P: p})
		a.Score += float64(i) * p
	}
	return a
}

func pr(key string, p float64) contract.Probability { return contract.Probability{Key: key, P: p} }

// single builds the input of a one-question run.
func single(question contract.Question, answer contract.Answer) *Input {
	return &Input{RunID: "r-1", Caller: "svc", Model: "nimble",
		Questions: []contract.Question{question}, Answers: []contract.Answer{answer}}
}

type want struct {
	status contract.VerdictStatus
	rule   string
	reason string
	review string // "" none, else the mode
}

func check1(t *testing.T, out Outcome, w want) {
	t.Helper()
	if len(out.Verdicts) != 1 {
		t.Fatalf("%d verdicts", len(out.Verdicts))
	}
	v := out.Verdicts[0]
	if v.Status != w.status || v.Rule != w.rule || v.Reason != w.reason {
		t.Errorf("verdict %s / %q / %q, want %s / %q / %q", v.Status, v.Rule, v.Reason, w.status, w.rule, w.reason)
	}
	got := ""
	if len(out.Review) == 1 {
		got = out.Review[0].Mode
		if out.Review[0].Index != 0 || out.Review[0].Question != v.Question {
			t.Errorf("review %+v does not point at question 0", out.Review[0])
		}
	} else if len(out.Review) > 1 {
		t.Fatalf("%d review entries for one question", len(out.Review))
	}
	if got != w.review {
		t.Errorf("review %q, want %q", got, w.review)
	}
	if (w.review == contract.ReviewHold) != out.Hold() {
		t.Errorf("Hold() = %v", out.Hold())
	}
}

func TestThresholds(t *testing.T) {
	const confidence = "rules:\n  - name: conf\n    min_confidence: 0.5\n"
	const probability = "rules:\n  - name: prob\n    min_probability: 0.6\n"
	const both = "rules:\n  - name: both\n    min_confidence: 0.5\n    min_probability: 0.6\n"
	const band = "rules:\n  - name: band\n    noul_abstain_between: [0.3, 0.7]\n"
	choice, score, noul := q("label", contract.TypeChoice), q("sev", contract.TypeScore), q("refund", contract.TypeNoul)
	cases := []struct {
		name   string
		policy string
		in     *Input
		want   want
	}{
		{"confidence below", confidence, single(choice, choiceA("label", "bug", f64(0.31), pr("bug", 0.7))),
			want{contract.VerdictAbstained, "conf", "confidence 0.31 < 0.50", contract.ReviewNotify}},
		{"confidence above", confidence, single(choice, choiceA("label", "bug", f64(0.82), pr("bug", 0.7))),
			want{contract.VerdictDecided, "conf", "confidence 0.82 >= 0.50", ""}},
		{"confidence equal passes", confidence, single(choice, choiceA("label", "bug", f64(0.5))),
			want{contract.VerdictDecided, "conf", "confidence 0.50 >= 0.50", ""}},
		{"confidence just below shows the digits that differ", confidence, single(choice, choiceA("label", "bug", f64(0.4999))),
			want{contract.VerdictAbstained, "conf", "confidence 0.4999 < 0.5000", contract.ReviewNotify}},
		{"score confidence", confidence, single(score, scoreA("sev", f64(0.2), 0.5, 0.5)),
			want{contract.VerdictAbstained, "conf", "confidence 0.20 < 0.50", contract.ReviewNotify}},
		{"choice probability below", probability, single(choice, choiceA("label", "bug", f64(0.9), pr("billing", 0.35), pr("bug", 0.4), pr("account", 0.25))),
			want{contract.VerdictAbstained, "prob", "probability of the chosen option 0.40 < 0.60", contract.ReviewNotify}},
		{"choice probability above", probability, single(choice, choiceA("label", "bug", nil, pr("billing", 0.2), pr("bug", 0.8))),
			want{contract.VerdictDecided, "prob", "probability of the chosen option 0.80 >= 0.60", ""}},
		{"score most probable level", probability, single(score, scoreA("sev", f64(0.9), 0.1, 0.55, 0.35)),
			want{contract.VerdictAbstained, "prob", "probability of the most probable level 0.55 < 0.60", contract.ReviewNotify}},
		{"score most probable level above", probability, single(score, scoreA("sev", f64(0.9), 0.05, 0.05, 0.9)),
			want{contract.VerdictDecided, "prob", "probability of the most probable level 0.90 >= 0.60", ""}},
		{"both pass: both named", both, single(choice, choiceA("label", "bug", f64(0.7), pr("bug", 0.9))),
			want{contract.VerdictDecided, "both", "confidence 0.70 >= 0.50, probability of the chosen option 0.90 >= 0.60", ""}},
		{"one fails: only it is named", both, single(choice, choiceA("label", "bug", f64(0.7), pr("bug", 0.59))),
			want{contract.VerdictAbstained, "both", "probability of the chosen option 0.59 < 0.60", contract.ReviewNotify}},
		{"both fail", both, single(choice, choiceA("label", "bug", f64(0.1), pr("bug", 0.2))),
			want{contract.VerdictAbstained, "both", "confidence 0.10 < 0.50, probability of the chosen option 0.20 < 0.60", contract.ReviewNotify}},
		{"noul inside the band", band, single(noul, noulA("refund", 0.48)),
			want{contract.VerdictAbstained, "band", "P(yes) 0.48 in [0.30, 0.70]", contract.ReviewNotify}},
		{"noul on the band's edge abstains", band, single(noul, noulA("refund", 0.7)),
			want{contract.VerdictAbstained, "band", "P(yes) 0.70 in [0.30, 0.70]", contract.ReviewNotify}},
		{"noul just outside", band, single(noul, noulA("refund", 0.70001)),
			want{contract.VerdictDecided, "band", "P(yes) 0.70001 outside [0.30000, 0.70000]", ""}},
		{"noul above", band, single(noul, noulA("refund", 0.81)),
			want{contract.VerdictDecided, "band", "P(yes) 0.81 outside [0.30, 0.70]", ""}},
		{"noul below", band, single(noul, noulA("refund", 0.02)),
			want{contract.VerdictDecided, "band", "P(yes) 0.02 outside [0.30, 0.70]", ""}},
		{"a threshold of 0.125 keeps its digits", "rules:\n  - name: c\n    min_confidence: 0.125\n", single(choice, choiceA("label", "bug", f64(0.1))),
			want{contract.VerdictAbstained, "c", "confidence 0.100 < 0.125", contract.ReviewNotify}},
		{"min_confidence 0 exempts", "rules:\n  - name: exempt\n    min_confidence: 0\n  - name: strict\n    min_confidence: 0.9\n", single(choice, choiceA("label", "bug", f64(0.01))),
			want{contract.VerdictDecided, "exempt", "confidence 0.01 >= 0.00", ""}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			check1(t, mustParse(t, c.policy).Evaluate(c.in), c.want)
		})
	}
}

func TestReviewModes(t *testing.T) {
	in := func(conf float64) *Input {
		return single(q("label", contract.TypeChoice), choiceA("label", "bug", f64(conf)))
	}
	for _, mode := range []string{contract.ReviewNone, contract.ReviewNotify, contract.ReviewHold} {
		p := mustParse(t, "rules:\n  - name: r\n    min_confidence: 0.5\n    review: "+mode+"\n")
		wantReview := mode
		if mode == contract.ReviewNone {
			wantReview = ""
		}
		t.Run(mode, func(t *testing.T) {
			check1(t, p.Evaluate(in(0.2)), want{contract.VerdictAbstained, "r", "confidence 0.20 < 0.50", wantReview})
			// A decided answer never goes to review, whatever the mode.
			check1(t, p.Evaluate(in(0.9)), want{contract.VerdictDecided, "r", "confidence 0.90 >= 0.50", ""})
		})
	}
	// The default mode is notify.
	p := mustParse(t, "rules:\n  - name: r\n    min_confidence: 0.5\n")
	check1(t, p.Evaluate(in(0.2)), want{contract.VerdictAbstained, "r", "confidence 0.20 < 0.50", contract.ReviewNotify})
}

// The safe side: a figure that is missing, NaN or out of range abstains and says so.
func TestBadFiguresAbstain(t *testing.T) {
	const conf = "rules:\n  - name: r\n    min_confidence: 0.5\n    min_probability: 0.1\n    noul_abstain_between: [0.4, 0.6]\n"
	choice, score, noul := q("c", contract.TypeChoice), q("s", contract.TypeScore), q("n", contract.TypeNoul)
	cases := []struct {
		name   string
		in     *Input
		reason string
	}{
		{"no confidence", single(choice, choiceA("c", "a", nil, pr("a", 1))), "confidence not reported (min 0.50)"},
		{"NaN confidence", single(choice, choiceA("c", "a", f64(math.NaN()), pr("a", 1))), "confidence NaN is not a probability in [0, 1] (min 0.50)"},
		{"confidence above 1", single(choice, choiceA("c", "a", f64(1.3), pr("a", 1))), "confidence 1.3 is not a probability in [0, 1] (min 0.50)"},
		{"negative confidence", single(choice, choiceA("c", "a", f64(-0.2), pr("a", 1))), "confidence -0.2 is not a probability in [0, 1] (min 0.50)"},
		{"infinite confidence", single(choice, choiceA("c", "a", f64(math.Inf(1)), pr("a", 1))), "confidence +Inf is not a probability in [0, 1] (min 0.50)"},
		{"no probability for the choice", single(choice, choiceA("c", "a", f64(0.9), pr("b", 1))), "probability of the chosen option not reported (min 0.10)"},
		{"NaN probability", single(choice, choiceA("c", "a", f64(0.9), pr("a", math.NaN()))), "probability of the chosen option NaN is not a probability in [0, 1] (min 0.10)"},
		{"score without probabilities", single(score, scoreA("s", f64(0.9))), "probability of the most probable level not reported (min 0.10)"},
		{"score with a NaN level", single(score, scoreA("s", f64(0.9), 0.9, math.NaN())), "probability of the most probable level NaN is not a probability in [0, 1] (min 0.10)"},
		{"noul NaN", single(noul, noulA("n", math.NaN())), "P(yes) NaN is not a probability in [0, 1] (abstain between 0.40 and 0.60)"},
		{"noul above 1", single(noul, noulA("n", 2)), "P(yes) 2 is not a probability in [0, 1] (abstain between 0.40 and 0.60)"},
		{"no answer", &Input{Questions: []contract.Question{choice}}, "the provider returned no answer for this question"},
		{"answer of another type", single(choice, noulA("c", 0.9)), `the answer is of type "noul", the question of type choice`},
	}
	p := mustParse(t, conf)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			check1(t, p.Evaluate(c.in), want{contract.VerdictAbstained, "r", c.reason, contract.ReviewNotify})
		})
	}
}

func TestNoRuleMatched(t *testing.T) {
	p := mustParse(t, "rules:\n  - name: other\n    caller: billing\n    min_confidence: 0.9\n")
	in := single(q("c", contract.TypeChoice), choiceA("c", "a", f64(0.1)))
	check1(t, p.Evaluate(in), want{contract.VerdictDecided, "", "no rule matched", ""})
	// An empty policy and a nil one: the same.
	check1(t, (&Policy{}).Evaluate(in), want{contract.VerdictDecided, "", "no rule matched", ""})
	var none *Policy
	check1(t, none.Evaluate(in), want{contract.VerdictDecided, "", "no rule matched", ""})
	if out := p.Evaluate(&Input{}); len(out.Verdicts) != 0 || out.Review != nil {
		t.Fatalf("no questions: %+v", out)
	}
}

func TestMatching(t *testing.T) {
	const policy = `
rules:
  - name: billing-refunds
    caller: billing-*
    question: refund_*
    min_confidence: 0.9
  - name: exact-caller
    caller: support
    question: "*_label"
    min_confidence: 0.8
  - name: one-char
    caller: "team-?"
    min_confidence: 0.7
  - name: class
    caller: "svc-[a-c]"
    min_confidence: 0.6
  - name: negated-class
    caller: "svc-[!a-c]"
    min_confidence: 0.65
  - name: literal-star
    caller: 'odd\*name'
    min_confidence: 0.55
  - name: big-model
    model: "hf.co/*:70b"
    min_confidence: 0.45
  - name: fallback
    min_confidence: 0.3
`
	p := mustParse(t, policy)
	cases := []struct {
		caller, model, question, rule string
	}{
		{"billing-eu", "nimble", "refund_requested", "billing-refunds"},
		{"billing-eu", "nimble", "priority", "fallback"},         // question glob misses
		{"billing", "nimble", "refund_requested", "fallback"},    // caller glob misses ("billing-*" needs the dash)
		{"support", "nimble", "ticket_label", "exact-caller"},    // suffix glob
		{"support", "nimble", "label", "fallback"},               // "*_label" needs the underscore
		{"support-2", "nimble", "ticket_label", "fallback"},      // a literal caller matches only itself
		{"team-x", "nimble", "q", "one-char"},                    // ? is one character
		{"team-xy", "nimble", "q", "fallback"},                   // not two
		{"team-", "nimble", "q", "fallback"},                     // nor none
		{"team-é", "nimble", "q", "one-char"},                    // a character, not a byte
		{"svc-b", "nimble", "q", "class"},                        // in the class
		{"svc-d", "nimble", "q", "negated-class"},                // outside it
		{"odd*name", "nimble", "q", "literal-star"},              // \* is a star
		{"oddXname", "nimble", "q", "fallback"},                  // and only a star
		{"x", "hf.co/meta/llama:70b", "q", "big-model"},          // '/' is not special to *
		{"x", "hf.co/meta/llama:8b", "q", "fallback"},            // model glob misses
		{"Billing-eu", "nimble", "refund_requested", "fallback"}, // case-sensitive
	}
	for _, c := range cases {
		in := &Input{Caller: c.caller, Model: c.model, Questions: []contract.Question{q(c.question, contract.TypeChoice)},
			Answers: []contract.Answer{choiceA(c.question, "a", f64(0.99))}}
		if got := p.Evaluate(in).Verdicts[0].Rule; got != c.rule {
			t.Errorf("caller %q model %q question %q: rule %q, want %q", c.caller, c.model, c.question, got, c.rule)
		}
	}
}

func TestFirstMatchWins(t *testing.T) {
	p := mustParse(t, `
rules:
  - name: first
    question: "label"
    min_confidence: 0.2
  - name: second
    question: "*"
    min_confidence: 0.9
`)
	// Both match "label"; the first decides it, though the second would abstain.
	check1(t, p.Evaluate(single(q("label", contract.TypeChoice), choiceA("label", "a", f64(0.5)))),
		want{contract.VerdictDecided, "first", "confidence 0.50 >= 0.20", ""})
	check1(t, p.Evaluate(single(q("other", contract.TypeChoice), choiceA("other", "a", f64(0.5)))),
		want{contract.VerdictAbstained, "second", "confidence 0.50 < 0.90", contract.ReviewNotify})
}

// A rule matches only the types it has a threshold for: a choice rule does not shadow a later
// noul rule, and an audit-only rule matches every type.
func TestRulesMatchTheTypesTheyJudge(t *testing.T) {
	p := mustParse(t, `
rules:
  - name: choice-score
    min_confidence: 0.5
  - name: noul
    noul_abstain_between: [0.2, 0.8]
`)
	check1(t, p.Evaluate(single(q("n", contract.TypeNoul), noulA("n", 0.5))),
		want{contract.VerdictAbstained, "noul", "P(yes) 0.50 in [0.20, 0.80]", contract.ReviewNotify})
	check1(t, p.Evaluate(single(q("s", contract.TypeScore), scoreA("s", f64(0.4), 1))),
		want{contract.VerdictAbstained, "choice-score", "confidence 0.40 < 0.50", contract.ReviewNotify})

	p = mustParse(t, `
rules:
  - name: audit-all
    caller: auditors
    audit_sample: 1
  - name: noul
    noul_abstain_between: [0.2, 0.8]
`)
	in := single(q("n", contract.TypeNoul), noulA("n", 0.5))
	in.Caller = "auditors"
	out := p.Evaluate(in)
	if v := out.Verdicts[0]; v.Status != contract.VerdictDecided || v.Rule != "audit-all" || !v.Audit ||
		v.Reason != "no threshold set, sampled for audit (share 1)" {
		t.Fatalf("audit-only rule on noul: %+v", v)
	}
	if len(out.Review) != 1 || !out.Review[0].Audit || out.Review[0].Mode != contract.ReviewNotify {
		t.Fatalf("audit review: %+v", out.Review)
	}
}

func TestHeaderTightensNeverLoosens(t *testing.T) {
	p := mustParse(t, `
rules:
  - name: lenient
    question: "l_*"
    min_confidence: 0.5
    review: hold
  - name: strict
    question: "s_*"
    min_confidence: 0.8
  - name: prob-only
    question: "p_*"
    min_probability: 0.5
  - name: noul
    noul_abstain_between: [0.4, 0.6]
`)
	run := func(name string, typ contract.QuestionType, a contract.Answer, header float64) Outcome {
		in := single(q(name, typ), a)
		in.MinConfidence = header
		return p.Evaluate(in)
	}
	cases := []struct {
		name string
		out  Outcome
		want want
	}{
		{"tightens a rule", run("l_a", contract.TypeChoice, choiceA("l_a", "x", f64(0.6)), 0.7),
			want{contract.VerdictAbstained, "lenient", "confidence 0.60 < 0.70 (Sys1-Min-Confidence)", contract.ReviewHold}},
		{"tightened and passed", run("l_a", contract.TypeChoice, choiceA("l_a", "x", f64(0.75)), 0.7),
			want{contract.VerdictDecided, "lenient", "confidence 0.75 >= 0.70 (Sys1-Min-Confidence)", ""}},
		{"never loosens", run("s_a", contract.TypeChoice, choiceA("s_a", "x", f64(0.6)), 0.3),
			want{contract.VerdictAbstained, "strict", "confidence 0.60 < 0.80", contract.ReviewNotify}},
		{"equal to the rule: the rule's", run("s_a", contract.TypeChoice, choiceA("s_a", "x", f64(0.9)), 0.8),
			want{contract.VerdictDecided, "strict", "confidence 0.90 >= 0.80", ""}},
		{"adds confidence to a probability rule", run("p_a", contract.TypeChoice, choiceA("p_a", "x", f64(0.6), pr("x", 0.9)), 0.7),
			want{contract.VerdictAbstained, "prob-only", "confidence 0.60 < 0.70 (Sys1-Min-Confidence)", contract.ReviewNotify}},
		{"score too", run("l_s", contract.TypeScore, scoreA("l_s", f64(0.65), 1), 0.7),
			want{contract.VerdictAbstained, "lenient", "confidence 0.65 < 0.70 (Sys1-Min-Confidence)", contract.ReviewHold}},
		{"no rule: the header is the rule", run("other", contract.TypeChoice, choiceA("other", "x", f64(0.6)), 0.7),
			want{contract.VerdictAbstained, HeaderRule, "confidence 0.60 < 0.70 (Sys1-Min-Confidence)", contract.ReviewNotify}},
		{"no rule, passed", run("other", contract.TypeChoice, choiceA("other", "x", f64(0.9)), 0.7),
			want{contract.VerdictDecided, HeaderRule, "confidence 0.90 >= 0.70 (Sys1-Min-Confidence)", ""}},
		{"no rule, no confidence", run("other", contract.TypeChoice, choiceA("other", "x", nil), 0.7),
			want{contract.VerdictAbstained, HeaderRule, "confidence not reported (min 0.70, Sys1-Min-Confidence)", contract.ReviewNotify}},
		{"noul is not touched", run("n", contract.TypeNoul, noulA("n", 0.9), 0.99),
			want{contract.VerdictDecided, "noul", "P(yes) 0.90 outside [0.40, 0.60]", ""}},
		{"header 0 is none", run("other", contract.TypeChoice, choiceA("other", "x", f64(0.1)), 0),
			want{contract.VerdictDecided, "", "no rule matched", ""}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { check1(t, c.out, c.want) })
	}
	// The header applies with no rules at all.
	in := single(q("c", contract.TypeChoice), choiceA("c", "x", f64(0.2)))
	in.MinConfidence = 0.5
	check1(t, (&Policy{}).Evaluate(in), want{contract.VerdictAbstained, HeaderRule, "confidence 0.20 < 0.50 (Sys1-Min-Confidence)", contract.ReviewNotify})
}

func TestCalibratedAndRaw(t *testing.T) {
	p := mustParse(t, `
rules:
  - name: cal-choice
    question: "c*"
    min_confidence: 0.5
    min_probability: 0.6
    use: calibrated
  - name: raw-choice
    question: "r*"
    min_confidence: 0.5
  - name: cal-noul
    noul_abstain_between: [0.3, 0.7]
    use: calibrated
`)
	fit := &contract.Calibrated{Probabilities: []contract.Probability{pr("a", 0.55), pr("b", 0.45)}, Confidence: f64(0.41), Temperature: 2.5}
	withFit := func(in *Input, c *contract.Calibrated) *Input { in.Calibrated = []*contract.Calibrated{c}; return in }
	raw := choiceA("c1", "a", f64(0.9), pr("a", 0.95), pr("b", 0.05))

	// Calibrated values decide; the raw ones would pass.
	out := p.Evaluate(withFit(single(q("c1", contract.TypeChoice), raw), fit))
	check1(t, out, want{contract.VerdictAbstained, "cal-choice",
		"calibrated confidence 0.41 < 0.50, calibrated probability of the chosen option 0.55 < 0.60", contract.ReviewNotify})
	if out.Verdicts[0].Calibrated != fit {
		t.Fatal("the verdict must carry the fit's values")
	}
	// No fit for the question: raw values, and the reason says so.
	check1(t, p.Evaluate(single(q("c1", contract.TypeChoice), raw)), want{contract.VerdictDecided, "cal-choice",
		"confidence 0.90 >= 0.50, probability of the chosen option 0.95 >= 0.60 (raw: no calibration fit)", ""})
	// use: raw ignores a fit for the thresholds but still reports it.
	rawQ := choiceA("r1", "a", f64(0.9), pr("a", 0.95))
	out = p.Evaluate(withFit(single(q("r1", contract.TypeChoice), rawQ), fit))
	check1(t, out, want{contract.VerdictDecided, "raw-choice", "confidence 0.90 >= 0.50", ""})
	if out.Verdicts[0].Calibrated != fit {
		t.Fatal("use: raw must still carry the fit's values")
	}
	// A fit lacking the figure the rule needs: the safe side.
	check1(t, p.Evaluate(withFit(single(q("c1", contract.TypeChoice), raw), &contract.Calibrated{Temperature: 2, Probabilities: fit.Probabilities})),
		want{contract.VerdictAbstained, "cal-choice", "calibrated confidence not reported (min 0.50), calibrated probability of the chosen option 0.55 < 0.60", contract.ReviewNotify})

	// noul: the calibrated P(yes) moves into the band.
	check1(t, p.Evaluate(withFit(single(q("n", contract.TypeNoul), noulA("n", 0.9)), &contract.Calibrated{Noul: f64(0.66), Temperature: 2})),
		want{contract.VerdictAbstained, "cal-noul", "calibrated P(yes) 0.66 in [0.30, 0.70]", contract.ReviewNotify})
	check1(t, p.Evaluate(single(q("n", contract.TypeNoul), noulA("n", 0.9))),
		want{contract.VerdictDecided, "cal-noul", "P(yes) 0.90 outside [0.30, 0.70] (raw: no calibration fit)", ""})
	check1(t, p.Evaluate(withFit(single(q("n", contract.TypeNoul), noulA("n", 0.9)), &contract.Calibrated{Temperature: 2})),
		want{contract.VerdictAbstained, "cal-noul", "calibrated P(yes) not reported (abstain between 0.30 and 0.70)", contract.ReviewNotify})
	// The header tightens calibrated values too.
	in := withFit(single(q("c1", contract.TypeChoice), raw), &contract.Calibrated{Confidence: f64(0.6), Probabilities: fit.Probabilities[:1], Temperature: 1})
	in.Calibrated[0].Probabilities = []contract.Probability{pr("a", 0.9)}
	in.MinConfidence = 0.7
	check1(t, p.Evaluate(in), want{contract.VerdictAbstained, "cal-choice", "calibrated confidence 0.60 < 0.70 (Sys1-Min-Confidence)", contract.ReviewNotify})
}

// A run with several questions: verdicts in request order, each its own rule, reviews
// listed in request order, and answers found by name when out of order.
func TestManyQuestionsInOrder(t *testing.T) {
	p := mustParse(t, `
rules:
  - name: hold-refunds
    question: refund
    noul_abstain_between: [0.3, 0.7]
    review: hold
  - name: conf
    min_confidence: 0.5
`)
	in := &Input{RunID: "r", Caller: "svc", Model: "m",
		Questions: []contract.Question{q("label", contract.TypeChoice), q("refund", contract.TypeNoul), q("sev", contract.TypeScore), q("free", contract.TypeNoul)},
		Answers:   []contract.Answer{noulA("refund", 0.5), choiceA("label", "a", f64(0.2)), noulA("free", 0.5), scoreA("sev", f64(0.9), 1)},
	}
	out := p.Evaluate(in)
	var got []string
	for _, v := range out.Verdicts {
		got = append(got, fmt.Sprintf("%s %s %s: %s", v.Question, v.Status, v.Rule, v.Reason))
	}
	wantV := []string{
		"label abstained conf: confidence 0.20 < 0.50",
		"refund abstained hold-refunds: P(yes) 0.50 in [0.30, 0.70]",
		"sev decided conf: confidence 0.90 >= 0.50",
		"free decided : no rule matched",
	}
	if !reflect.DeepEqual(got, wantV) {
		t.Fatalf("verdicts:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(wantV, "\n"))
	}
	wantR := []Review{{Index: 0, Question: "label", Mode: contract.ReviewNotify}, {Index: 1, Question: "refund", Mode: contract.ReviewHold}}
	if !reflect.DeepEqual(out.Review, wantR) || !out.Hold() || out.Abstained() != 2 {
		t.Fatalf("review %+v hold %v abstained %d", out.Review, out.Hold(), out.Abstained())
	}
}

func TestAuditSample(t *testing.T) {
	const share = 0.02
	p := mustParse(t, "rules:\n  - name: r\n    min_confidence: 0.5\n    audit_sample: 0.02\n")
	const runs = 100000
	qs := []contract.Question{q("label", contract.TypeChoice), q("other", contract.TypeChoice)}
	as := []contract.Answer{choiceA("label", "a", f64(0.9)), choiceA("other", "a", f64(0.9))}
	sampled := map[string]bool{}
	both := 0
	for i := 0; i < runs; i++ {
		// Derived run ids are sequential: the worst case for a weak hash.
		runID := fmt.Sprintf("SYS1_REQUESTS~%d~m3x1k2", i)
		out := p.Evaluate(&Input{RunID: runID, Caller: "svc", Questions: qs, Answers: as})
		n := 0
		for _, r := range out.Review {
			if !r.Audit || r.Mode != contract.ReviewNotify || !out.Verdicts[r.Index].Audit ||
				out.Verdicts[r.Index].Status != contract.VerdictDecided ||
				out.Verdicts[r.Index].Reason != "confidence 0.90 >= 0.50, sampled for audit (share 0.02)" {
				t.Fatalf("audit entry %+v, verdict %+v", r, out.Verdicts[r.Index])
			}
			sampled[runID+"/"+r.Question] = true
			n++
		}
		if n == 2 {
			both++
		}
	}
	// Binomial(200,000, 0.02): mean 4,000, sd 62.6; ±5 sd never fails by chance.
	if got := len(sampled); got < 4000-313 || got > 4000+313 {
		t.Fatalf("%d of %d answers sampled; want about %d", got, 2*runs, int(2*runs*share))
	}
	// The two questions of a run are drawn independently: both ≈ runs·share² = 40.
	if both < 10 || both > 90 {
		t.Fatalf("both questions sampled in %d runs; want about 40", both)
	}
	// Deterministic: a replay samples exactly the same answers.
	for i := 0; i < runs; i += 7 {
		runID := fmt.Sprintf("SYS1_REQUESTS~%d~m3x1k2", i)
		out := p.Evaluate(&Input{RunID: runID, Caller: "svc", Questions: qs, Answers: as})
		for k, v := range out.Verdicts {
			if v.Audit != sampled[runID+"/"+qs[k].Name] {
				t.Fatalf("run %s question %s: replay sampled %v", runID, qs[k].Name, v.Audit)
			}
		}
	}
	// Abstained answers are never audit samples: they go to review as abstentions.
	p = mustParse(t, "rules:\n  - name: r\n    min_confidence: 0.5\n    audit_sample: 1\n    review: none\n")
	out := p.Evaluate(single(q("label", contract.TypeChoice), choiceA("label", "a", f64(0.1))))
	if out.Verdicts[0].Audit || len(out.Review) != 0 {
		t.Fatalf("abstained answer audited: %+v", out)
	}
	out = p.Evaluate(single(q("label", contract.TypeChoice), choiceA("label", "a", f64(0.9))))
	if !out.Verdicts[0].Audit || len(out.Review) != 1 || out.Review[0].Mode != contract.ReviewNotify {
		t.Fatalf("share 1 with review none must still audit, as notify: %+v", out)
	}
}

func TestAuditDrawIsUniform(t *testing.T) {
	// Ten equal bins over 200,000 draws of random-looking run ids.
	var bins [10]int
	const n = 200000
	for i := 0; i < n; i++ {
		bins[int(auditDraw(fmt.Sprintf("r-%08x", i*2654435761), "label")*10)]++
	}
	for i, c := range bins {
		// mean 20,000, sd 134: ±5 sd.
		if c < 20000-670 || c > 20000+670 {
			t.Fatalf("bin %d holds %d of %d draws: %v", i, c, n, bins)
		}
	}
	if auditDraw("ab", "c") == auditDraw("a", "bc") {
		t.Fatal("the run id and question must be separated in the hash")
	}
}

// Evaluate is pure: it leaves its input alone and gives the same outcome every time.
func TestEvaluateIsPure(t *testing.T) {
	p, in := benchPolicy(t), benchInput(t)
	before := fmt.Sprintf("%+v", *in)
	first := p.Evaluate(in)
	for i := 0; i < 3; i++ {
		if again := p.Evaluate(in); !reflect.DeepEqual(first, again) {
			t.Fatal("a second evaluation differs")
		}
	}
	if fmt.Sprintf("%+v", *in) != before {
		t.Fatal("Evaluate changed its input")
	}
	// 64 questions spread over several rules, each verdict with a reason.
	rules := map[string]bool{}
	for _, v := range first.Verdicts {
		if v.Reason == "" || v.Question == "" {
			t.Fatalf("verdict %+v", v)
		}
		rules[v.Rule] = true
	}
	if len(first.Verdicts) != 64 || len(rules) < 5 {
		t.Fatalf("%d verdicts over rules %v", len(first.Verdicts), rules)
	}
}
