// Package rungatetest is the run-id gate's bucket in memory, for tests of the gate and of
// what uses it (the worker's pipeline, the hold releaser) without a NATS server.
package rungatetest

import (
	"context"
	"encoding/json"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sys1hq/sys1/worker/rungate"
)

// Bucket is a KV bucket in memory, compare-and-set on revisions like JetStream's.
type Bucket struct {
	// OnWrite, when set, is told of every write that landed: "create" or "update", the key,
	// and the entry's status.
	OnWrite func(op, key, status string)

	mu      sync.Mutex
	rev     uint64
	entries map[string]entry
	// loseCreate makes the next Create land but report a timeout.
	loseCreate bool
}

type entry struct {
	value []byte
	rev   uint64
}

// New is an empty bucket.
func New() *Bucket { return &Bucket{entries: map[string]entry{}} }

// Gate is a gate over b.
func (b *Bucket) Gate() rungate.Gate { return rungate.New(b, b.Read) }

// LoseNextCreate makes the next Create land but report a timeout: an answer lost in a
// leader election.
func (b *Bucket) LoseNextCreate() {
	b.mu.Lock()
	b.loseCreate = true
	b.mu.Unlock()
}

// Create stores key unless it exists (jetstream.ErrKeyExists).
func (b *Bucket) Create(_ context.Context, key string, value []byte, _ ...jetstream.KVCreateOpt) (uint64, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.entries[key]; ok {
		return 0, jetstream.ErrKeyExists
	}
	b.rev++
	b.entries[key] = entry{value, b.rev}
	b.wrote("create", key, value)
	if b.loseCreate {
		b.loseCreate = false
		return 0, context.DeadlineExceeded
	}
	return b.rev, nil
}

// Update stores key if its revision is still last (jetstream.ErrKeyRevisionMismatch).
func (b *Bucket) Update(_ context.Context, key string, value []byte, last uint64) (uint64, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if e, ok := b.entries[key]; !ok || e.rev != last {
		return 0, jetstream.ErrKeyRevisionMismatch
	}
	b.rev++
	b.entries[key] = entry{value, b.rev}
	b.wrote("update", key, value)
	return b.rev, nil
}

// Read is the gate's ReadFunc over b.
func (b *Bucket) Read(_ context.Context, key string) ([]byte, uint64, bool, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	e, ok := b.entries[key]
	return e.value, e.rev, ok, nil
}

// State is the stored entry of runID, and whether there is one.
func (b *Bucket) State(runID string) (rungate.State, bool, error) {
	value, _, ok, _ := b.Read(context.Background(), rungate.Key(runID))
	var st rungate.State
	if !ok {
		return st, false, nil
	}
	err := json.Unmarshal(value, &st)
	return st, true, err
}

func (b *Bucket) wrote(op, key string, value []byte) {
	if b.OnWrite == nil {
		return
	}
	var st rungate.State
	_ = json.Unmarshal(value, &st)
	b.OnWrite(op, key, st.Status)
}
