package budget

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sys1hq/sys1/worker/limits"
	"github.com/sys1hq/sys1/worker/natsconn/natstest"
	"github.com/sys1hq/sys1/worker/topology"
)

const producers = 16

// noon is a fixed instant well inside a minute and a day, for tests that must not roll over.
var noon = time.Date(2026, 12, 1, 12, 0, 10, 0, time.UTC)

// hammer runs producers goroutines spread over the replicas, each admitting for caller under
// rule until a decision it does not retry: a rate delay or a spent budget. A delay for
// contention is retried at once, as the worker would after its (shorter) delay. onAdmit runs
// for each admitted ticket. It returns how many were admitted.
func hammer(t *testing.T, reps []*replica, caller string, rule limits.Rule, est Estimate, onAdmit func(*replica, *Ticket)) int64 {
	t.Helper()
	var admitted atomic.Int64
	var wg sync.WaitGroup
	ctx := context.Background()
	for p := range producers {
		rep := reps[p%len(reps)]
		wg.Go(func() {
			for {
				d, err := rep.b.Admit(ctx, caller, rule, est)
				if err != nil {
					t.Errorf("producer %d: %v", p, err)
					return
				}
				switch {
				case d.Outcome == Admitted:
					admitted.Add(1)
					if onAdmit != nil {
						onAdmit(rep, d.Ticket)
					}
				case d.Outcome == Delayed && d.Reason == KindContention:
				default:
					return
				}
			}
		})
	}
	wg.Wait()
	return admitted.Load()
}

// TestExactAcrossReplicas is issue 16's acceptance test: 3 replicas (3 connections to one
// nats-server) and 16 producers admitting at once for one caller admit exactly N under a
// budget of N, never N+1, for rate limits in consecutive minute windows and USD budgets.
func TestExactAcrossReplicas(t *testing.T) {
	clk := newClock(noon)
	_, reps := fleet(t, 3, func(_ int, c *Config) { c.Now = clk.Now })
	for _, n := range []int64{1, 7, 50, 200} {
		t.Run(fmt.Sprintf("decisions_per_minute=%d", n), func(t *testing.T) {
			clk.Set(noon)
			caller := fmt.Sprintf("rate-%d", n)
			rule := limits.Rule{Name: "r", Caller: caller, DecisionsPerMinute: n}
			for w := range 3 { // three consecutive minute windows, each admitting exactly n
				if got := hammer(t, reps, caller, rule, Estimate{}, nil); got != n {
					t.Fatalf("window %d: admitted %d, want exactly %d", w, got, n)
				}
				if c := counter(t, reps[0].kv, caller, "r", clk.Now()); c.Decisions != n || c.Admitted != n*int64(w+1) {
					t.Fatalf("window %d: counter %+v", w, c)
				}
				clk.Add(time.Minute)
			}
		})
		t.Run(fmt.Sprintf("usd_per_day=%d", n), func(t *testing.T) {
			clk.Set(noon)
			caller := fmt.Sprintf("usd-%d", n)
			// A cent a call: n calls spend the budget to the nano-dollar.
			rule := limits.Rule{Name: "u", Caller: caller, USDPerDay: float64(n) * 0.01}
			if got := hammer(t, reps, caller, rule, Estimate{USD: 0.01}, nil); got != n {
				t.Fatalf("admitted %d, want exactly %d", got, n)
			}
			if c := counter(t, reps[0].kv, caller, "u", noon); c.NanoUSD != n*10_000_000 {
				t.Fatalf("counter %+v", c)
			}
		})
	}
	var st Stats
	for _, r := range reps {
		s := r.b.Stats()
		st.Operations += s.Operations
		st.Attempts += s.Attempts
		st.Conflicts += s.Conflicts
		st.Exhausted += s.Exhausted
		st.Batches += s.Batches
	}
	t.Logf("contention over all runs: %d operations in %d batches, %d compare-and-set attempts, %d lost, %d batches gave up",
		st.Operations, st.Batches, st.Attempts, st.Conflicts, st.Exhausted)
}

