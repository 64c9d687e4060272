// Package risk chooses a policy threshold with a guaranteed error rate (selective
// classification with guaranteed risk): from labelled answers, the most permissive threshold
// on confidence (or top probability) whose upper confidence bound on the error among the
// answers it decides is at most a target ε, with probability at least 1 − δ.
//
// # The labels and their weights
//
// Labels do not sample the traffic uniformly: every abstained answer is reviewed, but only a
// known share s of decided ones (the policy's audit_sample). Each label therefore carries the
// inverse of its chance of being labelled, its Weight (1 for a reviewed abstention, 1/s for an
// audit sample), and every estimate here is inverse-probability weighted (Horvitz–Thompson):
// the error among the answers a threshold t covers is
//
//	R̂(t) = Σ_{covered} wᵢ·wrongᵢ / Σ_{covered} wᵢ
//
// which is unbiased for the traffic the labels were drawn from, where the unweighted share of
// wrong labels overstates the error 1/s-fold for the low-confidence answers the policy sent to
// review (TestRiskSyntheticUnweightedFails shows what that costs).
//
// # The bound
//
// Labels of equal weight form a stratum h (n_h labels, k_h of them wrong among those covered,
// weight w_h, W_h = w_h·n_h). Conditional on the labelled answers' values (confidences) and
// strata, each wrongᵢ is an independent Bernoulli trial, so k_h is a sum of independent,
// not necessarily identical, Bernoulli trials. The one-sided Clopper–Pearson bound
// U_h = Beta⁻¹(1 − δ_h; k_h + 1, n_h − k_h) covers their mean error p̄ with probability at
// least 1 − δ_h: U_h < p̄ only when k_h falls in a lower tail {k ≤ c} of the binomial
// Bin(n_h, p̄) of probability ≤ δ_h, and such a sum's lower tail is no heavier than that
// binomial's (Hoeffding 1956, "On the distribution of the number of successes in independent
// trials", Ann. Math. Statist. 27(3), Theorem 4: P(S ≤ c) ≤ P(Bin ≤ c) for c ≤ n·p̄ − 1). That
// covers every such tail when δ_h < 1/4: the binomial's probability up to n·p̄ is at least 1/4
// (Doerr 2018, "An elementary analysis of the probability that a binomial random variable
// exceeds its expectation", applied to the failures, for p̄ ≤ 1 − 1/n), so a tail of less ends
// below ⌊n·p̄⌋. For c = 0 it holds outright: P(S = 0) = Π(1 − pᵢ) ≤ (1 − p̄)ⁿ by AM–GM. (With a
// δ of 1/4 or more, which nobody asks of a guarantee, this step is not proven.) The strata are bounded separately, at δ_h = δ·W_h/W (rounded down a little: see
// roundShareDown), and combined
//
//	U(t) = Σ_h (W_h/W)·U_h
//
// which by the union bound (Σ δ_h ≤ δ) holds for all strata at once with probability at least
// 1 − δ. Each stratum gets the share of δ its weight has in the estimate, so the audit
// samples, which carry most of the weight of the decided answers, get most of δ.
//
// # The search
//
// Thresholds are tested from the strictest down (fixed-sequence testing), and the search
// stops at the first whose bound exceeds ε; the threshold chosen is the last that passed. The
// order is fixed by the values alone, before any label is looked at, so fixed-sequence testing
// controls the chance that any threshold passed wrongly at δ with no correction for the number
// of thresholds (Angelopoulos, Bates, Candès, Jordan, Lei 2021, "Learn then Test", §3; the
// selective-risk search of Geifman & El-Yaniv 2017, "Selective classification for deep neural
// networks", needs a union bound over its binary search instead). The candidates are the
// thresholds of a grid (multiples of 0.001 by default) at which the covered set changes. A bound
// over a handful of labels can never be ε, so the sequence starts at the strictest candidate
// that could pass if the errors there were at half the target (decided by the counts alone,
// so the order stays fixed before the labels' outcomes are read).
//
// The guarantee: with probability at least 1 − δ, the weighted error among the answers the
// chosen threshold decides — averaged over the confidences of answers like the labelled
// window's — is at most ε. It says nothing about traffic unlike the window's (another model,
// prompt or population: refit then), and it assumes the weights are right: every abstention
// reviewed, audit samples drawn with the recorded share.
package risk

