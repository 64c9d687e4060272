package risk

import (
	"math"
	"sort"
	"testing"

	"github.com/sys1hq/sys1/worker/calibration/synthetic"
)

// The acceptance scenario of issue 25: synthetic.DefaultTraffic under a policy min_confidence
// 0.6 that reviews every abstention and audits 5% of decided answers, 2,000 labels, ε = 0.05,
// δ = 0.1.
const (
	scenarioLabels     = 2000
	scenarioMinConf    = 0.6
	scenarioAuditShare = 0.05
	scenarioTarget     = 0.05
	scenarioDelta      = 0.1
)

// sweepSeeds is the number of seeds of the synthetic sweeps: 200, as the issue asks, in every
// run CI makes (go test -race: about 2.5 s per sweep on a loaded 2-core machine, 0.5 s
// without the race detector); 60 under -short.
func sweepSeeds() int {
	if testing.Short() {
		return 60
	}
	return 200
}

// sweep is what a sweep found over the seeds.
type sweep struct {
	seeds               int
	withinTarget        int // seeds whose chosen threshold's exact risk is ≤ ε
	coverageNearOracle  int // seeds whose coverage is within 0.05 of the oracle's
	gaps                []float64
	risks               []float64
	abstainAll, refused int
	oracleT, oracleCov  float64
	meanAudits          float64
}

// runSweep fits every seed's labels, weighted (inverse probability) or not, and measures the
// chosen threshold against the exact truth.
func runSweep(t *testing.T, weighted bool) sweep {
	t.Helper()
	m := synthetic.DefaultTraffic
	s := sweep{seeds: sweepSeeds()}
	s.oracleT, s.oracleCov = m.Oracle(scenarioTarget)
	audits := 0
	for seed := 1; seed <= s.seeds; seed++ {
		answers, _ := m.Labels(scenarioLabels, scenarioMinConf, scenarioAuditShare, uint64(seed))
		labels := make([]Label, len(answers))
		for i, a := range answers {
			w := 1.0
			if a.Audit {
				audits++
				if weighted {
					w = 1 / scenarioAuditShare
				}
			}
			labels[i] = Label{Value: a.Confidence, Wrong: a.Wrong, Weight: w}
		}
		res, err := Fit(labels, Options{Target: scenarioTarget, Delta: scenarioDelta, StopAtTarget: true})
		if err != nil {
			s.refused++
			s.gaps = append(s.gaps, s.oracleCov)
			continue
		}
		risk, cov := 0.0, 0.0
		if res.AbstainAll {
			s.abstainAll++
		} else {
			risk, cov = m.Risk(res.Threshold)
		}
		if risk <= scenarioTarget {
			s.withinTarget++
		}
		gap := s.oracleCov - cov
		if math.Abs(gap) <= 0.05 {
			s.coverageNearOracle++
		}
		s.gaps, s.risks = append(s.gaps, gap), append(s.risks, risk)
	}
	s.meanAudits = float64(audits) / float64(s.seeds)
	return s
}

func (s sweep) log(t *testing.T, name string) {
	t.Helper()
	g := append([]float64(nil), s.gaps...)
	sort.Float64s(g)
	r := append([]float64(nil), s.risks...)
	sort.Float64s(r)
	t.Logf("%s, %d seeds (%.0f audit samples each on average): exact risk ≤ %.2f in %d (%.1f%%); coverage within 0.05 of the oracle's %.3f (threshold %.3f) in %d (%.1f%%); coverage gap median %.3f, 90th percentile %.3f; risk median %.4f, 90th percentile %.4f; abstain all %d, refused %d",
		name, s.seeds, s.meanAudits, scenarioTarget, s.withinTarget, pctOf(s.withinTarget, s.seeds), s.oracleCov, s.oracleT, s.coverageNearOracle, pctOf(s.coverageNearOracle, s.seeds),
		g[len(g)/2], g[len(g)*9/10], r[len(r)/2], r[len(r)*9/10], s.abstainAll, s.refused)
}

func pctOf(a, b int) float64 { return 100 * float64(a) / float64(b) }

// TestRiskSyntheticGuarantee is issue 25's acceptance test: over the seeds, the exact error
// among the answers the fitted threshold decides is at most ε in at least 90% of seeds (the
// guarantee promises 1 − δ = 90%), and the coverage is within 0.05 of the oracle threshold's
// in at least 90% of seeds. (200 seeds: risk ≤ ε in 99.5%, coverage within 0.05 in 92%; see
// the log.)
func TestRiskSyntheticGuarantee(t *testing.T) {
	s := runSweep(t, true)
	s.log(t, "weighted")
	if s.withinTarget < s.seeds*9/10 {
		t.Errorf("exact risk ≤ %g in %d of %d seeds, want at least 90%%", scenarioTarget, s.withinTarget, s.seeds)
	}
	if s.coverageNearOracle < s.seeds*9/10 {
		t.Errorf("coverage within 0.05 of the oracle's in %d of %d seeds, want at least 90%%", s.coverageNearOracle, s.seeds)
	}
	if s.refused > 0 {
		t.Errorf("%d seeds refused", s.refused)
	}
}

// TestRiskSyntheticUnweightedFails runs the same acceptance test with every label weighted 1,
// as if the labels were a uniform sample of the traffic. They are not: every abstention is
// labelled but only 5% of decided answers, so the low-confidence answers, wrong far more
// often, count twenty times too much, the error among decided answers is overestimated, and
// the threshold comes out far too strict. The test must fail on coverage — that is what the
// weighting is for.
func TestRiskSyntheticUnweightedFails(t *testing.T) {
	s := runSweep(t, false)
	s.log(t, "unweighted")
	if s.coverageNearOracle >= s.seeds*9/10 {
		t.Errorf("unweighted labels met the coverage criterion in %d of %d seeds: the scenario does not show the bias the weights remove", s.coverageNearOracle, s.seeds)
	}
	g := append([]float64(nil), s.gaps...)
	sort.Float64s(g)
	if med := g[len(g)/2]; med < 0.08 {
		t.Errorf("unweighted coverage gap median %.3f: expected the bias to cost well over 0.05 of coverage", med)
	}
}

// The scenario is what its comment says, computed exactly.
func TestRiskSyntheticScenario(t *testing.T) {
	m := synthetic.DefaultTraffic
	if r, cov := m.Risk(scenarioMinConf); math.Abs(r-0.0129) > 0.0005 || math.Abs(cov-0.841) > 0.001 {
		t.Errorf("at min_confidence 0.6: risk %.4f, coverage %.4f", r, cov)
	}
	if th, cov := m.Oracle(scenarioTarget); math.Abs(th-0.464) > 0.001 || math.Abs(cov-0.958) > 0.001 {
		t.Errorf("oracle: threshold %.4f, coverage %.4f", th, cov)
	}
	if e := m.ErrorAt(0.5); e != 0.5 {
		t.Errorf("P(wrong | 0.5) = %v, want a coin flip", e)
	}
}
