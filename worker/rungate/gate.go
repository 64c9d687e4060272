package rungate

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// The gate: one JetStream KV entry per run id records which verified caller owns it, the
// provider attempts made so far (across deliveries and replicas) and, once the run has
// finished, its stored outcome. Every transition is a compare-and-set on the entry's revision,
// so two replicas can never both believe they own the same step. Writes go to the bucket;
// reads go to the leader of its stream (Read): a follower catching up after a restart would
// say a run does not exist, or is still running when it has finished.

// Bucket is the compare-and-set writes of the gate's bucket (jetstream.KeyValue has them).
type Bucket interface {
	Create(ctx context.Context, key string, value []byte, opts ...jetstream.KVCreateOpt) (uint64, error)
	Update(ctx context.Context, key string, value []byte, revision uint64) (uint64, error)
}

// ReadFunc reads key from the bucket's stream leader: its value, its revision, and whether it
// exists (the worker's is topology.LeaderGet).
type ReadFunc func(ctx context.Context, key string) (value []byte, revision uint64, found bool, err error)

// Gate is the run-id gate over one bucket.
type Gate struct {
	kv   Bucket
	read ReadFunc
}

// New is the gate over kv, read through read.
func New(kv Bucket, read ReadFunc) Gate { return Gate{kv: kv, read: read} }

// Entry is an entry read from the leader.
type Entry struct {
	Value    []byte
	Revision uint64
}

// Get reads key from the leader; jetstream.ErrKeyNotFound when it does not exist.
func (g Gate) Get(ctx context.Context, key string) (Entry, error) {
	value, rev, found, err := g.read(ctx, key)
	if err != nil {
		return Entry{}, err
	}
	if !found {
		return Entry{}, jetstream.ErrKeyNotFound
	}
	return Entry{Value: value, Revision: rev}, nil
}

// Claim is what claiming a run id found.
type Claim int

const (
	ClaimNew        Claim = iota // first delivery of a fresh run id
	ClaimRedelivery              // the same message again (retry or a dead replica's)
	ClaimBusy                    // the same message, while another delivery's lease on it lives
	ClaimFinished                // already finished: answer from the stored outcome
	ClaimConflict                // the id belongs to another caller
	ClaimDuplicate               // same caller, another message, run still in flight
)

// Claimant is a delivery claiming a run id.
type Claimant struct {
	RunID string
	// Caller is the verified caller, stored as the run's owner of a fresh entry; Owns says
	// whether it owns a run stored with owner (a run id belongs to the caller that first
	// used it: auth.SameOwner).
	Caller string
	Owns   func(owner string) bool
	// StreamSeq is the delivery's message, Start when the delivery began.
	StreamSeq uint64
	Start     time.Time
	// Lease is the delivery's token, held for LeaseFor unless renewed.
	Lease    string
	LeaseFor time.Duration
}

// Claim records ownership of c.RunID for c, or reports why it cannot, with the entry and its
// revision.
func (g Gate) Claim(ctx context.Context, c Claimant) (Claim, *State, uint64, error) {
	now := time.Now()
	key := Key(c.RunID)
	if strings.Contains(c.RunID, ":") {
		// An entry written before grouped keys (see LegacyKey) still governs its run until it
		// expires (SYS1_RUN_ID_TTL); one lookup keeps a run in flight across an upgrade from
		// being scored twice.
		switch _, err := g.Get(ctx, LegacyKey(c.RunID)); {
		case err == nil:
			key = LegacyKey(c.RunID)
		case !errors.Is(err, jetstream.ErrKeyNotFound):
			return 0, nil, 0, fmt.Errorf("run-id gate: get legacy entry: %w", err)
		}
	}
	fresh := State{Caller: c.Caller, Status: StatusRunning, StreamSeq: c.StreamSeq, StartedAt: c.Start, Key: key, Owner: c.Lease, LeaseUntil: now.Add(c.LeaseFor)}
	val, err := fresh.Encode()
	if err != nil {
		return 0, nil, 0, fmt.Errorf("encode run state: %w", err)
	}
	for range 3 {
		rev, err := g.kv.Create(ctx, key, val)
		if err == nil {
			return ClaimNew, &fresh, rev, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			// The create's fate is unknown (a timeout in an election): if it landed, the entry
			// holds this delivery's lease, and it is this delivery's run.
			if e, gerr := g.Get(ctx, key); gerr == nil && bytes.Equal(e.Value, val) {
				return ClaimNew, &fresh, e.Revision, nil
			}
			return 0, nil, 0, fmt.Errorf("run-id gate: create: %w", err)
		}
		entry, err := g.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // expired or deleted between the two calls: try to create again
		}
		if err != nil {
			return 0, nil, 0, fmt.Errorf("run-id gate: get: %w", err)
		}
		var st State
		if err := json.Unmarshal(entry.Value, &st); err != nil {
			return 0, nil, 0, fmt.Errorf("run-id gate: decode entry: %w", err)
		}
		st.Key = key
		switch {
		case !c.Owns(st.Caller):
			return ClaimConflict, &st, entry.Revision, nil
		case st.Status == StatusDone:
			return ClaimFinished, &st, entry.Revision, nil
		case st.StreamSeq == c.StreamSeq && st.Owner != "" && st.Owner != c.Lease && now.Before(st.LeaseUntil):
			return ClaimBusy, &st, entry.Revision, nil
		case st.StreamSeq == c.StreamSeq:
			return ClaimRedelivery, &st, entry.Revision, nil
		default:
			return ClaimDuplicate, &st, entry.Revision, nil
		}
	}
	return 0, nil, 0, errors.New("run-id gate: entry keeps disappearing")
}

