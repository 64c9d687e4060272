package budget

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// errContention: every compare-and-set attempt lost to another replica.
var errContention = errors.New("budget: compare-and-set lost to other replicas too often")

// How this replica writes one counter key: its operations on the key queue up, and one of
// them at a time (the leader) takes everything queued as a batch, applies the operations in
// order to the key's value and writes the result in ONE compare-and-set. Sixteen admissions
// waiting on one replica cost one write, not sixteen racing ones; only replicas race each
// other, and a replica that loses a race retries its whole batch on the fresh value. When the
// leader's own operation is done it hands the lead to the first one still queued, so no
// caller serves others forever.

// keyState is this replica's view of one counter key.
type keyState struct {
	mu      sync.Mutex
	pending []*op
	busy    bool      // a leader is running
	used    time.Time // last use, for pruning

	// The last revision and value this replica read or wrote (only the leader touches
	// them). They save a read: a stale revision is caught by the compare-and-set.
	known bool   // rev and val are what the key held at some point
	rev   uint64 // 0 with known: the key did not exist
	val   []byte
}

// op is one read-modify-write waiting for, or in, a batch.
type op struct {
	fn       func(cur []byte) ([]byte, error)
	attempts int
	err      error
	finished bool          // err is final (guarded by keyState.mu once queued)
	chosen   bool          // handed the lead (guarded by keyState.mu)
	done     chan struct{} // closed when finished
	lead     chan struct{} // receives the lead
}

// maxKeyStates bounds the cached key states; past it, idle states unused for an hour go.
const maxKeyStates = 4096

func (b *Budget) state(key string) *keyState {
	b.mu.Lock()
	defer b.mu.Unlock()
	st := b.keys[key]
	if st == nil {
		if len(b.keys) >= maxKeyStates {
			cutoff := time.Now().Add(-time.Hour)
			for k, s := range b.keys {
				s.mu.Lock()
				idle := !s.busy && len(s.pending) == 0 && s.used.Before(cutoff)
				s.mu.Unlock()
				if idle {
					delete(b.keys, k)
				}
			}
		}
		st = &keyState{}
		b.keys[key] = st
	}
	st.mu.Lock()
	st.used = time.Now()
	st.mu.Unlock()
	return st
}

// mustLand multiplies the attempts of the writes that correct or free what an admission took
// (Settle, Release, lease extensions): an admission that loses too often is only delayed,
// but a lost correction leaves the counter wrong, so those try harder before giving up.
const mustLand = 4

// batchTimeout bounds one batch's round trips. A batch outlives the context of the operation
// that leads it (the others in it are not that caller's), but not a NATS outage.
const batchTimeout = 5 * time.Second

// update runs one read-modify-write of key under compare-and-set, in at most attempts tries
// (of its batch). fn gets the current value (nil when the key does not exist) and returns the
// value to write, or nil to change nothing (a refusal decided on the current value). fn may
// run several times, once per attempt, and must keep its results only from the last run.
// Once its batch has started, update waits for the outcome even if ctx ends: the write may
// land, and the caller must know whether it did.
func (b *Budget) update(ctx context.Context, key string, attempts int, fn func(cur []byte) ([]byte, error)) error {
	b.stats.ops.Add(1)
	st := b.state(key)
	o := &op{fn: fn, attempts: attempts, done: make(chan struct{}), lead: make(chan struct{}, 1)}
	st.mu.Lock()
	st.pending = append(st.pending, o)
	leader := !st.busy
	st.busy = true
	st.mu.Unlock()
	if !leader {
		select {
		case <-o.done:
			return o.err
		case <-o.lead:
		case <-ctx.Done():
			st.mu.Lock()
			if i := slices.Index(st.pending, o); i >= 0 && !o.chosen {
				st.pending = slices.Delete(st.pending, i, i+1)
				st.mu.Unlock()
				return ctx.Err()
			}
			st.mu.Unlock()
			select { // in a batch already, or handed the lead: see it through
			case <-o.done:
				return o.err
			case <-o.lead:
			}
		}
	}
	b.lead(ctx, key, st, o)
	return o.err
}

