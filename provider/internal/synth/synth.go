// Package synth writes deterministic, model-free System One answers.
//
// It is shared by the fake Ollama (provider/ollamatest) and the simulator provider so both
// answer the same request identically and the rules live in one place:
//
//   - every option of a question gets a logit hashed from model, state, question name and
//     option, and the distribution is the softmax over those logits;
//   - confidence = 1 − H(p)/ln N; an exact tie for the top probability picks the first tied
//     option and reports confidence 0 (the model could not decide);
//   - noul answers P(true) over the two slots "false" and "true", without a confidence;
//   - score answers Σ i·pᵢ with probabilities and a legend keyed by the level index "0".."N-1".
//
// Logits are quantised to 1/32 on [-4, 4) so exact ties exist (and can be tested) without
// being common. The writer appends JSON by hand: it runs once per call in benchmarks at
// thousands of calls per second, and encoding/json would force maps, which lose order.
package synth

import (
	"math"
	"strconv"

	"github.com/sys1hq/sys1/contract"
)

// Question types, as spelled on the wire.
const (
	TypeChoice = "choice"
	TypeNoul   = "noul"
	TypeScore  = "score"
)

// Question is one question as far as answering needs it.
type Question struct {
	Name string
	// Type is "choice", "noul" or "score".
	Type string
	// Keys are the choice option keys in order, or the score level labels in order (index i
	// is level i). Ignored for noul.
	Keys []string
}

// Corruption breaks an otherwise valid answer in one way a drifting upstream might; the fake
// Ollama uses it for malformed-answer faults. The zero value writes a valid answer.
type Corruption int

// The corruptions, each applied to the first question (or the answer set as a whole).
const (
	CorruptNone Corruption = iota
	// CorruptWrongType gives the first answer another question type than asked.
	CorruptWrongType
	// CorruptMissingAnswer leaves out the last question's answer.
	CorruptMissingAnswer
	// CorruptBadSum halves the first answer's probabilities (noul: answers 1.5).
	CorruptBadSum
	// CorruptNaN writes the first answer's main value as a bare NaN, as Python's json emits.
	CorruptNaN
	// CorruptExtraAnswer adds an answer to a question nobody asked.
	CorruptExtraAnswer
)

// ExtraAnswerName is the question name CorruptExtraAnswer answers (suffixed with "_" until it
// does not clash with an asked question).
const ExtraAnswerName = "sys1_unasked"

// Response describes one answer set to write.
type Response struct {
	Model        string
	State        []byte // the request's state, raw JSON bytes: answers depend on it
	Questions    []Question
	InputTokens  int64
	OutputTokens int64
	Corrupt      Corruption
}

// Append appends the response JSON ({"model","answers","usage"}) to dst.
func Append(dst []byte, r Response) []byte {
	seed := seedOf(r.Model, r.State)
	dst = append(dst, `{"model":`...)
	dst = AppendString(dst, r.Model)
	dst = append(dst, `,"answers":{`...)
	n := len(r.Questions)
	if r.Corrupt == CorruptMissingAnswer && n > 0 {
		n--
	}
	var buf scratch
	for i := 0; i < n; i++ {
		if i > 0 {
			dst = append(dst, ',')
		}
		c := CorruptNone
		if i == 0 {
			c = r.Corrupt
		}
		dst = appendAnswer(dst, seed, r.Questions[i], c, &buf)
	}
	if r.Corrupt == CorruptExtraAnswer {
		if n > 0 {
			dst = append(dst, ',')
		}
		extra := Question{Name: extraName(r.Questions), Type: TypeNoul}
		dst = appendAnswer(dst, seed, extra, CorruptNone, &buf)
	}
	dst = append(dst, `},"usage":{"input_tokens":`...)
	dst = strconv.AppendInt(dst, r.InputTokens, 10)
	dst = append(dst, `,"output_tokens":`...)
	dst = strconv.AppendInt(dst, r.OutputTokens, 10)
	dst = append(dst, "}}"...)
	return dst
}

func extraName(qs []Question) string {
	name := ExtraAnswerName
	for clash := true; clash; {
		clash = false
		for _, q := range qs {
			if q.Name == name {
				name += "_"
				clash = true
				break
			}
		}
	}
	return name
}

// scratch holds per-call buffers reused across the questions of one response.
type scratch struct {
	logits [32]float64
	probs  [32]float64
	big    []float64 // for questions with more options than the arrays hold
}

func (s *scratch) floats(n int) (logits, probs []float64) {
	if n <= len(s.logits) {
		return s.logits[:n], s.probs[:n]
	}
	if cap(s.big) < 2*n {
		s.big = make([]float64, 2*n)
	}
	return s.big[:n], s.big[n : 2*n]
}

// Distribution computes the probabilities of a question's slots and the index of the top one
// (the first on an exact tie) with its confidence. It is exported for tests that check the
// fake's answers against the rule.
func Distribution(model string, state []byte, q Question) (probs []float64, top int, confidence float64) {
	seed := seedOf(model, state)
	var s scratch
	p, top, conf := distribution(seed, q, &s)
	return append([]float64(nil), p...), top, conf
}

func slotCount(q Question) int {
	if q.Type == TypeNoul {
		return 2
	}
	return len(q.Keys)
}

