package limit

import (
	"context"
	"math"
	"math/rand/v2"
	"sync"
	"time"
)

// Adaptive is a latency-based limiter of the Gradient family. It keeps a baseline, the
// lowest latency per unit of Result.Size of a window of calls, and once per window (Window
// to 2×Window−1 results, and at least the limit's worth) compares the window's latency per
// unit with it:
//
//   - Within Tolerance × baseline the provider is not queueing (much): the limit grows by
//     about Increase (a random 0.5–1.5×, so replicas started together drift apart), if the
//     window used it (a limiter whose calls never reach the limit has learnt
//     nothing about more).
//   - Beyond it the limit shrinks to limit × baseline ÷ latency, at most halving: the
//     gradient, so a long queue is shed fast and a short one gently.
//   - Half a window slower than Tolerance² × baseline shrinks it the same way without
//     waiting for the rest: at a low limit a window takes many round trips to fill, too
//     slow to catch a burst of queueing (several neighbours stepping up together).
//   - A drop (429/503, a timeout) multiplies it by DropBackoff at once.
//
// Additive increase with multiplicative decrease is what makes independent limiters that
// share one provider converge to equal shares (Chiu and Jain): they see the same queue, so
// they shrink together, and each grows by the same step. A decrease applies once per round:
// results of calls admitted before it describe the old limit and are left out of the next
// window, so one burst of slow calls cannot shrink the limit many times over.
//
// The baseline is a minimum that is never forgotten by age. A forgetting minimum is how
// latency limiters ratchet up: a queue held long enough becomes the new normal, the limiter
// tolerates more on top of it, and its neighbours, whose memory differs, are crowded out.
// The baseline is only replaced when congestion lasts StaleWindows windows while the limit
// is at Min, where this replica has shed all it can: the provider became slower for good,
// or other clients keep its queue full.
//
// Latency is divided by Result.Size, so a big request that takes proportionally longer does
// not read as congestion. Results marked Ignore (cancellations, refused requests) are not
// counted at all.
type Adaptive struct {
	cfg AdaptiveConfig

	mu       sync.Mutex
	limit    float64 // the estimate; the effective limit is its floor, within [Min, Max]
	inFlight int
	waiters  queue[*waiter] // FIFO, urgent first
	epoch    uint64         // bumped by every decrease
	window   window
	// baseline is the lowest window latency per unit of size (seconds); 0 until the first
	// window closes. stale counts the congested windows in a row at Min.
	baseline float64
	stale    int
	stats    AdaptiveStats
	// rng draws each window's length: replicas that share a provider see the same latency
	// and would otherwise decide in lockstep, all growing in the same round.
	rng *rand.Rand
}

type waiter struct {
	ready chan struct{}
	tok   *adaptiveToken // guarded by mu: set when a slot is handed over
}

// window accumulates the results of one evaluation round.
type window struct {
	want        int     // results that close it
	last        float64 // the latest result's latency per unit
	latency     float64 // seconds, summed
	size        float64 // summed
	n           int
	maxInFlight int
}

// AdaptiveStats is a snapshot for metrics and traces.
type AdaptiveStats struct {
	// Limit is the estimate before rounding down (Limiter.Limit is the effective limit).
	Limit float64
	// Baseline is the lowest latency per unit of size of a window, and Recent the last
	// window's; zero until the first window closes.
	Baseline, Recent time.Duration
	// Increases, Decreases and Drops count the adjustments and the drops seen; Relearnt
	// counts baselines replaced after congestion lasted at Min (see StaleWindows).
	Increases, Decreases, Drops, Relearnt int64
}

// NewAdaptive returns an adaptive limiter starting at cfg.Initial (default cfg.Min). A bad
// configuration returns an error naming every bad field (see AdaptiveConfig.Validate).
func NewAdaptive(cfg AdaptiveConfig) (*Adaptive, error) {
	if err := joinConfigErrors(cfg.Validate()); err != nil {
		return nil, err
	}
	seed := cfg.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	a := &Adaptive{cfg: cfg, limit: float64(cfg.Initial), rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
	a.newWindowLocked()
	a.stats.Limit = a.limit
	return a, nil
}

// Acquire implements Limiter. Waiters are served in arrival order.
func (a *Adaptive) Acquire(ctx context.Context) (Token, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	a.mu.Lock()
	if a.waiters.len() == 0 && a.inFlight < a.effective() {
		t := a.admitLocked()
		a.mu.Unlock()
		return t, nil
	}
	w := &waiter{ready: make(chan struct{})}
	a.waiters.push(w, isUrgent(ctx))
	a.mu.Unlock()

	select {
	case <-w.ready:
		return w.tok, nil
	case <-ctx.Done():
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if w.tok != nil {
		// The token came as ctx ended: give it back.
		a.inFlight--
		a.wakeLocked()
	} else {
		a.waiters.remove(func(x *waiter) bool { return x == w })
	}
	return nil, ctx.Err()
}

// admitLocked takes a slot. The token remembers the round it was admitted in.
func (a *Adaptive) admitLocked() *adaptiveToken {
	a.inFlight++
	a.window.maxInFlight = max(a.window.maxInFlight, a.inFlight)
	return &adaptiveToken{a: a, start: time.Now(), epoch: a.epoch}
}

// wakeLocked hands free slots to waiters, in order, the urgent first.
func (a *Adaptive) wakeLocked() {
	for a.inFlight < a.effective() {
		w, ok := a.waiters.pop()
		if !ok {
			return
		}
		w.tok = a.admitLocked()
		close(w.ready)
	}
}

// effective is the limit in force: the estimate rounded down, within [Min, Max].
func (a *Adaptive) effective() int {
	return min(max(int(a.limit), a.cfg.Min), a.cfg.Max)
}

// Limit implements Limiter.
func (a *Adaptive) Limit() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.effective()
}

// InFlight implements Limiter.
func (a *Adaptive) InFlight() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.inFlight
}

