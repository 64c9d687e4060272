package synthetic

import (
	"math"
	"math/rand/v2"

	"gonum.org/v1/gonum/integrate/quad"
	"gonum.org/v1/gonum/stat/distuv"
)

// Traffic is a model of a question's traffic with a known truth, for the tests of risk
// control (worker/calibration/risk): each answer's confidence is drawn from Beta(ConfA,
// ConfB), and the answer is wrong with probability
//
//	P(wrong | c) = 1 / (1 + exp(Slope·(c − Centre)))
//
// so accuracy rises with confidence along a logistic curve: a coin flip at Centre, nearly
// always right well above it. Because the curve and the distribution are known, the error
// among the answers a threshold decides, and the threshold an oracle would choose, are
// computed exactly (Risk, Oracle), with no held-out sample.
type Traffic struct {
	ConfA, ConfB  float64
	Centre, Slope float64
}

// DefaultTraffic is the model the acceptance test uses: confidence Beta(6, 2) (mean 0.75: a
// decision model that is usually sure), right half the time at confidence 0.5, 88% of the
// time at 0.6, 98% at 0.7. Under a policy min_confidence 0.6 it abstains on 16% of answers,
// and the error among the decided ones is 1.3%; the oracle threshold for a 5% error is 0.464,
// deciding 95.8% of answers.
var DefaultTraffic = Traffic{ConfA: 6, ConfB: 2, Centre: 0.5, Slope: 20}

func (m Traffic) beta() distuv.Beta { return distuv.Beta{Alpha: m.ConfA, Beta: m.ConfB} }

// ErrorAt is P(wrong | confidence c).
func (m Traffic) ErrorAt(c float64) float64 { return 1 / (1 + math.Exp(m.Slope*(c-m.Centre))) }

// Risk is the exact error among answers with confidence ≥ t, and their share of the traffic
// (coverage). With nothing covered the risk is 0.
func (m Traffic) Risk(t float64) (risk, coverage float64) {
	b := m.beta()
	coverage = b.Survival(t)
	if coverage <= 0 || t >= 1 {
		return 0, 0
	}
	// Gauss–Legendre on [t, 1]: the integrand is smooth (a Beta density with a ≥ 1, b ≥ 1
	// times a logistic), so 200 points are exact to far below the tests' tolerances.
	wrong := quad.Fixed(func(c float64) float64 { return m.ErrorAt(c) * b.Prob(c) }, t, 1, 200, nil, 0)
	return wrong / coverage, coverage
}

// Oracle is the most permissive threshold whose exact risk is at most eps (risk falls as the
// threshold rises), and its coverage.
func (m Traffic) Oracle(eps float64) (threshold, coverage float64) {
	if r, _ := m.Risk(0); r <= eps {
		return 0, 1
	}
	lo, hi := 0.0, 1.0
	for range 60 {
		mid := (lo + hi) / 2
		if r, _ := m.Risk(mid); r > eps {
			lo = mid
		} else {
			hi = mid
		}
	}
	_, coverage = m.Risk(hi)
	return hi, coverage
}

// LabelledAnswer is one answer that got a label under a policy.
type LabelledAnswer struct {
	Confidence float64
	Wrong      bool
	// Audit is true for a decided answer sampled for review; false for an abstention.
	Audit bool
}

// Labels draws traffic under a policy — abstain below minConfidence and review every
// abstention, sample auditShare of decided answers for review — until n answers are labelled,
// and returns them with the number of answers drawn. The same arguments give the same labels.
func (m Traffic) Labels(n int, minConfidence, auditShare float64, seed uint64) (labels []LabelledAnswer, drawn int) {
	r := rand.New(rand.NewPCG(seed, seed^0x2545f4914f6cdd1d))
	b := distuv.Beta{Alpha: m.ConfA, Beta: m.ConfB, Src: r}
	labels = make([]LabelledAnswer, 0, n)
	for len(labels) < n {
		drawn++
		c := b.Rand()
		wrong := r.Float64() < m.ErrorAt(c)
		switch {
		case c < minConfidence:
			labels = append(labels, LabelledAnswer{Confidence: c, Wrong: wrong})
		case r.Float64() < auditShare:
			labels = append(labels, LabelledAnswer{Confidence: c, Wrong: wrong, Audit: true})
		}
	}
	return labels, drawn
}
