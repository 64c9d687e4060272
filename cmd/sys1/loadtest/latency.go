package loadtest

import (
	"math"
	"slices"
	"time"
)

// Summary is the distribution of one measured quantity. Percentiles are exact (nearest rank
// over every sample): a run holds at most a few hundred thousand samples, so sorting them
// costs less than a histogram's approximation would explain.
type Summary struct {
	Count int     `json:"count"`
	MinMS float64 `json:"min_ms"`
	P50MS float64 `json:"p50_ms"`
	P90MS float64 `json:"p90_ms"`
	P99MS float64 `json:"p99_ms"`
	MaxMS float64 `json:"max_ms"`
	// MeanMS is the arithmetic mean.
	MeanMS float64 `json:"mean_ms"`
}

// Percentile returns the nearest-rank p-th percentile (0 ≤ p ≤ 100) of sorted, ascending
// samples: the smallest sample with at least p% of the samples at or below it. p ≤ 0 gives
// the minimum, p ≥ 100 the maximum, and no samples give zero.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	if p <= 0 {
		return sorted[0]
	}
	if p >= 100 {
		return sorted[n-1]
	}
	// The rank is ⌈p·n/100⌉, but p (99.9) is not exact in binary: when p·n/100 is a whole
	// number the product can land just above it and ceil would take the next sample. The
	// relative nudge is far below the rounding error's reach of the next integer down.
	x := p * float64(n) / 100
	rank := int(math.Ceil(x - x*1e-12))
	return sorted[min(max(rank, 1), n)-1]
}

// Summarize sorts samples in place and summarises them.
func Summarize(samples []time.Duration) Summary {
	if len(samples) == 0 {
		return Summary{}
	}
	slices.Sort(samples)
	var sum time.Duration
	for _, d := range samples {
		sum += d
	}
	return Summary{
		Count:  len(samples),
		MinMS:  ms(samples[0]),
		P50MS:  ms(Percentile(samples, 50)),
		P90MS:  ms(Percentile(samples, 90)),
		P99MS:  ms(Percentile(samples, 99)),
		MaxMS:  ms(samples[len(samples)-1]),
		MeanMS: ms(sum / time.Duration(len(samples))),
	}
}

// ms is a duration in milliseconds with microsecond resolution.
func ms(d time.Duration) float64 { return math.Round(float64(d)/1e3) / 1e3 }