// Stats returns the limiter's state.
func (a *Adaptive) Stats() AdaptiveStats {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.stats
}

type adaptiveToken struct {
	a     *Adaptive
	start time.Time
	epoch uint64
	once  sync.Once
}

// Release implements Token. A second Release is ignored.
func (t *adaptiveToken) Release(r Result) {
	t.once.Do(func() {
		if r.Latency <= 0 && !r.Ignore && !r.Dropped {
			r.Latency = time.Since(t.start)
		}
		t.a.release(t.epoch, r)
	})
}

func (a *Adaptive) release(epoch uint64, r Result) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.inFlight--
	defer a.wakeLocked()
	switch {
	case r.Ignore:
		return
	case r.Dropped:
		a.stats.Drops++
		if epoch == a.epoch && a.limit > float64(a.cfg.Min) {
			a.decreaseLocked(a.cfg.DropBackoff)
		}
		return
	case epoch != a.epoch:
		return // admitted under a limit since decreased: says nothing about this one
	}
	size := r.Size
	if !(size >= 1) || math.IsInf(size, 0) {
		size = 1 // Size is at least 1 by contract; NaN and nonsense count as one unit
	}
	w := &a.window
	w.latency += r.Latency.Seconds()
	w.size += size
	w.n++
	w.last = r.Latency.Seconds() / size
	if w.n < max(w.want, a.effective()) {
		// Half a window far slower than the baseline shrinks the limit at once: at a low
		// limit a window takes many round trips to fill, too slow to catch a burst of
		// queueing (neighbours stepping up together). Half, because one call that waited
		// for a single slot is already twice as slow as the service itself.
		if perUnit := w.latency / w.size; a.baseline > 0 && 2*w.n >= a.cfg.Window &&
			perUnit > a.cfg.Tolerance*a.cfg.Tolerance*a.baseline && a.limit > float64(a.cfg.Min) {
			a.decreaseLocked(max(a.baseline/perUnit, 0.5))
		}
		return
	}
	a.closeWindowLocked()
}

// closeWindowLocked evaluates a full window.
func (a *Adaptive) closeWindowLocked() {
	w := a.window
	a.newWindowLocked()
	recent := w.latency / w.size
	a.stats.Recent = seconds(recent)
	if a.baseline == 0 || recent < a.baseline {
		a.baseline = recent
	}
	congested := recent > a.cfg.Tolerance*a.baseline
	if congested && a.effective() == a.cfg.Min {
		// Congested at the minimum, where this replica has shed all it can: others' load, or
		// a provider that became slower for good. Long enough, it is the new floor.
		if a.stale++; a.stale >= a.cfg.StaleWindows {
			a.baseline, a.stale, congested = recent, 0, false
			a.stats.Relearnt++
		}
	} else {
		a.stale = 0
	}
	a.stats.Baseline = seconds(a.baseline)
	gradient := a.baseline / recent
	if !congested {
		gradient = 1
	}
	switch {
	case gradient < 1:
		if a.limit > float64(a.cfg.Min) {
			a.decreaseLocked(max(gradient, 0.5))
		}
	case w.last > a.cfg.Tolerance*a.baseline:
		// The window was fine on average but its latest call already queued: a neighbour
		// has just stepped up. Growing now would have every replica step up together.
	case w.maxInFlight >= a.effective() && a.effective() < a.cfg.Max:
		// A step of 0.5 to 1.5 × Increase: replicas started together would otherwise reach
		// the next whole limit in the same round and all step up at once.
		a.limit = min(a.limit+a.cfg.Increase*(0.5+a.rng.Float64()), float64(a.cfg.Max))
		a.stats.Increases++
		a.stats.Limit = a.limit
	}
}

// decreaseLocked multiplies the limit by factor (< 1) and starts a new round.
func (a *Adaptive) decreaseLocked(factor float64) {
	a.limit = max(a.limit*factor, float64(a.cfg.Min))
	a.epoch++
	a.newWindowLocked()
	a.stats.Decreases++
	a.stats.Limit = a.limit
}

// newWindowLocked starts a round of Window to 2×Window−1 results.
func (a *Adaptive) newWindowLocked() {
	a.window = window{want: a.cfg.Window + a.rng.IntN(a.cfg.Window), maxInFlight: a.inFlight}
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

var _ Limiter = (*Adaptive)(nil)
