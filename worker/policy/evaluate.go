package policy

import (
	"math"
	"strconv"
	"unsafe"

	"github.com/sys1hq/sys1/contract"
)

// Evaluate judges every answer of one run. It is pure: the same input always gives the same
// outcome, audit samples included. A nil or empty Policy decides every question ("no rule
// matched"), except that Sys1-Min-Confidence still applies as the rule "header".
func (p *Policy) Evaluate(in *Input) Outcome {
	n := len(in.Questions)
	out := Outcome{Verdicts: make([]contract.Verdict, n)}
	if n == 0 {
		return out
	}

	// The caller and model are the same for every question: filter the rules once, into
	// those that govern choice and score answers and those that govern noul ones.
	var csStack, noulStack [24]*Rule
	candCS, candNoul := csStack[:0], noulStack[:0]
	if p != nil {
		for i := range p.rules {
			r := &p.rules[i]
			if r.caller.match(in.Caller) && (!r.hasModel || r.model.match(in.Model)) {
				if r.forChoiceScore {
					candCS = append(candCS, r)
				}
				if r.forNoul {
					candNoul = append(candNoul, r)
				}
			}
		}
	}

	// Every reason is written into one buffer and becomes one string: one allocation for the
	// reasons of the whole run instead of one per question.
	var offStack [65]int
	offs := offStack[:0]
	if n+1 > len(offStack) {
		offs = make([]int, 0, n+1)
	}
	e := evaluator{buf: make([]byte, 0, 64*n)} // most reasons are 15–60 bytes
	var hdr threshold                          // zero: none
	if in.MinConfidence > 0 && in.MinConfidence <= 1 {
		hdr = newThreshold(in.MinConfidence)
	}
	for i := range in.Questions {
		q := &in.Questions[i]
		v := &out.Verdicts[i]
		v.Question = q.Name
		var cal *contract.Calibrated
		if i < len(in.Calibrated) {
			cal = in.Calibrated[i]
		}
		v.Calibrated = cal

		k := kindOf(q.Type)
		var cand []*Rule
		switch k {
		case kindChoice, kindScore:
			cand = candCS
		case kindNoul:
			cand = candNoul
		}
		var rule *Rule
		for _, r := range cand {
			if r.question.match(q.Name) {
				rule = r
				break
			}
		}
		offs = append(offs, len(e.buf))
		abstain, mode, audit := e.judge(in, i, q, k, rule, cal, &hdr)
		switch {
		case rule != nil:
			v.Rule = rule.Name
		case e.usedHeader:
			v.Rule = HeaderRule
		}
		if abstain {
			v.Status = contract.VerdictAbstained
			if mode != contract.ReviewNone {
				out.Review = appendReview(out.Review, n, Review{Index: i, Question: q.Name, Mode: mode})
			}
			continue
		}
		v.Status = contract.VerdictDecided
		if rule != nil && rule.AuditSample > 0 {
			// Every decided answer of the rule had this chance of an audit, sampled or not:
			// what an audit label's weight is made of.
			v.AuditShare = rule.AuditSample
		}
		if audit {
			v.Audit = true
			out.Review = appendReview(out.Review, n, Review{Index: i, Question: q.Name, Mode: contract.ReviewNotify, Audit: true})
		}
	}
	offs = append(offs, len(e.buf))
	// The buffer is never written again: the string may share its bytes, as strings.Builder's
	// does, instead of copying them.
	var reasons string
	if len(e.buf) > 0 {
		reasons = unsafe.String(&e.buf[0], len(e.buf))
	}
	for i := range out.Verdicts {
		out.Verdicts[i].Reason = reasons[offs[i]:offs[i+1]]
	}
	return out
}

// appendReview adds r, the review of question r.Index of n. The first allocates room for it
// and every question after it, the most there can be: one allocation, never a regrowth.
func appendReview(list []Review, n int, r Review) []Review {
	if list == nil {
		list = make([]Review, 0, n-r.Index)
	}
	return append(list, r)
}

// kind is a question type as a number: compared once per question, not once per rule.
type kind uint8

const (
	kindOther kind = iota // none sys1 knows; contract validation lets none through
	kindChoice
	kindScore
	kindNoul
)