import (
	"errors"
	"fmt"
	"math"
	"sort"

	"gonum.org/v1/gonum/stat/distuv"
)

// Label is one labelled answer as the fit sees it.
type Label struct {
	// Value is what a threshold is compared with (confidence, top probability, or max(P, 1−P)
	// for yes/no), in [0, 1]; an answer is covered (decided) at threshold t when Value ≥ t.
	Value float64
	// Wrong is whether the answer disagreed with its label.
	Wrong bool
	// Weight is the inverse of the answer's chance of being labelled: 1 for a reviewed
	// abstention, 1/share for an audit sample. At least 1.
	Weight float64
}

// DefaultGrid is the threshold grid: thresholds are multiples of 1/DefaultGrid (0.001).
const DefaultGrid = 1000

// MaxCurveBound is the largest bound the curve keeps: nobody sets max_error above it.
const MaxCurveBound = 0.5

// Options set the target and the confidence of a fit.
type Options struct {
	// Target is ε, the error rate among decided answers to guarantee, in (0, 1).
	Target float64
	// Delta is δ, the chance the guarantee may fail, in (0, 1).
	Delta float64
	// Grid is the number of thresholds per unit: thresholds are multiples of 1/Grid
	// (DefaultGrid when 0).
	Grid int
	// StopAtTarget ends the search at the target's threshold instead of computing the curve
	// for every other max_error (the synthetic tests use it: they need the threshold only).
	StopAtTarget bool
}

// Point is one threshold of the curve: the bound certified down to it (the largest bound of
// every threshold tested from the strictest to it, rounded up to 0.001). A threshold is good
// for any max_error at or above its Bound.
type Point struct {
	Threshold float64 `json:"threshold"`
	Bound     float64 `json:"bound"`
}

// Stratum is the labels of one weight.
type Stratum struct {
	Weight float64 `json:"weight"`
	N      int     `json:"n"`
	Wrong  int     `json:"wrong"`
}

// Result is a fit.
type Result struct {
	Target, Delta float64
	// N is the number of labels; Strata their strata, heaviest weight first.
	N      int
	Strata []Stratum
	// AbstainAll is true when no threshold meets Target: every answer must abstain.
	AbstainAll bool
	// Threshold is the chosen threshold (when not AbstainAll); Covered the labels it covers,
	// Coverage their weighted share (the estimated share of traffic it decides), Error the
	// weighted error among them and Bound its upper confidence bound (≤ Target).
	Threshold float64
	Covered   int
	Coverage  float64
	Error     float64
	Bound     float64
	// Start is the strictest threshold tested and StartBound its bound: when AbstainAll, the
	// best there was.
	Start, StartBound float64
	// Curve holds, strictest first, the thresholds certified for other max_error values.
	Curve []Point
}

// Reason says why no fit was made.
type Reason string

// The reasons.
const (
	ReasonBadOptions  Reason = "bad options"
	ReasonBadLabel    Reason = "bad label"
	ReasonTooFew      Reason = "too few labels"
	ReasonNoneCovered Reason = "no labels"
)

// Error is why Fit refused.
type Error struct {
	Reason  Reason
	Message string
}

func (e *Error) Error() string { return e.Message }

func refuse(r Reason, format string, args ...any) error {
	return &Error{Reason: r, Message: fmt.Sprintf(format, args...)}
}

// CheckOptions validates a target and a confidence as a person gave them.
func CheckOptions(o Options) error {
	var errs []error
	if !(o.Target > 0 && o.Target < 1) {
		errs = append(errs, fmt.Errorf("target error %v must be in (0, 1): a share of wrong answers, e.g. 0.05", o.Target))
	}
	if !(o.Delta > 0 && o.Delta < 1) {
		errs = append(errs, fmt.Errorf("delta %v must be in (0, 1): the chance the guarantee may fail, e.g. 0.1", o.Delta))
	}
	if o.Grid < 0 || o.Grid > 1_000_000 {
		errs = append(errs, fmt.Errorf("grid %d must be in [1, 1000000] (0: the default)", o.Grid))
	}
	if len(errs) > 0 {
		return &Error{Reason: ReasonBadOptions, Message: errors.Join(errs...).Error()}
	}
	return nil
}

