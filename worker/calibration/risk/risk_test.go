package risk

import (
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"gonum.org/v1/gonum/stat/distuv"
)

// The Clopper–Pearson bounds are the binomial's exact tail inversions: at the upper bound u,
// P(Bin(n, u) ≤ k) = δ; at the lower bound l, P(Bin(n, l) ≥ k) = δ.
func TestClopperPearson(t *testing.T) {
	for _, c := range []struct {
		k, n  int
		delta float64
	}{{0, 45, 0.1}, {3, 100, 0.1}, {12, 408, 0.05}, {250, 1000, 0.01}, {99, 100, 0.1}} {
		u := ClopperPearsonUpper(c.k, c.n, c.delta)
		if p := (distuv.Binomial{N: float64(c.n), P: u}).CDF(float64(c.k)); math.Abs(p-c.delta) > 1e-9 {
			t.Errorf("k %d n %d: upper %v has P(X ≤ k) = %v, want %v", c.k, c.n, u, p, c.delta)
		}
		if c.k > 0 {
			l := ClopperPearsonLower(c.k, c.n, c.delta)
			if p := 1 - (distuv.Binomial{N: float64(c.n), P: l}).CDF(float64(c.k-1)); math.Abs(p-c.delta) > 1e-9 {
				t.Errorf("k %d n %d: lower %v has P(X ≥ k) = %v, want %v", c.k, c.n, l, p, c.delta)
			}
			if !(l < float64(c.k)/float64(c.n) && float64(c.k)/float64(c.n) < u) {
				t.Errorf("k %d n %d: [%v, %v] does not hold the estimate", c.k, c.n, l, u)
			}
		}
	}
	// Zero errors in n: 1 − δ^(1/n), the textbook closed form.
	if u, want := ClopperPearsonUpper(0, 45, 0.1), 1-math.Pow(0.1, 1.0/45); math.Abs(u-want) > 1e-12 {
		t.Errorf("k 0: %v, want %v", u, want)
	}
	if ClopperPearsonUpper(5, 5, 0.1) != 1 || ClopperPearsonUpper(0, 0, 0.1) != 1 || ClopperPearsonLower(0, 10, 0.1) != 0 {
		t.Error("edge cases")
	}
}

// labels draws n labels whose error is errAt(value), values uniform on [lo, 1], the first
// audits of them weighted w.
func labels(n int, audits int, w float64, errAt func(float64) float64, seed uint64) []Label {
	r := rand.New(rand.NewPCG(seed, 1))
	out := make([]Label, n)
	for i := range out {
		v := r.Float64()
		weight := 1.0
		if i < audits {
			weight = w
		}
		out[i] = Label{Value: v, Wrong: r.Float64() < errAt(v), Weight: weight}
	}
	return out
}

// The guarantee is a statement about how often a fit is wrong: where every threshold's true
// error is above ε, a fit may certify one only with probability ≤ δ. With the error a flat
// 6% against a 5% target, weighted and unweighted labels of two strata both stay well under
// δ = 0.1 (Bonferroni and Clopper–Pearson are conservative).
func TestRiskFalseCertificationRate(t *testing.T) {
	// 200 seeds: a certification rate of 10% would show as 20 ± 4, the 5% these give as 10 ± 3.
	const seeds = 200
	for _, audits := range []int{0, 300} {
		certified := 0
		for seed := range uint64(seeds) {
			ls := labels(2000, audits, 20, func(float64) float64 { return 0.06 }, seed)
			res, err := Fit(ls, Options{Target: 0.05, Delta: 0.1, StopAtTarget: true})
			if err != nil {
				t.Fatal(err)
			}
			if !res.AbstainAll {
				certified++
			}
		}
		if rate := float64(certified) / seeds; rate > 0.1 {
			t.Errorf("%d audits: certified a threshold in %.1f%% of seeds where none meets the target; the guarantee allows 10%%", audits, 100*rate)
		} else {
			t.Logf("%d audits: false certification in %.1f%% of seeds (δ = 10%%)", audits, 100*rate)
		}
	}
}

