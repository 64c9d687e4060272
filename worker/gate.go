package worker

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/worker/auth"
	"github.com/sys1hq/sys1/worker/topology"
)

// The run-id gate: one JetStream KV entry per run id records which verified caller owns it,
// the provider attempts made so far (across deliveries and replicas) and, once the run has
// finished, its stored outcome. Every transition is a compare-and-set on the entry's revision,
// so two replicas can never both believe they own the same step.

const (
	runRunning = "running"
	runDone    = "done"
)

// runState is the value of a gate entry.
type runState struct {
	Caller    string             `json:"caller"`
	Status    string             `json:"status"`
	StreamSeq uint64             `json:"stream_seq"`
	StartedAt time.Time          `json:"started_at"`
	Attempts  []contract.Attempt `json:"attempts,omitempty"`
	// Waits counts the deliveries that waited for the caller's limits (a rate limit's window,
	// an in-flight slot) instead of running: they do not count against SYS1_MAX_DELIVER.
	Waits int `json:"waits,omitempty"`
	// Owner is the delivery running the run now (a token of its own) and LeaseUntil how long
	// the run is its: JetStream can hand the same message to a second replica while the first
	// still runs it (a consumer's leader dies before the delivery was replicated, and the new
	// leader delivers it again at once), and without a lease both would call the model. A
	// delivery that finds another's live lease waits; one that finds it lapsed (its replica
	// died) takes the run over. Released (emptied) when a delivery ends without finishing.
	Owner      string    `json:"owner,omitempty"`
	LeaseUntil time.Time `json:"lease_until,omitzero"`
	// Outcome of a finished run: what a replay needs, and nothing more. The exact reply bytes
	// answer any later delivery of the run id; the record is written again only when the
	// run's own message comes back (a crash between finishing and acking), and is rebuilt
	// then from that message's request and Finished — the gate never holds the request.
	ReplyTo  string          `json:"reply_to,omitempty"`
	Reply    json.RawMessage `json:"reply,omitempty"`
	Subject  string          `json:"record_subject,omitempty"`
	Finished *finishedState  `json:"finished,omitempty"`
	// Held lists the questions a person must label before the reply is sent (review: hold);
	// until then replays answer nothing.
	Held []string `json:"held,omitempty"`
	// Record is the whole record as entries written before Finished held it; read, never written.
	Record json.RawMessage `json:"record,omitempty"`

	// key is the gate entry's key (GateKey, or a legacy key), set by claim; not stored.
	key string
}

// finishedState is what a finished run's record says beyond its reply.
type finishedState struct {
	At          time.Time `json:"at"`
	Deliveries  int       `json:"deliveries"`
	CallerKind  string    `json:"caller_kind"`
	Roles       []string  `json:"roles,omitempty"`
	Scopes      []string  `json:"scopes,omitempty"`
	Provider    string    `json:"provider"`
	Worker      string    `json:"worker"`
	Version     string    `json:"version"`
	OmitRequest bool      `json:"omit_request,omitempty"` // the record was too large with it
	CostUSD     *float64  `json:"cost_usd,omitempty"`
	CacheHit    bool      `json:"cache_hit,omitempty"`
}

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
	kv     jetstream.KeyValue
	js     jetstream.JetStream
	bucket string
}

// gateEntry is an entry read from the gate's leader.
type gateEntry struct {
	value    []byte
	revision uint64
}

// get reads key from the leader; jetstream.ErrKeyNotFound when it does not exist.
func (g gate) get(ctx context.Context, key string) (gateEntry, error) {
	value, rev, found, err := topology.LeaderGet(ctx, g.js, g.bucket, key)
	if err != nil {
		return gateEntry{}, err
	}
	if !found {
		return gateEntry{}, jetstream.ErrKeyNotFound
	}
	return gateEntry{value: value, revision: rev}, nil
}

// GateKey maps a run id to its KV key in the run-id gate. Run ids may hold ':' (not a valid
// key character) and derived ids hold '~', so ids are hex-encoded: injective and always valid.
// An id with a ':' is a group and an item ("<batch id>:<item id>"): its key puts a '.' between
// the two, so GateGroupFilter can list one group's runs (a batch's) without reading the whole
// bucket. Hex has no '.', so keys of ids without ':' never contain one, and the first ':' is
// where the '.' goes: the mapping stays injective. An empty item is "-" (not hex), because a
// KV key may not end in '.'.
func GateKey(runID string) string {
	group, item, grouped := strings.Cut(runID, ":")
	if !grouped {
		return "r" + hex.EncodeToString([]byte(runID))
	}
	if item == "" {
		return "r" + hex.EncodeToString([]byte(group)) + ".-"
	}
	return "r" + hex.EncodeToString([]byte(group)) + "." + hex.EncodeToString([]byte(item))
}

