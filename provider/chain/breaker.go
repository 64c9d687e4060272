package chain

import (
	"sync"
	"time"
)

// BreakerState is a circuit breaker's state, as health reports it.
type BreakerState string

// Breaker states.
const (
	// BreakerClosed: calls go through; consecutive provider failures are counted.
	BreakerClosed BreakerState = "closed"
	// BreakerOpen: the provider is skipped until the cool-down has passed.
	BreakerOpen BreakerState = "open"
	// BreakerHalfOpen: the cool-down has passed; exactly one trial call decides.
	BreakerHalfOpen BreakerState = "half-open"
)

// verdict is what one call says about a provider's health.
type verdict int

const (
	// neutral: the call says nothing (cancelled, expired before an answer).
	neutral verdict = iota
	// healthy: the provider answered (a success, or a refusal of the request itself).
	healthy
	// failed: a transient provider failure or a configuration fault.
	failed
)

// breaker is one link's circuit breaker. Results are tagged with the generation they were
// admitted in, so a slow call admitted before the circuit opened cannot close it again (the
// half-open trial decides) and one admitted before a reset cannot count against the new state.
type breaker struct {
	threshold int
	cooldown  time.Duration

	mu          sync.Mutex
	state       BreakerState
	generation  uint64
	consecutive int
	openedAt    time.Time
	trial       bool // a half-open trial call is in flight
}

func newBreaker(threshold int, cooldown time.Duration) *breaker {
	return &breaker{threshold: threshold, cooldown: cooldown, state: BreakerClosed}
}

// admission is allow's answer.
type admission struct {
	ok         bool
	trial      bool          // this call is the half-open trial
	generation uint64        // pass back to record
	reopensIn  time.Duration // when not ok: time left in the cool-down (0 while a trial runs)
}

// allow decides whether a call may go to the provider now. The clock is read only while the
// circuit is open (a closed circuit, the common case, costs no clock read).
func (b *breaker) allow(clock Clock) admission {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case BreakerOpen:
		if left := b.cooldown - clock.Now().Sub(b.openedAt); left > 0 {
			return admission{reopensIn: left}
		}
		b.state, b.trial = BreakerHalfOpen, true
		b.generation++
		return admission{ok: true, trial: true, generation: b.generation}
	case BreakerHalfOpen:
		if b.trial {
			return admission{}
		}
		b.trial = true // the last trial said nothing: this call is the next one
		return admission{ok: true, trial: true, generation: b.generation}
	}
	return admission{ok: true, generation: b.generation}
}

// record takes a call's verdict and returns the state it moved to ("" when unchanged).
func (b *breaker) record(a admission, v verdict, clock Clock) BreakerState {
	b.mu.Lock()
	defer b.mu.Unlock()
	if a.generation != b.generation {
		return "" // admitted under an earlier state: says nothing about this one
	}
	if a.trial {
		b.trial = false
	}
	switch v {
	case healthy:
		b.consecutive = 0
		if b.state != BreakerClosed {
			b.state = BreakerClosed
			b.generation++
			return BreakerClosed
		}
	case failed:
		b.consecutive++
		if a.trial || b.state == BreakerClosed && b.consecutive >= b.threshold {
			b.state, b.openedAt = BreakerOpen, clock.Now()
			b.generation++
			return BreakerOpen
		}
	}
	return ""
}

// snapshot is the state for health: an open circuit whose cool-down has passed reads
// half-open (the next call is its trial).
func (b *breaker) snapshot(now time.Time) (BreakerState, int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state == BreakerOpen && now.Sub(b.openedAt) >= b.cooldown {
		return BreakerHalfOpen, b.consecutive
	}
	return b.state, b.consecutive
}