// Fit chooses the threshold (see the package comment). It refuses (an *Error) bad options,
// a label with a value outside [0, 1] or a weight below 1, and labels too few to certify the
// target even if their errors were at half of it.
func Fit(labels []Label, o Options) (Result, error) {
	if err := CheckOptions(o); err != nil {
		return Result{}, err
	}
	grid := float64(o.Grid)
	if o.Grid == 0 {
		grid = DefaultGrid
	}
	if len(labels) == 0 {
		return Result{}, refuse(ReasonNoneCovered, "no labels")
	}
	for i, l := range labels {
		if !(l.Value >= 0 && l.Value <= 1) {
			return Result{}, refuse(ReasonBadLabel, "label %d: value %v is not in [0, 1]", i, l.Value)
		}
		if !(l.Weight >= 1) || math.IsInf(l.Weight, 0) {
			return Result{}, refuse(ReasonBadLabel, "label %d: weight %v is not at least 1 (the inverse of a probability)", i, l.Weight)
		}
	}
	sorted := append([]Label(nil), labels...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Value > sorted[j].Value })

	b := newBounder(sorted, o.Delta)
	res := Result{Target: o.Target, Delta: o.Delta, N: len(labels), Strata: b.strata(), AbstainAll: true}
	total := b.totalWeight()

	// The candidates: grid points at or below each value, strictest first; covered(t) is
	// every label with Value ≥ t, compared directly (never through the grid index, whose
	// floating-point rounding could put a label on the wrong side of a threshold).
	next := 0 // labels[:next] are covered
	started := false
	runMax := 0.0
	lastCell := math.MaxInt
	for next < len(sorted) {
		// The grid point at or below the strictest label not yet covered (below the last
		// candidate, which that label is under).
		v := sorted[next].Value
		cell := int(math.Floor(v * grid))
		if float64(cell+1)/grid <= v { // v·grid rounded down past a grid point
			cell++
		}
		if float64(cell)/grid > v {
			cell--
		}
		cell = max(min(cell, lastCell-1), 0)
		lastCell = cell
		t := float64(cell) / grid
		for next < len(sorted) && sorted[next].Value >= t {
			b.add(sorted[next])
			next++
		}
		if !started {
			if !b.couldPass(o.Target/2, o.Target) {
				continue
			}
			started = true
			res.Start = t
		}
		u := b.bound()
		if res.Start == t {
			res.StartBound = u
		}
		runMax = math.Max(runMax, u)
		if runMax <= o.Target {
			res.AbstainAll = false
			res.Threshold, res.Covered, res.Bound = t, next, u
			res.Coverage = b.coveredWeight() / total
			res.Error = b.weightedErrors() / b.coveredWeight()
		} else if o.StopAtTarget {
			break
		}
		if bound := roundUp(runMax); bound <= MaxCurveBound && !o.StopAtTarget {
			if n := len(res.Curve); n > 0 && res.Curve[n-1].Bound == bound {
				res.Curve[n-1].Threshold = t
			} else {
				res.Curve = append(res.Curve, Point{Threshold: t, Bound: bound})
			}
		} else if runMax > MaxCurveBound {
			break
		}
		if t == 0 {
			break
		}
	}
	if !started {
		need := b.labelsNeeded(o.Target)
		return Result{}, refuse(ReasonTooFew, "%d labels cannot certify an error of at most %s: even if only half that share of them were wrong, the bound on all of them would be %.3f; about %d labels of this mix are needed",
			len(labels), fmtShare(o.Target), b.hypothetical(o.Target/2), need)
	}
	return res, nil
}

