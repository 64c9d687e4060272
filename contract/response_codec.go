package contract

import (
	"bytes"
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode/utf8"
)

// ProbabilityTolerance is how far a distribution's sum may stray from 1: providers round each
// probability (to 4 decimals, typically), so 26 rounded values can miss 1 by a little.
const ProbabilityTolerance = 0.03

// levelKeys are the probability and legend keys of score levels: "0", "1", … "25".
var levelKeys = func() []string {
	k := make([]string, MaxLevels)
	for i := range k {
		k[i] = strconv.Itoa(i)
	}
	return k
}()

// DecodeResponse decodes a provider's answer to req and checks it against the request:
// contract drift is an error, never a pass-through. There must be one answer per question,
// with the question's name and type; probabilities are finite, in [0, 1], keyed exactly by
// the options (score: by level index "0".."N-1") and sum to 1 within ProbabilityTolerance; a
// choice is one of the options; a score lies in [0, N-1]; noul and confidence lie in [0, 1];
// a legend may be an object or an array; usage is non-negative. Unknown fields are kept:
// Answer.Raw holds each answer's bytes verbatim and Response.Extra the unknown top-level
// fields. Answers come back in request order. Any failure is SYS1_UPSTREAM_ERROR whose
// message names each problem's path; its Err is the Problems.
func DecodeResponse(req *Request, body []byte) (*Response, *Error) {
	if req == nil {
		return nil, Errorf(CodeInternal, "DecodeResponse needs the request the answer is for")
	}
	if !utf8.Valid(body) {
		return nil, upstreamError(Problems{{Path: "body", Message: fmt.Sprintf("invalid UTF-8 at byte %d", firstInvalidUTF8(body))}})
	}
	if !checkDepth(body, MaxDepth) {
		return nil, upstreamError(Problems{{Path: "body", Message: fmt.Sprintf("nesting deeper than %d levels", MaxDepth)}})
	}
	// One copy of the body backs every Raw and Extra value: callers may reuse their buffer.
	buf := bytes.Clone(body)
	d := responseDecoder{p: parser{data: buf, text: string(buf), strict: true}, strict: true, req: req}
	resp, err := d.decode()
	if err != nil {
		d.probs.add("body", err.Error())
		return nil, upstreamError(capProblems(&d.probs))
	}
	if len(d.probs.list) > 0 {
		return nil, upstreamError(capProblems(&d.probs))
	}
	return resp, nil
}

// apath names a place in an answer for problem messages; it is only rendered when there is a
// problem, so a valid response builds no path strings.
type apath struct{ name, sub string }

func (p apath) at(suffix string) string { return "answers." + p.name + p.sub + suffix }
func (p apath) with(sub string) apath   { return apath{name: p.name, sub: p.sub + sub} }

type responseDecoder struct {
	p      parser
	strict bool
	req    *Request
	probs  problemList
}

func (d *responseDecoder) skipQuiet() error {
	strict := d.p.strict
	d.p.strict = false
	_, _, err := d.p.skip()
	d.p.strict = strict
	return err
}

// skipChecked skips a value at path, reporting duplicate keys inside it, and returns its span.
func (d *responseDecoder) skipChecked(path string) ([]byte, error) {
	d.p.path = append(d.p.path[:0], pathSeg{key: path, index: -1})
	s, e, err := d.p.skip()
	d.p.path = d.p.path[:0]
	d.probs.take(&d.p)
	if err != nil {
		return nil, err
	}
	return d.p.data[s:e], nil
}

