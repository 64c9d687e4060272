package policy

import (
	"github.com/sys1hq/sys1/contract"
)

// Use values of a rule: which figures its thresholds compare.
const (
	UseRaw        = "raw"        // the provider's answer as sent
	UseCalibrated = "calibrated" // the calibrated values when a fit applies, raw otherwise
)

// HeaderRule is the rule name of verdicts decided by Sys1-Min-Confidence alone, for
// questions no rule of the file governs.
const HeaderRule = "header"

// Rule is one rule of a policy file, defaults filled in.
type Rule struct {
	Name string
	// Caller, Question and Model are globs (see the package documentation). Caller and
	// Question default to "*"; Model "" means any model.
	Caller, Question, Model string
	// The thresholds; nil when the rule does not set them.
	MinConfidence      *float64
	MinProbability     *float64
	NoulAbstainBetween *[2]float64
	// MaxError is the error rate among decided answers the rule guarantees, in (0, 1): it
	// compares each answer with the threshold a risk fit (sys1 calibrate --target-error)
	// certified for its model, caller and question, and abstains without one.
	MaxError *float64
	// Review is contract.ReviewNone, ReviewNotify (the default) or ReviewHold.
	Review string
	// AuditSample is the share of decided answers also sent to review, in [0, 1].
	AuditSample float64
	// Use is UseRaw (the default) or UseCalibrated.
	Use string
	// Line is the rule's line in the file.
	Line int

	nameLine int

	caller, question, model glob
	hasModel                bool
	// forChoiceScore and forNoul say which answer types the rule governs: those it sets a
	// threshold for, or every type for a rule that only samples for audit.
	forChoiceScore, forNoul bool
	minConf, minProb        threshold
	lo, hi                  threshold
	maxErr                  threshold
	maxErrText              string // max_error as written, for reasons: 0.2, 0.02
	useCalibrated           bool
	auditText               string
}

// threshold is a rule's figure with its text ready for reasons: evaluation runs on every
// decision, so nothing about the rule is formatted there.
type threshold struct {
	v      float64
	text   string // shortest form with at least two decimals, 0.50 or 0.125 ("" until withText)
	prec   int    // its decimals
	scaled uint64 // v in units of 10^-prec (see scaled)
}

func newThreshold(v float64) threshold {
	// The fewest decimals (two at least) that give v back; the request's Sys1-Min-Confidence
	// is prepared on every run, so this avoids strconv's shortest-form search.
	prec := 2
	for prec < maxPrec && float64(scaled(v, prec))/pow10[prec] != v {
		prec++
	}
	return threshold{v: v, prec: prec, scaled: scaled(v, prec)}
}

// withText is t with its text, for a rule's thresholds (prepared once, at load).
func (t threshold) withText() threshold {
	t.text = string(appendFixed(nil, t.v, t.prec))
	return t
}

// Policy is a parsed, valid policy file: its rules in order. The zero value and nil have no
// rules. A Policy is immutable and safe for concurrent use.
type Policy struct {
	rules []Rule
}

// Rules returns a copy of the rules in file order.
func (p *Policy) Rules() []Rule {
	if p == nil {
		return nil
	}
	return append([]Rule(nil), p.rules...)
}

// Len is the number of rules.
func (p *Policy) Len() int {
	if p == nil {
		return 0
	}
	return len(p.rules)
}

// Input is what the policy judges: one run's questions and the provider's answers.
type Input struct {
	// RunID seeds the audit sample: the same run id and question always make the same choice,
	// so a redelivery or a replay samples exactly what the first delivery did.
	RunID string
	// Caller is the run's verified caller id; Model the model the run resolved to.
	Caller, Model string
	// Questions in request order; Answers the provider's answers (in request order, as
	// contract.DecodeResponse checked them; a question is also found by name).
	Questions []contract.Question
	Answers   []contract.Answer
	// Calibrated holds the calibrated values per question, index for index with Questions;
	// nil (or a nil entry) where no fit applies. Entries are copied into the verdicts.
	Calibrated []*contract.Calibrated
	// MinConfidence is the producer's Sys1-Min-Confidence (see ParseMinConfidence); 0 is none.
	MinConfidence float64
	// Risk holds the risk fits per question, index for index with Questions; nil (or a nil
	// entry) where none is stored. Only max_error rules read them.
	Risk []RiskFit
}

// RiskFit is a stored risk fit (sys1 calibrate --target-error) as a max_error rule uses it.
type RiskFit interface {
	// RiskThreshold is the lowest threshold the fit certified for an error of at most
	// maxError among decided answers; false when it certified none.
	RiskThreshold(maxError float64) (threshold float64, ok bool)
	// RiskValue says what its thresholds compare: the top probability (choice: the chosen
	// option's; score: the most probable level's) or else the confidence, and calibrated
	// values (the fit's temperature applied) or raw ones. Noul answers compare max(P, 1 − P)
	// either way.
	RiskValue() (probability, calibrated bool)
	// RiskLabel names the fit in reasons: "fit of 2026-12-01, n 2,000".
	RiskLabel() string
}

// Outcome is the policy's conclusion about one run.
type Outcome struct {
	// Verdicts, one per question, in request order (Question set).
	Verdicts []contract.Verdict
	// Review lists the questions to queue for human review, in request order: abstained
	// answers under a rule with review notify or hold, and audit samples.
	Review []Review
}

// Review is one question to send to review.
type Review struct {
	Index    int    // into Input.Questions and Outcome.Verdicts
	Question string // its name
	// Mode is contract.ReviewNotify or contract.ReviewHold. Audit samples are always notify:
	// their answer was decided, and holding its reply would change what the audit measures.
	Mode  string
	Audit bool
}

// Hold reports whether the run's reply must wait for a person (a question under review: hold
// abstained).
func (o Outcome) Hold() bool {
	for _, r := range o.Review {
		if r.Mode == contract.ReviewHold {
			return true
		}
	}
	return false
}

// Abstained is the number of abstained questions.
func (o Outcome) Abstained() int {
	n := 0
	for i := range o.Verdicts {
		if o.Verdicts[i].Status == contract.VerdictAbstained {
			n++
		}
	}
	return n
}
