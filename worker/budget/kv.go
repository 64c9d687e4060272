package budget

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// errContention: every compare-and-set attempt lost to another replica.
var errContention = errors.New("budget: compare-and-set lost to other replicas too often")

// keyState is this replica's view of one counter key: a lock that makes its own operations
// on the key take turns, and the last revision and value it read or wrote there. The cached
// revision only saves a read; a stale one is caught by the compare-and-set and re-read.
type keyState struct {
	lock  chan struct{}
	known bool   // rev and val are what the key held at some point
	rev   uint64 // 0 with known: the key did not exist
	val   []byte
	used  time.Time // last use, for pruning
}

// maxKeyStates bounds the cached key states; past it, states unused for an hour go.
const maxKeyStates = 4096

func (b *Budget) state(key string) *keyState {
	b.mu.Lock()
	defer b.mu.Unlock()
	st := b.keys[key]
	if st == nil {
		if len(b.keys) >= maxKeyStates {
			cutoff := time.Now().Add(-time.Hour)
			for k, s := range b.keys {
				if s.used.Before(cutoff) && len(s.lock) == 0 {
					delete(b.keys, k)
				}
			}
		}
		st = &keyState{lock: make(chan struct{}, 1)}
		b.keys[key] = st
	}
	st.used = time.Now()
	return st
}

// update runs one read-modify-write of key under compare-and-set. fn gets the current value
// (nil when the key does not exist) and returns the value to write, or nil to write nothing
// (a refusal decided on the current value, which needs no write). fn may run several times,
// once per attempt; only the last run's effects count.
func (b *Budget) update(ctx context.Context, key string, fn func(cur []byte) ([]byte, error)) error {
	b.stats.ops.Add(1)
	st := b.state(key)
	select {
	case st.lock <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-st.lock }()
	for attempt := range b.maxAttempts {
		b.stats.attempts.Add(1)
		fresh := false
		if !st.known {
			entry, err := b.kv.Get(ctx, key)
			switch {
			case err == nil:
				st.rev, st.val = entry.Revision(), entry.Value()
			case errors.Is(err, jetstream.ErrKeyNotFound):
				st.rev, st.val = 0, nil
			default:
				return fmt.Errorf("read %s: %w", key, err)
			}
			st.known, fresh = true, true
		}
		next, err := fn(st.val)
		if err != nil {
			return err
		}
		if next == nil {
			if !fresh && attempt+1 < b.maxAttempts {
				// A refusal is decided on what the key holds now, not on what this replica
				// last saw: another may have released or refunded since.
				st.known = false
				continue
			}
			return nil
		}
		var rev uint64
		if st.rev == 0 {
			// Create, not Update at revision 0: Create also writes over the marker a key
			// leaves when it expires.
			rev, err = b.kv.Create(ctx, key, next)
		} else {
			rev, err = b.kv.Update(ctx, key, next, st.rev)
		}
		if err == nil {
			st.rev, st.val = rev, next
			return nil
		}
		st.known = false
		if !errors.Is(err, jetstream.ErrKeyRevisionMismatch) && !errors.Is(err, jetstream.ErrKeyExists) {
			// Not a lost race: the write's fate is unknown (see the package comment).
			return fmt.Errorf("write %s: %w", key, err)
		}
		b.stats.conflicts.Add(1)
		if err := sleep(ctx, backoff(attempt)); err != nil {
			return err
		}
	}
	b.stats.exhausted.Add(1)
	return errContention
}

// backoff is the pause after the n-th lost compare-and-set (from 0): growing from 250µs to
// 16ms, jittered over its upper half so replicas that collided do not collide again in step.
func backoff(n int) time.Duration {
	d := 250 * time.Microsecond << min(n, 6)
	return d/2 + rand.N(d/2+1)
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Stats counts this replica's compare-and-set work since New.
type Stats struct {
	Operations int64 // read-modify-writes (admissions, settlements, releases, refreshes)
	Attempts   int64 // compare-and-set attempts among them
	Conflicts  int64 // attempts lost to another replica's write
	Exhausted  int64 // operations that gave up after Config.MaxAttempts
}

// Stats reports the contention seen so far.
func (b *Budget) Stats() Stats {
	return Stats{
		Operations: b.stats.ops.Load(), Attempts: b.stats.attempts.Load(),
		Conflicts: b.stats.conflicts.Load(), Exhausted: b.stats.exhausted.Load(),
	}
}
