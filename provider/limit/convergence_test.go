package limit_test

import (
	"testing"
	"time"

	"github.com/sys1hq/sys1/provider/limit"
)

// adaptiveFleet makes one seeded limiter per replica, as independent replicas would have.
func adaptiveFleet(max int) func() limit.Limiter {
	seed := uint64(0)
	return func() limit.Limiter {
		seed++
		cfg := limit.DefaultAdaptiveConfig(max)
		cfg.Seed = seed
		a, err := limit.NewAdaptive(cfg)
		if err != nil {
			panic(err)
		}
		return a
	}
}

// Issue 15's scenario on a virtual clock: four replicas of 16 against two slots. The bounds
// are generous (the real-time figures are in deploy/performance.md); what is asserted is the
// behaviour: the fixed limit collapses into timeouts, the adaptive fleet does not, keeps the
// slots busy, shares them fairly and keeps latency near the best fixed setting's.
func TestAdaptiveFleetSharesOneProvider(t *testing.T) {
	cfg := issueScenario()
	cfg.duration, cfg.warmup = 40*time.Minute, 5*time.Minute
	fixed16 := simulate(cfg, func() limit.Limiter { return limit.NewFixed(16) })
	fixed1 := simulate(cfg, func() limit.Limiter { return limit.NewFixed(1) })
	adaptive := simulate(cfg, adaptiveFleet(16))
	t.Logf("fixed 16: goodput %.3f timeouts %d p99 %s", fixed16.goodput(), fixed16.timeouts(), fixed16.p99())
	t.Logf("fixed 1:  goodput %.3f timeouts %d p99 %s", fixed1.goodput(), fixed1.timeouts(), fixed1.p99())
	t.Logf("adaptive: goodput %.3f timeouts %d p99 %s fairness %.3f limits %v", adaptive.goodput(), adaptive.timeouts(), adaptive.p99(), adaptive.fairness(), adaptive.trace)
	if fixed16.timeouts() == 0 || fixed16.goodput() > 0.5 {
		t.Fatalf("the scenario is not hard: fixed 16 had %d timeouts, goodput %.2f", fixed16.timeouts(), fixed16.goodput())
	}
	if adaptive.timeouts() != 0 {
		t.Errorf("adaptive: %d timeouts", adaptive.timeouts())
	}
	if g := adaptive.goodput(); g < 0.9 {
		t.Errorf("adaptive goodput %.3f of the slots", g)
	}
	if f := adaptive.fairness(); f < 0.9 {
		t.Errorf("adaptive fairness (Jain) %.3f", f)
	}
	if r := adaptive.p99().Seconds() / fixed1.p99().Seconds(); r > 2 {
		t.Errorf("adaptive p99 %.2f× the best fixed setting's", r)
	}
	for i, tr := range adaptive.trace {
		for _, l := range tr {
			if l < 1 || l > 16 {
				t.Errorf("replica %d limit %v outside [1, 16]", i, l)
			}
		}
	}
}

// Alone in front of eight slots a replica must find them: the limit climbs from 1 and the
// slots stay busy without a queue that times out.
func TestAdaptiveFindsASingleProvidersCapacity(t *testing.T) {
	cfg := issueScenario()
	cfg.replicas, cfg.server.slots = 1, 8
	cfg.duration, cfg.warmup = 40*time.Minute, 5*time.Minute
	r := simulate(cfg, adaptiveFleet(16))
	t.Logf("goodput %.3f timeouts %d p99 %s limits %v", r.goodput(), r.timeouts(), r.p99(), r.trace)
	if r.goodput() < 0.9 || r.timeouts() != 0 {
		t.Fatalf("goodput %.3f, %d timeouts", r.goodput(), r.timeouts())
	}
	// It probes a little above the slots and backs off below them: a sawtooth around 8.
	for _, l := range r.trace[0][2:] {
		if l < 6 || l > 12 {
			t.Fatalf("limits %v, want about the 8 slots once grown", r.trace[0])
		}
	}
}

// Replicas that join one after another still end with fair shares and no timeouts.
func TestAdaptiveLateReplicasGetTheirShare(t *testing.T) {
	cfg := issueScenario()
	cfg.start = func(rep int) time.Duration { return time.Duration(rep) * 10 * time.Minute }
	cfg.duration, cfg.warmup = 90*time.Minute, 40*time.Minute
	r := simulate(cfg, adaptiveFleet(16))
	t.Logf("goodput %.3f timeouts %d p99 %s fairness %.3f", r.goodput(), r.timeouts(), r.p99(), r.fairness())
	if r.timeouts() != 0 || r.goodput() < 0.9 || r.fairness() < 0.9 {
		t.Fatalf("goodput %.3f, %d timeouts, fairness %.3f", r.goodput(), r.timeouts(), r.fairness())
	}
}