// What a fit says about its threshold is what the labels it covers say.
func TestRiskFitReportsItsThreshold(t *testing.T) {
	errAt := func(v float64) float64 { return 0.3 * (1 - v) * (1 - v) }
	ls := labels(3000, 400, 10, errAt, 7)
	res, err := Fit(ls, Options{Target: 0.05, Delta: 0.1})
	if err != nil || res.AbstainAll {
		t.Fatalf("fit: %+v %v", res, err)
	}
	if got := res.Threshold * 1000; math.Abs(got-math.Round(got)) > 1e-9 {
		t.Errorf("threshold %v is not on the 0.001 grid", res.Threshold)
	}
	covered, wsum, werr, total := 0, 0.0, 0.0, 0.0
	for _, l := range ls {
		total += l.Weight
		if l.Value >= res.Threshold {
			covered++
			wsum += l.Weight
			if l.Wrong {
				werr += l.Weight
			}
		}
	}
	if covered != res.Covered || math.Abs(wsum/total-res.Coverage) > 1e-12 || math.Abs(werr/wsum-res.Error) > 1e-12 {
		t.Errorf("covered %d, coverage %v, error %v; the fit says %d, %v, %v", covered, wsum/total, werr/wsum, res.Covered, res.Coverage, res.Error)
	}
	if !(res.Error < res.Bound && res.Bound <= 0.05) {
		t.Errorf("error %v, bound %v", res.Error, res.Bound)
	}
	if res.N != 3000 || len(res.Strata) != 2 || res.Strata[0].Weight != 10 || res.Strata[0].N != 400 || res.Strata[1].N != 2600 {
		t.Errorf("strata %+v", res.Strata)
	}
	// The curve: strictest first, bounds rising, the target's threshold the last at ≤ 0.05.
	last := 2.0
	var at05 float64
	for i, p := range res.Curve {
		if p.Threshold >= last || (i > 0 && p.Bound <= res.Curve[i-1].Bound) || p.Bound > MaxCurveBound {
			t.Fatalf("curve not monotone at %d: %+v", i, res.Curve[max(0, i-1):i+1])
		}
		last = p.Threshold
		if p.Bound <= 0.05 {
			at05 = p.Threshold
		}
	}
	if at05 != res.Threshold {
		t.Errorf("the curve's threshold for 0.05 is %v, the fit's %v", at05, res.Threshold)
	}
	// Stopping at the target gives the same threshold.
	quick, _ := Fit(ls, Options{Target: 0.05, Delta: 0.1, StopAtTarget: true})
	if quick.Threshold != res.Threshold || quick.Bound != res.Bound || len(quick.Curve) != 0 {
		t.Errorf("StopAtTarget: %v %v, full: %v %v", quick.Threshold, quick.Bound, res.Threshold, res.Bound)
	}
	// A looser target never gets a stricter threshold.
	loose, _ := Fit(ls, Options{Target: 0.1, Delta: 0.1})
	if loose.Threshold > res.Threshold {
		t.Errorf("target 0.1: threshold %v above the 0.05 one %v", loose.Threshold, res.Threshold)
	}
}

// Bad input: each a clear message.
func TestRiskBadInput(t *testing.T) {
	good := labels(500, 0, 1, func(float64) float64 { return 0.01 }, 1)
	for _, c := range []struct {
		o    Options
		want string
	}{
		{Options{Target: 0, Delta: 0.1}, "target error 0 must be in (0, 1)"},
		{Options{Target: 1, Delta: 0.1}, "target error 1 must be in (0, 1)"},
		{Options{Target: -0.05, Delta: 0.1}, "target error -0.05 must be in (0, 1)"},
		{Options{Target: math.NaN(), Delta: 0.1}, "target error NaN must be in (0, 1)"},
		{Options{Target: 0.05, Delta: 1.5}, "delta 1.5 must be in (0, 1)"},
	} {
		_, err := Fit(good, c.o)
		var re *Error
		if !errors.As(err, &re) || re.Reason != ReasonBadOptions || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.o, err, c.want)
		}
	}
	for _, bad := range []Label{{Value: 1.2, Weight: 1}, {Value: math.NaN(), Weight: 1}, {Value: 0.5, Weight: 0.5}, {Value: 0.5, Weight: math.Inf(1)}} {
		_, err := Fit(append([]Label{bad}, good...), Options{Target: 0.05, Delta: 0.1})
		var re *Error
		if !errors.As(err, &re) || re.Reason != ReasonBadLabel || !strings.Contains(err.Error(), "label 0") {
			t.Errorf("%+v: %v", bad, err)
		}
	}
	if _, err := Fit(nil, Options{Target: 0.05, Delta: 0.1}); err == nil {
		t.Error("no labels accepted")
	}
}

