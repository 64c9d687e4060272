package contract

import (
	"bytes"
	"encoding/json"
	"os"
	"reflect"
	"strings"
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

// marshalNoEscape is json.Marshal without HTML escaping, which sys1's encoders never do
// (they keep the caller's '<', '>' and '&').
func marshalNoEscape(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// TestEnvelopeEncodersMatchReflection: the hand-written encoders produce byte for byte what
// encoding/json produces from the struct tags (lists normalized to arrays).
func TestEnvelopeEncodersMatchReflection(t *testing.T) {
	reply := Reply{RunID: "r1", Status: StatusFailed, Result: fullResult(), Verdicts: fullVerdicts(), Review: fullReview(),
		Error: Errorf(CodeTimeout, "slow \"provider\"\n"), Attempts: fullAttempts(), QueuedMS: 3, LatencyMS: 44}
	allFieldsSet(t, reply)
	allFieldsSet(t, reply.Attempts[0])
	rec := fullRecord(t)
	allFieldsSet(t, rec)

	type plainReply Reply
	type plainRecord RunRecord
	type plainAttempt Attempt
	zeroCost := 0.0
	cases := []struct {
		name      string
		fast      func() ([]byte, error)
		reflected any
	}{
		{"reply", reply.MarshalJSON, plainReply(reply)},
		{"empty reply", Reply{}.MarshalJSON, plainReply{Attempts: []Attempt{}}},
		{"record", rec.MarshalJSON, plainRecord(rec)},
		{"empty record", RunRecord{}.MarshalJSON, plainRecord{Roles: []string{}, Scopes: []string{}, Images: []ImageRef{}, Attempts: []Attempt{}}},
		{"record of a free cache hit", RunRecord{CacheHit: true, CostUSD: &zeroCost}.MarshalJSON,
			plainRecord{CacheHit: true, CostUSD: &zeroCost, Roles: []string{}, Scopes: []string{}, Images: []ImageRef{}, Attempts: []Attempt{}}},
		{"attempts", func() ([]byte, error) { return appendAttempts(nil, reply.Attempts), nil },
			[]plainAttempt{plainAttempt(reply.Attempts[0]), plainAttempt(reply.Attempts[1])}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fast, err := c.fast()
			if err != nil {
				t.Fatal(err)
			}
			slow, err := marshalNoEscape(c.reflected)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(fast, slow) {
				t.Fatalf("fast encoder differs:\nfast %s\nslow %s", fast, slow)
			}
		})
	}
	// And the record and the reply read back through encoding/json (as the sink's tests and
	// the Go client read them) to the same bytes.
	for name, v := range map[string]interface {
		MarshalJSON() ([]byte, error)
	}{"record": rec, "reply": reply} {
		b, _ := v.MarshalJSON()
		var again []byte
		switch name {
		case "record":
			var back RunRecord
			if err := json.Unmarshal(b, &back); err != nil {
				t.Fatal(err)
			}
			again, _ = back.MarshalJSON()
		case "reply":
			var back Reply
			if err := json.Unmarshal(b, &back); err != nil {
				t.Fatal(err)
			}
			again, _ = back.MarshalJSON()
		}
		if !bytes.Equal(b, again) {
			t.Fatalf("%s round trip:\n%s\n%s", name, b, again)
		}
	}
}

// TestVerdictsEncoding: verdicts are an object keyed by question name in request order, each
// with its optional fields only when set, and read back in that order.
func TestVerdictsEncoding(t *testing.T) {
	vs := Verdicts{
		{Question: "zeta", Status: VerdictAbstained, Rule: "r", Reason: "confidence 0.31 < 0.50"},
		{Question: "alpha", Status: VerdictReviewed, Rule: "r", Reason: "held", Label: json.RawMessage(` "bug" `), Reviewer: "ana"},
		{Question: "mid", Status: VerdictDecided, Calibrated: &Calibrated{Probabilities: []Probability{{"b", 0.25}, {"a", 0.75}}, Temperature: 2.5}},
	}
	b, err := vs.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	want := `{"zeta":{"status":"abstained","rule":"r","reason":"confidence 0.31 < 0.50"},` +
		`"alpha":{"status":"reviewed","rule":"r","reason":"held","label":"bug","reviewer":"ana"},` +
		`"mid":{"status":"decided","rule":"","reason":"","calibrated":{"probabilities":{"b":0.25,"a":0.75},"temperature":2.5}}}`
	if string(b) != want {
		t.Fatalf("got  %s\nwant %s", b, want)
	}
	var back Verdicts
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if len(back) != 3 || back[0].Question != "zeta" || back[1].Question != "alpha" || back[2].Calibrated.Probabilities[0].Key != "b" {
		t.Fatalf("order lost: %+v", back)
	}
	if v, ok := back.Get("alpha"); !ok || string(v.Label) != `"bug"` || v.Reviewer != "ana" {
		t.Fatalf("Get(alpha) = %+v, %v", v, ok)
	}
	// A label that is not JSON never makes the document invalid, and is not turned into
	// null, which would say "none of these".
	b, _ = json.Marshal(Verdicts{{Question: "q", Status: VerdictReviewed, Label: json.RawMessage(`{bad`)}})
	if !json.Valid(b) || bytes.Contains(b, []byte(`"label"`)) {
		t.Fatalf("invalid label written as %s", b)
	}
	// A null label (none of these) survives a round trip.
	if err := json.Unmarshal([]byte(`{"q":{"status":"reviewed","label":null}}`), &back); err != nil || string(back[0].Label) != "null" {
		t.Fatalf("null label read back as %q, %v", back[0].Label, err)
	}
	for _, bad := range []string{`[]`, `{"q":[]}`, `{"q":{"status":5}}`, `{"q":{"calibrated":{"temperature":"hot"}}}`,
		`{"q":{"calibrated":{"probabilities":{"a":"x"}}}}`, `{"q":{"audit":"yes"}}`, `{"q":{"calibrated":{"temperature":1e999}}}`} {
		var v Verdicts
		if err := json.Unmarshal([]byte(bad), &v); err == nil {
			t.Errorf("%s: accepted", bad)
		}
	}
	var none Verdicts = Verdicts{{Question: "x"}}
	if err := json.Unmarshal([]byte(`null`), &none); err != nil || none != nil {
		t.Fatalf("null: %v, %v", none, err)
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

// TestReplyExampleDecodes: the example reply reads through encoding/json, as the Go client
// reads replies, with its verdicts in order and its review reference.
func TestReplyExampleDecodes(t *testing.T) {
	b, err := os.ReadFile("examples/reply.json")
	if err != nil {
		t.Fatal(err)
	}
	var r Reply
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, v := range r.Verdicts {
		names = append(names, v.Question+"="+string(v.Status))
	}
	if got := strings.Join(names, ","); got != "label=decided,refund_requested=abstained,urgency=decided" {
		t.Fatalf("verdicts %s", got)
	}
	if u, _ := r.Verdicts.Get("urgency"); u.Calibrated == nil || u.Calibrated.Temperature != 1.4 || u.Calibrated.Probabilities[2].Key != "2" {
		t.Fatalf("calibrated %+v", u.Calibrated)
	}
	if r.Review == nil || r.Review.Item != ReviewItemID(r.RunID, "refund_requested") || r.Attempts[0].Model != "nimble" {
		t.Fatalf("review %+v, attempts %+v", r.Review, r.Attempts)
	}
}
