package calibration

import (
	"math"
	"math/rand/v2"

	"github.com/sys1hq/sys1/contract"
)

// synthetic generates n labelled answers of typ from a perfectly calibrated model (each label
// drawn from the very distribution the model states), then reports them distorted by
// temperature distort: the reported distribution is q^distort normalised, so distort > 1 is
// overconfident (sharper than the truth) and < 1 underconfident, and a fit should find
// T = distort. It also returns the true distributions. Seeded: the same arguments give the
// same samples.
func synthetic(typ contract.QuestionType, n int, distort float64, seed uint64) (reported, truth []Sample) {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	reported, truth = make([]Sample, n), make([]Sample, n)
	for i := range reported {
		var logits []float64
		// How strongly the model leans to its answer: uniform on [2, 5] in logits. The shape
		// is that of a decision model that is usually sure and sometimes torn, and keeps the
		// distorted probabilities mostly above Epsilon (a reported 0 is a rounding, see the
		// package comment; this generator does not round).
		margin := 2 + 3*r.Float64()
		switch typ {
		case contract.TypeNoul:
			z := margin
			if r.IntN(2) == 0 {
				z = -z
			}
			logits = []float64{0, z}
		case contract.TypeScore:
			// An ordered rubric of 5 levels: mass around a centre level, spread by margin.
			centre := float64(r.IntN(5)) + r.NormFloat64()*0.15
			logits = make([]float64, 5)
			for j := range logits {
				logits[j] = -0.55 * margin * math.Abs(float64(j)-centre)
			}
		default:
			// 4 options: noise, and one option the model leans to by margin.
			logits = make([]float64, 4)
			for j := range logits {
				logits[j] = r.NormFloat64() * 0.5
			}
			logits[r.IntN(4)] += margin
		}
		q := softmax(logits, 1)
		u, y := r.Float64(), len(q)-1
		for j, acc := 0, 0.0; j < len(q); j++ {
			acc += q[j]
			if u < acc {
				y = j
				break
			}
		}
		reported[i] = Sample{Probs: softmax(logits, distort), Label: y, Confidence: math.NaN()}
		truth[i] = Sample{Probs: q, Label: y, Confidence: math.NaN()}
	}
	return reported, truth
}

func softmax(z []float64, scale float64) []float64 {
	m := math.Inf(-1)
	for _, v := range z {
		m = math.Max(m, v*scale)
	}
	out := make([]float64, len(z))
	sum := 0.0
	for i, v := range z {
		out[i] = math.Exp(v*scale - m)
		sum += out[i]
	}
	for i := range out {
		out[i] /= sum
	}
	return out
}
