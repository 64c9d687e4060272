package calibration

import (
	"errors"
	"math"
	"testing"

	"github.com/sys1hq/sys1/contract"
)

func TestCalibrationNewSample(t *testing.T) {
	conf := 0.42
	s, err := NewSample(contract.TypeChoice, []string{"bug", "billing"}, []float64{0.3, 0.7}, "billing", &conf)
	if err != nil || s.Label != 1 || s.Probs[1] != 0.7 || s.Confidence != 0.42 || s.LabelName != "billing" {
		t.Errorf("choice: %+v, %v", s, err)
	}
	// Noul is laid out [P(false), P(true)] whatever the key order.
	s, err = NewSample(contract.TypeNoul, []string{"true", "false"}, []float64{0.8, 0.2}, "true", nil)
	if err != nil || s.Probs[0] != 0.2 || s.Probs[1] != 0.8 || s.Label != 1 || !math.IsNaN(s.Confidence) {
		t.Errorf("noul: %+v, %v", s, err)
	}
	s, err = NewSample(contract.TypeScore, []string{"0", "1", "2"}, []float64{0.1, 0.2, 0.7}, "0", nil)
	if err != nil || s.Label != 0 {
		t.Errorf("score: %+v, %v", s, err)
	}

	for _, tc := range []struct {
		name   string
		typ    contract.QuestionType
		keys   []string
		values []float64
		label  string
		want   SkipReason
	}{
		{"no probabilities", contract.TypeChoice, nil, nil, "a", SkipNoProbabilities},
		{"lengths differ", contract.TypeChoice, []string{"a", "b"}, []float64{1}, "a", SkipLengthMismatch},
		{"NaN", contract.TypeChoice, []string{"a", "b"}, []float64{math.NaN(), 0.5}, "a", SkipBadProbability},
		{"infinite", contract.TypeChoice, []string{"a", "b"}, []float64{math.Inf(1), 0}, "a", SkipBadProbability},
		{"negative", contract.TypeScore, []string{"0", "1"}, []float64{-0.1, 1.1}, "0", SkipBadProbability},
		{"bad sum", contract.TypeChoice, []string{"a", "b"}, []float64{0.5, 0.2}, "a", SkipBadSum},
		{"duplicate key", contract.TypeChoice, []string{"a", "a"}, []float64{0.5, 0.5}, "a", SkipDuplicateKey},
		{"unknown label", contract.TypeChoice, []string{"a", "b"}, []float64{0.5, 0.5}, "c", SkipUnknownLabel},
		{"noul label", contract.TypeNoul, []string{"false", "true"}, []float64{0.5, 0.5}, "yes", SkipUnknownLabel},
		{"noul keys", contract.TypeNoul, []string{"no", "yes"}, []float64{0.5, 0.5}, "true", SkipNoulKeys},
		{"one option", contract.TypeChoice, []string{"a"}, []float64{1}, "a", SkipNoProbabilities},
		{"type", contract.QuestionType("rank"), []string{"a", "b"}, []float64{0.5, 0.5}, "a", SkipUnknownType},
	} {
		_, err := NewSample(tc.typ, tc.keys, tc.values, tc.label, nil)
		var se *SkipError
		if !errors.As(err, &se) || se.Reason != tc.want {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}