func kindOf(t contract.QuestionType) kind {
	switch t {
	case contract.TypeChoice:
		return kindChoice
	case contract.TypeScore:
		return kindScore
	case contract.TypeNoul:
		return kindNoul
	}
	return kindOther
}

// evaluator holds the reasons being written and the checks of the question being judged.
type evaluator struct {
	buf        []byte
	checks     [3]check
	nchecks    int
	usedHeader bool
}

type checkState uint8

const (
	checkPass        checkState = iota
	checkBelow                  // value < minimum
	checkInBand                 // noul: lo <= P(yes) <= hi
	checkMissing                // the answer carries no such value
	checkInvalid                // NaN or outside [0, 1]
	checkNoFit                  // max_error: no risk fit for the question
	checkNoThreshold            // max_error: the fit certified no threshold for it
)

// check is one threshold compared with one figure of the answer.
type check struct {
	what       string // "confidence", "probability of the chosen option", "P(yes)"
	calibrated bool
	state      checkState
	val        float64
	min        threshold  // min_confidence, min_probability (a copy: it may be the header's)
	lo, hi     *threshold // noul_abstain_between
	band       bool
	header     bool // min is the producer's Sys1-Min-Confidence
	// risk is the max_error rule whose fit set min, and fit names that fit ("" without one).
	risk *Rule
	fit  string
}

func (c *check) failed() bool { return c.state != checkPass }

// judge writes question i's reason into e.buf and returns its verdict: whether it abstains,
// the review mode for an abstention, and whether a decided answer is sampled for audit.
func (e *evaluator) judge(in *Input, i int, q *contract.Question, k kind, r *Rule, cal *contract.Calibrated, hdr *threshold) (abstain bool, mode string, audit bool) {
	header := hdr.v > 0 && (k == kindChoice || k == kindScore)
	e.nchecks, e.usedHeader = 0, r == nil && header
	if r == nil && !header {
		e.buf = append(e.buf, "no rule matched"...)
		return false, "", false
	}
	mode = contract.ReviewNotify
	if r != nil {
		mode = r.Review
	}
	a := findAnswer(in.Answers, i, q.Name)
	if a == nil {
		e.buf = append(e.buf, "the provider returned no answer for this question"...)
		return true, mode, false
	}
	if a.Type != q.Type {
		e.buf = append(e.buf, "the answer is of type "...)
		e.buf = appendClipped(e.buf, string(a.Type))
		e.buf = append(e.buf, ", the question of type "...)
		e.buf = append(e.buf, q.Type...)
		return true, mode, false
	}

	useCal := r != nil && r.useCalibrated && cal != nil
	noFit := r != nil && r.useCalibrated && cal == nil
	switch k {
	case kindChoice, kindScore:
		var limit *threshold
		fromHeader := false
		if r != nil && r.MinConfidence != nil {
			limit = &r.minConf
		}
		if header && (limit == nil || hdr.v > limit.v) {
			limit, fromHeader = hdr, true
		}
		if limit != nil {
			c := e.add("confidence", useCal)
			c.min, c.header = *limit, fromHeader
			conf := a.Confidence
			if useCal {
				conf = cal.Confidence
			}
			if conf == nil {
				c.state = checkMissing
			} else {
				c.compareMin(*conf)
			}
		}
		if r != nil && r.MinProbability != nil {
			probs := a.Probabilities
			if useCal {
				probs = cal.Probabilities
			}
			if k == kindChoice {
				c := e.add("probability of the chosen option", useCal)
				c.min = r.minProb
				c.setFrom(chosenProbability(probs, a.Choice))
			} else {
				c := e.add("probability of the most probable level", useCal)
				c.min = r.minProb
				c.setFrom(topProbability(probs))
			}
		}
	case kindNoul:
		if r != nil && r.NoulAbstainBetween != nil {
			c := e.add("P(yes)", useCal)
			c.band, c.lo, c.hi = true, &r.lo, &r.hi
			switch {
			case !useCal:
				c.compareBand(a.Noul)
			case cal.Noul == nil:
				c.state = checkMissing
			default:
				c.compareBand(*cal.Noul)
			}
		}
	}

	if r != nil && r.MaxError != nil {
		var fit RiskFit
		if i < len(in.Risk) {
			fit = in.Risk[i]
		}
		e.riskCheck(k, a, cal, fit, r)
	}

	failed := false
	for j := 0; j < e.nchecks; j++ {
		failed = failed || e.checks[j].failed()
	}
	// An abstention names only what failed; a decision names every check it passed.
	wrote := false
	for j := 0; j < e.nchecks; j++ {
		c := &e.checks[j]
		if failed && !c.failed() {
			continue
		}
		if wrote {
			e.buf = append(e.buf, ", "...)
		}
		e.writeCheck(c)
		wrote = true
	}
	if !wrote {
		e.buf = append(e.buf, "no threshold set"...)
	}
	if noFit && e.nchecks > 0 {
		e.buf = append(e.buf, " (raw: no calibration fit)"...)
	}
	if failed {
		return true, mode, false
	}
	if r != nil && r.AuditSample > 0 && auditDraw(in.RunID, q.Name) < r.AuditSample {
		e.buf = append(e.buf, ", sampled for audit (share "...)
		e.buf = append(e.buf, r.auditText...)
		e.buf = append(e.buf, ')')
		audit = true
	}
	return false, "", audit
}