// roundUp rounds a bound up to 0.001, so that the curve's figures claim no more than shown.
func roundUp(u float64) float64 { return math.Ceil(u*1000-1e-9) / 1000 }

func fmtShare(v float64) string { return fmt.Sprintf("%g", v) }

// bounder keeps the counts per stratum of the labels covered so far and their bounds.
type bounder struct {
	delta   float64
	weights []float64 // per stratum, heaviest first
	total   []int     // labels per stratum
	n, k    []int     // covered labels and wrong ones, per stratum
	// cache of each stratum's bound at its current (n, k, δ_h), recomputed when they change
	cached []cachedBound
}

type cachedBound struct {
	n, k  int
	delta float64
	u     float64
	ok    bool
}

func newBounder(labels []Label, delta float64) *bounder {
	b := &bounder{delta: delta}
	idx := map[float64]int{}
	for _, l := range labels {
		if _, ok := idx[l.Weight]; !ok {
			idx[l.Weight] = len(b.weights)
			b.weights = append(b.weights, l.Weight)
		}
	}
	sort.Sort(sort.Reverse(sort.Float64Slice(b.weights)))
	for i, w := range b.weights {
		idx[w] = i
	}
	b.total = make([]int, len(b.weights))
	for _, l := range labels {
		b.total[idx[l.Weight]]++
	}
	b.n, b.k = make([]int, len(b.weights)), make([]int, len(b.weights))
	b.cached = make([]cachedBound, len(b.weights))
	return b
}

func (b *bounder) stratum(w float64) int {
	for i, x := range b.weights {
		if x == w {
			return i
		}
	}
	panic("risk: unknown weight") // newBounder saw every label
}

func (b *bounder) add(l Label) {
	h := b.stratum(l.Weight)
	b.n[h]++
	if l.Wrong {
		b.k[h]++
	}
}

func (b *bounder) strata() []Stratum {
	out := make([]Stratum, len(b.weights))
	for h, w := range b.weights {
		out[h] = Stratum{Weight: w, N: b.total[h]}
	}
	return out
}

func (b *bounder) totalWeight() float64 {
	s := 0.0
	for h, w := range b.weights {
		s += w * float64(b.total[h])
	}
	return s
}

func (b *bounder) coveredWeight() float64 {
	s := 0.0
	for h, w := range b.weights {
		s += w * float64(b.n[h])
	}
	return s
}

func (b *bounder) weightedErrors() float64 {
	s := 0.0
	for h, w := range b.weights {
		s += w * float64(b.k[h])
	}
	return s
}

// bound is U(t) for the labels covered now.
func (b *bounder) bound() float64 {
	W := b.coveredWeight()
	u := 0.0
	for h, w := range b.weights {
		if b.n[h] == 0 {
			continue
		}
		share := w * float64(b.n[h]) / W
		c := &b.cached[h]
		d := b.delta * roundShareDown(share)
		if !c.ok || c.n != b.n[h] || c.k != b.k[h] || c.delta != d {
			*c = cachedBound{n: b.n[h], k: b.k[h], delta: d, u: ClopperPearsonUpper(b.k[h], b.n[h], d), ok: true}
		}
		u += share * c.u
	}
	return u
}

// roundShareDown rounds a stratum's share of the weight down to a step of 1/16 in log2 (4.4%):
// its share of δ then stays put while another stratum's labels come in, so its bound is
// reused instead of recomputed for every threshold. Rounding down spends less than δ in all,
// which keeps the union bound.
func roundShareDown(share float64) float64 {
	if share >= 1 {
		return 1
	}
	return math.Exp2(math.Floor(math.Log2(share)*16) / 16)
}

// hypothetical is the bound the covered labels would have if a share rate of each stratum's
// were wrong (rounded down): it depends on the counts only.
func (b *bounder) hypothetical(rate float64) float64 {
	W := b.coveredWeight()
	u := 0.0
	for h, w := range b.weights {
		if b.n[h] == 0 {
			continue
		}
		share := w * float64(b.n[h]) / W
		k := int(math.Floor(rate * float64(b.n[h])))
		u += share * ClopperPearsonUpper(k, b.n[h], b.delta*roundShareDown(share))
	}
	return u
}

