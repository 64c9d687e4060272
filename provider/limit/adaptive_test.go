package limit_test

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/sys1hq/sys1/provider/limit"
)

func newAdaptive(t *testing.T, mutate func(*limit.AdaptiveConfig)) *limit.Adaptive {
	t.Helper()
	cfg := limit.DefaultAdaptiveConfig(16)
	cfg.Seed = 1
	if mutate != nil {
		mutate(&cfg)
	}
	a, err := limit.NewAdaptive(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// drive runs n calls through a, as a closed loop that keeps the limit full: it takes every
// token the limit allows, then releases the oldest with the result res gives it. It returns
// the highest and lowest limits seen.
func drive(t *testing.T, a *limit.Adaptive, n int, res func(i int) limit.Result) (hi, lo int) {
	t.Helper()
	var held []limit.Token
	hi, lo = a.Limit(), a.Limit()
	for i := 0; i < n; i++ {
		for a.InFlight() < a.Limit() {
			tok, err := a.Acquire(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, tok)
		}
		held[0].Release(res(i))
		held = held[1:]
		hi, lo = max(hi, a.Limit()), min(lo, a.Limit())
	}
	for _, tok := range held {
		tok.Release(limit.Result{Ignore: true})
	}
	return hi, lo
}

// near compares durations computed in floating point.
func near(a, b time.Duration) bool { return (a - b).Abs() < time.Microsecond }

func flat(d time.Duration) func(int) limit.Result {
	return func(int) limit.Result { return limit.Result{Latency: d, Size: 1} }
}

func TestAdaptiveGrowsToMaxWhenLatencyIsFlat(t *testing.T) {
	a := newAdaptive(t, func(c *limit.AdaptiveConfig) { c.Max = 8 })
	if a.Limit() != 1 {
		t.Fatalf("starts at %d, want Min", a.Limit())
	}
	hi, _ := drive(t, a, 2000, flat(10*time.Millisecond))
	if a.Limit() != 8 || hi != 8 {
		t.Fatalf("flat latency: limit %d (highest %d), want Max 8", a.Limit(), hi)
	}
	if st := a.Stats(); st.Increases == 0 || st.Decreases != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestAdaptiveDoesNotGrowWhenTheLimitIsNotUsed(t *testing.T) {
	// A limit of 3 with one call at a time: flat latency says nothing about 4.
	a := newAdaptive(t, func(c *limit.AdaptiveConfig) { c.Initial = 3 })
	for range 200 {
		tok, err := a.Acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		tok.Release(limit.Result{Latency: time.Millisecond, Size: 1})
	}
	if a.Limit() != 3 {
		t.Fatalf("an unused limit moved to %d", a.Limit())
	}
}

func TestAdaptiveShrinksWhenLatencyGrowsAndNeverBelowMin(t *testing.T) {
	a := newAdaptive(t, func(c *limit.AdaptiveConfig) { c.Initial = 16; c.Min = 2 })
	drive(t, a, 200, flat(10*time.Millisecond))
	before := a.Limit()
	// The provider queues: latency four times the baseline.
	_, lo := drive(t, a, 400, flat(40*time.Millisecond))
	if a.Limit() >= before || a.Limit() != 2 || lo < 2 {
		t.Fatalf("limit %d → %d (lowest %d), want a decrease to Min 2 and never below", before, a.Limit(), lo)
	}
	if st := a.Stats(); st.Decreases == 0 || !near(st.Baseline, 10*time.Millisecond) {
		t.Fatalf("stats %+v", st)
	}
}

func TestAdaptiveHalvesOnDropsOncePerRound(t *testing.T) {
	a := newAdaptive(t, func(c *limit.AdaptiveConfig) { c.Initial = 16 })
	var toks []limit.Token
	for range 16 {
		tok, err := a.Acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		toks = append(toks, tok)
	}
	// A burst of timeouts from calls admitted together is one congestion event.
	for _, tok := range toks[:4] {
		tok.Release(limit.Result{Dropped: true, Latency: 30 * time.Second})
	}
	if a.Limit() != 8 {
		t.Fatalf("after a burst of drops: limit %d, want 16 halved once", a.Limit())
	}
	for _, tok := range toks[4:] {
		tok.Release(limit.Result{Ignore: true})
	}
	// A drop of a call admitted after the decrease halves again; never below Min.
	for range 10 {
		tok, err := a.Acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		tok.Release(limit.Result{Dropped: true})
	}
	if a.Limit() != 1 || a.InFlight() != 0 {
		t.Fatalf("after repeated drops: limit %d in flight %d, want Min 1 and 0", a.Limit(), a.InFlight())
	}
	if st := a.Stats(); st.Drops != 14 || st.Decreases != 4 {
		t.Fatalf("drops %d decreases %d, want 14 and 4 (16→8→4→2→1)", st.Drops, st.Decreases)
	}
}

func TestAdaptiveIgnoresCancelledCalls(t *testing.T) {
	a := newAdaptive(t, func(c *limit.AdaptiveConfig) { c.Initial = 4 })
	drive(t, a, 100, flat(10*time.Millisecond))
	before := a.Stats()
	// Cancellations with absurd latencies, and calls refused as invalid, say nothing.
	drive(t, a, 500, func(int) limit.Result { return limit.Result{Latency: time.Hour, Size: 1, Ignore: true} })
	after := a.Stats()
	if after != before || a.InFlight() != 0 {
		t.Fatalf("ignored results moved the limiter: %+v → %+v (in flight %d)", before, after, a.InFlight())
	}
}

func TestAdaptiveNormalisesLatencyBySize(t *testing.T) {
	// Requests of 1 and 64 units; latency proportional to size (10 ms a unit) is no
	// congestion: the limit must grow, never shrink.
	sized := func(i int) limit.Result {
		size := 1.0
		if i%2 == 1 {
			size = 64
		}
		return limit.Result{Latency: time.Duration(size * float64(10*time.Millisecond)), Size: size}
	}
	a := newAdaptive(t, func(c *limit.AdaptiveConfig) { c.Max = 8 })
	_, lo := drive(t, a, 3000, sized)
	if st := a.Stats(); a.Limit() != 8 || lo < 1 || st.Decreases != 0 {
		t.Fatalf("proportional latency: limit %d, stats %+v; want Max and no decrease", a.Limit(), st)
	}
	// The same latencies without their sizes look like a queue: the control experiment.
	b := newAdaptive(t, func(c *limit.AdaptiveConfig) { c.Max = 8 })
	drive(t, b, 3000, func(i int) limit.Result { r := sized(i); r.Size = 1; return r })
	if st := b.Stats(); st.Decreases == 0 {
		t.Fatalf("without sizes no decrease either (%+v): the test does not test normalisation", st)
	}
	// Sizes below 1, NaN or infinite count as 1 rather than poisoning the baseline.
	c := newAdaptive(t, nil)
	drive(t, c, 200, func(i int) limit.Result {
		return limit.Result{Latency: 10 * time.Millisecond, Size: []float64{0, -3, math.NaN(), math.Inf(1)}[i%4]}
	})
	if st := c.Stats(); !near(st.Baseline, 10*time.Millisecond) {
		t.Fatalf("bad sizes: baseline %s, want 10ms a unit", st.Baseline)
	}
}

func TestAdaptiveRelearnsALastingSlowerProvider(t *testing.T) {
	a := newAdaptive(t, func(c *limit.AdaptiveConfig) { c.Max = 4; c.StaleWindows = 8 })
	drive(t, a, 500, flat(10*time.Millisecond))
	// The model became three times slower for good: down to Min, then the new floor is
	// learnt and the limit grows again.
	hi := 0
	lo := 4
	for range 10 {
		h, l := drive(t, a, 400, flat(30*time.Millisecond))
		hi, lo = max(hi, h), min(lo, l)
	}
	st := a.Stats()
	if lo != 1 || a.Limit() != 4 || st.Relearnt == 0 || !near(st.Baseline, 30*time.Millisecond) {
		t.Fatalf("lowest %d, limit %d, stats %+v; want a fall to 1, a relearnt 30ms baseline and Max again", lo, a.Limit(), st)
	}
}

func TestAdaptiveAcquireWaitsInOrderAndHonoursTheContext(t *testing.T) {
	a := newAdaptive(t, nil) // limit 1
	held, err := a.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancelled := make(chan error, 1)
	go func() {
		_, err := a.Acquire(ctx)
		cancelled <- err
	}()
	cancel()
	if err := <-cancelled; !errors.Is(err, context.Canceled) {
		t.Fatalf("a cancelled wait returned %v", err)
	}
	if _, err := a.Acquire(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("an ended context got a token: %v", err)
	}

	got := make(chan int, 2)
	first := make(chan struct{})
	for i := range 2 {
		go func() {
			if i == 1 {
				<-first // queue behind the first waiter
			}
			tok, err := a.Acquire(context.Background())
			if err != nil {
				t.Error(err)
				return
			}
			got <- i
			tok.Release(limit.Result{Ignore: true})
		}()
		if i == 0 {
			waitFor(t, func() bool { return waiting(a) == 1 })
			close(first)
		}
	}
	waitFor(t, func() bool { return waiting(a) == 2 })
	held.Release(limit.Result{Ignore: true})
	held.Release(limit.Result{Ignore: true}) // a second Release is ignored
	if a, b := <-got, <-got; a != 0 || b != 1 {
		t.Fatalf("served %d then %d, want arrival order", a, b)
	}
	waitFor(t, func() bool { return a.InFlight() == 0 })
}

// waiting is how many Acquire calls wait (exported for tests in export_test.go).
func waiting(a *limit.Adaptive) int { return limit.Waiting(a) }

// waitFor polls cond for up to 5 s: the goroutines it waits on are running, not sleeping.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached within 5s")
		}
		time.Sleep(time.Millisecond)
	}
}