// riskCheck compares the answer with the threshold rule r's risk fit certified for its
// max_error, on the values the fit was made on (see RiskFit); without a fit, or a threshold
// for that max_error, the check fails: an error rate nobody measured is not guaranteed.
func (e *evaluator) riskCheck(k kind, a *contract.Answer, cal *contract.Calibrated, fit RiskFit, r *Rule) {
	if fit == nil {
		c := e.add("", false)
		c.state, c.risk = checkNoFit, r
		return
	}
	t, ok := fit.RiskThreshold(r.maxErr.v)
	if !ok {
		c := e.add("", false)
		c.state, c.risk, c.fit = checkNoThreshold, r, fit.RiskLabel()
		return
	}
	probability, calibrated := fit.RiskValue()
	var c *check
	switch {
	case k == kindNoul:
		c = e.add("max(P(yes), 1 − P(yes))", calibrated)
		c.min = newThreshold(t)
		p := a.Noul
		if calibrated {
			if cal == nil || cal.Noul == nil {
				c.state = checkMissing
				break
			}
			p = *cal.Noul
		}
		if !validProbability(p) {
			c.val, c.state = p, checkInvalid
			break
		}
		c.compareMin(math.Max(p, 1-p))
	case probability:
		probs := a.Probabilities
		if calibrated && cal != nil {
			probs = cal.Probabilities
		}
		if k == kindChoice {
			c = e.add("probability of the chosen option", calibrated)
		} else {
			c = e.add("probability of the most probable level", calibrated)
		}
		c.min = newThreshold(t)
		switch {
		case calibrated && cal == nil:
			c.state = checkMissing
		case k == kindChoice:
			c.setFrom(chosenProbability(probs, a.Choice))
		default:
			c.setFrom(topProbability(probs))
		}
	default:
		c = e.add("confidence", calibrated)
		c.min = newThreshold(t)
		conf := a.Confidence
		if calibrated {
			conf = nil
			if cal != nil {
				conf = cal.Confidence
			}
		}
		if conf == nil {
			c.state = checkMissing
		} else {
			c.compareMin(*conf)
		}
	}
	c.risk, c.fit = r, fit.RiskLabel()
}

func (e *evaluator) add(what string, calibrated bool) *check {
	c := &e.checks[e.nchecks]
	*c = check{what: what, calibrated: calibrated}
	e.nchecks++
	return c
}

func validProbability(v float64) bool { return v >= 0 && v <= 1 } // false for NaN

func (c *check) compareMin(v float64) {
	c.val = v
	switch {
	case !validProbability(v):
		c.state = checkInvalid
	case v < c.min.v:
		c.state = checkBelow
	}
}

func (c *check) compareBand(v float64) {
	c.val = v
	switch {
	case !validProbability(v):
		c.state = checkInvalid
	case v >= c.lo.v && v <= c.hi.v:
		c.state = checkInBand
	}
}

// setFrom compares a probability found in the answer (ok false: none was).
func (c *check) setFrom(v float64, ok bool) {
	if !ok {
		c.state = checkMissing
		return
	}
	c.compareMin(v)
}

func chosenProbability(probs []contract.Probability, choice string) (float64, bool) {
	for i := range probs {
		if probs[i].Key == choice {
			return probs[i].P, true
		}
	}
	return 0, false
}