func (d *responseDecoder) decode() (*Response, error) {
	if d.p.kind() != kindObject {
		return nil, d.p.fail("the response must be a JSON object")
	}
	resp := &Response{}
	var found []Answer // arrival order; reordered below
	var foundIdx []int
	var seenTop []string // top-level keys: a handful
	answersSeen, answersBad := false, false
	err := d.p.object(func(key []byte) error {
		k := d.p.keyString()
		if contains(seenTop, k) {
			d.probs.add(k, "duplicate key")
			return d.skipQuiet()
		}
		seenTop = append(seenTop, k)
		switch k {
		case "model":
			if kd := d.p.kind(); kd != kindString {
				d.probs.add("model", "must be a string, got "+kindName(kd))
				return d.skipQuiet()
			}
			s, err := d.p.str()
			resp.Model = s
			return err
		case "answers":
			answersSeen = true
			if kd := d.p.kind(); kd != kindObject {
				d.probs.add("answers", "must be an object of named answers, got "+kindName(kd))
				answersBad = true
				return d.skipQuiet()
			}
			return d.p.object(func(key []byte) error {
				name := d.p.keyString()
				path := apath{name: name}
				qi := d.questionIndex(name)
				if qi < 0 {
					d.probs.add(path.at(""), "answers no question of the request")
					return d.skipQuiet()
				}
				for _, j := range foundIdx {
					if j == qi {
						d.probs.add("answers", fmt.Sprintf("duplicate key %q", name))
						return d.skipQuiet()
					}
				}
				a, st, err := d.answer(name, path)
				if err != nil {
					return err
				}
				checkAnswer(&d.req.Questions[qi], &a, st, path, &d.probs)
				found = append(found, a)
				foundIdx = append(foundIdx, qi)
				return nil
			})
		case "usage":
			return d.usage(&resp.Usage)
		default:
			raw, err := d.skipChecked(k)
			if err != nil {
				return err
			}
			resp.Extra = append(resp.Extra, RawField{Key: k, Value: raw})
			return nil
		}
	})
	if err != nil {
		return nil, err
	}
	if err := d.p.end(); err != nil {
		return nil, err
	}
	if !answersSeen {
		d.probs.add("answers", "required")
		return resp, nil
	}
	// Request order, whatever order the provider used.
	resp.Answers = make([]Answer, len(d.req.Questions))
	have := make([]bool, len(d.req.Questions))
	for i, qi := range foundIdx {
		resp.Answers[qi] = found[i]
		have[qi] = true
	}
	for i, ok := range have {
		if !ok && !answersBad {
			d.probs.add("answers."+d.req.Questions[i].Name, "missing: the request asked this question")
		}
	}
	return resp, nil
}

func (d *responseDecoder) questionIndex(name string) int {
	for i := range d.req.Questions {
		if d.req.Questions[i].Name == name {
			return i
		}
	}
	return -1
}

func (d *responseDecoder) usage(u *Usage) error {
	if k := d.p.kind(); k != kindObject {
		if d.strict {
			d.probs.add("usage", "must be an object, got "+kindName(k))
		}
		return d.skipQuiet()
	}
	return d.p.object(func(key []byte) error {
		var dst *int64
		switch string(key) {
		case "input_tokens":
			dst = &u.InputTokens
		case "output_tokens":
			dst = &u.OutputTokens
		default:
			_, err := d.skipChecked("usage." + string(key))
			return err
		}
		path := func() string { return "usage." + string(key) }
		if k := d.p.kind(); k != kindNumber {
			if d.strict {
				d.probs.add(path(), "must be a non-negative integer, got "+kindName(k))
			}
			return d.skipQuiet()
		}
		f, err := d.p.float()
		if err != nil {
			return err
		}
		if d.strict && (f < 0 || f != math.Trunc(f) || f > 1<<53) {
			d.probs.add(path(), fmt.Sprintf("must be a non-negative integer, got %v", f))
			return nil
		}
		*dst = int64(f)
		return nil
	})
}

// Answer fields, as bits: which were present, and which were present but malformed.
const (
	aType = 1 << iota
	aChoice
	aNoul
	aScore
	aConfidence
	aProbabilities
	aLegend
)

type answerState struct{ present, bad int }

func (s answerState) ok(bit int) bool { return s.present&bit != 0 && s.bad&bit == 0 }

