package contract

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
)

// RecordState is what is kept of the caller's content — the request's state and every
// question's instructions — wherever a run is stored (SYS1_RECORD_STATE): the run record on
// SYS1_RUNS, the run-id gate's stored outcome and ClickHouse.
//
// The stored forms, exactly:
//
//   - full: state and instructions byte for byte as the caller sent them.
//   - hash: each replaced by a JSON string holding the lowercase hex SHA-256 of its JSON bytes
//     exactly as sent ({"state":"9f86d081…"}): runs with the same state stay comparable, and
//     nothing of the content is kept. An instructions value that was never set stays null.
//   - none: each replaced by JSON null.
//
// The rest of the request (model, question names, types, criteria, images as their hashes)
// is kept in every mode. The modes only ever get stricter (full → hash → none): applying a
// mode to content already in a stricter form changes nothing, so content is never hashed
// twice and never restored.
type RecordState string

// The SYS1_RECORD_STATE modes.
const (
	RecordFull RecordState = "full"
	RecordHash RecordState = "hash"
	RecordNone RecordState = "none"
)

// Valid reports whether m is one of full, hash and none.
func (m RecordState) Valid() bool { return m == RecordFull || m == RecordHash || m == RecordNone }

// rank orders the modes by strictness; "" (not applied yet) is full.
func (m RecordState) rank() int {
	switch m {
	case RecordHash:
		return 1
	case RecordNone:
		return 2
	}
	return 0
}

// Stricter returns the stricter of m and other ("" counts as full).
func (m RecordState) Stricter(other RecordState) RecordState {
	a, b := m.normal(), other.normal()
	if b.rank() > a.rank() {
		return b
	}
	return a
}

// normal maps "" and unknown values to full: content whose form nobody recorded is taken as
// sent (the strictest reading for the caller's privacy is to redact it again).
func (m RecordState) normal() RecordState {
	if m.Valid() {
		return m
	}
	return RecordFull
}

// ContentState is the form the request's state and instructions are in: full unless
// RedactContent produced it, or WithContentState said otherwise (a request read back from a
// record whose record_state names its form).
func (r *Request) ContentState() RecordState { return r.contentState.normal() }

// WithContentState returns a shallow copy of r marked as holding its state and instructions
// in form m (what a record's record_state says about the request it carries), so that
// RedactContent takes it from there. r is not modified.
func (r *Request) WithContentState(m RecordState) *Request {
	if r == nil {
		return nil
	}
	out := *r
	out.contentState = m.normal()
	return &out
}

// RedactContent returns req with its state and every question's instructions in the stored
// form of mode (see RecordState), never modifying req; when nothing changes it returns req
// itself. The result's ContentState is the stricter of req's and mode, so calling it again,
// with the same or a laxer mode, returns its argument unchanged: a hash is never hashed.
func RedactContent(req *Request, mode RecordState) *Request {
	if req == nil {
		return nil
	}
	have := req.ContentState()
	want := have.Stricter(mode)
	if want == have {
		return req
	}
	out := *req
	out.contentState = want
	out.State = RedactRaw(req.State, have, want)
	out.Questions = make([]Question, len(req.Questions))
	for i, q := range req.Questions {
		q.Instructions = RedactRaw(q.Instructions, have, want)
		out.Questions[i] = q
	}
	return &out
}

// RedactRaw converts one content value (state or instructions) from the stored form have to
// the stored form want (see RecordState). Only stricter forms are produced: a want laxer than
// have returns raw unchanged. An empty raw value (never set) becomes null under hash and none.
func RedactRaw(raw json.RawMessage, have, want RecordState) json.RawMessage {
	have, want = have.normal(), want.normal()
	if want.rank() <= have.rank() {
		return raw
	}
	if want == RecordHash && len(raw) > 0 {
		sum := sha256.Sum256(raw)
		b := make([]byte, 0, 2+2*sha256.Size)
		b = append(b, '"')
		b = hex.AppendEncode(b, sum[:])
		return append(b, '"')
	}
	return json.RawMessage("null")
}

// RedactContent returns a shallow copy of the record whose request holds state and
// instructions in the stricter of the record's RecordState and mode, with RecordState set to
// that form. It is what the worker applies where the record is made, and what the sink
// applies again on the way into ClickHouse: a record already in that form (or a stricter one)
// passes through unchanged. r is not modified.
func (r *RunRecord) RedactContent(mode RecordState) *RunRecord {
	out := *r
	have := r.RecordState.normal()
	if r.Request != nil {
		// The record's word or the request's own mark, whichever is stricter: a request
		// redacted in this process but put in a record that does not say so is still never
		// hashed twice.
		have = have.Stricter(r.Request.ContentState())
		out.Request = RedactContent(r.Request.WithContentState(have), mode)
	}
	out.RecordState = have.Stricter(mode)
	return &out
}

// ParseRecordState reads a SYS1_RECORD_STATE value.
func ParseRecordState(s string) (RecordState, error) {
	m := RecordState(s)
	if !m.Valid() {
		return "", fmt.Errorf("%q is not one of full, hash, none", s)
	}
	return m, nil
}