// TestExactTokenBudgetWithCorrections: admissions charge an estimate and Settle corrects it
// to the actual use. However the producers interleave, the budget admits exactly the calls
// whose estimate fitted what was charged before them, and the counter ends equal to the sum
// of the actual uses (no correction lost, none applied twice).
func TestExactTokenBudgetWithCorrections(t *testing.T) {
	_, reps := fleet(t, 3, nil)
	ctx := context.Background()
	const limit, est, actual = 10_000, 100, 60
	rule := limits.Rule{Name: "t", Caller: "tok", InputTokensPerDay: limit}
	settle := func(_ *replica, tk *Ticket) {
		if err := tk.Settle(ctx, Actual{InputTokens: actual}); err != nil {
			t.Error(err)
		}
	}
	got := hammer(t, reps, "tok", rule, Estimate{InputTokens: est}, settle)
	// A producer may have been refused while others' estimates were still charged; once all
	// is settled, admit one at a time until refused. The total is then exact: k calls, the
	// last admitted with 60·(k−1)+100 ≤ 10,000 and the next refused with 60·k+100 > 10,000.
	for {
		d, err := reps[int(got)%3].b.Admit(ctx, "tok", rule, Estimate{InputTokens: est})
		if err != nil {
			t.Fatal(err)
		}
		if d.Outcome != Admitted {
			if d.Outcome != Exceeded || d.Reason != KindInputTokens {
				t.Fatalf("refusal: %+v", d)
			}
			break
		}
		got++
		settle(nil, d.Ticket)
	}
	const want = 166 // (10,000 − 100) / 60 + 1
	if got != want {
		t.Fatalf("admitted %d, want exactly %d", got, want)
	}
	if c := counter(t, reps[0].kv, "tok", "t", time.Now()); c.Tokens != want*actual || c.Admitted != want {
		t.Fatalf("counter %+v, want %d tokens: a correction was lost or doubled", c, want*actual)
	}
}

// TestUnderestimateIsChargedInFull: a call admitted on an estimate that turns out low is
// charged what it used; the next call is refused with the budget's exact state.
func TestUnderestimateIsChargedInFull(t *testing.T) {
	clk := newClock(time.Date(2026, 12, 1, 18, 30, 0, 0, time.UTC))
	_, reps := fleet(t, 1, func(_ int, c *Config) { c.Now = clk.Now })
	b, ctx := reps[0].b, context.Background()
	rule := limits.Rule{Name: "billing", Caller: "billing", USDPerDay: 5}
	d, err := b.Admit(ctx, "billing", rule, Estimate{USD: 4.99})
	if err != nil || d.Outcome != Admitted {
		t.Fatalf("first call: %+v %v", d, err)
	}
	spent := 5.02
	if err := d.Ticket.Settle(ctx, Actual{USD: &spent}); err != nil {
		t.Fatal(err)
	}
	d, err = b.Admit(ctx, "billing", rule, Estimate{USD: 0.001})
	if err != nil || d.Outcome != Exceeded || d.Reason != KindUSD {
		t.Fatalf("over budget: %+v %v", d, err)
	}
	const want = "caller billing: USD per day budget 5.00 spent (5.02); resets 2026-12-02T00:00:00Z"
	if got := d.Exceeded.Error(); got != want {
		t.Fatalf("message\n got %q\nwant %q", got, want)
	}
	if d.Exceeded.Limit != 5 || d.Exceeded.Used != 5.02 || !d.Exceeded.ResetsAt.Equal(time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)) {
		t.Fatalf("exceeded: %+v", d.Exceeded)
	}
}

func TestExceededMessages(t *testing.T) {
	resets := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		e    ExceededError
		want string
	}{
		{ExceededError{Caller: "billing", Kind: KindUSD, Limit: 5, Used: 4.99, Estimate: 0.02, ResetsAt: resets},
			"caller billing: USD per day budget 5.00 would be exceeded: 4.99 spent, this call is estimated at 0.02; resets 2026-12-02T00:00:00Z"},
		{ExceededError{Caller: "b", Kind: KindUSD, Limit: 0.5, Used: 0.4999, Estimate: 0.000412, ResetsAt: resets},
			"caller b: USD per day budget 0.50 would be exceeded: 0.4999 spent, this call is estimated at 0.000412; resets 2026-12-02T00:00:00Z"},
		{ExceededError{Caller: "t", Kind: KindInputTokens, Limit: 1_000_000, Used: 1_000_230, ResetsAt: resets},
			"caller t: input tokens per day budget 1000000 spent (1000230); resets 2026-12-02T00:00:00Z"},
		{ExceededError{Caller: "t", Kind: KindInputTokens, Limit: 1000, Used: 900, Estimate: 800, ResetsAt: resets},
			"caller t: input tokens per day budget 1000 would be exceeded: 900 spent, this call is estimated at 800 tokens; resets 2026-12-02T00:00:00Z"},
	} {
		if got := c.e.Error(); got != c.want {
			t.Errorf("\n got %q\nwant %q", got, c.want)
		}
	}
	for v, want := range map[float64]string{0: "0.00", 5: "5.00", 5.02: "5.02", 5.0212345: "5.0212", 0.01: "0.01", 0.0004: "0.0004", 0.000412345: "0.000412", 1234.5: "1234.50"} {
		if got := formatUSD(v); got != want {
			t.Errorf("formatUSD(%v) = %q, want %q", v, got, want)
		}
	}
}