// GateGroupFilter is the KV key filter (for ListKeysFiltered or WatchFiltered) matching every
// run id "<group>:<item>" of one group, e.g. a batch's items.
func GateGroupFilter(group string) string {
	return "r" + hex.EncodeToString([]byte(group)) + ".*"
}

// legacyGateKey is the key versions before grouped keys gave every run id, ':' or not. A run
// id with a ':' that arrived before an upgrade may still be in its legacy entry (see claim).
func legacyGateKey(runID string) string { return "r" + hex.EncodeToString([]byte(runID)) }

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
	fresh := runState{Caller: caller, Status: runRunning, StreamSeq: seq, StartedAt: start, key: key, Owner: owner, LeaseUntil: now.Add(lease)}
	val, err := fresh.encode()
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
		st.key = key
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
	val, err := st.encode()
	if err != nil {
		return 0, fmt.Errorf("encode run state: %w", err)
	}
	key := st.key
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

// encode is json.Marshal(st) without its cost on the hot path: the stored reply (most of the
// entry's bytes) is spliced in as it is instead of being re-scanned and
// re-compacted as json.RawMessage, and the small fields skip reflection. The JSON decodes to
// the same runState (json.Unmarshal reads it back).
func (st *runState) encode() ([]byte, error) {
	b := make([]byte, 0, 384+160*len(st.Attempts)+len(st.Reply))
	b = append(b, `{"caller":`...)
	b = contract.AppendJSONString(b, st.Caller)
	b = append(b, `,"status":`...)
	b = contract.AppendJSONString(b, st.Status)
	b = append(b, `,"stream_seq":`...)
	b = strconv.AppendUint(b, st.StreamSeq, 10)
	b = append(b, `,"started_at":`...)
	ts, err := st.StartedAt.MarshalJSON()
	if err != nil {
		return nil, err
	}
	b = append(b, ts...)
	if st.Waits > 0 {
		b = append(b, `,"waits":`...)
		b = strconv.AppendInt(b, int64(st.Waits), 10)
	}
	if st.Owner != "" {
		b = append(b, `,"owner":`...)
		b = contract.AppendJSONString(b, st.Owner)
		lu, err := st.LeaseUntil.MarshalJSON()
		if err != nil {
			return nil, err
		}
		b = append(b, `,"lease_until":`...)
		b = append(b, lu...)
	}
	if len(st.Attempts) > 0 {
		as, err := json.Marshal(st.Attempts)
		if err != nil {
			return nil, err
		}
		b = append(b, `,"attempts":`...)
		b = append(b, as...)
	}
	if st.ReplyTo != "" {
		b = append(b, `,"reply_to":`...)
		b = contract.AppendJSONString(b, st.ReplyTo)
	}
	// Reply is JSON this worker encoded (or read back from an entry it wrote).
	if len(st.Reply) > 0 {
		b = append(b, `,"reply":`...)
		b = append(b, st.Reply...)
	}
	if st.Subject != "" {
		b = append(b, `,"record_subject":`...)
		b = contract.AppendJSONString(b, st.Subject)
	}
	if len(st.Held) > 0 {
		h, err := json.Marshal(st.Held)
		if err != nil {
			return nil, err
		}
		b = append(b, `,"held":`...)
		b = append(b, h...)
	}
	if st.Finished != nil {
		f, err := json.Marshal(st.Finished)
		if err != nil {
			return nil, err
		}
		b = append(b, `,"finished":`...)
		b = append(b, f...)
	}
	return append(b, '}'), nil
}

// messageGone reports whether the request message at seq has left the request stream (acked,
// terminated, or aged out), which a gate entry still marked running can outlive.
func (w *Worker) messageGone(ctx context.Context, seq uint64) (bool, error) {
	_, err := w.requests.GetMsg(ctx, seq)
	switch {
	case err == nil:
		return false, nil
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return true, nil
	default:
		return false, fmt.Errorf("look up request %d: %w", seq, err)
	}
}