// answer reads one answer object, keeping its bytes as Raw.
func (d *responseDecoder) answer(name string, path apath) (Answer, answerState, error) {
	a := Answer{Name: name}
	var st answerState
	if k := d.p.kind(); k != kindObject {
		if d.strict {
			d.probs.add(path.at(""), "must be an object, got "+kindName(k))
		}
		st.bad = -1
		s, e, err := d.p.skip()
		if err == nil {
			a.Raw = d.p.data[s:e]
		}
		return a, st, err
	}
	start := d.p.pos
	var keys keySet
	num := func(bit int, field string, dst *float64) error {
		if k := d.p.kind(); k != kindNumber {
			if d.strict {
				d.probs.add(path.at("."+field), "must be a number, got "+kindName(k))
			}
			st.bad |= bit
			return d.skipQuiet()
		}
		f, err := d.p.float()
		*dst = f
		return err
	}
	err := d.p.object(func(key []byte) error {
		k := d.p.keyString()
		if keys.add(k) {
			if d.strict {
				d.probs.add(path.at(""), fmt.Sprintf("duplicate key %q", k))
			}
			return d.skipQuiet()
		}
		switch k {
		case "type":
			st.present |= aType
			if kd := d.p.kind(); kd != kindString {
				if d.strict {
					d.probs.add(path.at(".type"), "must be a string, got "+kindName(kd))
				}
				st.bad |= aType
				return d.skipQuiet()
			}
			s, err := d.p.str()
			a.Type = QuestionType(s)
			return err
		case "choice":
			st.present |= aChoice
			if kd := d.p.kind(); kd != kindString {
				if d.strict {
					d.probs.add(path.at(".choice"), "must be a string, got "+kindName(kd))
				}
				st.bad |= aChoice
				return d.skipQuiet()
			}
			s, err := d.p.str()
			a.Choice = s
			return err
		case "noul":
			st.present |= aNoul
			return num(aNoul, "noul", &a.Noul)
		case "score":
			st.present |= aScore
			return num(aScore, "score", &a.Score)
		case "confidence":
			st.present |= aConfidence
			if d.p.kind() == kindNull {
				return d.p.literal("null")
			}
			var c float64
			err := num(aConfidence, "confidence", &c)
			if st.bad&aConfidence == 0 {
				a.Confidence = &c
			}
			return err
		case "probabilities":
			st.present |= aProbabilities
			return d.probabilities(&a, &st, path.with(".probabilities"))
		case "legend":
			st.present |= aLegend
			return d.legend(&a, &st, path.with(".legend"))
		default:
			_, err := d.skipChecked(path.at("." + k))
			return err
		}
	})
	if err != nil {
		return a, st, err
	}
	a.Raw = d.p.data[start:d.p.pos]
	return a, st, nil
}

func (d *responseDecoder) probabilities(a *Answer, st *answerState, path apath) error {
	if k := d.p.kind(); k != kindObject {
		if d.strict {
			d.probs.add(path.at(""), "must be an object of key → probability, got "+kindName(k))
		}
		st.bad |= aProbabilities
		return d.skipQuiet()
	}
	tooMany := false
	return d.p.object(func(key []byte) error {
		if d.strict && len(a.Probabilities) >= MaxOptions {
			// No question has more than 26 keys: the rest is wrong anyway and not kept, so a
			// hostile answer cannot make the checks quadratic.
			if !tooMany {
				d.probs.add(path.at(""), fmt.Sprintf("more than %d entries", MaxOptions))
				tooMany = true
			}
			st.bad |= aProbabilities
			return d.skipQuiet()
		}
		k := d.p.keyString()
		for _, prev := range a.Probabilities {
			if prev.Key == k {
				if d.strict {
					d.probs.add(path.at(""), fmt.Sprintf("duplicate key %q", k))
				}
				st.bad |= aProbabilities
				return d.skipQuiet()
			}
		}
		if kd := d.p.kind(); kd != kindNumber {
			if d.strict {
				d.probs.add(path.at("."+k), "must be a number, got "+kindName(kd))
			}
			st.bad |= aProbabilities
			return d.skipQuiet()
		}
		f, err := d.p.float()
		a.Probabilities = append(a.Probabilities, Probability{Key: k, P: f})
		return err
	})
}