// Save writes st over revision rev and returns the new revision. A revision conflict is
// jetstream.ErrKeyExists or jetstream.ErrKeyRevisionMismatch (wrapped), as the server says.
func (g Gate) Save(ctx context.Context, runID string, st *State, rev uint64) (uint64, error) {
	val, err := st.Encode()
	if err != nil {
		return 0, fmt.Errorf("encode run state: %w", err)
	}
	key := st.Key
	if key == "" {
		key = Key(runID)
	}
	newRev, err := g.kv.Update(ctx, key, val, rev)
	// A revision conflict reads as ErrKeyExists on one server and as ErrKeyRevisionMismatch
	// on replicated buckets.
	if IsConflict(err) {
		// The revision moved on. When an earlier try of this very write landed but its answer
		// was lost (a timeout during a leader election), the entry holds what we meant to
		// write: that is success, not a conflict.
		if entry, gerr := g.Get(ctx, key); gerr == nil && bytes.Equal(entry.Value, val) {
			return entry.Revision, nil
		}
	}
	if err != nil {
		return 0, fmt.Errorf("run-id gate: update: %w", err)
	}
	return newRev, nil
}

// IsConflict reports whether err is a compare-and-set that found the revision moved on.
func IsConflict(err error) bool {
	return errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch)
}

// ErrUnreadable marks a gate entry that is not a run state: no retry can fix it.
var ErrUnreadable = errors.New("run-id gate entry does not decode")

// Lookup reads the entry of runID, and its revision; nil when the gate holds none (never run,
// or forgotten after SYS1_RUN_ID_TTL). An id with a ':' may still live under its legacy key
// (see Claim), which then governs it.
func (g Gate) Lookup(ctx context.Context, runID string) (*State, uint64, error) {
	keys := []string{Key(runID)}
	if strings.Contains(runID, ":") {
		keys = []string{LegacyKey(runID), Key(runID)}
	}
	for _, key := range keys {
		e, err := g.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return nil, 0, fmt.Errorf("run-id gate: get: %w", err)
		}
		var st State
		if err := json.Unmarshal(e.Value, &st); err != nil {
			return nil, 0, fmt.Errorf("%w: %w", ErrUnreadable, err)
		}
		st.Key = key
		return &st, e.Revision, nil
	}
	return nil, 0, nil
}

// KeepManifest stores m unless another caller owns the batch's manifest (kept false).
func (g Gate) KeepManifest(ctx context.Context, m Manifest) (kept bool, err error) {
	key := ManifestKey(m.BatchID)
	val, _ := json.Marshal(m)
	for range 3 {
		if _, err := g.kv.Create(ctx, key, val); err == nil {
			return true, nil
		} else if !errors.Is(err, jetstream.ErrKeyExists) {
			return false, fmt.Errorf("batch manifest: create: %w", err)
		}
		e, err := g.Get(ctx, key) // from the leader: a follower catching up may not have it
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // expired or deleted between the two calls
		}
		if err != nil {
			return false, fmt.Errorf("batch manifest: get: %w", err)
		}
		var old Manifest
		if json.Unmarshal(e.Value, &old) == nil && old.Caller != m.Caller {
			return false, nil
		}
		if _, err := g.kv.Update(ctx, key, val, e.Revision); err == nil {
			return true, nil
		} else if !IsConflict(err) {
			return false, fmt.Errorf("batch manifest: update: %w", err)
		}
	}
	return false, errors.New("batch manifest: the entry keeps changing")
}