// couldPass reports whether hypothetical(rate) ≤ target. Most thresholds before the start
// fail it, so a cheap lower bound of each stratum's bound — its estimate, and the closed form
// 1 − δ_h^(1/n) of a bound with no error, both below any Clopper–Pearson bound with errors —
// decides those without a quantile.
func (b *bounder) couldPass(rate, target float64) bool {
	W := b.coveredWeight()
	lower := 0.0
	for h, w := range b.weights {
		if b.n[h] == 0 {
			continue
		}
		n := float64(b.n[h])
		share := w * n / W
		k := math.Floor(rate * n)
		zero := -math.Expm1(math.Log(b.delta*roundShareDown(share)) / n) // 1 − δ_h^(1/n)
		lower += share * math.Max(k/n, zero)
	}
	if lower > target {
		return false
	}
	return b.hypothetical(rate) <= target
}

// labelsNeeded estimates how many labels of the same mix would let the full set pass the
// start rule: it scales every stratum until it does.
func (b *bounder) labelsNeeded(target float64) int {
	n := 0
	for _, c := range b.total {
		n += c
	}
	for scale := 2; scale <= 1<<16; scale *= 2 {
		nb := &bounder{delta: b.delta, weights: b.weights, n: make([]int, len(b.total)), k: make([]int, len(b.total))}
		for h, c := range b.total {
			nb.n[h] = c * scale
		}
		if nb.hypothetical(target/2) <= target {
			return n * scale
		}
	}
	return n << 16
}

// ClopperPearsonUpper is the one-sided (1 − delta) Clopper–Pearson upper bound on a
// proportion with k successes in n trials: the (1 − delta) quantile of Beta(k + 1, n − k),
// 1 when k = n (or n = 0).
func ClopperPearsonUpper(k, n int, delta float64) float64 {
	if n <= 0 || k >= n {
		return 1
	}
	return distuv.Beta{Alpha: float64(k + 1), Beta: float64(n - k)}.Quantile(1 - delta)
}

// ClopperPearsonLower is the one-sided (1 − delta) lower bound: the delta quantile of
// Beta(k, n − k + 1), 0 when k = 0.
func ClopperPearsonLower(k, n int, delta float64) float64 {
	if n <= 0 || k <= 0 {
		return 0
	}
	if k > n {
		k = n
	}
	return distuv.Beta{Alpha: float64(k), Beta: float64(n - k + 1)}.Quantile(delta)
}

// Interval is a weighted error estimate with its confidence interval.
type Interval struct {
	N        int     `json:"n"`
	Estimate float64 `json:"estimate"`
	Lower    float64 `json:"lower"`
	Upper    float64 `json:"upper"`
	// Level is the interval's confidence, 1 − δ.
	Level float64 `json:"level"`
}

// Estimate is the weighted error of labels with a two-sided (1 − delta) interval: each end is
// the strata's bounds combined as in Fit, at delta/2 each. With no labels it is an error.
func Estimate(labels []Label, delta float64) (Interval, error) {
	if !(delta > 0 && delta < 1) {
		return Interval{}, refuse(ReasonBadOptions, "delta %v must be in (0, 1)", delta)
	}
	if len(labels) == 0 {
		return Interval{}, refuse(ReasonNoneCovered, "no labels")
	}
	for i, l := range labels {
		if !(l.Weight >= 1) || math.IsInf(l.Weight, 0) {
			return Interval{}, refuse(ReasonBadLabel, "label %d: weight %v is not at least 1", i, l.Weight)
		}
	}
	b := newBounder(labels, delta/2)
	for _, l := range labels {
		b.add(l)
	}
	W := b.coveredWeight()
	iv := Interval{N: len(labels), Estimate: b.weightedErrors() / W, Upper: b.bound(), Level: 1 - delta}
	for h, w := range b.weights {
		share := w * float64(b.n[h]) / W
		iv.Lower += share * ClopperPearsonLower(b.k[h], b.n[h], delta/2*share)
	}
	return iv, nil
}
