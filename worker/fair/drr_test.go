package fair

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// sim is a scheduler over in-memory queues: queued[flow] messages wait, and serve hands out
// what Next allows, as a lane's Take does with fetches.
type sim struct {
	s      *Scheduler
	queued map[string]int
	group  map[string]string
	served map[string]int
	order  []string // flows in the order their messages were handed out
}

func newSim() *sim {
	return &sim{s: NewScheduler(), queued: map[string]int{}, group: map[string]string{}, served: map[string]int{}}
}

func (m *sim) add(group, flow string, n, weight int) {
	m.queued[flow] += n
	m.group[flow] = group
	m.s.Activate(group, flow, weight)
}

// serve hands out up to left messages, like one Take.
func (m *sim) serve(left int) int {
	used := 0
	for left > 0 {
		f, n, ok := m.s.Next(left)
		if !ok {
			break
		}
		got := min(n, m.queued[f])
		m.queued[f] -= got
		m.served[f] += got
		for range got {
			m.order = append(m.order, f)
		}
		used += got
		left -= got
		m.s.Took(f, got, got < n || m.queued[f] == 0)
	}
	return used
}

func TestALoneFlowGetsEverySlotAtOnce(t *testing.T) {
	m := newSim()
	m.add("a", "a", 1000, 1)
	if got := m.serve(16); got != 16 {
		t.Fatalf("a lone caller was given %d of 16 free slots, want all 16 (work-conserving)", got)
	}
}

func TestTwoCallersAlternateWhateverTheirBacklog(t *testing.T) {
	m := newSim()
	m.add("a", "a", 1000, 1)
	m.serve(8) // a alone: fills the slots
	m.add("b", "b", 10, 1)
	// From now on slots free one at a time, as runs finish.
	for range 20 {
		m.serve(1)
	}
	if m.served["b"] != 10 {
		t.Fatalf("b was served %d of its 10 in the 20 slots after it arrived, want all 10 (a had 992 waiting)", m.served["b"])
	}
	tail := m.order[8:]
	for i := 0; i+1 < len(tail); i += 2 {
		if tail[i] == tail[i+1] {
			t.Fatalf("slot %d and %d both went to %s while both callers had work: %v", i+8, i+9, tail[i], tail)
		}
	}
}

func TestWeightsShareSlotsInProportion(t *testing.T) {
	for _, tc := range []struct{ wa, wb int }{{1, 1}, {1, 3}, {3, 1}, {2, 5}} {
		t.Run(fmt.Sprintf("%d:%d", tc.wa, tc.wb), func(t *testing.T) {
			m := newSim()
			m.add("a", "a", 100000, tc.wa)
			m.add("b", "b", 100000, tc.wb)
			const rounds = 7000
			for range rounds {
				m.serve(1)
			}
			want := float64(tc.wb) / float64(tc.wa+tc.wb)
			got := float64(m.served["b"]) / rounds
			if d := got - want; d > 0.001 || d < -0.001 {
				t.Fatalf("b's share %.4f, want %.4f (weights %d:%d; served %v)", got, want, tc.wa, tc.wb, m.served)
			}
		})
	}
}

func TestLargerPullsKeepTheProportions(t *testing.T) {
	m := newSim()
	m.add("a", "a", 100000, 1)
	m.add("b", "b", 100000, 3)
	m.add("c", "c", 100000, 1)
	for range 1000 {
		m.serve(7)
	}
	total := m.served["a"] + m.served["b"] + m.served["c"]
	for f, w := range map[string]float64{"a": 0.2, "b": 0.6, "c": 0.2} {
		if got := float64(m.served[f]) / float64(total); got < w-0.005 || got > w+0.005 {
			t.Fatalf("%s's share %.4f, want %.2f (served %v)", f, got, w, m.served)
		}
	}
}

func TestAnIdleCallerBanksNoService(t *testing.T) {
	m := newSim()
	m.add("a", "a", 100000, 1)
	m.add("b", "b", 1, 5)
	for range 10 {
		m.serve(1)
	}
	// b had one message; it left the ring when it ran dry. Back with a backlog, it gets its
	// weight's share from now on, not the turns it missed.
	m.add("b", "b", 1000, 5)
	before := m.served["b"]
	for range 60 {
		m.serve(1)
	}
	if got := m.served["b"] - before; got != 50 {
		t.Fatalf("b was served %d of the 60 slots after it came back, want 50 (weight 5 of 6)", got)
	}
}

func TestACallersBatchesTakeTurnsWithinItsShare(t *testing.T) {
	m := newSim()
	m.add("a", "a/1", 1000, 1)
	m.add("a", "a/2", 1000, 1)
	m.add("a", "a/3", 1000, 1)
	m.add("b", "b/1", 1000, 1)
	for range 600 {
		m.serve(1)
	}
	if m.served["b/1"] != 300 {
		t.Fatalf("caller b (one batch) got %d of 600, want 300: callers share first, batches within (served %v)", m.served["b/1"], m.served)
	}
	for _, f := range []string{"a/1", "a/2", "a/3"} {
		if m.served[f] != 100 {
			t.Fatalf("batch %s got %d of caller a's 300, want 100 each (served %v)", f, m.served[f], m.served)
		}
	}
}

func TestEveryWaitingFlowIsServedWithinOneRound(t *testing.T) {
	// 1,000 callers with work: none waits more than one round of the others, whatever the
	// order they arrived in.
	m := newSim()
	m.add("flood", "flood", 1000000, 1)
	for i := range 999 {
		m.add(fmt.Sprint("c", i), fmt.Sprint("c", i), 3, 1)
	}
	for range 1000 {
		m.serve(1)
	}
	for i := range 999 {
		if m.served[fmt.Sprint("c", i)] != 1 {
			t.Fatalf("caller c%d was served %d times in the first 1,000 slots, want 1", i, m.served[fmt.Sprint("c", i)])
		}
	}
}

func TestSchedulerSurvivesRandomChurn(t *testing.T) {
	// Flows come and go at random and pulls of random size are served: every message is
	// handed out exactly once, nothing active is ever starved, and the books balance.
	r := rand.New(rand.NewPCG(1, 2))
	m := newSim()
	total := 0
	for step := range 20000 {
		if r.IntN(3) == 0 {
			g := fmt.Sprint("g", r.IntN(20))
			f := fmt.Sprint(g, "/", r.IntN(3))
			n := 1 + r.IntN(20)
			total += n
			m.add(g, f, n, 1+r.IntN(4))
		}
		m.serve(1 + r.IntN(8))
		flows, groups := m.s.Active()
		if flows < groups || (groups == 0) != (flows == 0) {
			t.Fatalf("step %d: %d active flows in %d groups", step, flows, groups)
		}
	}
	for m.serve(64) > 0 {
	}
	served := 0
	for f, n := range m.served {
		served += n
		if m.queued[f] != 0 {
			t.Fatalf("flow %s still has %d queued with the scheduler empty", f, m.queued[f])
		}
	}
	if served != total {
		t.Fatalf("served %d messages of %d queued", served, total)
	}
	if f, g := m.s.Active(); f != 0 || g != 0 {
		t.Fatalf("scheduler still has %d flows in %d groups active with nothing queued", f, g)
	}
}