// topProbability is the largest probability; any invalid entry makes the result invalid (a
// NaN would otherwise vanish in the comparison).
func topProbability(probs []contract.Probability) (float64, bool) {
	if len(probs) == 0 {
		return 0, false
	}
	top := math.Inf(-1)
	for i := range probs {
		p := probs[i].P
		if !validProbability(p) {
			return p, true
		}
		if p > top {
			top = p
		}
	}
	return top, true
}

// findAnswer returns question i's answer: at index i when the provider kept request order (it
// does, once DecodeResponse checked it), otherwise by name.
func findAnswer(answers []contract.Answer, i int, name string) *contract.Answer {
	if i < len(answers) && answers[i].Name == name {
		return &answers[i]
	}
	for k := range answers {
		if answers[k].Name == name {
			return &answers[k]
		}
	}
	return nil
}

func (e *evaluator) writeCheck(c *check) {
	switch c.state {
	case checkNoFit:
		e.buf = append(e.buf, "no risk fit (max_error "...)
		e.buf = append(e.buf, c.risk.maxErrText...)
		e.buf = append(e.buf, ')')
		return
	case checkNoThreshold:
		e.buf = append(e.buf, "max_error "...)
		e.buf = append(e.buf, c.risk.maxErrText...)
		e.buf = append(e.buf, " is met at no threshold ("...)
		e.buf = append(e.buf, c.fit...)
		e.buf = append(e.buf, ')')
		return
	}
	if c.calibrated {
		e.buf = append(e.buf, "calibrated "...)
	}
	e.buf = append(e.buf, c.what...)
	switch c.state {
	case checkMissing:
		e.buf = append(e.buf, " not reported"...)
		e.writeLimit(c)
		return
	case checkInvalid:
		e.buf = append(e.buf, ' ')
		e.buf = appendRaw(e.buf, c.val)
		e.buf = append(e.buf, " is not a probability in [0, 1]"...)
		e.writeLimit(c)
		return
	}
	e.buf = append(e.buf, ' ')
	if c.band {
		prec := max(c.lo.prec, c.hi.prec)
		prec = e.appendDistinct(c.val, prec, c.lo, c.hi)
		if c.state == checkInBand {
			e.buf = append(e.buf, " in ["...)
		} else {
			e.buf = append(e.buf, " outside ["...)
		}
		e.buf = appendAt(e.buf, c.lo, prec)
		e.buf = append(e.buf, ", "...)
		e.buf = appendAt(e.buf, c.hi, prec)
		e.buf = append(e.buf, ']')
		return
	}
	prec := e.appendDistinct(c.val, c.min.prec, &c.min, &c.min)
	if c.state == checkBelow {
		e.buf = append(e.buf, " < "...)
	} else {
		e.buf = append(e.buf, " >= "...)
	}
	e.buf = appendAt(e.buf, &c.min, prec)
	if c.header {
		e.buf = append(e.buf, " (Sys1-Min-Confidence)"...)
	}
	if c.risk != nil {
		e.writeRisk(c)
	}
}

// writeRisk names the max_error and the fit a threshold came from: " (max_error 0.02, fit of
// 2026-12-01, n 2,000)".
func (e *evaluator) writeRisk(c *check) {
	e.buf = append(e.buf, " (max_error "...)
	e.buf = append(e.buf, c.risk.maxErrText...)
	e.buf = append(e.buf, ", "...)
	e.buf = append(e.buf, c.fit...)
	e.buf = append(e.buf, ')')
}

// writeLimit says which threshold a missing or invalid figure could not be held to.
func (e *evaluator) writeLimit(c *check) {
	if c.band {
		e.buf = append(e.buf, " (abstain between "...)
		e.buf = appendAt(e.buf, c.lo, c.lo.prec)
		e.buf = append(e.buf, " and "...)
		e.buf = appendAt(e.buf, c.hi, c.hi.prec)
		e.buf = append(e.buf, ')')
		return
	}
	if c.risk != nil {
		e.buf = append(e.buf, " (threshold "...)
		e.buf = appendAt(e.buf, &c.min, c.min.prec)
		e.buf = append(e.buf, ", max_error "...)
		e.buf = append(e.buf, c.risk.maxErrText...)
		e.buf = append(e.buf, ", "...)
		e.buf = append(e.buf, c.fit...)
		e.buf = append(e.buf, ')')
		return
	}
	e.buf = append(e.buf, " (min "...)
	e.buf = appendAt(e.buf, &c.min, c.min.prec)
	if c.header {
		e.buf = append(e.buf, ", Sys1-Min-Confidence"...)
	}
	e.buf = append(e.buf, ')')
}

