package soak

import (
	"reflect"
	"testing"
	"time"
)

func TestPlanIsReplayableFromItsSeed(t *testing.T) {
	opt := PlanOptions{Seed: 24, Duration: 10 * time.Minute, Workers: 3, Nodes: 3}
	a, b := NewPlan(opt), NewPlan(opt)
	if !reflect.DeepEqual(a, b) {
		t.Fatal("one seed gave two plans")
	}
	opt.Seed = 25
	if c := NewPlan(opt); reflect.DeepEqual(a.Faults, c.Faults) {
		t.Fatal("two seeds gave one plan")
	}
}

// Even a one-minute soak combines every fault, keeps the process faults one at a time, and
// leaves the last part of the load fault-free to recover in.
func TestPlanCombinesEveryFaultWithinTheWindow(t *testing.T) {
	for seed := uint64(1); seed <= 50; seed++ {
		for _, d := range []time.Duration{time.Minute, 10 * time.Minute, time.Hour} {
			p := NewPlan(PlanOptions{Seed: seed, Duration: d, Workers: 2, Nodes: 3})
			counts := p.Counts()
			for _, k := range []FaultKind{KillWorker, KillNATS, KillNATSAndWorker, CrashCluster, CutClickHouse, PauseFleet, SlowModel, FailModel} {
				if counts[k] == 0 {
					t.Errorf("seed %d, %s: no %q in %v", seed, d, k, p.Faults)
				}
			}
			var procEnd time.Duration
			for _, f := range p.Faults {
				if f.At < time.Second || f.At+f.Down > d*85/100 {
					t.Errorf("seed %d, %s: %s outside the fault window", seed, d, f)
				}
				switch f.Kind {
				case KillWorker, KillNATS, KillNATSAndWorker, CrashCluster:
					if f.At < procEnd {
						t.Errorf("seed %d, %s: %s starts before the last process fault recovered", seed, d, f)
					}
					procEnd = f.At + f.Down
					if (f.Kind == KillWorker || f.Kind == KillNATSAndWorker) && (f.Worker < 1 || f.Worker > 2) {
						t.Errorf("seed %d: %s kills no worker slot", seed, f)
					}
					if (f.Kind == KillNATS || f.Kind == KillNATSAndWorker) && f.Role == "" && (f.Node < 1 || f.Node > 3) {
						t.Errorf("seed %d: %s kills no node", seed, f)
					}
				}
			}
			if d == time.Hour && len(p.Faults) < 300 {
				t.Errorf("seed %d: only %d faults in an hour", seed, len(p.Faults))
			}
		}
	}
}

func TestPlanKeepsToTheKindsAsked(t *testing.T) {
	kinds, err := ParseKinds("worker,clickhouse")
	if err != nil {
		t.Fatal(err)
	}
	p := NewPlan(PlanOptions{Seed: 3, Duration: 10 * time.Minute, Workers: 3, Nodes: 3, Kinds: kinds})
	for _, f := range p.Faults {
		if f.Kind != KillWorker && f.Kind != CutClickHouse {
			t.Errorf("%s was not asked for", f)
		}
	}
	none, _ := ParseKinds("none")
	if p := NewPlan(PlanOptions{Seed: 3, Duration: 10 * time.Minute, Workers: 3, Nodes: 3, Kinds: none}); len(p.Faults) != 0 {
		t.Errorf("faults none: %v", p.Faults)
	}
	if _, err := ParseKinds("worker,meteor"); err == nil {
		t.Error("an unknown fault was accepted")
	}
}
