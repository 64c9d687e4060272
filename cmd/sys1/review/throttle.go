package review

import (
	"sync"
	"time"
)

// throttle slows down password guessing: after freeFailures failed logins for a key (a user
// name, a client address) within failureMemory, each further attempt must wait twice as long
// as the one before (1 s, 2 s, 4 s, … up to maxLoginDelay) after the last failure. A waiting
// attempt is refused without checking its password, so guessing cannot go faster than the
// delays. It is per replica: several replicas multiply an attacker's rate by their count,
// which the exponential delay still bounds.
type throttle struct {
	mu      sync.Mutex
	entries map[string]*failures
	now     func() time.Time
}

type failures struct {
	n    int
	last time.Time
}

const (
	freeFailures   = 5
	failureMemory  = 15 * time.Minute
	maxLoginDelay  = 15 * time.Minute
	maxThrottleKey = 100_000 // bounds memory under a flood of distinct names or addresses
)

func newThrottle(now func() time.Time) *throttle {
	return &throttle{entries: map[string]*failures{}, now: now}
}

// wait is how long the caller must wait before an attempt for any of keys is considered.
func (t *throttle) wait(keys ...string) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	var longest time.Duration
	for _, k := range keys {
		f := t.entries[k]
		if f == nil || f.n < freeFailures {
			continue
		}
		if left := f.last.Add(delayAfter(f.n)).Sub(now); left > longest {
			longest = left
		}
	}
	return longest
}

// delayAfter is the wait after n failures (n ≥ freeFailures).
func delayAfter(n int) time.Duration {
	d := time.Second
	for i := freeFailures; i < n && d < maxLoginDelay; i++ {
		d *= 2
	}
	return min(d, maxLoginDelay)
}

// fail records a failed attempt for each key.
func (t *throttle) fail(keys ...string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	if len(t.entries) >= maxThrottleKey {
		t.sweep(now)
	}
	for _, k := range keys {
		f := t.entries[k]
		if f == nil || now.Sub(f.last) > failureMemory+maxLoginDelay {
			f = &failures{}
			if len(t.entries) >= maxThrottleKey {
				continue // full of live entries: the other key (the user's) still counts
			}
			t.entries[k] = f
		}
		f.n++
		f.last = now
	}
}

// succeed forgets key's failures (a user who finally typed the right password).
func (t *throttle) succeed(key string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.entries, key)
}

func (t *throttle) sweep(now time.Time) {
	for k, f := range t.entries {
		if now.Sub(f.last) > failureMemory+maxLoginDelay {
			delete(t.entries, k)
		}
	}
}
