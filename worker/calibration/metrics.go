package calibration

import (
	"fmt"
	"math"
	"slices"

	"github.com/sys1hq/sys1/contract"
)

// ThresholdOn names the value a policy threshold is compared with, for coverage.
type ThresholdOn string

const (
	// OnConfidence: choice and score compare the answer's confidence (policy min_confidence);
	// noul, which has no confidence, compares max(P, 1 − P), so a threshold t is the policy's
	// noul_abstain_between [1 − t, t].
	OnConfidence ThresholdOn = "confidence"
	// OnProbability: the top-class probability (policy min_probability: the winning option's,
	// the most probable level's); noul as for OnConfidence.
	OnProbability ThresholdOn = "probability"
)

// ParseThresholdOn checks a ThresholdOn spelled by a person.
func ParseThresholdOn(s string) (ThresholdOn, error) {
	switch ThresholdOn(s) {
	case OnConfidence, OnProbability:
		return ThresholdOn(s), nil
	}
	return "", fmt.Errorf("%q is not %s or %s", s, OnConfidence, OnProbability)
}

// Metrics measure how well a set of probabilities matches its labels.
type Metrics struct {
	// ECE is the expected calibration error over Bins equal-width bins of the top-class
	// probability: Σ_b (n_b/N)·|accuracy_b − mean top probability_b|. 0 is perfect.
	ECE float64 `json:"ece"`
	// Brier is the mean squared error of the probabilities against the one-hot label, summed
	// over the classes (choice, score: 0 best, 2 worst); for noul the binary form
	// (P(true) − y)², 0 best, 1 worst (half the two-class sum).
	Brier float64 `json:"brier"`
	// NLL is the mean −ln max(p_label, ε): the quantity the fit minimises.
	NLL float64 `json:"nll"`
	// Accuracy is the share of answers whose most probable class is the label (noul: P ≥ 0.5
	// means true, as labelled_answers.predicted).
	Accuracy float64 `json:"accuracy"`
	// Coverage is one entry per threshold, in the order given.
	Coverage []CoveragePoint `json:"coverage"`
	// Bins are the reliability diagram's non-empty bins, lowest first.
	Bins []Bin `json:"bins"`
}

// CoveragePoint is what a policy threshold would do to the labelled answers: Coverage is the
// share of answers whose value (see ThresholdOn) is at least Threshold, i.e. the answers a
// rule with that minimum decides instead of abstaining; Accuracy is the accuracy among those
// (nil when none is covered); Decided counts them.
type CoveragePoint struct {
	Threshold float64  `json:"threshold"`
	Coverage  float64  `json:"coverage"`
	Accuracy  *float64 `json:"accuracy"`
	Decided   int      `json:"decided"`
}

// Bin is one equal-width bin of the top-class probability, [Lower, Upper) (the last bin
// includes 1).
type Bin struct {
	Lower      float64 `json:"lower"`
	Upper      float64 `json:"upper"`
	Count      int     `json:"count"`
	Confidence float64 `json:"confidence"` // the mean top-class probability in the bin
	Accuracy   float64 `json:"accuracy"`   // the share of the bin's answers that were right
}

// MeasureOptions choose the coverage thresholds and the value they apply to.
type MeasureOptions struct {
	Thresholds  []float64
	ThresholdOn ThresholdOn
}

// MeasureRaw measures the answers as the provider sent them (before calibration). Coverage on
// confidence uses each sample's reported Confidence when it has one, else the confidence
// computed from its probabilities.
func MeasureRaw(typ contract.QuestionType, samples []Sample, o MeasureOptions) Metrics {
	return measure(typ, samples, o, func(s Sample, dst []float64) ([]float64, float64) {
		return s.Probs, s.Confidence
	})
}

// MeasureCalibrated measures the answers after temperature T, exactly as Apply would hand them
// to the policy.
func MeasureCalibrated(typ contract.QuestionType, samples []Sample, T float64, o MeasureOptions) Metrics {
	beta := 1 / T
	return measure(typ, samples, o, func(s Sample, dst []float64) ([]float64, float64) {
		dst = dst[:len(s.Probs)]
		if typ == contract.TypeNoul {
			pt := scaleNoul(s.Probs[1], beta)
			dst[0], dst[1] = 1-pt, pt
		} else {
			scaleInto(dst, s.Probs, beta)
		}
		return dst, math.NaN()
	})
}

// view returns a sample's distribution (in dst or its own) and its reported confidence (NaN:
// compute it).
type view func(s Sample, dst []float64) ([]float64, float64)

func measure(typ contract.QuestionType, samples []Sample, o MeasureOptions, get view) Metrics {
	type binAcc struct {
		n       int
		conf    float64
		correct int
	}
	var bins [Bins]binAcc
	covered := make([]int, len(o.Thresholds))
	coveredRight := make([]int, len(o.Thresholds))
	maxK := 0
	for _, s := range samples {
		maxK = max(maxK, len(s.Probs))
	}
	buf := make([]float64, maxK)
	var brier, nll float64
	right := 0
	for _, s := range samples {
		p, reported := get(s, buf)
		var pred int
		var top float64
		if typ == contract.TypeNoul {
			pred, top = 0, p[0]
			if p[1] >= p[0] {
				pred, top = 1, p[1]
			}
			d := p[1] - float64(s.Label)
			brier += d * d
		} else {
			pred = argmax(p)
			top = p[pred]
			for j, v := range p {
				d := v
				if j == s.Label {
					d = v - 1
				}
				brier += d * d
			}
		}
		nll -= clippedLog(p[s.Label])
		ok := pred == s.Label
		if ok {
			right++
		}
		b := min(int(top*Bins), Bins-1)
		bins[b].n++
		bins[b].conf += top
		if ok {
			bins[b].correct++
		}
		value := top
		if o.ThresholdOn == OnConfidence && typ != contract.TypeNoul {
			value = reported
			if math.IsNaN(value) {
				value = normalisedConfidence(p)
			}
		}
		for t, th := range o.Thresholds {
			if value >= th {
				covered[t]++
				if ok {
					coveredRight[t]++
				}
			}
		}
	}
	n := float64(len(samples))
	m := Metrics{Brier: brier / n, NLL: nll / n, Accuracy: float64(right) / n}
	for b, acc := range bins {
		if acc.n == 0 {
			continue
		}
		conf, accuracy := acc.conf/float64(acc.n), float64(acc.correct)/float64(acc.n)
		m.ECE += float64(acc.n) / n * math.Abs(accuracy-conf)
		m.Bins = append(m.Bins, Bin{Lower: float64(b) / Bins, Upper: float64(b+1) / Bins, Count: acc.n, Confidence: conf, Accuracy: accuracy})
	}
	m.Coverage = make([]CoveragePoint, len(o.Thresholds))
	for t, th := range o.Thresholds {
		m.Coverage[t] = CoveragePoint{Threshold: th, Coverage: float64(covered[t]) / n, Decided: covered[t]}
		if covered[t] > 0 {
			a := float64(coveredRight[t]) / float64(covered[t])
			m.Coverage[t].Accuracy = &a
		}
	}
	return m
}

// ParseThresholds checks a list of thresholds: each a number in [0, 1]; returned sorted, without
// repeats.
func ParseThresholds(ts []float64) ([]float64, error) {
	for _, t := range ts {
		if math.IsNaN(t) || t < 0 || t > 1 {
			return nil, fmt.Errorf("threshold %v is not in [0, 1]", t)
		}
	}
	out := slices.Clone(ts)
	slices.Sort(out)
	return slices.Compact(out), nil
}
