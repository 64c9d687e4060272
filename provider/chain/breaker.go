package chain

import (
	"sync"
	"time"

	"github.com/sys1hq/sys1/contract"
)

// BreakerState is a circuit breaker's state, as health reports it.
type BreakerState string

// Breaker states.
const (
	// BreakerClosed: calls go through; consecutive failures are counted.
	BreakerClosed BreakerState = "closed"
	// BreakerOpen: the provider (or the route) is skipped until the cool-down has passed.
	BreakerOpen BreakerState = "open"
	// BreakerHalfOpen: the cool-down (or the absence) has passed; exactly one trial call decides.
	BreakerHalfOpen BreakerState = "half-open"
	// BreakerAbsent: routes only. The provider answered that it does not have the model (404);
	// the route is skipped until the absence has been remembered for Config.AbsenceTTL, then
	// one call asks again. An absence is not a failure: it says nothing of the provider's health.
	BreakerAbsent BreakerState = "absent"
)

// verdict is what one call says to a breaker.
type verdict int

const (
	// neutral: the call says nothing (cancelled, expired before an answer, a bug, or a
	// failure that belongs to the other level).
	neutral verdict = iota
	// healthy: the provider answered (a success, or a refusal of the request itself).
	healthy
	// failed: one failure, counted toward the breaker's threshold.
	failed
	// tripped: a failure that opens the circuit now (a provider whose routes fail across
	// several models: one more call per model would only prolong it).
	tripped
	// missing: the model is not there (404); routes only.
	missing
)

// breaker is one circuit breaker: a provider's, or one route's (a provider × model). Results
// are tagged with the generation they were admitted in, so a slow call admitted before the
// circuit opened cannot close it again (the half-open trial decides) and one admitted before
// a reset cannot count against the new state.
type breaker struct {
	threshold int
	cooldown  time.Duration
	absence   time.Duration // how long a missing model is remembered (routes)

	mu          sync.Mutex
	state       BreakerState
	held        BreakerState // while half-open: the state the trial may end (open or absent)
	generation  uint64
	consecutive int
	since       time.Time       // when it opened or the model was found missing
	trial       bool            // a half-open trial call is in flight
	last        *contract.Error // the last failure counted, or the 404; nil after an answer
}

func newBreaker(threshold int, cooldown, absence time.Duration) *breaker {
	return &breaker{threshold: threshold, cooldown: cooldown, absence: absence, state: BreakerClosed}
}

// admission is allow's answer.
type admission struct {
	ok         bool
	trial      bool   // this call is the half-open trial
	generation uint64 // pass back to record

	// When not ok: why (open or absent, also while another call is the trial), the time
	// left before the next trial (0 while a trial runs), the failures counted and the last.
	state     BreakerState
	reopensIn time.Duration
	failures  int
	last      *contract.Error
}

// allow decides whether a call may go through now. The clock is read only while the
// circuit is open or the model absent (a closed circuit, the common case, costs no clock read).
func (b *breaker) allow(clock Clock) admission {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case BreakerOpen, BreakerAbsent:
		if left := b.wait() - clock.Now().Sub(b.since); left > 0 {
			return b.refusal(b.state, left)
		}
		b.held = b.state
		b.state, b.trial = BreakerHalfOpen, true
		b.generation++
		return admission{ok: true, trial: true, generation: b.generation}
	case BreakerHalfOpen:
		if b.trial {
			return b.refusal(b.held, 0)
		}
		b.trial = true // the last trial said nothing: this call is the next one
		return admission{ok: true, trial: true, generation: b.generation}
	}
	return admission{ok: true, generation: b.generation}
}

// wait is how long the current open or absent state lasts before a trial. Call with mu held.
func (b *breaker) wait() time.Duration {
	if b.state == BreakerAbsent || b.state == BreakerHalfOpen && b.held == BreakerAbsent {
		return b.absence
	}
	return b.cooldown
}

func (b *breaker) refusal(why BreakerState, left time.Duration) admission {
	return admission{state: why, reopensIn: left, failures: b.consecutive, last: b.last}
}

// record takes a call's verdict (cause: the call's error, for failures and absences) and
// returns the state it moved to ("" when unchanged).
func (b *breaker) record(a admission, v verdict, cause *contract.Error, clock Clock) BreakerState {
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
		b.consecutive, b.last = 0, nil
		if b.state != BreakerClosed {
			b.state = BreakerClosed
			b.generation++
			return BreakerClosed
		}
	case failed, tripped:
		b.consecutive++
		b.last = cause
		if v == tripped || a.trial || b.state == BreakerClosed && b.consecutive >= b.threshold {
			return b.move(BreakerOpen, clock)
		}
	case missing:
		b.consecutive, b.last = 0, cause
		return b.move(BreakerAbsent, clock)
	}
	return ""
}

func (b *breaker) move(to BreakerState, clock Clock) BreakerState {
	b.state, b.since = to, clock.Now()
	b.generation++
	return to
}

// breakerSnapshot is a breaker's state for health.
type breakerSnapshot struct {
	state    BreakerState
	failures int
	last     *contract.Error
	// reopensAt is when an open circuit or an absence allows its next trial; zero otherwise.
	reopensAt time.Time
}

// snapshot is the state for health: an open circuit (or an absence) whose time has passed
// reads half-open (the next call is its trial).
func (b *breaker) snapshot(now time.Time) breakerSnapshot {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := breakerSnapshot{state: b.state, failures: b.consecutive, last: b.last}
	if b.state == BreakerOpen || b.state == BreakerAbsent {
		s.reopensAt = b.since.Add(b.wait())
		if !now.Before(s.reopensAt) {
			s.state, s.reopensAt = BreakerHalfOpen, time.Time{}
		}
	}
	return s
}

// closed reports whether the circuit is closed: forgetting it loses at most a count of
// failures below the threshold (a route table evicts these first).
func (b *breaker) closed() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.state == BreakerClosed
}

// isOpen reports whether a call would be refused now (open or absent, the time not passed).
func (b *breaker) isOpen(now time.Time) bool {
	s := b.snapshot(now)
	return s.state == BreakerOpen || s.state == BreakerAbsent
}
