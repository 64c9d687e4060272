package calibration

import (
	"errors"
	"fmt"
	"math"
)

// Temperature is the outcome of fitting one temperature.
type Temperature struct {
	// T is the fitted temperature, in [MinTemperature, MaxTemperature].
	T float64
	// Converged is false when the search ran out of evaluations, stopped on a bound, or the
	// likelihood does not depend on T; Note then says which, in words for an operator.
	Converged bool
	Note      string
	// NLL is the mean negative log-likelihood at T; Evaluations counts likelihood evaluations.
	NLL         float64
	Evaluations int
}

// Search settings: ln T to 1e-6 (T to a millionth of itself), far more evaluations than
// Brent's method ever needs on a convex function (it takes 10–30).
const (
	searchTol      = 1e-6
	searchMaxEvals = 200
)

// FitTemperature finds the T minimising the mean NLL of the labels under p' ∝ max(p, ε)^(1/T)
// (see the package comment). It reads each sample's Probs and Label only.
func FitTemperature(samples []Sample) (Temperature, error) {
	if len(samples) == 0 {
		return Temperature{}, errors.New("no samples to fit")
	}
	if err := checkSamples(samples); err != nil {
		return Temperature{}, err
	}
	d := newFitData(samples)
	lo, hi := math.Log(MinTemperature), math.Log(MaxTemperature)
	f := func(u float64) float64 { return d.nll(math.Exp(-u)) }
	u, fu, evals, ok := brentMin(f, lo, hi, searchTol, searchMaxEvals)

	// Brent's method never evaluates the ends, so look at them: the minimum of a convex
	// function on an interval may sit on an end, and then the unconstrained optimum lies
	// beyond the bound.
	fLo, fHi := f(lo), f(hi)
	evals += 2
	res := Temperature{T: math.Exp(u), NLL: fu, Evaluations: evals, Converged: ok}
	spread := math.Max(math.Abs(fLo-fu), math.Abs(fHi-fu))
	switch {
	case spread <= 1e-12*(1+math.Abs(fu)):
		res = Temperature{T: 1, NLL: fu, Evaluations: evals, Note: "the likelihood does not depend on T (every answer's distribution is uniform): no temperature can be learnt"}
	case fLo <= fu || u-lo <= 2*searchTol:
		res.T, res.NLL, res.Converged = MinTemperature, math.Min(fLo, fu), false
		res.Note = fmt.Sprintf("T stopped at the lower bound %g: the labels ask for sharper probabilities than the bound allows (is the model nearly always right?)", MinTemperature)
	case fHi <= fu || hi-u <= 2*searchTol:
		res.T, res.NLL, res.Converged = MaxTemperature, math.Min(fHi, fu), false
		res.Note = fmt.Sprintf("T stopped at the upper bound %g: the probabilities carry almost no information about the labels", MaxTemperature)
	case !ok:
		res.Note = fmt.Sprintf("the search did not converge within %d evaluations", searchMaxEvals)
	}
	return res, nil
}

// fitData is the samples laid out for the likelihood: clipped log-probabilities in one slice,
// each sample's share of it, its largest log-probability and its label's.
type fitData struct {
	lp     []float64
	off    []int32
	max    []float64
	labelL []float64
}

func newFitData(samples []Sample) *fitData {
	total := 0
	for _, s := range samples {
		total += len(s.Probs)
	}
	d := &fitData{
		lp: make([]float64, 0, total), off: make([]int32, 0, len(samples)+1),
		max: make([]float64, len(samples)), labelL: make([]float64, len(samples)),
	}
	for i, s := range samples {
		d.off = append(d.off, int32(len(d.lp)))
		m := math.Inf(-1)
		for _, p := range s.Probs {
			l := clippedLog(p)
			d.lp = append(d.lp, l)
			m = math.Max(m, l)
		}
		d.max[i] = m
		d.labelL[i] = clippedLog(s.Probs[s.Label])
	}
	d.off = append(d.off, int32(len(d.lp)))
	return d
}

// nll is the mean of ln Σⱼ exp(β·lⱼ) − β·l_label over the samples, with the largest term
// factored out of each sum (β·lⱼ ≤ β·max), so no exp overflows or underflows to a zero sum.
func (d *fitData) nll(beta float64) float64 {
	sum := 0.0
	for i, m := range d.max {
		s := 0.0
		for _, l := range d.lp[d.off[i]:d.off[i+1]] {
			s += math.Exp(beta * (l - m))
		}
		sum += math.Log(s) + beta*(m-d.labelL[i])
	}
	return sum / float64(len(d.max))
}
