package calibration

import (
	"fmt"
	"math"

	"github.com/sys1hq/sys1/contract"
)

// Sample is one labelled answer: its distribution and the index of the true class in it.
type Sample struct {
	// Probs is the raw distribution in the answer's order (choice options, score levels), or
	// [P(false), P(true)] for noul.
	Probs []float64
	// Label is the index in Probs of the labelled class; LabelName is the label as
	// labelled_answers spells it (option key, "true"/"false", level index), for messages.
	Label     int
	LabelName string
	// Confidence is the answer's own confidence as the provider reported it, NaN when it sent
	// none (noul). It is the "before" value of coverage on confidence.
	Confidence float64
}

// SkipReason says why a labelled row cannot be used; the command counts rows per reason.
type SkipReason string

// The reasons a row is skipped.
const (
	SkipNoProbabilities SkipReason = "probabilities missing"
	SkipLengthMismatch  SkipReason = "probability keys and values differ in length"
	SkipBadProbability  SkipReason = "probability NaN, infinite or outside [0, 1]"
	SkipBadSum          SkipReason = "probabilities do not sum to 1"
	SkipDuplicateKey    SkipReason = "a probability key appears twice"
	SkipUnknownLabel    SkipReason = "label is not one of the answer's keys"
	SkipNoulKeys        SkipReason = "noul probabilities are not keyed false and true"
	SkipUnknownType     SkipReason = "unknown question type"
	SkipTypeChanged     SkipReason = "question type changed; only rows of the latest type are fitted"
	SkipSuperseded      SkipReason = "an older label of a run and question labelled again later"
)

// SkipError is why NewSample refused a row.
type SkipError struct {
	Reason SkipReason
	Detail string
}

func (e *SkipError) Error() string {
	if e.Detail == "" {
		return string(e.Reason)
	}
	return string(e.Reason) + ": " + e.Detail
}

func skip(r SkipReason, format string, args ...any) *SkipError {
	return &SkipError{Reason: r, Detail: fmt.Sprintf(format, args...)}
}

// NewSample builds a sample from one row of labelled_answers: the raw distribution's keys and
// values in the answer's order (noul: ["false","true"] with [1−P, P], in any order), the label
// (an option key, "true"/"false", or a level index in decimal) and the answer's confidence
// (nil when absent). A row that cannot be used is a *SkipError naming why. Probabilities must
// be finite, in [0, 1], and sum to 1 within contract.ProbabilityTolerance, as the contract
// demands of every answer.
func NewSample(typ contract.QuestionType, keys []string, values []float64, label string, confidence *float64) (Sample, error) {
	switch typ {
	case contract.TypeChoice, contract.TypeScore, contract.TypeNoul:
	default:
		return Sample{}, skip(SkipUnknownType, "%q", string(typ))
	}
	if len(keys) == 0 || len(values) == 0 {
		return Sample{}, &SkipError{Reason: SkipNoProbabilities}
	}
	if len(keys) != len(values) {
		return Sample{}, skip(SkipLengthMismatch, "%d keys, %d values", len(keys), len(values))
	}
	sum := 0.0
	for i, p := range values {
		if math.IsNaN(p) || p < 0 || p > 1 { // NaN fails every comparison; ±Inf is outside [0, 1]
			return Sample{}, skip(SkipBadProbability, "%s = %v", keys[i], p)
		}
		sum += p
	}
	if math.Abs(sum-1) > contract.ProbabilityTolerance {
		return Sample{}, skip(SkipBadSum, "they sum to %.4f", sum)
	}
	for i := range keys {
		for j := range i {
			if keys[i] == keys[j] {
				return Sample{}, skip(SkipDuplicateKey, "%q", keys[i])
			}
		}
	}
	conf := math.NaN()
	if confidence != nil && !math.IsNaN(*confidence) && !math.IsInf(*confidence, 0) {
		conf = *confidence
	}
	if typ == contract.TypeNoul {
		if len(keys) != 2 {
			return Sample{}, skip(SkipNoulKeys, "%d keys", len(keys))
		}
		f, t := index(keys, "false"), index(keys, "true")
		if f < 0 || t < 0 {
			return Sample{}, skip(SkipNoulKeys, "%q", keys)
		}
		var y int
		switch label {
		case "false":
			y = 0
		case "true":
			y = 1
		default:
			return Sample{}, skip(SkipUnknownLabel, "%q (noul labels are true or false)", label)
		}
		return Sample{Probs: []float64{values[f], values[t]}, Label: y, LabelName: label, Confidence: math.NaN()}, nil
	}
	if len(keys) < 2 {
		return Sample{}, skip(SkipNoProbabilities, "one option only")
	}
	y := index(keys, label)
	if y < 0 {
		return Sample{}, skip(SkipUnknownLabel, "%q", label)
	}
	return Sample{Probs: append([]float64(nil), values...), Label: y, LabelName: label, Confidence: conf}, nil
}

func index(keys []string, k string) int {
	for i, s := range keys {
		if s == k {
			return i
		}
	}
	return -1
}

// checkSamples rejects samples that NewSample would never build, so a caller that builds
// them by hand gets an error instead of a silently wrong fit.
func checkSamples(samples []Sample) error {
	for i, s := range samples {
		if len(s.Probs) < 2 {
			return fmt.Errorf("sample %d: %d classes, need at least 2", i, len(s.Probs))
		}
		if s.Label < 0 || s.Label >= len(s.Probs) {
			return fmt.Errorf("sample %d: label index %d outside its %d classes", i, s.Label, len(s.Probs))
		}
		for _, p := range s.Probs {
			if math.IsNaN(p) || p < 0 || p > 1 {
				return fmt.Errorf("sample %d: probability %v outside [0, 1]", i, p)
			}
		}
	}
	return nil
}
