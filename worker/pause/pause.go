// Package pause is the fleet's pause switch (sys1 pause, sys1 resume): one entry per lane in
// the KV bucket sys1-fleet (topology.Config.FleetBucket), which every replica follows. While a
// lane's entry says paused, no replica takes new work from it: runs in flight finish, what is
// queued waits in the stream.
//
// The switch is a bucket entry rather than JetStream's consumer pause because a lane is read
// through a consumer per flow (worker/fair), and flows come and go: a pause must cover the
// flows of callers that have not arrived yet. Replicas watch the bucket, so a pause takes
// effect everywhere within milliseconds, and re-read it every status interval in case a watch
// is slow to recover from a NATS failover.
package pause

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sys1hq/sys1/worker/topology"
)

// Lanes a pause applies to: interactive requests and batch requests. (Label submissions are
// never paused: checking a label calls no model.)
var Lanes = []topology.Lane{topology.LaneInteractive, topology.LaneBatch}

// UntilResumed is how far ahead a pause without an end is set: far enough that only sys1
// resume ends it.
const UntilResumed = 100 * 365 * 24 * time.Hour

// State is one lane's pause.
type State struct {
	// Until is when the pause ends by itself; a pause until resumed has Until UntilResumed
	// after At.
	Until time.Time `json:"until"`
	// Reason is the operator's (sys1 pause --reason), at most 512 bytes.
	Reason string `json:"reason,omitempty"`
	// At is when the pause was set.
	At time.Time `json:"at"`
}

// Active reports whether the pause holds at now.
func (s State) Active(now time.Time) bool { return now.Before(s.Until) }

// Open reports whether the pause lasts until sys1 resume (no end was given).
func (s State) Open() bool { return s.Until.Sub(s.At) > UntilResumed/2 }

// Key is a lane's entry in the fleet bucket.
func Key(l topology.Lane) string { return "pause." + string(l) }

// Set pauses a lane until s.Until.
func Set(ctx context.Context, kv jetstream.KeyValue, l topology.Lane, s State) error {
	b, err := json.Marshal(s)
	if err != nil {
		return fmt.Errorf("pause %s: %w", l, err)
	}
	if _, err := kv.Put(ctx, Key(l), b); err != nil {
		return fmt.Errorf("pause %s: %w", l, err)
	}
	return nil
}

// Clear ends a lane's pause (nothing to do when it is not paused).
func Clear(ctx context.Context, kv jetstream.KeyValue, l topology.Lane) error {
	if err := kv.Delete(ctx, Key(l)); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("resume %s: %w", l, err)
	}
	return nil
}

// Read returns every lane's pause that is active now.
func Read(ctx context.Context, kv jetstream.KeyValue) (map[topology.Lane]State, error) {
	out := map[topology.Lane]State{}
	now := time.Now()
	for _, l := range Lanes {
		e, err := kv.Get(ctx, Key(l))
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read the pause of %s: %w", l, err)
		}
		s, err := decode(e.Value())
		if err != nil {
			return nil, fmt.Errorf("the pause of %s: %w", l, err)
		}
		if s.Active(now) {
			out[l] = s
		}
	}
	return out, nil
}

func decode(b []byte) (State, error) {
	var s State
	if err := json.Unmarshal(b, &s); err != nil {
		return State{}, fmt.Errorf("not a pause entry: %w", err)
	}
	if s.Until.IsZero() {
		return State{}, errors.New("not a pause entry: no until")
	}
	return s, nil
}

// Follower keeps every lane's pause as the bucket says it, for a replica's pull loop and
// health. Its zero value is not paused; Follow fills it.
type Follower struct {
	mu      sync.Mutex
	states  map[topology.Lane]State
	changed chan struct{}
	// watching: the watch has delivered the current entries and is running, so a full read
	// (Replace) can only be older than what it says.
	watching atomic.Bool
	// done is closed once Follow's watch has ended for good (its context ended).
	done chan struct{}
}

// Done is closed once the follower has stopped following (the context given to Follow
// ended); before Follow it is nil.
func (f *Follower) Done() <-chan struct{} { return f.done }

// Watching reports whether the watch is up (so a full read is not needed).
func (f *Follower) Watching() bool { return f.watching.Load() }

// NewFollower returns a follower that knows of no pause yet.
func NewFollower() *Follower {
	return &Follower{states: map[topology.Lane]State{}, changed: make(chan struct{}, 1)}
}

// Paused is a lane's pause when it holds now.
func (f *Follower) Paused(l topology.Lane) (State, bool) {
	f.mu.Lock()
	s, ok := f.states[l]
	f.mu.Unlock()
	return s, ok && s.Active(time.Now())
}

// Changed is signalled after any lane's pause changed (set, cleared, or found again).
func (f *Follower) Changed() <-chan struct{} { return f.changed }

func (f *Follower) set(l topology.Lane, s State, ok bool) {
	f.mu.Lock()
	old, had := f.states[l]
	if ok {
		f.states[l] = s
	} else {
		delete(f.states, l)
	}
	f.mu.Unlock()
	if had != ok || old != s {
		select {
		case f.changed <- struct{}{}:
		default:
		}
	}
}

// Replace sets every lane's pause to what states says (a full read of the bucket).
func (f *Follower) Replace(states map[topology.Lane]State) {
	for _, l := range Lanes {
		s, ok := states[l]
		f.set(l, s, ok)
	}
}

// Follow watches the bucket until ctx ends, applying each change as it comes. It returns
// once the watch has delivered the current entries (or could not start), and goes on in the
// background; a watch that fails is started again after a second.
func (f *Follower) Follow(ctx context.Context, kv jetstream.KeyValue, onError func(error)) {
	ready := make(chan struct{})
	var once sync.Once
	f.done = make(chan struct{})
	go func() {
		defer close(f.done)
		for ctx.Err() == nil {
			err := f.watch(ctx, kv, func() {
				f.watching.Store(true)
				once.Do(func() { close(ready) })
			})
			f.watching.Store(false)
			once.Do(func() { close(ready) })
			if ctx.Err() != nil {
				return
			}
			if err != nil && onError != nil {
				onError(err)
			}
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}()
	select {
	case <-ready:
	case <-ctx.Done():
	}
}

func (f *Follower) watch(ctx context.Context, kv jetstream.KeyValue, caughtUp func()) error {
	w, err := kv.Watch(ctx, "pause.*")
	if err != nil {
		return fmt.Errorf("watch the fleet's pause: %w", err)
	}
	defer func() { _ = w.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-w.Updates():
			if !ok {
				return errors.New("watch the fleet's pause: the watch ended")
			}
			if e == nil {
				caughtUp()
				continue
			}
			l := topology.Lane(e.Key()[len("pause."):])
			if e.Operation() != jetstream.KeyValuePut {
				f.set(l, State{}, false)
				continue
			}
			s, err := decode(e.Value())
			f.set(l, s, err == nil)
		}
	}
}
