package worker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sys1hq/sys1/worker/auth"
	"github.com/sys1hq/sys1/worker/rungate"
	"github.com/sys1hq/sys1/worker/topology"
)

// The run-id gate: one JetStream KV entry per run id records which verified caller owns it,
// the provider attempts made so far (across deliveries and replicas) and, once the run has
// finished, its stored outcome. Every transition is a compare-and-set on the entry's revision,
// so two replicas can never both believe they own the same step.

// A gate entry's value and its statuses are rungate's, which sys1 batch status reads too.
const (
	runRunning = rungate.StatusRunning
	runDone    = rungate.StatusDone
)

type (
	runState      = rungate.State
	finishedState = rungate.Finished
)

type claimResult int

const (
	claimNew        claimResult = iota // first delivery of a fresh run id
	claimRedelivery                    // the same message again (retry or a dead replica's)
	claimBusy                          // the same message, while another delivery's lease on it lives
	claimFinished                      // already finished: answer from the stored outcome
	claimConflict                      // the id belongs to another caller
	claimDuplicate                     // same caller, another message, run still in flight
)

// gate wraps the KV bucket. Writes are compare-and-set on the bucket; reads go to the
// leader of its stream (get): a follower catching up after a restart would say a run does not
// exist, or is still running when it has finished (topology.LeaderGet says why).
type gate struct {
	kv gateBucket
	// read reads a key from the bucket's stream leader (topology.LeaderGet): value, revision,
	// and whether it exists.
	read func(ctx context.Context, key string) ([]byte, uint64, bool, error)
}

// gateBucket is the compare-and-set writes of the gate's bucket (jetstream.KeyValue).
type gateBucket interface {
	Create(ctx context.Context, key string, value []byte, opts ...jetstream.KVCreateOpt) (uint64, error)
	Update(ctx context.Context, key string, value []byte, revision uint64) (uint64, error)
}

// newGate is the gate over the KV bucket kv of the run-id gate, read from its leader.
func newGate(js jetstream.JetStream, kv jetstream.KeyValue, bucket string) gate {
	return gate{kv: kv, read: func(ctx context.Context, key string) ([]byte, uint64, bool, error) {
		return topology.LeaderGet(ctx, js, bucket, key)
	}}
}

// gateEntry is an entry read from the gate's leader.
type gateEntry struct {
	value    []byte
	revision uint64
}

// get reads key from the leader; jetstream.ErrKeyNotFound when it does not exist.
func (g gate) get(ctx context.Context, key string) (gateEntry, error) {
	value, rev, found, err := g.read(ctx, key)
	if err != nil {
		return gateEntry{}, err
	}
	if !found {
		return gateEntry{}, jetstream.ErrKeyNotFound
	}
	return gateEntry{value: value, revision: rev}, nil
}

// GateKey is a run id's key in the run-id gate (rungate.Key).
func GateKey(runID string) string { return rungate.Key(runID) }

// legacyGateKey is the key versions before grouped keys gave every run id (rungate.LegacyKey).
func legacyGateKey(runID string) string { return rungate.LegacyKey(runID) }

// claim records ownership of runID for the caller of id, or reports why it cannot (a run id
// belongs to the caller that first used it: auth.SameOwner).
func (g gate) claim(ctx context.Context, runID string, id auth.Identity, seq uint64, start time.Time, owner string, lease time.Duration) (claimResult, *runState, uint64, error) {
	now := time.Now()
	caller := id.Caller
	key := GateKey(runID)
	if strings.Contains(runID, ":") {
		// An entry written before grouped keys (see legacyGateKey) still governs its run until
		// it expires (SYS1_RUN_ID_TTL); one lookup keeps a run in flight across an upgrade from
		// being scored twice.
		switch _, err := g.get(ctx, legacyGateKey(runID)); {
		case err == nil:
			key = legacyGateKey(runID)
		case !errors.Is(err, jetstream.ErrKeyNotFound):
			return 0, nil, 0, fmt.Errorf("run-id gate: get legacy entry: %w", err)
		}
	}
	fresh := runState{Caller: caller, Status: runRunning, StreamSeq: seq, StartedAt: start, Key: key, Owner: owner, LeaseUntil: now.Add(lease)}
	val, err := fresh.Encode()
	if err != nil {
		return 0, nil, 0, fmt.Errorf("encode run state: %w", err)
	}
	for range 3 {
		rev, err := g.kv.Create(ctx, key, val)
		if err == nil {
			return claimNew, &fresh, rev, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			// The create's fate is unknown (a timeout in an election): if it landed, the entry
			// holds this delivery's lease, and it is this delivery's run.
			if e, gerr := g.get(ctx, key); gerr == nil && bytes.Equal(e.value, val) {
				return claimNew, &fresh, e.revision, nil
			}
			return 0, nil, 0, fmt.Errorf("run-id gate: create: %w", err)
		}
		entry, err := g.get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // expired or deleted between the two calls: try to create again
		}
		if err != nil {
			return 0, nil, 0, fmt.Errorf("run-id gate: get: %w", err)
		}
		var st runState
		if err := json.Unmarshal(entry.value, &st); err != nil {
			return 0, nil, 0, fmt.Errorf("run-id gate: decode entry: %w", err)
		}
		st.Key = key
		switch {
		case !auth.SameOwner(st.Caller, id):
			return claimConflict, &st, entry.revision, nil
		case st.Status == runDone:
			return claimFinished, &st, entry.revision, nil
		case st.StreamSeq == seq && st.Owner != "" && st.Owner != owner && now.Before(st.LeaseUntil):
			return claimBusy, &st, entry.revision, nil
		case st.StreamSeq == seq:
			return claimRedelivery, &st, entry.revision, nil
		default:
			return claimDuplicate, &st, entry.revision, nil
		}
	}
	return 0, nil, 0, errors.New("run-id gate: entry keeps disappearing")
}

// save writes st over revision rev and returns the new revision.
func (g gate) save(ctx context.Context, runID string, st *runState, rev uint64) (uint64, error) {
	val, err := st.Encode()
	if err != nil {
		return 0, fmt.Errorf("encode run state: %w", err)
	}
	key := st.Key
	if key == "" {
		key = GateKey(runID)
	}
	newRev, err := g.kv.Update(ctx, key, val, rev)
	// A revision conflict reads as ErrKeyExists on one server and as ErrKeyRevisionMismatch
	// on replicated buckets.
	if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		// The revision moved on. When an earlier try of this very write landed but its answer
		// was lost (a timeout during a leader election), the entry holds what we meant to
		// write: that is success, not a conflict.
		if entry, gerr := g.get(ctx, key); gerr == nil && bytes.Equal(entry.value, val) {
			return entry.revision, nil
		}
	}
	if err != nil {
		return 0, fmt.Errorf("run-id gate: update: %w", err)
	}
	return newRev, nil
}