func (d *responseDecoder) legend(a *Answer, st *answerState, path apath) error {
	switch k := d.p.kind(); k {
	case kindObject:
		tooMany := false
		return d.p.object(func(key []byte) error {
			if d.strict && len(a.Legend) >= MaxLevels {
				if !tooMany {
					d.probs.add(path.at(""), fmt.Sprintf("more than %d levels", MaxLevels))
					tooMany = true
				}
				st.bad |= aLegend
				return d.skipQuiet()
			}
			kk := d.p.keyString()
			for _, prev := range a.Legend {
				if prev.Key == kk {
					if d.strict {
						d.probs.add(path.at(""), fmt.Sprintf("duplicate key %q", kk))
					}
					st.bad |= aLegend
					return d.skipQuiet()
				}
			}
			if kd := d.p.kind(); kd != kindString {
				if d.strict {
					d.probs.add(path.at("."+kk), "must be a string, got "+kindName(kd))
				}
				st.bad |= aLegend
				return d.skipQuiet()
			}
			s, err := d.p.str()
			a.Legend = append(a.Legend, LegendEntry{Key: kk, Label: s})
			return err
		})
	case kindArray:
		i := 0
		tooMany := false
		return d.p.array(func() error {
			defer func() { i++ }()
			if d.strict && i >= MaxLevels {
				if !tooMany {
					d.probs.add(path.at(""), fmt.Sprintf("more than %d levels", MaxLevels))
					tooMany = true
				}
				st.bad |= aLegend
				return d.skipQuiet()
			}
			if kd := d.p.kind(); kd != kindString {
				if d.strict {
					d.probs.add(fmt.Sprintf("%s[%d]", path.at(""), i), "must be a string, got "+kindName(kd))
				}
				st.bad |= aLegend
				return d.skipQuiet()
			}
			s, err := d.p.str()
			key := strconv.Itoa(i)
			if i < len(levelKeys) {
				key = levelKeys[i]
			}
			a.Legend = append(a.Legend, LegendEntry{Key: key, Label: s})
			return err
		})
	default:
		if d.strict {
			d.probs.add(path.at(""), "must be an object or an array of level labels, got "+kindName(k))
		}
		st.bad |= aLegend
		return d.skipQuiet()
	}
}

func finite(f float64) bool { return !math.IsNaN(f) && !math.IsInf(f, 0) }

func unit(f float64) bool { return finite(f) && f >= 0 && f <= 1 }