func distribution(seed uint64, q Question, s *scratch) (probs []float64, top int, confidence float64) {
	n := slotCount(q)
	logits, probs := s.floats(n)
	qh := hashString(seed, q.Name)
	maxLogit := math.Inf(-1)
	for i := 0; i < n; i++ {
		var h uint64
		switch q.Type {
		case TypeNoul:
			// slot 0 is "false", slot 1 is "true"
			if i == 0 {
				h = hashString(qh, "false")
			} else {
				h = hashString(qh, "true")
			}
		case TypeScore:
			h = hashString(hashString(qh, strconv.Itoa(i)), q.Keys[i])
		default:
			h = hashString(qh, q.Keys[i])
		}
		// 256 logit values, 1/32 apart, on [-4, 4).
		l := float64(mix(h)%256)/32 - 4
		logits[i] = l
		if l > maxLogit {
			maxLogit = l
		}
	}
	var sum float64
	for i, l := range logits {
		e := math.Exp(l - maxLogit)
		probs[i] = e
		sum += e
	}
	ties := 0
	top = -1
	for i := range probs {
		probs[i] /= sum
		if logits[i] == maxLogit {
			ties++
			if top < 0 {
				top = i
			}
		}
	}
	if ties > 1 || n < 2 {
		return probs, top, 0
	}
	var entropy float64
	for _, p := range probs {
		if p > 0 {
			entropy -= p * math.Log(p)
		}
	}
	confidence = 1 - entropy/math.Log(float64(n))
	confidence = math.Min(1, math.Max(0, confidence))
	return probs, top, confidence
}

var wrongType = map[string]string{TypeChoice: TypeNoul, TypeNoul: TypeScore, TypeScore: TypeChoice}

func appendAnswer(dst []byte, seed uint64, q Question, c Corruption, s *scratch) []byte {
	probs, top, conf := distribution(seed, q, s)
	scale := 1.0
	if c == CorruptBadSum {
		scale = 0.5
	}
	typ := q.Type
	if c == CorruptWrongType {
		typ = wrongType[q.Type]
	}
	dst = AppendString(dst, q.Name)
	dst = append(dst, `:{"type":`...)
	dst = AppendString(dst, typ)
	switch q.Type {
	case TypeNoul:
		dst = append(dst, `,"noul":`...)
		switch c {
		case CorruptNaN:
			dst = append(dst, "NaN"...)
		case CorruptBadSum:
			dst = append(dst, "1.5"...)
		default:
			dst = appendFloat(dst, probs[1])
		}
	case TypeScore:
		var expected float64
		for i, p := range probs {
			expected += float64(i) * p
		}
		dst = append(dst, `,"score":`...)
		if c == CorruptNaN {
			dst = append(dst, "NaN"...)
		} else {
			dst = appendFloat(dst, expected)
		}
		dst = append(dst, `,"probabilities":{`...)
		for i, p := range probs {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = append(dst, '"')
			dst = strconv.AppendInt(dst, int64(i), 10)
			dst = append(dst, `":`...)
			dst = appendFloat(dst, p*scale)
		}
		dst = append(dst, `},"legend":{`...)
		for i, label := range q.Keys {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = append(dst, '"')
			dst = strconv.AppendInt(dst, int64(i), 10)
			dst = append(dst, `":`...)
			dst = AppendString(dst, label)
		}
		dst = append(dst, `},"confidence":`...)
		dst = appendFloat(dst, conf)
	default:
		dst = append(dst, `,"choice":`...)
		if c == CorruptNaN {
			dst = append(dst, "NaN"...)
		} else {
			dst = AppendString(dst, q.Keys[top])
		}
		dst = append(dst, `,"probabilities":{`...)
		for i, p := range probs {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = AppendString(dst, q.Keys[i])
			dst = append(dst, ':')
			dst = appendFloat(dst, p*scale)
		}
		dst = append(dst, `},"confidence":`...)
		dst = appendFloat(dst, conf)
	}
	return append(dst, '}')
}

func appendFloat(dst []byte, f float64) []byte {
	return strconv.AppendFloat(dst, f, 'g', -1, 64)
}

// AppendString appends s as a JSON string (see contract.AppendJSONString).
func AppendString(dst []byte, s string) []byte { return contract.AppendJSONString(dst, s) }

// seedOf is the hash of model and state every answer of one response starts from.
func seedOf(model string, state []byte) uint64 { return hashBytes(hashString(offset64, model), state) }

// FNV-1a, streamed so the (possibly large) state is hashed once per response, not once per
// option.
const (
	offset64 = 14695981039346656037
	prime64  = 1099511628211
)

func hashString(h uint64, s string) uint64 {
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= prime64
	}
	// a separator byte that cannot occur in UTF-8, so ("ab","c") and ("a","bc") differ
	h ^= 0xff
	h *= prime64
	return h
}

func hashBytes(h uint64, b []byte) uint64 {
	for _, c := range b {
		h ^= uint64(c)
		h *= prime64
	}
	h ^= 0xff
	h *= prime64
	return h
}

// mix is the splitmix64 finaliser: FNV's low bits are weak, and the logit uses them.
func mix(h uint64) uint64 {
	h ^= h >> 30
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 27
	h *= 0x94d049bb133111eb
	h ^= h >> 31
	return h
}