// TestWindowsRollOver drives the clock across a minute and a UTC midnight: a full minute
// delays until the next (and the next admits again); a spent day refuses until midnight; a
// call admitted before midnight and settled after it corrects the day it was charged to.
func TestWindowsRollOver(t *testing.T) {
	clk := newClock(time.Date(2026, 12, 1, 23, 58, 30, 0, time.UTC))
	_, reps := fleet(t, 2, func(_ int, c *Config) { c.Now = clk.Now })
	ctx := context.Background()
	rule := limits.Rule{Name: "r", Caller: "c", DecisionsPerMinute: 2, USDPerDay: 1}
	admit := func(i int, usd float64) Decision {
		t.Helper()
		d, err := reps[i%2].b.Admit(ctx, "c", rule, Estimate{USD: usd})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	for i := range 2 {
		if d := admit(i, 0.1); d.Outcome != Admitted {
			t.Fatalf("call %d: %+v", i, d)
		}
	}
	d := admit(2, 0.1)
	nextMinute := time.Date(2026, 12, 1, 23, 59, 0, 0, time.UTC)
	if d.Outcome != Delayed || d.Reason != KindDecisions || d.Until.Before(nextMinute) || !d.Until.Before(nextMinute.Add(time.Second)) {
		t.Fatalf("third call in a minute of two: %+v, want delayed to %s (+ under 1s of jitter)", d, nextMinute)
	}
	clk.Set(nextMinute)
	// 23:59: spend the rest of the day's dollar; the second call's estimate does not fit.
	late := admit(3, 0.75)
	if late.Outcome != Admitted {
		t.Fatalf("new minute: %+v", late)
	}
	d = admit(4, 0.1)
	if d.Outcome != Exceeded || d.Reason != KindUSD || !strings.Contains(d.Exceeded.Error(), "would be exceeded: 0.95 spent, this call is estimated at 0.10; resets 2026-12-02T00:00:00Z") {
		t.Fatalf("over the day: %+v %v", d, d.Exceeded)
	}
	// Midnight: a new day, a new budget, a new minute.
	clk.Set(time.Date(2026, 12, 2, 0, 0, 0, 1, time.UTC))
	for i := range 2 {
		if d := admit(i, 0.1); d.Outcome != Admitted {
			t.Fatalf("after midnight, call %d: %+v", i, d)
		}
	}
	// The 23:59 call ends now and used less: the correction goes to Dec 1, not Dec 2.
	used := 0.25
	if err := late.Ticket.Settle(ctx, Actual{USD: &used}); err != nil {
		t.Fatal(err)
	}
	if c := counter(t, reps[0].kv, "c", "r", time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)); c.NanoUSD != 450_000_000 || c.Admitted != 3 {
		t.Fatalf("Dec 1 after the late settlement: %+v, want 0.45 USD", c)
	}
	if c := counter(t, reps[0].kv, "c", "r", clk.Now()); c.NanoUSD != 200_000_000 || c.Admitted != 2 {
		t.Fatalf("Dec 2: %+v", c)
	}
	// A replica whose clock is a little behind still counts into the newest minute.
	slow := newClock(clk.Now().Add(-500 * time.Millisecond))
	sb, err := New(Config{KV: reps[0].kv, Now: slow.Now})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	clk.Add(time.Minute) // the others move on to 00:01 …
	slow.Set(clk.Now().Add(-2 * time.Second))
	if d := admit(0, 0); d.Outcome != Admitted { // … one call at 00:01
		t.Fatalf("00:01: %+v", d)
	}
	if d, err := sb.Admit(ctx, "c", rule, Estimate{}); err != nil || d.Outcome != Admitted { // the slow one, at 00:00:58
		t.Fatalf("slow replica: %+v %v", d, err)
	}
	if d := admit(1, 0); d.Outcome != Delayed {
		t.Fatalf("00:01 holds two calls, one from the slow replica: %+v", d)
	}
}

