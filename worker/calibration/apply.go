package calibration

import (
	"fmt"
	"math"

	"github.com/sys1hq/sys1/contract"
)

// Apply calibrates one answer with fit f (see the package comment for the formulas):
//
//   - choice, score: Probabilities are max(pᵢ, ε)^(1/T) normalised, in the answer's order
//     with its keys; Confidence is 1 − H(p')/ln N (0 on an exact top tie);
//   - noul: Noul is 1 / (1 + exp((ln max(1−P, ε) − ln max(P, ε)) / T)).
//
// Temperature is T. The answer is not changed. An answer of another type than the fit's (the
// question was redefined since the fit), or without a usable distribution, is an error: the
// caller then uses the raw answer.
func Apply(f *Fit, a *contract.Answer) (contract.Calibrated, error) {
	if a.Type != f.Type {
		return contract.Calibrated{}, fmt.Errorf("calibration of %s is for a %s question, the answer is %s", f.Question, f.Type, a.Type)
	}
	return ApplyTemperature(f.Temperature, a)
}

// ApplyTemperature calibrates one answer with temperature T, as Apply does without the type
// check. T must lie in [MinTemperature, MaxTemperature].
func ApplyTemperature(T float64, a *contract.Answer) (contract.Calibrated, error) {
	if math.IsNaN(T) || T < MinTemperature || T > MaxTemperature {
		return contract.Calibrated{}, fmt.Errorf("temperature %v is outside [%g, %g]", T, MinTemperature, MaxTemperature)
	}
	beta := 1 / T
	switch a.Type {
	case contract.TypeNoul:
		if math.IsNaN(a.Noul) || a.Noul < 0 || a.Noul > 1 {
			return contract.Calibrated{}, fmt.Errorf("noul %v is not a probability", a.Noul)
		}
		p := scaleNoul(a.Noul, beta)
		return contract.Calibrated{Noul: &p, Temperature: T}, nil
	case contract.TypeChoice, contract.TypeScore:
		n := len(a.Probabilities)
		if n < 2 {
			return contract.Calibrated{}, fmt.Errorf("%s answer has %d probabilities, need at least 2", a.Type, n)
		}
		out := make([]contract.Probability, n)
		// A small distribution is scaled on the stack; the contract allows at most 26 options
		// or levels.
		var small [32]float64
		buf := small[:0]
		if n > len(small) {
			buf = make([]float64, 0, n)
		}
		for _, pr := range a.Probabilities {
			if math.IsNaN(pr.P) || pr.P < 0 || pr.P > 1 {
				return contract.Calibrated{}, fmt.Errorf("probability of %q is %v, not in [0, 1]", pr.Key, pr.P)
			}
			buf = append(buf, pr.P)
		}
		scaleInto(buf, buf, beta)
		for i, pr := range a.Probabilities {
			out[i] = contract.Probability{Key: pr.Key, P: buf[i]}
		}
		c := normalisedConfidence(buf)
		return contract.Calibrated{Probabilities: out, Confidence: &c, Temperature: T}, nil
	}
	return contract.Calibrated{}, fmt.Errorf("question type %q cannot be calibrated", string(a.Type))
}
