// Package rungate is the run-id gate: the KV bucket sys1-runs, one entry per run id, saying
// which verified caller owns the run, its attempts so far and, once finished, its stored
// outcome. It holds the entries' format (State), the keys runs and batch manifests live under,
// and Gate, whose compare-and-set transitions (Claim, Save, Lookup, KeepManifest) the worker
// runs on them. sys1 batch status reads the same entries; both name them from here, so
// neither re-declares the other's format.
package rungate

import (
	"encoding/hex"
	"encoding/json"
	"strconv"
	"strings"
	"time"

	"github.com/sys1hq/sys1/contract"
)

// Statuses of a gate entry.
const (
	StatusRunning = "running"
	StatusDone    = "done"
)

// State is the value of a gate entry.
type State struct {
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
	Finished *Finished       `json:"finished,omitempty"`
	// Held lists the questions a person must label before the reply is sent (review: hold);
	// until then replays answer nothing.
	Held []string `json:"held,omitempty"`
	// Answer is the model's answer of a run not finished yet, kept before the answer's first
	// effect outside the gate (its review message): a delivery that dies after queueing the
	// review leaves the answer the review shows, and the next delivery of the message finishes
	// the run with it instead of asking the model again — whose new answer, or failure, would
	// leave a review item (and a held reply) for an answer the run never gave.
	Answer *Answer `json:"answer,omitempty"`
	// Record is the whole record as entries written before Finished held it; read, never written.
	Record json.RawMessage `json:"record,omitempty"`

	// Key is the gate entry's key (Key, or a legacy key), set when it is read; not stored.
	Key string `json:"-"`
}

// Answer is a run's answer in hand: the validated response and who gave it with what model.
type Answer struct {
	Response json.RawMessage `json:"response"`
	Provider string          `json:"provider"`
	Model    string          `json:"model"`
	At       time.Time       `json:"at"`
}

// Finished is what a finished run's record says beyond its reply.
type Finished struct {
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

// Encode is json.Marshal(st) without its cost on the hot path: the stored reply (most of the
// entry's bytes) is spliced in as it is instead of being re-scanned and
// re-compacted as json.RawMessage, and the small fields skip reflection. The JSON decodes to
// the same State (json.Unmarshal reads it back).
func (st *State) Encode() ([]byte, error) {
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
	if st.Answer != nil {
		a, err := json.Marshal(st.Answer)
		if err != nil {
			return nil, err
		}
		b = append(b, `,"answer":`...)
		b = append(b, a...)
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

// Key maps a run id to its KV key in the run-id gate. Run ids may hold ':' (not a valid key
// character) and derived ids hold '~', so ids are hex-encoded: injective and always valid. An
// id with a ':' is a group and an item ("<batch id>:<item id>"): its key puts a '.' between
// the two, so GroupFilter can list one group's runs (a batch's) without reading the whole
// bucket. Hex has no '.', so keys of ids without ':' never contain one, and the first ':' is
// where the '.' goes: the mapping stays injective. An empty item is "-" (not hex), because a
// KV key may not end in '.'.
func Key(runID string) string {
	group, item, grouped := strings.Cut(runID, ":")
	if !grouped {
		return "r" + hex.EncodeToString([]byte(runID))
	}
	if item == "" {
		return "r" + hex.EncodeToString([]byte(group)) + ".-"
	}
	return "r" + hex.EncodeToString([]byte(group)) + "." + hex.EncodeToString([]byte(item))
}

// GroupFilter is the KV key filter (for ListKeysFiltered or WatchFiltered) matching every run
// id "<group>:<item>" of one group, e.g. a batch's items.
func GroupFilter(group string) string {
	return "r" + hex.EncodeToString([]byte(group)) + ".*"
}

// LegacyKey is the key versions before grouped keys gave every run id, ':' or not. A run id
// with a ':' that arrived before an upgrade may still be in its legacy entry.
func LegacyKey(runID string) string { return "r" + hex.EncodeToString([]byte(runID)) }

// Manifest is what a batch run says about its input: published by sys1 batch run before its
// items, kept by a worker under ManifestKey for the caller that first named the batch id.
type Manifest struct {
	BatchID string `json:"batch_id"`
	// Caller is the verified caller that sent it (set by the worker).
	Caller string `json:"caller,omitempty"`
	// Items is the input's item count (non-blank lines or rows); Invalid the items that
	// failed the contract check and were never sent.
	Items   int `json:"items"`
	Invalid int `json:"invalid"`
	// UpdatedAt is when the worker stored it.
	UpdatedAt time.Time `json:"updated_at"`
}

// ManifestKey is a batch manifest's key in the run-id gate bucket (run keys start with "r",
// so the two never meet).
func ManifestKey(batchID string) string { return "batch-manifest." + batchID }
