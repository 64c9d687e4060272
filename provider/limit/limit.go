// Package limit bounds the calls in flight to one provider endpoint. A Limiter hands out
// tokens; each call holds one and, on release, says how it went, which an adaptive limiter
// uses to move its limit. The worker holds one Limiter per provider of its chain.
package limit

import (
	"context"
	"sync/atomic"
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

// Fixed is a Limiter with a constant limit: a semaphore.
type Fixed struct {
	slots    chan struct{}
	inFlight atomic.Int64
}

// NewFixed returns a limiter admitting n calls at once (n ≥ 1).
func NewFixed(n int) *Fixed {
	if n < 1 {
		n = 1
	}
	return &Fixed{slots: make(chan struct{}, n)}
}

// Acquire implements Limiter.
func (f *Fixed) Acquire(ctx context.Context) (Token, error) {
	select {
	case f.slots <- struct{}{}:
		f.inFlight.Add(1)
		return fixedToken{f}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Limit implements Limiter.
func (f *Fixed) Limit() int { return cap(f.slots) }

// InFlight implements Limiter.
func (f *Fixed) InFlight() int { return int(f.inFlight.Load()) }

type fixedToken struct{ f *Fixed }

func (t fixedToken) Release(Result) {
	t.f.inFlight.Add(-1)
	<-t.f.slots
}
