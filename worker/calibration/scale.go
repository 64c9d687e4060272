package calibration

import "math"

// The fit's bounds and constants.
const (
	// MinTemperature and MaxTemperature bound every fit: beyond them the probabilities are
	// essentially one-hot or uniform, and a fit that wants to go there says more about the
	// data (one class, no signal) than about the model's confidence.
	MinTemperature = 0.05
	MaxTemperature = 20.0
	// Epsilon replaces probabilities below it, when fitting and when applying.
	Epsilon = 1e-6
	// Bins is the number of equal-width confidence bins of ECE and the reliability diagram.
	Bins = 15
	// DefaultMinLabels is the fewest labels a fit is made from.
	DefaultMinLabels = 50
)

var logEpsilon = math.Log(Epsilon)

// clippedLog is ln max(p, ε).
func clippedLog(p float64) float64 {
	if p < Epsilon {
		return logEpsilon
	}
	return math.Log(p)
}

// scaleInto writes the calibrated distribution of p under 1/T = beta into dst (len(dst) ==
// len(p); dst may be p): max(pᵢ, ε)^β normalised, computed in log space with the largest term
// factored out so that no power underflows to a zero sum.
func scaleInto(dst, p []float64, beta float64) {
	m := math.Inf(-1)
	for i, v := range p {
		l := clippedLog(v) * beta
		dst[i] = l
		if l > m {
			m = l
		}
	}
	sum := 0.0
	for i, l := range dst {
		e := math.Exp(l - m)
		dst[i] = e
		sum += e
	}
	for i := range dst {
		dst[i] /= sum
	}
}

// scaleNoul is the two-class form for P(true) = p: a^β / (a^β + b^β) with a = max(p, ε),
// b = max(1 − p, ε). It equals scaleInto on [1 − p, p] (second entry).
func scaleNoul(p, beta float64) float64 {
	return 1 / (1 + math.Exp(beta*(clippedLog(1-p)-clippedLog(p))))
}

// normalisedConfidence is upstream's confidence of a distribution: 1 − H(p)/ln N clamped to
// [0, 1], and 0 for an exact tie at the top or fewer than two classes.
func normalisedConfidence(p []float64) float64 {
	n := len(p)
	if n < 2 {
		return 0
	}
	top, ties := math.Inf(-1), 0
	h := 0.0
	for _, v := range p {
		switch {
		case v > top:
			top, ties = v, 1
		case v == top:
			ties++
		}
		if v > 0 {
			h -= v * math.Log(v)
		}
	}
	if ties > 1 {
		return 0
	}
	c := 1 - h/math.Log(float64(n))
	return math.Min(1, math.Max(0, c))
}

// argmax is the index of the most probable class, the first on a tie (upstream picks the
// first tied option).
func argmax(p []float64) int {
	best := 0
	for i, v := range p {
		if v > p[best] {
			best = i
		}
	}
	return best
}