// TestInFlightCapReleaseAndLease: the cap holds across replicas; a release frees a slot at
// once; a dead replica's slot lapses after LeaseTTL and not before; a live replica's lease is
// extended and outlives LeaseTTL.
func TestInFlightCapReleaseAndLease(t *testing.T) {
	clk := newClock(noon)
	const ttl = 30 * time.Second
	_, reps := fleet(t, 3, func(_ int, c *Config) { c.Now, c.LeaseTTL, c.manualRefresh = clk.Now, ttl, true })
	ctx := context.Background()
	rule := limits.Rule{Name: "f", Caller: "c", InFlight: 2}
	admit := func(i int) Decision {
		t.Helper()
		d, err := reps[i].b.Admit(ctx, "c", rule, Estimate{})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	a, b := admit(0), admit(1)
	if a.Outcome != Admitted || b.Outcome != Admitted {
		t.Fatalf("two slots: %+v %+v", a, b)
	}
	d := admit(2)
	if d.Outcome != Delayed || d.Reason != KindInFlight || d.Until.Before(noon.Add(DefaultInFlightRetry/2)) || d.Until.After(noon.Add(3*DefaultInFlightRetry/2)) {
		t.Fatalf("third call: %+v", d)
	}
	if err := b.Ticket.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Ticket.Release(ctx); err != nil { // twice is harmless
		t.Fatal(err)
	}
	c := admit(2)
	if c.Outcome != Admitted {
		t.Fatalf("after a release: %+v", c)
	}
	if u, err := reps[0].b.Usage(ctx, "c", rule); err != nil || len(u.Uses) != 1 || u.Uses[0].Kind != KindInFlight || u.Uses[0].Used != 2 || u.Uses[0].Limit != 2 {
		t.Fatalf("usage: %+v %v", u, err)
	}

	// Replica 0 dies holding a's slot: no more refreshes, no release.
	reps[0].b.Close()
	reps[0].nc.Close()
	// Replica 2 stays alive and extends c's lease two thirds into its life, and again later.
	clk.Add(20 * time.Second)
	reps[2].b.refresh(ctx)
	clk.Add(ttl - 20*time.Second - time.Millisecond) // a's lease has 1 ms left
	if d := admit(1); d.Outcome != Delayed || d.Reason != KindInFlight {
		t.Fatalf("before the dead replica's lease lapses: %+v", d)
	}
	if d.Until.After(clk.Now().Add(time.Millisecond)) {
		t.Fatalf("a delay should end when the first lease lapses (%s), got %s", clk.Now().Add(time.Millisecond), d.Until)
	}
	clk.Add(2 * time.Millisecond) // a lapsed; c was extended at +20s and lives to +50s
	n := admit(1)
	if n.Outcome != Admitted {
		t.Fatalf("after the dead replica's lease lapsed: %+v", n)
	}
	if d := admit(1); d.Outcome != Delayed {
		t.Fatalf("c's extended lease must still hold its slot past the TTL: %+v", d)
	}
	reps[2].b.refresh(ctx)
	clk.Add(25 * time.Second) // +55s: beyond c's first expiry, but it was extended again at +30s
	if d := admit(1); d.Outcome != Delayed {
		t.Fatalf("c, extended twice: %+v", d)
	}
	if err := c.Ticket.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if d := admit(1); d.Outcome != Admitted {
		t.Fatalf("after c's release: %+v", d)
	}
}

// TestInFlightCapUnderLoad: 16 producers on 3 replicas, each holding its slot for a moment:
// the calls in flight, as counted by the producers themselves, never exceed the cap.
func TestInFlightCapUnderLoad(t *testing.T) {
	_, reps := fleet(t, 3, nil)
	ctx := context.Background()
	const limit, calls = 3, 200
	rule := limits.Rule{Name: "f", Caller: "c", InFlight: limit}
	var inFlight, peak, done atomic.Int64
	var wg sync.WaitGroup
	for p := range producers {
		rep := reps[p%3]
		wg.Go(func() {
			for done.Load() < calls {
				d, err := rep.b.Admit(ctx, "c", rule, Estimate{})
				if err != nil {
					t.Error(err)
					return
				}
				if d.Outcome != Admitted {
					continue // delayed: a slot frees when some call ends; try again
				}
				n := inFlight.Add(1)
				for {
					p := peak.Load()
					if n <= p || peak.CompareAndSwap(p, n) {
						break
					}
				}
				done.Add(1)
				inFlight.Add(-1)
				if err := d.Ticket.Release(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if peak.Load() > limit {
		t.Fatalf("%d calls in flight at once under a cap of %d", peak.Load(), limit)
	}
	if u, err := reps[0].b.Usage(ctx, "c", rule); err != nil || u.Uses[0].Used != 0 {
		t.Fatalf("every slot must be free at the end: %+v %v", u, err)
	}
}

// TestRefusalHandsBackTheSlot: a call with a slot but over its rate is delayed and its slot
// is free again at once.
func TestRefusalHandsBackTheSlot(t *testing.T) {
	clk := newClock(noon)
	_, reps := fleet(t, 1, func(_ int, c *Config) { c.Now = clk.Now })
	b, ctx := reps[0].b, context.Background()
	rule := limits.Rule{Name: "x", Caller: "c", InFlight: 1, DecisionsPerMinute: 1}
	first, err := b.Admit(ctx, "c", rule, Estimate{})
	if err != nil || first.Outcome != Admitted {
		t.Fatal(first, err)
	}
	if err := first.Ticket.Release(ctx); err != nil {
		t.Fatal(err)
	}
	d, err := b.Admit(ctx, "c", rule, Estimate{})
	if err != nil || d.Outcome != Delayed || d.Reason != KindDecisions {
		t.Fatalf("second call: %+v %v", d, err)
	}
	if u, _ := b.Usage(ctx, "c", rule); u.Uses[1].Kind != KindInFlight || u.Uses[1].Used != 0 {
		t.Fatalf("the delayed call kept its slot: %+v", u)
	}
}

// TestLimitsReloadChangesTheLimit: the limits file is edited while the worker runs (livefile);
// the new limit applies at once and what was counted under the rule's name still counts.
func TestLimitsReloadChangesTheLimit(t *testing.T) {
	clk := newClock(noon)
	_, reps := fleet(t, 2, func(_ int, c *Config) { c.Now = clk.Now })
	path := filepath.Join(t.TempDir(), "limits.yaml")
	at := time.Now().Add(-time.Hour)
	write := func(s string) {
		t.Helper()
		at = at.Add(time.Second)
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(path, at, at); err != nil {
			t.Fatal(err)
		}
	}
	write("rules:\n  - caller: \"team-*\"\n    name: teams\n    decisions_per_minute: 5\n")
	file, err := limits.LoadLimits(path)
	if err != nil {
		t.Fatal(err)
	}
	admitAll := func() int64 {
		rule, ok := file.Current().Match("team-a")
		if !ok {
			t.Fatal("no rule for team-a")
		}
		return hammer(t, reps, "team-a", rule, Estimate{}, nil)
	}
	if got := admitAll(); got != 5 {
		t.Fatalf("limit 5: admitted %d", got)
	}
	write("rules:\n  - caller: \"team-*\"\n    name: teams\n    decisions_per_minute: 8\n")
	if changed, err := file.Check(); !changed || err != nil {
		t.Fatalf("reload: %v %v", changed, err)
	}
	if got := admitAll(); got != 3 {
		t.Fatalf("raised to 8 with 5 used this minute: admitted %d more, want 3", got)
	}
	write("rules:\n  - caller: \"team-*\"\n    name: teams\n    decisions_per_minute: -1\n")
	if _, err := file.Check(); err == nil {
		t.Fatal("a bad edit was accepted")
	}
	if got := admitAll(); got != 0 {
		t.Fatalf("a bad edit keeps the last good limit (8, all used): admitted %d", got)
	}
	write("rules:\n  - caller: \"team-*\"\n    name: teams-v2\n    decisions_per_minute: 2\n")
	if _, err := file.Check(); err != nil {
		t.Fatal(err)
	}
	if got := admitAll(); got != 2 {
		t.Fatalf("a renamed rule counts afresh: admitted %d, want 2", got)
	}
}

// TestUsageAndReport: sys1 status reads each counted caller's use against its rule.
func TestUsageAndReport(t *testing.T) {
	clk := newClock(noon)
	_, reps := fleet(t, 1, func(_ int, c *Config) { c.Now = clk.Now })
	b, ctx := reps[0].b, context.Background()
	if got, err := b.Counted(ctx); err != nil || len(got) != 0 {
		t.Fatalf("empty bucket: %v %v", got, err)
	}
	l, err := limits.ParseLimits([]byte(`rules:
  - caller: billing
    usd_per_day: 5
    decisions_per_minute: 100
    input_tokens_per_day: 1000
  - caller: "svc/*"
    in_flight: 4
  - caller: free
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, caller := range []string{"billing", "billing", "svc/a b", "free"} {
		r, _ := l.Match(caller)
		d, err := b.Admit(ctx, caller, r, Estimate{InputTokens: 100, USD: 0.5})
		if err != nil || d.Outcome != Admitted {
			t.Fatal(d, err)
		}
	}
	rep, err := b.Report(ctx, l)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep) != 2 || rep[0].Caller != "billing" || rep[1].Caller != "svc/a b" || rep[1].Rule != "svc/*" {
		t.Fatalf("report: %+v", rep)
	}
	bill := rep[0]
	want := []Use{
		{KindDecisions, 100, 2, time.Date(2026, 12, 1, 12, 1, 0, 0, time.UTC)},
		{KindInputTokens, 1000, 200, time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)},
		{KindUSD, 5, 1, time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)},
	}
	if bill.AdmittedToday != 2 || len(bill.Uses) != 3 {
		t.Fatalf("billing: %+v", bill)
	}
	for i, w := range want {
		if g := bill.Uses[i]; g.Kind != w.Kind || g.Limit != w.Limit || g.Used != w.Used || !g.ResetsAt.Equal(w.ResetsAt) {
			t.Errorf("use %d: %+v, want %+v", i, g, w)
		}
	}
	if u := rep[1].Uses; len(u) != 1 || u[0].Used != 1 || u[0].Limit != 4 {
		t.Fatalf("svc: %+v", u)
	}
	// The next minute, the rate count reads 0 (no write needed to see it).
	clk.Add(time.Minute)
	u, err := b.Usage(ctx, "billing", l.Rules[0])
	if err != nil || u.Uses[0].Used != 0 || u.Uses[1].Used != 200 {
		t.Fatalf("next minute: %+v %v", u, err)
	}
}

// TestUnlimitedCallersCostNoRoundTrip: a caller no rule limits is admitted without NATS.
func TestUnlimitedCallersCostNoRoundTrip(t *testing.T) {
	_, reps := fleet(t, 1, nil)
	reps[0].nc.Close()
	ctx := context.Background()
	d, err := reps[0].b.Admit(ctx, "free", limits.Rule{Name: "free", Caller: "free", Cache: time.Hour}, Estimate{InputTokens: 5})
	if err != nil || d.Outcome != Admitted {
		t.Fatalf("unlimited: %+v %v", d, err)
	}
	if err := d.Ticket.Settle(ctx, Actual{InputTokens: 9}); err != nil {
		t.Fatal(err)
	}
	if err := d.Ticket.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// A limited caller without NATS is refused with the error: nothing is admitted blind.
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := reps[0].b.Admit(cctx, "c", limits.Rule{Name: "c", Caller: "c", DecisionsPerMinute: 1}, Estimate{}); err == nil {
		t.Fatal("admitted with NATS closed")
	}
}

// TestUnreadableCounterIsAnError: a counter someone overwrote by hand fails the admission
// with the key named, instead of resetting the budget.
func TestUnreadableCounterIsAnError(t *testing.T) {
	_, reps := fleet(t, 1, nil)
	ctx := context.Background()
	key := dayKey("c", "r", utcDay(time.Now()))
	if _, err := reps[0].kv.Put(ctx, key, []byte("not json")); err != nil {
		t.Fatal(err)
	}
	_, err := reps[0].b.Admit(ctx, "c", limits.Rule{Name: "r", Caller: "c", USDPerDay: 1}, Estimate{})
	if err == nil || !strings.Contains(err.Error(), key) || !strings.Contains(err.Error(), "unreadable") {
		t.Fatalf("corrupt counter: %v", err)
	}
}

// TestKeysAreValidForAnyCaller: callers are JWT subjects too (any character); keys stay valid
// KV keys and decode back.
func TestKeysAreValidForAnyCaller(t *testing.T) {
	_, reps := fleet(t, 1, nil)
	ctx := context.Background()
	for _, caller := range []string{"", "a.b", "svc/x y", "ü*>", strings.Repeat("z", 256)} {
		rule := limits.Rule{Name: "*", Caller: "*", DecisionsPerMinute: 10, InFlight: 2}
		d, err := reps[0].b.Admit(ctx, caller, rule, Estimate{})
		if err != nil || d.Outcome != Admitted {
			t.Fatalf("%q: %+v %v", caller, d, err)
		}
		if err := d.Ticket.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	got, err := reps[0].b.Counted(ctx)
	if err != nil || len(got) != 5 {
		t.Fatalf("counted: %v %v", got, err)
	}
	if got[0].Caller != "" || got[1].Caller != "a.b" || got[0].Rule != "*" {
		t.Fatalf("decoded: %+v", got[:2])
	}
}

func TestNewRefusesNoBucket(t *testing.T) {
	if _, err := New(Config{}); err == nil {
		t.Fatal("no bucket accepted")
	}
	_, js := natstest.Connect(t, natstest.Start(t))
	kv, err := js.CreateKeyValue(context.Background(), topology.Default().LimitsBucketConfig())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := New(Config{KV: kv, LeaseTTL: time.Millisecond}); err == nil {
		t.Fatal("a lease too short to refresh accepted")
	}
	var d Decision
	if d.Outcome.String() != "Outcome(0)" || Admitted.String() != "admitted" || errors.Is(nil, errContention) {
		t.Fatal("outcome names")
	}
}

// TestAbsurdUsageSpendsTheBudgetInsteadOfWrappingIt: a usage figure past what int64
// nano-dollars hold (a provider reporting 10^30 tokens, a price typo) saturates the day's
// counter: the next call is refused. Without saturation the conversion wrapped the counter
// to nothing and the caller could spend again.
func TestAbsurdUsageSpendsTheBudgetInsteadOfWrappingIt(t *testing.T) {
	clk := newClock(time.Date(2026, 12, 1, 18, 30, 0, 0, time.UTC))
	_, reps := fleet(t, 1, func(_ int, c *Config) { c.Now = clk.Now })
	b, ctx := reps[0].b, context.Background()
	rule := limits.Rule{Name: "billing", Caller: "billing", USDPerDay: 5, InputTokensPerDay: 1_000_000}
	for _, absurd := range []Actual{{USD: ptr(1e12)}, {USD: ptr(math.Inf(1))}, {InputTokens: math.MaxInt64}} {
		d, err := b.Admit(ctx, "billing", rule, Estimate{USD: 0.01, InputTokens: 10})
		if err != nil || d.Outcome != Admitted {
			t.Fatalf("before %+v: %+v %v", absurd, d, err)
		}
		if err := d.Ticket.Settle(ctx, absurd); err != nil {
			t.Fatal(err)
		}
		d, err = b.Admit(ctx, "billing", rule, Estimate{USD: 0.001, InputTokens: 1})
		if err != nil || d.Outcome != Exceeded {
			t.Fatalf("after an absurd %+v: %+v %v, want the budget spent", absurd, d, err)
		}
		c := counter(t, reps[0].kv, "billing", "billing", clk.Now())
		if c.NanoUSD < 0 || c.Tokens < 0 {
			t.Fatalf("counter wrapped: %+v", c)
		}
		clk.Add(24 * time.Hour) // a new day, a fresh counter
	}
	if got := satAdd(math.MaxInt64, math.MaxInt64); got != maxCount {
		t.Errorf("satAdd saturates at %d", got)
	}
	if got := nano(1e300); got != maxCount {
		t.Errorf("nano(1e300) = %d", got)
	}
}

func ptr(f float64) *float64 { return &f }

// TestARunIsChargedOnceWhateverItsReplicaDid is issue 24's budget finding: a run whose
// replica died during the call (or whose admission's answer was lost in a NATS election)
// was charged again when its next delivery was admitted, and its first estimate was never
// refunded, so a budget of N paid for fewer than N runs. An admission named by the run stays
// open until settled, and the run's next delivery is admitted on that same charge.
func TestARunIsChargedOnceWhateverItsReplicaDid(t *testing.T) {
	clk := newClock(noon)
	_, reps := fleet(t, 2, func(_ int, c *Config) { c.Now = clk.Now })
	ctx := context.Background()
	rule := limits.Rule{Name: "day", Caller: "billing", USDPerDay: 0.05}
	cent := 0.01
	for i := range 5 {
		id := fmt.Sprintf("run-%d", i)
		// The first delivery is admitted and its replica dies: never settled.
		d, err := reps[0].b.Admit(ctx, "billing", rule, Estimate{USD: cent, ID: id})
		if err != nil || d.Outcome != Admitted {
			t.Fatalf("%s, first delivery: %+v %v", id, d, err)
		}
		// The run comes back on the other replica: admitted on the open charge, settled.
		d, err = reps[1].b.Admit(ctx, "billing", rule, Estimate{USD: cent, ID: id})
		if err != nil || d.Outcome != Admitted {
			t.Fatalf("%s, redelivery: %+v %v", id, d, err)
		}
		if err := d.Ticket.Settle(ctx, Actual{USD: &cent}); err != nil {
			t.Fatal(err)
		}
		// A settlement of the same admission again (a retried write that had landed) changes
		// nothing.
		if err := d.Ticket.Settle(ctx, Actual{USD: &cent}); err != nil {
			t.Fatal(err)
		}
	}
	c := counter(t, reps[0].kv, "billing", "day", clk.Now())
	if c.NanoUSD != nano(0.05) || c.Admitted != 5 || len(c.Open) != 0 {
		t.Fatalf("after five runs each admitted twice: %+v; want 0.05 USD, 5 admitted, nothing open", c)
	}
	d, err := reps[0].b.Admit(ctx, "billing", rule, Estimate{USD: cent, ID: "run-6"})
	if err != nil || d.Outcome != Exceeded {
		t.Fatalf("the sixth run: %+v %v; want exceeded", d, err)
	}
}

// A run whose earlier delivery failed without an answer (refunded: settled with nothing) is
// charged again when a later delivery is admitted: its open charge was closed.
func TestARefundedRunIsChargedAgainWhenItRunsAgain(t *testing.T) {
	clk := newClock(noon)
	_, reps := fleet(t, 1, func(_ int, c *Config) { c.Now = clk.Now })
	ctx := context.Background()
	rule := limits.Rule{Name: "day", Caller: "billing", USDPerDay: 1}
	cent := 0.01
	d, _ := reps[0].b.Admit(ctx, "billing", rule, Estimate{USD: cent, ID: "r"})
	if err := d.Ticket.Settle(ctx, Actual{}); err != nil { // the provider failed: nothing used
		t.Fatal(err)
	}
	if c := counter(t, reps[0].kv, "billing", "day", clk.Now()); c.NanoUSD != 0 || len(c.Open) != 0 {
		t.Fatalf("after the refund: %+v", c)
	}
	d, _ = reps[0].b.Admit(ctx, "billing", rule, Estimate{USD: cent, ID: "r"})
	if err := d.Ticket.Settle(ctx, Actual{USD: &cent}); err != nil {
		t.Fatal(err)
	}
	if c := counter(t, reps[0].kv, "billing", "day", clk.Now()); c.NanoUSD != nano(cent) || c.Admitted != 2 {
		t.Fatalf("after the answer: %+v", c)
	}
}

// The open admissions of a day are bounded: runs that never come back cannot grow the
// counter without end.
func TestOpenAdmissionsAreBounded(t *testing.T) {
	clk := newClock(noon)
	_, reps := fleet(t, 1, func(_ int, c *Config) { c.Now = clk.Now })
	ctx := context.Background()
	rule := limits.Rule{Name: "day", Caller: "billing", InputTokensPerDay: 1 << 40}
	for i := range maxOpen + 10 {
		if d, err := reps[0].b.Admit(ctx, "billing", rule, Estimate{InputTokens: 1, ID: fmt.Sprint("lost-", i)}); err != nil || d.Outcome != Admitted {
			t.Fatalf("%d: %+v %v", i, d, err)
		}
	}
	c := counter(t, reps[0].kv, "billing", "day", clk.Now())
	if len(c.Open) != maxOpen || c.Open[0].ID != "lost-10" || c.Tokens != maxOpen+10 {
		t.Fatalf("%d open (first %q), %d tokens", len(c.Open), c.Open[0].ID, c.Tokens)
	}
}

// TestAHeldAdmissionCarriesTheRunToItsNextDelivery (found by the soak, twice): a delivery
// handed back for another (its answer lost, or its call failed) holds its admission open and
// charged, so the run's next delivery is admitted on it even once the budget is spent — never
// refused for a run already paid for, never charged a second estimate — while no other run
// is admitted on the budget the waiting run holds.
func TestAHeldAdmissionCarriesTheRunToItsNextDelivery(t *testing.T) {
	clk := newClock(noon)
	_, reps := fleet(t, 2, func(_ int, c *Config) { c.Now = clk.Now })
	ctx := context.Background()
	rule := limits.Rule{Name: "day", Caller: "billing", USDPerDay: 0.02}
	cent := 0.01
	d, err := reps[0].b.Admit(ctx, "billing", rule, Estimate{USD: cent, ID: "r-1"})
	if err != nil || d.Outcome != Admitted {
		t.Fatalf("first delivery: %+v %v", d, err)
	}
	// The call failed and the delivery was handed back: the admission stays open and charged.
	if err := d.Ticket.Hold(ctx, Actual{}); err != nil {
		t.Fatal(err)
	}
	if c := counter(t, reps[0].kv, "billing", "day", clk.Now()); c.NanoUSD != nano(cent) || len(c.Open) != 1 || c.Admitted != 1 {
		t.Fatalf("after the hold: %+v; want its cent still charged, one open, one admitted", c)
	}
	// Meanwhile other runs ask: one fits beside the held run, the next does not.
	d2, err := reps[1].b.Admit(ctx, "billing", rule, Estimate{USD: cent, ID: "r-2"})
	if err != nil || d2.Outcome != Admitted {
		t.Fatalf("r-2: %+v %v", d2, err)
	}
	if err := d2.Ticket.Settle(ctx, Actual{USD: &cent}); err != nil {
		t.Fatal(err)
	}
	if d3, err := reps[1].b.Admit(ctx, "billing", rule, Estimate{USD: cent, ID: "r-3"}); err != nil || d3.Outcome != Exceeded {
		t.Fatalf("r-3 while r-1 holds the rest of the budget: %+v %v; want exceeded", d3, err)
	}
	// The run comes back: admitted on its open charge, though the budget is spent.
	d, err = reps[1].b.Admit(ctx, "billing", rule, Estimate{USD: cent, ID: "r-1"})
	if err != nil || d.Outcome != Admitted {
		t.Fatalf("the run's next delivery: %+v %v; want admitted on its open charge", d, err)
	}
	if err := d.Ticket.Settle(ctx, Actual{USD: &cent}); err != nil {
		t.Fatal(err)
	}
	c := counter(t, reps[0].kv, "billing", "day", clk.Now())
	if c.NanoUSD != nano(0.02) || c.Admitted != 2 || len(c.Open) != 0 {
		t.Fatalf("after the two runs: %+v; want exactly the 0.02 USD budget spent, 2 admitted, nothing open", c)
	}
}

// TestAHeldRunThatFailsInTheEndIsRefunded: the charge a held admission keeps is refunded when
// the run's last delivery settles it without an answer.
func TestAHeldRunThatFailsInTheEndIsRefunded(t *testing.T) {
	clk := newClock(noon)
	_, reps := fleet(t, 1, func(_ int, c *Config) { c.Now = clk.Now })
	ctx := context.Background()
	rule := limits.Rule{Name: "day", Caller: "billing", USDPerDay: 0.02}
	d, err := reps[0].b.Admit(ctx, "billing", rule, Estimate{USD: 0.01, ID: "r-1"})
	if err != nil || d.Outcome != Admitted {
		t.Fatalf("first delivery: %+v %v", d, err)
	}
	if err := d.Ticket.Hold(ctx, Actual{}); err != nil {
		t.Fatal(err)
	}
	d, err = reps[0].b.Admit(ctx, "billing", rule, Estimate{USD: 0.01, ID: "r-1"})
	if err != nil || d.Outcome != Admitted {
		t.Fatalf("last delivery: %+v %v", d, err)
	}
	if err := d.Ticket.Settle(ctx, Actual{}); err != nil {
		t.Fatal(err)
	}
	if c := counter(t, reps[0].kv, "billing", "day", clk.Now()); c.NanoUSD != 0 || len(c.Open) != 0 {
		t.Fatalf("after the run failed for good: %+v; want nothing charged, nothing open", c)
	}
}
