// Package limit bounds the calls in flight to one provider endpoint. A Limiter hands out
// tokens; each call holds one and, on release, says how it went, which an adaptive limiter
// uses to move its limit. The worker holds one Limiter per provider of its chain.
package limit

import (
	"context"
	"sync"
	"time"
)

// Limiter bounds concurrent calls.
type Limiter interface {
	// Acquire waits for a free slot, or returns ctx's error when it ends first.
	Acquire(ctx context.Context) (Token, error)
	// Limit is the current limit (fixed, or the adaptive limiter's estimate).
	Limit() int
	// InFlight is how many tokens are held now.
	InFlight() int
}

// Token is one held slot. Release it exactly once.
type Token interface {
	Release(Result)
}

// Result is how one call went, for an adaptive limiter.
type Result struct {
	// Latency is the call's duration (the limiter may measure its own).
	Latency time.Duration
	// Size is the call's work in arbitrary units (e.g. questions × state KiB), at least 1:
	// latency is normalised by it, so big requests do not look like congestion.
	Size float64
	// Dropped marks overload: the provider said busy (429/503) or the call timed out.
	Dropped bool
	// Ignore marks a call that says nothing about load (cancelled, refused as invalid).
	Ignore bool
}

// Fixed is a Limiter with a constant limit: a semaphore whose waiters are served in arrival
// order, urgent ones (see Urgent) first.
type Fixed struct {
	n int

	mu       sync.Mutex
	inFlight int
	waiters  queue[chan struct{}]
}

// NewFixed returns a limiter admitting n calls at once (n ≥ 1).
func NewFixed(n int) *Fixed {
	if n < 1 {
		n = 1
	}
	return &Fixed{n: n}
}

// Acquire implements Limiter.
func (f *Fixed) Acquire(ctx context.Context) (Token, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	f.mu.Lock()
	if f.waiters.len() == 0 && f.inFlight < f.n {
		f.inFlight++
		f.mu.Unlock()
		return fixedToken{f}, nil
	}
	ready := make(chan struct{})
	f.waiters.push(ready, isUrgent(ctx))
	f.mu.Unlock()
	select {
	case <-ready:
		return fixedToken{f}, nil
	case <-ctx.Done():
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	select {
	case <-ready:
		// The slot came as ctx ended: hand it on.
		f.inFlight--
		f.wakeLocked()
	default:
		f.waiters.remove(func(c chan struct{}) bool { return c == ready })
	}
	return nil, ctx.Err()
}

// wakeLocked hands free slots to waiters.
func (f *Fixed) wakeLocked() {
	for f.inFlight < f.n {
		w, ok := f.waiters.pop()
		if !ok {
			return
		}
		f.inFlight++
		close(w)
	}
}

// Limit implements Limiter.
func (f *Fixed) Limit() int { return f.n }

// InFlight implements Limiter.
func (f *Fixed) InFlight() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.inFlight
}

type fixedToken struct{ f *Fixed }

func (t fixedToken) Release(Result) {
	t.f.mu.Lock()
	defer t.f.mu.Unlock()
	t.f.inFlight--
	t.f.wakeLocked()
}
