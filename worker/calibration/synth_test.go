package calibration

import (
	"math"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/worker/calibration/synthetic"
)

// synth returns synthetic.Generate's answers as samples: as reported (distorted by
// distort) and as the truth.
func synth(typ contract.QuestionType, n int, distort float64, seed uint64) (reported, truth []Sample) {
	answers := synthetic.Generate(typ, n, distort, seed)
	reported, truth = make([]Sample, n), make([]Sample, n)
	for i, a := range answers {
		reported[i] = Sample{Probs: a.Reported, Label: a.Label, Confidence: math.NaN()}
		truth[i] = Sample{Probs: a.Truth, Label: a.Label, Confidence: math.NaN()}
	}
	return reported, truth
}