// lead runs batches on st until o is finished, then hands the lead on.
func (b *Budget) lead(ctx context.Context, key string, st *keyState, o *op) {
	bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), batchTimeout)
	defer cancel()
	for {
		st.mu.Lock()
		if o.finished {
			if len(st.pending) > 0 {
				next := st.pending[0]
				next.chosen = true
				next.lead <- struct{}{}
			} else {
				st.busy = false
			}
			st.mu.Unlock()
			return
		}
		batch := st.pending
		st.pending = nil
		st.mu.Unlock()
		b.commit(bctx, key, st, batch)
	}
}

// commit applies a batch in order and writes the result with compare-and-set.
func (b *Budget) commit(ctx context.Context, key string, st *keyState, batch []*op) {
	b.stats.batches.Add(1)
	attempts := 0
	for _, o := range batch {
		attempts = max(attempts, o.attempts)
	}
	finish := func(err error) {
		st.mu.Lock()
		for _, o := range batch {
			if o.err == nil {
				o.err = err
			}
			o.finished = true
			close(o.done)
		}
		st.mu.Unlock()
	}
	for attempt := range attempts {
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
				finish(fmt.Errorf("read %s: %w", key, err))
				return
			}
			st.known, fresh = true, true
		}
		val, changed, refused := st.val, false, false
		for _, o := range batch {
			next, err := o.fn(val)
			o.err = err
			switch {
			case err != nil:
			case next == nil:
				refused = true
			default:
				val, changed = next, true
			}
		}
		if refused && !fresh && attempt+1 < attempts {
			// A refusal is decided on what the key holds now, not on what this replica last
			// saw: another may have released or refunded since.
			st.known = false
			continue
		}
		if !changed {
			finish(nil)
			return
		}
		var rev uint64
		var err error
		if st.rev == 0 {
			// Create, not Update at revision 0: Create also writes over the marker a key
			// leaves when it expires.
			rev, err = b.kv.Create(ctx, key, val)
		} else {
			rev, err = b.kv.Update(ctx, key, val, st.rev)
		}
		if err == nil {
			st.rev, st.val = rev, val
			finish(nil)
			return
		}
		st.known = false
		if !errors.Is(err, jetstream.ErrKeyRevisionMismatch) && !errors.Is(err, jetstream.ErrKeyExists) {
			// Not a lost race: the write's fate is unknown (see the package comment).
			clearErrs(batch)
			finish(fmt.Errorf("write %s: %w", key, err))
			return
		}
		b.stats.conflicts.Add(1)
		if err := sleep(ctx, backoff(attempt)); err != nil {
			clearErrs(batch)
			finish(err)
			return
		}
	}
	b.stats.exhausted.Add(1)
	clearErrs(batch)
	finish(errContention)
}

// clearErrs drops the errors the operations' last run gave, before a batch-wide error.
func clearErrs(batch []*op) {
	for _, o := range batch {
		o.err = nil
	}
}

// backoff is the pause after the n-th lost compare-and-set (from 0): growing from 100µs to
// 3.2ms (a round trip is tens of µs, so a longer pause only idles the loser while the others
// write on), jittered over its upper half so replicas that collided do not collide again in
// step.
func backoff(n int) time.Duration {
	d := 100 * time.Microsecond << min(n, 5)
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
	Batches    int64 // batches they were written in (one compare-and-set each, if it wins)
	Attempts   int64 // compare-and-set attempts of the batches
	Conflicts  int64 // attempts lost to another replica's write
	Exhausted  int64 // batches that gave up after their attempts
}

// Stats reports the contention seen so far.
func (b *Budget) Stats() Stats {
	return Stats{
		Operations: b.stats.ops.Load(), Batches: b.stats.batches.Load(), Attempts: b.stats.attempts.Load(),
		Conflicts: b.stats.conflicts.Load(), Exhausted: b.stats.exhausted.Load(),
	}
}
