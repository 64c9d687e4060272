package contract

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"
	"time"
)

// allFieldsSet fails when a struct field holds its zero value, so a field added to Reply or
// RunRecord must be added to the test values below, which then checks the fast encoder.
func allFieldsSet(t *testing.T, v any) {
	t.Helper()
	rv := reflect.ValueOf(v)
	for i := 0; i < rv.NumField(); i++ {
		if rv.Field(i).IsZero() {
			t.Errorf("%s.%s is not set in the test value", rv.Type().Name(), rv.Type().Field(i).Name)
		}
	}
}

// TestEnvelopeEncodersMatchReflection: the hand-written encoders produce byte for byte what
// encoding/json produces from the struct tags (lists normalized to arrays).
func TestEnvelopeEncodersMatchReflection(t *testing.T) {
	now := time.Date(2026, 11, 29, 23, 0, 0, 123456000, time.UTC)
	req := fullRequest(t)
	red := Redact(req)
	reply := Reply{RunID: "r1", Status: StatusFailed, Result: fullResult(), Error: Errorf(CodeTimeout, "slow \"provider\"\n"),
		Attempts: fullAttempts(), QueuedMS: 3, LatencyMS: 44}
	allFieldsSet(t, reply)
	rec := RunRecord{
		SchemaVersion: RecordSchemaVersion, RunID: "r1", Caller: "svc", CallerKind: CallerKindJWT,
		Roles: []string{"decider"}, Scopes: []string{"sys1:decide", "x"}, Subject: "sys1.decide.svc",
		StreamSeq: 1 << 40, Deliveries: 2, PublishedAt: now, StartedAt: now.Add(time.Millisecond), FinishedAt: now.Add(time.Second),
		QueuedMS: 1, LatencyMS: 1000, Status: StatusFailed, ErrorCode: CodeUpstreamError, ErrorStatus: 502, ErrorMessage: "[SYS1_UPSTREAM_ERROR] é",
		Provider: "ollama", Model: "nimble", RequestedModel: "nimble", Request: red, Images: red.ImageRefs(),
		Result: fullResult(), Attempts: fullAttempts(), ReplyTo: "sys1.replies.svc", Worker: "w1", Version: "v1",
	}
	allFieldsSet(t, rec)

	type plainReply Reply
	type plainRecord RunRecord
	cases := []struct {
		name      string
		fast      func() ([]byte, error)
		reflected any
	}{
		{"reply", reply.MarshalJSON, plainReply(reply)},
		{"empty reply", Reply{}.MarshalJSON, plainReply{Attempts: []Attempt{}}},
		{"record", rec.MarshalJSON, plainRecord(rec)},
		{"empty record", RunRecord{}.MarshalJSON, plainRecord{Roles: []string{}, Scopes: []string{}, Images: []ImageRef{}, Attempts: []Attempt{}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fast, err := c.fast()
			if err != nil {
				t.Fatal(err)
			}
			slow, err := json.Marshal(c.reflected)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(fast, slow) {
				t.Fatalf("fast encoder differs:\nfast %s\nslow %s", fast, slow)
			}
		})
	}
	// And the record reads back through encoding/json (as the sink reads it).
	b, _ := json.Marshal(rec)
	var back RunRecord
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	again, _ := json.Marshal(back)
	if !bytes.Equal(b, again) {
		t.Fatalf("record round trip:\n%s\n%s", b, again)
	}
}

func BenchmarkMarshalRecord(b *testing.B) {
	now := time.Now()
	red := Redact(fullRequest(b))
	rec := RunRecord{SchemaVersion: 1, RunID: "r1", Caller: "svc", CallerKind: CallerKindSubject, Subject: "sys1.decide.svc",
		PublishedAt: now, StartedAt: now, FinishedAt: now, Status: StatusSuccess, Provider: "ollama", Model: "nimble",
		Request: red, Images: red.ImageRefs(), Result: fullResult(), Attempts: fullAttempts()}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := rec.MarshalJSON(); err != nil {
			b.Fatal(err)
		}
	}
}
