package sink

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"time"

	"github.com/sys1hq/sys1/contract"
)

// deadLetterColumns is the INSERT column list of <db>.runs_dead_letter.
var deadLetterColumns = []string{
	"received_at", "kind", "runs_stream", "subject", "runs_seq", "deliveries", "error",
	"payload", "payload_sha256", "payload_bytes",
}

// Dead-letter kinds (the kind column).
const (
	deadRun           = "run"            // a run record the sink cannot store
	deadLabel         = "label"          // an accepted label the sink cannot store
	deadRejectedLabel = "rejected_label" // a submitted label the workers refused
)

// deadLetter is a message that can never become a row of runs or labels (or a label the
// workers refused).
type deadLetter struct {
	receivedAt   time.Time
	kind         string
	stream       string
	subject      string
	seq          uint64
	deliveries   uint64
	reason       string
	payload      string
	payloadSHA   string
	payloadBytes uint64

	from origin // for the deduplication token
}

func (d *deadLetter) values() []any {
	kind := d.kind
	if kind == "" {
		kind = deadRun
	}
	return []any{d.receivedAt, kind, d.stream, d.subject, d.seq, d.deliveries, d.reason, d.payload, d.payloadSHA, d.payloadBytes}
}

// newDeadLetter builds the dead-letter row of a message. The payload honours
// SYS1_RECORD_STATE: in hash and none modes, state and instructions are redacted from it when
// it parses as JSON, and it is left out (hash and size kept) when it does not, because a
// deployment that must not keep caller content must not keep it here either. The message stays
// readable in SYS1_RUNS by runs_seq for the stream's max age.
func newDeadLetter(data []byte, from origin, subject string, deliveries uint64, reason string, mode RecordState) *deadLetter {
	sum := sha256.Sum256(data)
	d := &deadLetter{
		receivedAt: time.Now().UTC(), stream: from.stream, subject: subject, seq: from.seq,
		deliveries: deliveries, reason: reason,
		payloadSHA: hex.EncodeToString(sum[:]), payloadBytes: uint64(len(data)), from: from,
	}
	if p, ok := redactPayload(data, mode); ok {
		d.payload = p
	} else {
		d.reason += " (payload not stored: it is not JSON that SYS1_RECORD_STATE=" + string(mode) + " can redact)"
	}
	return d
}

// redactPayload applies the record-state mode to an arbitrary (possibly malformed) record
// body. Key order is not preserved in redacted payloads; they are for diagnosis only. A
// payload whose record_state already says it is in that form (or a stricter one) is kept
// as it is; one made stricter here says so in its record_state, so a replay of it is never
// hashed again.
func redactPayload(data []byte, mode RecordState) (string, bool) {
	if mode == RecordFull {
		return string(data), true
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(data, &top); err != nil {
		return "", false
	}
	var have RecordState
	if raw, ok := top["record_state"]; ok {
		var s string
		if json.Unmarshal(raw, &s) == nil && contract.RecordState(s).Valid() {
			have = contract.RecordState(s)
		}
	}
	want := have.Stricter(mode)
	if want == have {
		return string(data), true
	}
	redactRaw := func(raw json.RawMessage, _ RecordState) json.RawMessage { return contract.RedactRaw(raw, have, want) }
	if raw, ok := top["request"]; ok && string(raw) != "null" {
		var req map[string]json.RawMessage
		if err := json.Unmarshal(raw, &req); err != nil {
			return "", false
		}
		if s, ok := req["state"]; ok {
			req["state"] = redactRaw(s, mode)
		}
		if qraw, ok := req["questions"]; ok && string(qraw) != "null" {
			var qs map[string]map[string]json.RawMessage
			if err := json.Unmarshal(qraw, &qs); err != nil {
				return "", false
			}
			for _, q := range qs {
				if in, ok := q["instructions"]; ok {
					q["instructions"] = redactRaw(in, mode)
				}
			}
			b, err := json.Marshal(qs)
			if err != nil {
				return "", false
			}
			req["questions"] = b
		}
		b, err := json.Marshal(req)
		if err != nil {
			return "", false
		}
		top["request"] = b
	}
	if _, ok := top["request"]; ok {
		top["record_state"], _ = json.Marshal(want)
	}
	b, err := json.Marshal(top)
	if err != nil {
		return "", false
	}
	return string(b), true
}