// checkAnswer checks a parsed answer against its question.
func checkAnswer(q *Question, a *Answer, st answerState, path apath, probs *problemList) {
	if st.bad == -1 {
		return // not an object; already reported
	}
	if st.present&aType == 0 {
		probs.add(path.at(".type"), "required")
		return
	}
	if !st.ok(aType) {
		return
	}
	if a.Type != q.Type {
		probs.add(path.at(".type"), fmt.Sprintf("must be %q (the question's type), got %q", q.Type, a.Type))
		return
	}
	if st.ok(aConfidence) && a.Confidence != nil && !unit(*a.Confidence) {
		probs.add(path.at(".confidence"), fmt.Sprintf("must be in [0, 1], got %v", *a.Confidence))
	}
	switch q.Type {
	case TypeChoice:
		var small [MaxOptions]string
		keys := small[:len(q.Options)]
		for i, o := range q.Options {
			keys[i] = o.Key
		}
		switch {
		case st.present&aChoice == 0:
			probs.add(path.at(".choice"), "required")
		case st.ok(aChoice) && !contains(keys, a.Choice):
			probs.add(path.at(".choice"), fmt.Sprintf("%q is not one of the options (%s)", a.Choice, strings.Join(keys, ", ")))
		}
		checkDistribution(a, st, keys, path, true, probs)
	case TypeNoul:
		switch {
		case st.present&aNoul == 0:
			probs.add(path.at(".noul"), "required")
		case st.ok(aNoul) && !unit(a.Noul):
			probs.add(path.at(".noul"), fmt.Sprintf("must be a probability in [0, 1], got %v", a.Noul))
		}
		checkDistribution(a, st, []string{"true", "false"}, path, false, probs)
	case TypeScore:
		n := len(q.Levels)
		if n > len(levelKeys) {
			n = len(levelKeys)
		}
		keys := levelKeys[:n]
		switch {
		case st.present&aScore == 0:
			probs.add(path.at(".score"), "required")
		case st.ok(aScore) && !(finite(a.Score) && a.Score >= 0 && a.Score <= float64(n-1)):
			probs.add(path.at(".score"), fmt.Sprintf("must be in [0, %d], got %v", n-1, a.Score))
		}
		checkDistribution(a, st, keys, path, true, probs)
		if st.ok(aLegend) {
			for i, e := range a.Legend {
				if !contains(keys, e.Key) {
					probs.add(path.at(".legend."+e.Key), fmt.Sprintf("is not a level index (0–%d)", n-1))
				}
				for _, prev := range a.Legend[:i] {
					if prev.Key == e.Key {
						probs.add(path.at(".legend."+e.Key), "duplicate level")
					}
				}
			}
		}
	}
}

// checkDistribution checks probabilities: keyed exactly by keys, each in [0, 1], summing to 1.
func checkDistribution(a *Answer, st answerState, keys []string, path apath, required bool, probs *problemList) {
	path = path.with(".probabilities")
	if st.present&aProbabilities == 0 {
		if required {
			probs.add(path.at(""), "required")
		}
		return
	}
	if !st.ok(aProbabilities) {
		return
	}
	sum := 0.0
	sane := true
	for _, pr := range a.Probabilities {
		if !contains(keys, pr.Key) {
			probs.add(path.at("."+pr.Key), fmt.Sprintf("is not a key of the question (%s)", strings.Join(keys, ", ")))
			sane = false
			continue
		}
		if !unit(pr.P) {
			probs.add(path.at("."+pr.Key), fmt.Sprintf("must be in [0, 1], got %v", pr.P))
			sane = false
			continue
		}
		sum += pr.P
	}
	for _, k := range keys {
		found := false
		for _, pr := range a.Probabilities {
			if pr.Key == k {
				found = true
				break
			}
		}
		if !found {
			probs.add(path.at(""), fmt.Sprintf("missing %q", k))
			sane = false
		}
	}
	if sane && math.Abs(sum-1) > ProbabilityTolerance {
		probs.add(path.at(""), fmt.Sprintf("sum to %.4f, not 1 (±%v)", sum, ProbabilityTolerance))
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// MarshalJSON encodes the response as the provider's shape: model, answers (in order, each
// verbatim), usage, then the unknown fields it arrived with.
func (r *Response) MarshalJSON() ([]byte, error) {
	b := make([]byte, 0, 128+answersSize(r.Answers))
	b = append(b, `{"model":`...)
	b = appendString(b, r.Model)
	b = append(b, `,"answers":`...)
	b = appendAnswers(b, r.Answers)
	b = append(b, `,"usage":`...)
	b = appendUsage(b, r.Usage)
	for _, f := range r.Extra {
		b = append(b, ',')
		b = appendString(b, f.Key)
		b = append(b, ':')
		b = appendRaw(b, f.Value)
	}
	return append(b, '}'), nil
}

// Result returns what a successful run of this response produced, for a reply or a record.
func (r *Response) Result(provider string) *Result {
	return &Result{Provider: provider, Model: r.Model, Answers: r.Answers, Usage: r.Usage}
}

func answersSize(as []Answer) int {
	n := 2
	for i := range as {
		n += len(as[i].Name) + len(as[i].Raw) + 4
		if len(as[i].Raw) == 0 {
			n += 256
		}
	}
	return n
}

func appendAnswers(b []byte, as []Answer) []byte {
	b = append(b, '{')
	for i := range as {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, as[i].Name)
		b = append(b, ':')
		b = as[i].AppendJSON(b)
	}
	return append(b, '}')
}

// AppendJSON appends the answer: Raw verbatim when present (the provider's bytes, unknown
// fields included), otherwise built from the typed fields (answers made in Go, e.g. by fakes).
func (a *Answer) AppendJSON(b []byte) []byte {
	if len(a.Raw) > 0 {
		return append(b, a.Raw...)
	}
	b = append(b, `{"type":`...)
	b = appendString(b, string(a.Type))
	switch a.Type {
	case TypeChoice:
		b = append(b, `,"choice":`...)
		b = appendString(b, a.Choice)
	case TypeNoul:
		b = append(b, `,"noul":`...)
		b = appendFloat(b, a.Noul)
	case TypeScore:
		b = append(b, `,"score":`...)
		b = appendFloat(b, a.Score)
	}
	if len(a.Probabilities) > 0 {
		b = append(b, `,"probabilities":{`...)
		for i, p := range a.Probabilities {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, p.Key)
			b = append(b, ':')
			b = appendFloat(b, p.P)
		}
		b = append(b, '}')
	}
	if a.Confidence != nil {
		b = append(b, `,"confidence":`...)
		b = appendFloat(b, *a.Confidence)
	}
	if len(a.Legend) > 0 {
		b = append(b, `,"legend":{`...)
		for i, e := range a.Legend {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, e.Key)
			b = append(b, ':')
			b = appendString(b, e.Label)
		}
		b = append(b, '}')
	}
	return append(b, '}')
}

