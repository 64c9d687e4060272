package calibration

import "math"

// brentMin minimises f on [lo, hi] by Brent's method (golden-section search with parabolic
// interpolation, R. P. Brent, "Algorithms for Minimization without Derivatives", 1973, ch. 5;
// the bounded form of Forsythe, Malcolm and Moler's FMIN). It returns the minimiser, its value,
// the number of evaluations and whether the interval shrank below tol within maxEval.
//
// Why hand-written: gonum.org/v1/gonum/optimize (checked at v0.17.0) has only multivariate
// methods (BFGS, L-BFGS, CG, Newton, Nelder-Mead, CMA-ES, GuessAndCheck, ListSearch) with
// no bounds, and its Bisection, Backtracking and MoreThuente are line searchers driven by
// those methods, not standalone minimisers. A bounded one-dimensional minimiser through it
// would mean a change of variables plus a multivariate method on one variable, slower and with
// a weaker guarantee. Brent's method needs no derivative, never leaves [lo, hi], converges
// superlinearly on the smooth, unimodal NLL and falls back to golden section (guaranteed
// linear convergence) when the parabola misbehaves.
func brentMin(f func(float64) float64, lo, hi, tol float64, maxEval int) (x, fx float64, evals int, ok bool) {
	const golden = 0.3819660112501051 // (3 − √5)/2
	sqrtEps := math.Sqrt(2.220446049250313e-16)

	a, b := lo, hi
	// x: best point so far; w: second best; v: the previous w.
	x = a + golden*(b-a)
	w, v := x, x
	fx = f(x)
	evals = 1
	fw, fv := fx, fx
	var d, e float64 // this step and the one before the last
	for evals < maxEval {
		m := 0.5 * (a + b)
		tol1 := sqrtEps*math.Abs(x) + tol/3
		tol2 := 2 * tol1
		if math.Abs(x-m) <= tol2-0.5*(b-a) {
			return x, fx, evals, true
		}
		useGolden := true
		if math.Abs(e) > tol1 {
			// Fit a parabola through x, w and v; p/q is the step to its vertex.
			r := (x - w) * (fx - fv)
			q := (x - v) * (fx - fw)
			p := (x-v)*q - (x-w)*r
			q = 2 * (q - r)
			if q > 0 {
				p = -p
			}
			q = math.Abs(q)
			eOld := e
			e = d
			// Accept the parabolic step if it is smaller than half the step before last and
			// lands inside (a, b); else take a golden-section step.
			if math.Abs(p) < math.Abs(0.5*q*eOld) && p > q*(a-x) && p < q*(b-x) {
				d = p / q
				u := x + d
				if u-a < tol2 || b-u < tol2 {
					// Never evaluate closer than tol1 to an end of the interval.
					d = math.Copysign(tol1, m-x)
				}
				useGolden = false
			}
		}
		if useGolden {
			if x >= m {
				e = a - x
			} else {
				e = b - x
			}
			d = golden * e
		}
		// Never step by less than tol1: points closer than that cannot be told apart.
		var u float64
		if math.Abs(d) >= tol1 {
			u = x + d
		} else {
			u = x + math.Copysign(tol1, d)
		}
		fu := f(u)
		evals++
		if fu <= fx {
			if u >= x {
				a = x
			} else {
				b = x
			}
			v, fv = w, fw
			w, fw = x, fx
			x, fx = u, fu
		} else {
			if u < x {
				a = u
			} else {
				b = u
			}
			if fu <= fw || w == x {
				v, fv = w, fw
				w, fw = u, fu
			} else if fu <= fv || v == x || v == w {
				v, fv = u, fu
			}
		}
	}
	return x, fx, evals, false
}