func TestAdaptiveConfigRejectsBadValuesTogether(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(*limit.AdaptiveConfig)
		fields []string
	}{
		{"min above max", func(c *limit.AdaptiveConfig) { c.Min, c.Max, c.Initial = 8, 4, 4 }, []string{"Min"}},
		{"zeros", func(c *limit.AdaptiveConfig) { *c = limit.AdaptiveConfig{} },
			[]string{"Min", "Max", "Initial", "Tolerance", "Increase", "DropBackoff", "Window", "StaleWindows"}},
		{"negatives", func(c *limit.AdaptiveConfig) {
			c.Min, c.Max, c.Initial, c.Tolerance, c.Increase, c.DropBackoff, c.Window, c.StaleWindows = -1, -2, -3, -1, -1, -1, -1, -1
		}, []string{"Min", "Max", "Initial", "Tolerance", "Increase", "DropBackoff", "Window", "StaleWindows"}},
		{"initial outside", func(c *limit.AdaptiveConfig) { c.Initial = 17 }, []string{"Initial"}},
		{"not numbers", func(c *limit.AdaptiveConfig) {
			c.Tolerance, c.Increase, c.DropBackoff = math.NaN(), math.Inf(1), 1
		}, []string{"Tolerance", "Increase", "DropBackoff"}},
		{"tolerance of one", func(c *limit.AdaptiveConfig) { c.Tolerance = 1 }, []string{"Tolerance"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := limit.DefaultAdaptiveConfig(16)
			tc.mutate(&cfg)
			errs := cfg.Validate()
			var fields []string
			for _, err := range errs {
				var fe *limit.FieldError
				if !errors.As(err, &fe) {
					t.Fatalf("%v is not a *FieldError", err)
				}
				fields = append(fields, fe.Field)
			}
			if strings.Join(fields, ",") != strings.Join(tc.fields, ",") {
				t.Fatalf("bad fields %v, want %v (%v)", fields, tc.fields, errs)
			}
			if _, err := limit.NewAdaptive(cfg); err == nil || !strings.Contains(err.Error(), tc.fields[0]) {
				t.Fatalf("NewAdaptive: %v", err)
			}
		})
	}
	if errs := limit.DefaultAdaptiveConfig(1).Validate(); len(errs) != 0 {
		t.Fatalf("the default for a concurrency of 1 is bad: %v", errs)
	}
}