// appendDistinct writes v with at least prec decimals, and with as many more as it takes for
// its text to differ from the thresholds it is compared with: 0.4999 < 0.50 must not read
// "0.50 < 0.50". It returns the precision used, for the thresholds. Rounding is monotone, so
// the texts never contradict the comparison they report.
func (e *evaluator) appendDistinct(v float64, prec int, t1, t2 *threshold) int {
	for prec < maxPrec {
		sv := scaled(v, prec)
		if (v == t1.v || sv != t1.scaledAt(prec)) && (v == t2.v || sv != t2.scaledAt(prec)) {
			break
		}
		prec++
	}
	e.buf = appendFixed(e.buf, v, prec)
	return prec
}

// maxPrec bounds the decimals of a reason's figures: 10^15 still scales [0, 1] exactly
// enough, and no two different probabilities a person compares differ further down.
const maxPrec = 15

var pow10 = [maxPrec + 1]float64{1, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15}

// scaled is v, a probability, in units of 10^-prec rounded half up: the digits appendFixed
// writes. Every step is monotone, so v < t never shows as digits above t's.
func scaled(v float64, prec int) uint64 { return uint64(v*pow10[prec] + 0.5) }

func (t *threshold) scaledAt(prec int) uint64 {
	if prec == t.prec {
		return t.scaled
	}
	return scaled(t.v, prec)
}

// appendFixed writes v, a probability in [0, 1], with prec decimals. It is strconv's 'f'
// format for these numbers at a fraction of its cost; evaluation writes a few figures for
// every question of every run.
func appendFixed(b []byte, v float64, prec int) []byte {
	n := scaled(v, prec)
	var digits [maxPrec + 2]byte
	i := len(digits)
	for k := 0; k < prec; k++ {
		i--
		digits[i] = byte('0' + n%10)
		n /= 10
	}
	b = strconv.AppendUint(b, n, 10)
	if prec > 0 {
		b = append(b, '.')
		b = append(b, digits[i:]...)
	}
	return b
}

// appendAt writes a threshold at prec decimals (its prepared text when that is its own).
func appendAt(b []byte, t *threshold, prec int) []byte {
	if prec == t.prec && t.text != "" {
		return append(b, t.text...)
	}
	return appendFixed(b, t.v, prec)
}

// appendRaw writes a provider's out-of-range figure as it is (NaN, +Inf, 1.3).
func appendRaw(b []byte, v float64) []byte {
	return strconv.AppendFloat(b, v, 'g', 6, 64)
}

// appendClipped writes a provider-supplied word, cut short: reasons are stored and shown.
func appendClipped(b []byte, s string) []byte {
	const limit = 32
	if len(s) > limit {
		return strconv.AppendQuote(b, s[:limit]+"…")
	}
	return strconv.AppendQuote(b, s)
}

// auditDraw maps (run id, question) to a number in [0, 1) that looks uniform: FNV-1a over
// both, then the splitmix64 finaliser (FNV alone leaves the high bits of short, similar keys
// correlated). A rule samples a decided answer when the draw is below its share, so a
// redelivery or replay of the run samples the same questions.
func auditDraw(runID, question string) float64 {
	const (
		offset64 = 14695981039346656037
		prime64  = 1099511628211
	)
	h := uint64(offset64)
	for i := 0; i < len(runID); i++ {
		h ^= uint64(runID[i])
		h *= prime64
	}
	// The separator: run ids are ASCII, so no run id ends in 0xff and ("ab","c") ≠ ("a","bc").
	h ^= 0xff
	h *= prime64
	for i := 0; i < len(question); i++ {
		h ^= uint64(question[i])
		h *= prime64
	}
	h ^= h >> 30
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 27
	h *= 0x94d049bb133111eb
	h ^= h >> 31
	return float64(h>>11) / (1 << 53)
}