// Too few labels: 20 labels, all right, cannot certify 5% (that takes 45 with no error at
// all, 160 for the search to start: see the package comment); the message says how many
// would.
func TestRiskTooFewLabels(t *testing.T) {
	ls := labels(20, 0, 1, func(float64) float64 { return 0 }, 1)
	_, err := Fit(ls, Options{Target: 0.05, Delta: 0.1})
	var re *Error
	if !errors.As(err, &re) || re.Reason != ReasonTooFew || !strings.Contains(err.Error(), "20 labels cannot certify an error of at most 0.05") || !strings.Contains(err.Error(), "about 160 labels") {
		t.Errorf("%v", err)
	}
	// 1,990 reviewed abstentions below 0.6 and 10 audit samples above: the audits carry the
	// decided answers' weight, and 10 cannot bound their error, however many abstentions.
	ls = ls[:0]
	for i := range 2000 {
		l := Label{Value: 0.6 * float64(i) / 2000, Weight: 1}
		if i < 10 {
			l = Label{Value: 0.6 + 0.04*float64(i), Weight: 20}
		}
		ls = append(ls, l)
	}
	if _, err := Fit(ls, Options{Target: 0.05, Delta: 0.1}); !errors.As(err, &re) || re.Reason != ReasonTooFew {
		t.Errorf("10 audits among 2,000: %v", err)
	}
}

// All labels right: the bound is the count's alone, and with enough labels every answer is
// decided. All wrong: no threshold, abstain all.
func TestRiskAllCorrectAllWrong(t *testing.T) {
	right := labels(2000, 200, 20, func(float64) float64 { return 0 }, 3)
	res, err := Fit(right, Options{Target: 0.05, Delta: 0.1})
	if err != nil || res.AbstainAll || res.Threshold != 0 || res.Coverage != 1 || res.Error != 0 {
		t.Errorf("all right: %+v %v", res, err)
	}
	wrong := labels(2000, 200, 20, func(float64) float64 { return 1 }, 3)
	res, err = Fit(wrong, Options{Target: 0.05, Delta: 0.1})
	if err != nil || !res.AbstainAll || res.StartBound <= 0.05 || res.Start == 0 {
		t.Errorf("all wrong: %+v %v", res, err)
	}
}

func TestRiskEstimate(t *testing.T) {
	// 400 audits of share 0.05 with 12 wrong: the plain Clopper–Pearson interval, both ends
	// at δ/2.
	var ls []Label
	for i := range 400 {
		ls = append(ls, Label{Value: 0.9, Wrong: i < 12, Weight: 20})
	}
	iv, err := Estimate(ls, 0.1)
	if err != nil || iv.N != 400 || iv.Estimate != 0.03 || iv.Level != 0.9 ||
		math.Abs(iv.Upper-ClopperPearsonUpper(12, 400, 0.05)) > 1e-12 || math.Abs(iv.Lower-ClopperPearsonLower(12, 400, 0.05)) > 1e-12 {
		t.Errorf("%+v %v", iv, err)
	}
	// Two shares (an audit_sample changed in the window): weighted, and the interval holds it.
	for i := range 100 {
		ls = append(ls, Label{Value: 0.9, Wrong: i < 10, Weight: 50})
	}
	iv, _ = Estimate(ls, 0.1)
	want := (12*20 + 10*50) / (400*20 + 100*50.0)
	if math.Abs(iv.Estimate-want) > 1e-12 || !(iv.Lower < want && want < iv.Upper) {
		t.Errorf("two strata: %+v, want estimate %v", iv, want)
	}
	if _, err := Estimate(nil, 0.1); err == nil {
		t.Error("no labels estimated")
	}
}