func TestNewAndParseMode(t *testing.T) {
	for in, want := range map[string]limit.Mode{"fixed": limit.ModeFixed, " Adaptive ": limit.ModeAdaptive} {
		if m, err := limit.ParseMode(in); err != nil || m != want {
			t.Errorf("ParseMode(%q) = %q, %v", in, m, err)
		}
	}
	if _, err := limit.ParseMode("vegas"); err == nil || !strings.Contains(err.Error(), "fixed or adaptive") {
		t.Errorf("ParseMode(vegas): %v", err)
	}
	l, err := limit.New(limit.ModeFixed, limit.DefaultAdaptiveConfig(5))
	if err != nil || l.Limit() != 5 {
		t.Fatalf("fixed: %v %v", l, err)
	}
	if _, err := limit.New(limit.ModeFixed, limit.AdaptiveConfig{}); err == nil {
		t.Fatal("a fixed limiter of 0 was built")
	}
	l, err = limit.New(limit.ModeAdaptive, limit.DefaultAdaptiveConfig(5))
	if _, ok := l.(*limit.Adaptive); err != nil || !ok || l.Limit() != 1 {
		t.Fatalf("adaptive: %T %v", l, err)
	}
	if _, err := limit.New("", limit.DefaultAdaptiveConfig(5)); err == nil {
		t.Fatal("an unknown mode built a limiter")
	}
}

func TestCallSize(t *testing.T) {
	for _, tc := range []struct {
		questions, state int
		want             float64
	}{{64, 1024, 128}, {1, 0, 1}, {8, 512, 12}, {0, -5, 1}, {4, 4096, 20}} {
		if got := limit.CallSize(tc.questions, tc.state); got != tc.want {
			t.Errorf("CallSize(%d, %d) = %g, want %g", tc.questions, tc.state, got, tc.want)
		}
	}
}
