package contract

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strings"
	"testing"
)

// contentRequest has state and instructions of every shape: an object, a string, an array,
// and a question whose instructions were never set (a Go-built request).
func contentRequest(t testing.TB) *Request {
	req, err := DecodeRequest([]byte(`{"model":"nimble","state":{"secret":"customer text","n":1.50},"questions":{` +
		`"label":{"type":"choice","instructions":"Pick the private label","criteria":{"a":"A","b":null}},` +
		`"n":{"type":"noul","instructions":["private","list"]}}}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Questions = append(req.Questions, Question{Name: "bare", Type: TypeNoul})
	return req
}

func sha(raw string) string {
	sum := sha256.Sum256([]byte(raw))
	return `"` + hex.EncodeToString(sum[:]) + `"`
}

// TestRedactContentStoredForms: the exact stored form of each mode, and everything else kept.
func TestRedactContentStoredForms(t *testing.T) {
	req := contentRequest(t)
	before, _ := req.MarshalJSON()
	for _, tc := range []struct {
		mode                      RecordState
		state, label, n, bareWant string
	}{
		{RecordFull, `{"secret":"customer text","n":1.50}`, `"Pick the private label"`, `["private","list"]`, `null`},
		{RecordHash, sha(`{"secret":"customer text","n":1.50}`), sha(`"Pick the private label"`), sha(`["private","list"]`), `null`},
		{RecordNone, `null`, `null`, `null`, `null`},
	} {
		t.Run(string(tc.mode), func(t *testing.T) {
			out := RedactContent(req, tc.mode)
			if got := string(out.State); got != tc.state {
				t.Errorf("state = %s, want %s", got, tc.state)
			}
			for i, want := range []string{tc.label, tc.n} {
				if got := string(out.Questions[i].Instructions); got != want {
					t.Errorf("%s instructions = %s, want %s", out.Questions[i].Name, got, want)
				}
			}
			if got := string(appendRaw(nil, out.Questions[2].Instructions)); got != tc.bareWant {
				t.Errorf("unset instructions = %s, want %s", got, tc.bareWant)
			}
			if out.ContentState() != tc.mode {
				t.Errorf("ContentState = %s", out.ContentState())
			}
			// Everything else survives: model, names, types, criteria.
			b, _ := out.MarshalJSON()
			for _, keep := range []string{`"model":"nimble"`, `"label":{"type":"choice"`, `"criteria":{"a":"A","b":null}`, `"n":{"type":"noul"`} {
				if !bytes.Contains(b, []byte(keep)) {
					t.Errorf("stored request lost %s:\n%s", keep, b)
				}
			}
			if tc.mode != RecordFull && (bytes.Contains(b, []byte("customer text")) || bytes.Contains(b, []byte("private"))) {
				t.Errorf("content left in %s", b)
			}
		})
	}
	// The argument is never modified.
	if after, _ := req.MarshalJSON(); !bytes.Equal(before, after) || req.ContentState() != RecordFull {
		t.Fatalf("RedactContent modified its argument:\n%s\n%s", before, after)
	}
}

// TestRedactContentIsIdempotent: redacting again, with the same or any laxer mode, changes
// nothing; only a stricter mode does (hash → none), and a hash is never hashed.
func TestRedactContentIsIdempotent(t *testing.T) {
	req := contentRequest(t)
	hashed := RedactContent(req, RecordHash)
	for _, mode := range []RecordState{RecordHash, RecordFull, ""} {
		if again := RedactContent(hashed, mode); again != hashed {
			t.Errorf("RedactContent(hashed, %q) made a new request", mode)
		}
	}
	none := RedactContent(hashed, RecordNone)
	if string(none.State) != "null" || none.ContentState() != RecordNone {
		t.Errorf("hash → none: state %s, %s", none.State, none.ContentState())
	}
	if RedactContent(none, RecordHash) != none {
		t.Error("none → hash changed something")
	}
	if RedactContent(req, RecordFull) != req {
		t.Error("full on full content made a copy")
	}
	if RedactContent(nil, RecordHash) != nil {
		t.Error("nil request")
	}
}

// TestRecordRedactContent is what the worker applies where the record is made and the sink
// applies again: the record's record_state says what it holds, so the sink's second pass never
// hashes a hash, and the stricter of the two settings always wins.
func TestRecordRedactContent(t *testing.T) {
	rec := fullRecord(t)
	rec.RecordState = ""
	rec.Request = contentRequest(t)
	stateHash := sha(`{"secret":"customer text","n":1.50}`)

	worker := rec.RedactContent(RecordHash)
	if worker.RecordState != RecordHash || string(worker.Request.State) != stateHash {
		t.Fatalf("worker pass: %s %s", worker.RecordState, worker.Request.State)
	}
	// Through the wire, as the sink reads it.
	b, _ := json.Marshal(worker)
	read, err := DecodeRecord(b)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		sink      RecordState
		wantState RecordState
		state     string
	}{
		{RecordHash, RecordHash, stateHash}, // the same mode: unchanged, not a hash of the hash
		{RecordFull, RecordHash, stateHash}, // a laxer sink cannot restore content
		{RecordNone, RecordNone, `null`},    // a stricter sink wins
	} {
		out := read.RedactContent(tc.sink)
		if out.RecordState != tc.wantState || string(out.Request.State) != tc.state {
			t.Errorf("sink %s on a hash record: %s %s, want %s %s", tc.sink, out.RecordState, out.Request.State, tc.wantState, tc.state)
		}
	}
	// A record made before the worker applied the setting (record_state "") is redacted by
	// the sink as before.
	b, _ = json.Marshal(rec)
	read, err = DecodeRecord(b)
	if err != nil {
		t.Fatal(err)
	}
	if out := read.RedactContent(RecordHash); out.RecordState != RecordHash || string(out.Request.State) != stateHash {
		t.Errorf("sink on an unredacted record: %s %s", out.RecordState, out.Request.State)
	}
	// A request redacted in process and put in a record that does not say so: not hashed twice.
	marked := rec
	marked.Request = RedactContent(rec.Request, RecordHash)
	if out := marked.RedactContent(RecordHash); string(out.Request.State) != stateHash || out.RecordState != RecordHash {
		t.Errorf("unmarked record of a hashed request: %s %s", out.RecordState, out.Request.State)
	}
	// A record without a request still says what mode governs it, and the original is intact.
	bare := RunRecord{RunID: "x"}
	if out := bare.RedactContent(RecordNone); out.RecordState != RecordNone || out.Request != nil || bare.RecordState != "" {
		t.Errorf("bare record: %+v", out)
	}
	if string(rec.Request.State) != `{"secret":"customer text","n":1.50}` || rec.RecordState != "" {
		t.Error("RunRecord.RedactContent modified its receiver")
	}
}

func TestParseRecordState(t *testing.T) {
	for _, s := range []string{"full", "hash", "none"} {
		if m, err := ParseRecordState(s); err != nil || string(m) != s {
			t.Errorf("%s: %v", s, err)
		}
	}
	if _, err := ParseRecordState("HASH"); err == nil || !strings.Contains(err.Error(), "full, hash, none") {
		t.Errorf("HASH: %v", err)
	}
}
