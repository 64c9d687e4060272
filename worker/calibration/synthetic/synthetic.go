// Package synthetic generates labelled answers with a known calibration error, for the tests
// and benchmarks of temperature scaling (worker/calibration, sys1 calibrate, the worker).
//
// Each answer is drawn from a perfectly calibrated model: its label is sampled from the very
// distribution q the model states. The answer is then reported distorted by a temperature d:
// p ∝ q^d, so d > 1 is overconfident (sharper than the truth), d < 1 underconfident, and a
// correct fit finds T = d. Generation is seeded: the same arguments give the same answers.
package synthetic

import (
	"math"
	"math/rand/v2"

	"github.com/sys1hq/sys1/contract"
)

// Answer is one synthetic labelled answer.
type Answer struct {
	// Reported is the distribution as the distorted model reports it, Truth the calibrated
	// one. Choice: 4 options; score: 5 levels; noul: [P(false), P(true)].
	Reported, Truth []float64
	// Label is the index of the drawn class.
	Label int
}

// Generate draws n answers of typ, distorted by temperature distort, from seed.
//
// How strongly the model leans to its answer is uniform on [2, 5] in logits: a decision
// model that is usually sure and sometimes torn. Choice has 4 options with small noise and one
// favoured option; score has 5 ordered levels with mass around a centre level; noul leans
// either way. The shapes keep distorted probabilities mostly above calibration.Epsilon.
// Draws do not depend on distort, so the same seed gives the same labels for every
// distortion.
func Generate(typ contract.QuestionType, n int, distort float64, seed uint64) []Answer {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	out := make([]Answer, n)
	for i := range out {
		var logits []float64
		margin := 2 + 3*r.Float64()
		switch typ {
		case contract.TypeNoul:
			z := margin
			if r.IntN(2) == 0 {
				z = -z
			}
			logits = []float64{0, z}
		case contract.TypeScore:
			centre := float64(r.IntN(5)) + r.NormFloat64()*0.15
			logits = make([]float64, 5)
			for j := range logits {
				logits[j] = -0.55 * margin * math.Abs(float64(j)-centre)
			}
		default:
			logits = make([]float64, 4)
			for j := range logits {
				logits[j] = r.NormFloat64() * 0.5
			}
			logits[r.IntN(4)] += margin
		}
		q := Softmax(logits, 1)
		u, y := r.Float64(), len(q)-1
		for j, acc := 0, 0.0; j < len(q); j++ {
			acc += q[j]
			if u < acc {
				y = j
				break
			}
		}
		out[i] = Answer{Reported: Softmax(logits, distort), Truth: q, Label: y}
	}
	return out
}

// Softmax is exp(scale·zᵢ) normalised, computed without overflow.
func Softmax(z []float64, scale float64) []float64 {
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