// MarshalJSON encodes {"provider", "model", "answers": {name: answer verbatim, …}, "usage"}.
func (r *Result) MarshalJSON() ([]byte, error) {
	return r.AppendJSON(make([]byte, 0, 128+len(r.Provider)+len(r.Model)+answersSize(r.Answers))), nil
}

// AppendJSON appends the result's JSON (see MarshalJSON) to b.
func (r *Result) AppendJSON(b []byte) []byte {
	b = append(b, `{"provider":`...)
	b = appendString(b, r.Provider)
	b = append(b, `,"model":`...)
	b = appendString(b, r.Model)
	b = append(b, `,"answers":`...)
	b = appendAnswers(b, r.Answers)
	b = append(b, `,"usage":`...)
	b = appendUsage(b, r.Usage)
	return append(b, '}')
}

// UnmarshalJSON reads a result leniently (no request to check against): answers keep their
// order and bytes (Raw) and get their typed fields filled, which the sink flattens.
func (r *Result) UnmarshalJSON(b []byte) error {
	buf := bytes.Clone(b)
	d := responseDecoder{p: parser{data: buf, text: string(buf)}}
	if d.p.kind() != kindObject {
		return fmt.Errorf("contract: decode result: %w", d.p.fail("expected an object"))
	}
	var out Result
	err := d.p.object(func(key []byte) error {
		switch string(key) {
		case "provider", "model":
			if d.p.kind() != kindString {
				return d.skipQuiet()
			}
			s, err := d.p.str()
			if string(key) == "provider" {
				out.Provider = s
			} else {
				out.Model = s
			}
			return err
		case "answers":
			if d.p.kind() != kindObject {
				return d.skipQuiet()
			}
			return d.p.object(func(key []byte) error {
				name := d.p.keyString()
				a, _, err := d.answer(name, apath{name: name})
				out.Answers = append(out.Answers, a)
				return err
			})
		case "usage":
			return d.usage(&out.Usage)
		}
		return d.skipQuiet()
	})
	if err == nil {
		err = d.p.end()
	}
	if err != nil {
		return fmt.Errorf("contract: decode result: %w", err)
	}
	*r = out
	return nil
}
