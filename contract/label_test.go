package contract

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
	"time"
)

func TestDecodeLabelAcceptsValidLabels(t *testing.T) {
	example, err := os.ReadFile("examples/label.json")
	if err != nil {
		t.Fatal(err)
	}
	l, derr := DecodeLabel(example)
	if derr != nil {
		t.Fatal(derr)
	}
	if l.RunID != "ticket-48213" || l.Question != "refund_requested" || string(l.Value) != "true" || l.Source != LabelSourceProducer ||
		!l.LabelledAt.Equal(time.Date(2026, 12, 2, 9, 15, 0, 0, time.UTC)) || l.Reviewer != "billing-backoffice" {
		t.Fatalf("decoded %+v", l)
	}
	// The smallest label, a derived run id, a trimmed question, an escaped option key.
	l, derr = DecodeLabel([]byte(` {"run_id":"SYS1_REQUESTS~7~1732920000","question":"  label ","label":"b\u00fcg"} `))
	if derr != nil {
		t.Fatal(derr)
	}
	if l.Question != "label" || string(l.Value) != `"b\u00fcg"` || !l.LabelledAt.IsZero() || l.Source != "" {
		t.Fatalf("decoded %+v", l)
	}
	if text, ok := LabelText(l.Value); !ok || text != "büg" {
		t.Fatalf("LabelText = %q, %v", text, ok)
	}
	// The encoding of a full label decodes to the same label.
	full := fullLabel()
	b, _ := json.Marshal(full)
	back, derr := DecodeLabel(b)
	if derr != nil {
		t.Fatal(derr)
	}
	if again, _ := json.Marshal(back); !bytes.Equal(again, b) {
		t.Fatalf("round trip:\n%s\n%s", b, again)
	}
}

// TestDecodeLabelRefusesBadInput: every way a submitted label can be wrong is named, with its
// path, in one error; nothing is half-accepted.
func TestDecodeLabelRefusesBadInput(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
		code Code
		want []string // every one must be in the message
	}{
		{"empty", ``, CodeInvalidInput, []string{"body: invalid JSON at byte 0: empty body"}},
		{"not an object", `["r","q",1]`, CodeInvalidInput, []string{"a label must be a JSON object"}},
		{"required fields", `{}`, CodeInvalidInput, []string{"run_id: required", "question: required", "label: required"}},
		{"wrong types", `{"run_id":1,"question":null,"label":{"a":1},"reviewer":[],"labelled_at":5,"source":true,"caller":1,"item":false}`, CodeInvalidInput,
			[]string{"run_id: must be a string, got a number", "question: must be a string, got null",
				"label: must be an option key (a string), true or false, a level index (an integer), or null (none of these), got an object",
				"reviewer: must be a string, got an array", "labelled_at: must be a string, got a number", "source: must be a string, got a boolean",
				"caller: must be a string, got a number", "item: must be a string, got a boolean"}},
		{"unknown and duplicate fields", `{"run_id":"r","run_id":"s","question":"q","label":1,"weight":2}`, CodeInvalidInput,
			[]string{"run_id: duplicate key", "weight: unknown field (allowed: run_id, question, label, reviewer, labelled_at, source, caller, item)"}},
		{"bad values", `{"run_id":"a b","question":"   ","label":[],"source":"oracle","labelled_at":"yesterday","reviewer":"ana\nroot"}`, CodeInvalidInput,
			[]string{`run_id: byte 1 is ' '`, "question: must not be blank", "label: must be an option key", `source: must be "review" or "producer", got "oracle"`,
				`labelled_at: must be an RFC 3339 time, got "yesterday"`, "reviewer: must not hold control characters"}},
		{"out of range time", `{"run_id":"r","question":"q","label":1,"labelled_at":"2400-01-01T00:00:00Z"}`, CodeInvalidInput,
			[]string{"labelled_at: must lie between 1900 and 2299"}},
		{"long names", `{"run_id":"` + strings.Repeat("r", 300) + `","question":"q","label":1,"item":"` + strings.Repeat("i", 200) + `"}`, CodeInvalidInput,
			[]string{"run_id: is 300 bytes; run ids are at most 256", "item: is 200 bytes; the limit is 128"}},
		{"duplicate key nested in the label", `{"run_id":"r","question":"q","label":"a","label":"b"}`, CodeInvalidInput, []string{"label: duplicate key"}},
		{"invalid UTF-8", "{\"run_id\":\"r\xff\",\"question\":\"q\",\"label\":1}", CodeInvalidInput, []string{"body: invalid UTF-8 at byte 12"}},
		{"deep", `{"run_id":"r","question":"q","label":` + strings.Repeat("[", 10) + strings.Repeat("]", 10) + `}`, CodeInvalidInput,
			[]string{"nesting deeper than 4 levels"}},
		{"trailing data", `{"run_id":"r","question":"q","label":1} {}`, CodeInvalidInput, []string{"unexpected data after the top-level value"}},
		{"huge", `{"run_id":"r","question":"q","label":"` + strings.Repeat("x", MaxLabelBytes) + `"}`, CodeRequestTooLarge,
			[]string{"label is 147496 bytes; the limit is 147456"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := DecodeLabel([]byte(tc.in))
			if err == nil {
				t.Fatalf("accepted as %+v", l)
			}
			if err.Code != tc.code || err.Status != tc.code.Status() {
				t.Fatalf("code %s (%d), want %s", err.Code, err.Status, tc.code)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Message, w) {
					t.Errorf("message lacks %q:\n%s", w, err.Message)
				}
			}
			var ps Problems
			if tc.code == CodeInvalidInput && (!errors.As(err, &ps) || len(ps) < len(tc.want)) {
				t.Errorf("problems %v, want at least %d", ps, len(tc.want))
			}
		})
	}
	// A hostile body full of unknown fields costs a bounded list of problems and message.
	var sb strings.Builder
	sb.WriteString(`{"run_id":"r","question":"q","label":1`)
	for i := range 10000 {
		sb.WriteString(`,"f` + itoa(i) + `":0`)
	}
	sb.WriteString(`}`)
	_, err := DecodeLabel([]byte(sb.String()))
	if err == nil || len(err.Message) > 100*(maxProblemPath+maxProblemMessage) || !strings.Contains(err.Message, "more problems") {
		t.Fatalf("10,000 unknown fields: %v", err)
	}
}

func TestCheckLabel(t *testing.T) {
	choice := Answer{Type: TypeChoice, Choice: "bug", Probabilities: []Probability{{"billing", 0.1}, {"bug", 0.8}, {"account", 0.1}}}
	noul := Answer{Type: TypeNoul, Noul: 0.62}
	score := Answer{Type: TypeScore, Score: 1.7, Probabilities: []Probability{{"0", 0.1}, {"1", 0.1}, {"2", 0.8}}}
	legendOnly := Answer{Type: TypeScore, Score: 0.4, Legend: []LegendEntry{{"0", "lo"}, {"1", "hi"}}}
	for _, tc := range []struct {
		name   string
		answer Answer
		value  string
		want   string // canonical text; "" means refused
		msg    string // in the refusal
	}{
		{"choice option", choice, `"account"`, "account", ""},
		{"choice, not the chosen one", choice, `"billing"`, "billing", ""},
		{"choice with escapes", choice, `"b\u0075g"`, "bug", ""},
		{"choice, unknown option", choice, `"refund"`, "", `label: "refund" is not one of the options (billing, bug, account)`},
		{"choice, a number", choice, `1`, "", "a choice question takes an option key as a JSON string (billing, bug, account), got a number"},
		{"choice, trimmed key is not the key", choice, `" bug"`, "", "is not one of the options"},
		{"noul true", noul, `true`, "true", ""},
		{"noul false", noul, ` false `, "false", ""},
		{"noul as a string", noul, `"true"`, "", "a noul question takes true or false, got a string"},
		{"noul as a number", noul, `1`, "", "got a number"},
		{"score level", score, `2`, "2", ""},
		{"score level zero", score, `0`, "0", ""},
		{"score level as 1.0", score, `1.0`, "1", ""},
		{"score, fractional", score, `1.5`, "", "an integer in [0, 2], got 1.5"},
		{"score, out of range", score, `3`, "", "an integer in [0, 2], got 3"},
		{"score, negative", score, `-1`, "", "got -1"},
		{"score, a string", score, `"2"`, "", "got a string"},
		{"score levels from the legend", legendOnly, `1`, "1", ""},
		{"empty value", choice, ``, "", "label: required"},
		{"two values", noul, `true false`, "", "got a boolean"},
		{"unknown type", Answer{Type: "rank"}, `1`, "", `a "rank" question cannot be labelled`},
		{"choice without options", Answer{Type: TypeChoice, Choice: "x"}, `"x"`, "", "lists no options"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := CheckLabel(tc.answer, json.RawMessage(tc.value))
			if tc.want != "" {
				if err != nil || got != tc.want {
					t.Fatalf("CheckLabel = %q, %v; want %q", got, err, tc.want)
				}
				if text, ok := LabelText(json.RawMessage(tc.value)); !ok || text != got {
					t.Fatalf("LabelText = %q, %v; CheckLabel said %q", text, ok, got)
				}
				return
			}
			if err == nil {
				t.Fatalf("accepted as %q", got)
			}
			if err.Code != CodeInvalidInput || !strings.Contains(err.Message, tc.msg) || !strings.HasPrefix(err.Message, "[SYS1_INVALID_INPUT] invalid label: ") {
				t.Fatalf("error %q, want it to say %q", err.Message, tc.msg)
			}
		})
	}
}

func TestLabelText(t *testing.T) {
	for in, want := range map[string]string{`"a"`: "a", `true`: "true", `false`: "false", `3`: "3", `3.0`: "3", ` 7 `: "7"} {
		if got, ok := LabelText(json.RawMessage(in)); !ok || got != want {
			t.Errorf("LabelText(%s) = %q, %v; want %q", in, got, ok, want)
		}
	}
	if text, ok := LabelText(json.RawMessage(`null`)); !ok || text != "" {
		t.Errorf("LabelText(null) = %q, %v; want \"\" (none of these)", text, ok)
	}
	for _, in := range []string{``, `1.5`, `{}`, `[1]`, `"a" "b"`, `1e300`, `tru`, `nul`} {
		if got, ok := LabelText(json.RawMessage(in)); ok {
			t.Errorf("LabelText(%s) = %q, want refused", in, got)
		}
	}
}

// TestLabelRejection: a refused submission keeps its body only when that is JSON, and always
// its size, hash and reason.
func TestLabelRejection(t *testing.T) {
	at := time.Date(2026, 12, 1, 10, 0, 0, 0, time.FixedZone("CET", 3600))
	cause := Errorf(CodeInvalidInput, "invalid label: label: required")
	r := NewLabelRejection([]byte(`{"run_id": "r", "question": "q"}`), "svc", "sys1.labels.svc", 4, cause, at)
	if string(r.Submission) != `{"run_id": "r", "question": "q"}` || r.Bytes != 32 || len(r.SHA256) != 64 || r.Reason() != cause.Message || !r.RejectedAt.Equal(at) || r.RejectedAt.Location() != time.UTC {
		t.Fatalf("rejection %+v", r)
	}
	b, _ := json.Marshal(r)
	if !bytes.Contains(b, []byte(`"submission":{"run_id":"r","question":"q"}`)) {
		t.Fatalf("encoded %s", b)
	}
	var back LabelRejection
	if err := json.Unmarshal(b, &back); err != nil || back.Error.Code != CodeInvalidInput || back.Seq != 4 || back.Reason() != cause.Message {
		t.Fatalf("read back %+v, %v", back, err)
	}
	for _, body := range [][]byte{[]byte("\xffnot json"), []byte("not json"), bytes.Repeat([]byte(" "), MaxLabelBytes+1)} {
		r := NewLabelRejection(body, "", "sys1.labels.x", 1, nil, at)
		if r.Submission != nil || r.Bytes != len(body) || r.Error == nil || r.Error.Code != CodeInvalidInput {
			t.Errorf("rejection of %d bytes of non-JSON: %+v", len(body), r)
		}
		if b, _ := json.Marshal(r); !json.Valid(b) || !bytes.Contains(b, []byte(`"submission":null`)) {
			t.Errorf("encoded %s", b)
		}
	}
}

// TestReviewItemRoundTrip: options and probabilities keep their order, instructions and state
// their bytes; hostile HTML is carried as data (escaping it is the page's job).
func TestReviewItemRoundTrip(t *testing.T) {
	it := fullReviewItem()
	it.Options = []Option{{Key: "zeta"}, {Key: "alpha", Description: it.Options[0].Description}}
	it.Probabilities = []Probability{{"zeta", 0.9}, {"alpha", 0.1}}
	b, err := it.MarshalJSON() // json.Marshal would escape '<' and '&' (still the same data)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"options":{"zeta":null,"alpha":"money back"}`, `"probabilities":{"zeta":0.9,"alpha":0.1}`,
		`"instructions":"Pick <b>one</b>"`, `"state":{"ticket":"<script>alert(1)</script>"}`} {
		if !bytes.Contains(b, []byte(want)) {
			t.Errorf("encoding lacks %s:\n%s", want, b)
		}
	}
	var back ReviewItem
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if again, _ := back.MarshalJSON(); !bytes.Equal(again, b) {
		t.Fatalf("round trip:\n%s\n%s", b, again)
	}
	if back.Options[0].Key != "zeta" || back.Options[0].Description != nil || *back.Options[1].Description != "money back" || back.Verdict.Status != VerdictAbstained {
		t.Fatalf("read back %+v", back)
	}
	example, err := os.ReadFile("examples/review-item.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(example, &back); err != nil || back.Type != TypeNoul || len(back.Options) != 2 || back.ID != ReviewItemID(back.RunID, back.Question) {
		t.Fatalf("example: %+v, %v", back, err)
	}
	for _, bad := range []string{`[]`, `{"options":[]}`, `{"options":{"a":1}}`, `{"probabilities":{"a":"x"}}`, `{"created_at":"soon"}`, `{"verdict":"x"}`} {
		var it ReviewItem
		if err := json.Unmarshal([]byte(bad), &it); err == nil {
			t.Errorf("%s: accepted", bad)
		}
	}
}

// TestNoneOfTheseIsALabel: a reviewer's "none of these" (null) is a valid label for any
// question, stored as the empty text, so it never counts as correct.
func TestNoneOfTheseIsALabel(t *testing.T) {
	for _, a := range []Answer{
		{Type: TypeChoice, Probabilities: []Probability{{Key: "a", P: 0.5}, {Key: "b", P: 0.5}}},
		{Type: TypeNoul},
		{Type: TypeScore, Probabilities: []Probability{{Key: "0", P: 1}}},
	} {
		if text, err := CheckLabel(a, json.RawMessage(`null`)); err != nil || text != "" {
			t.Errorf("%s: CheckLabel(null) = %q, %v", a.Type, text, err)
		}
	}
	l, err := DecodeLabel([]byte(`{"run_id":"r","question":"q","label":null,"source":"review","reviewer":"ana"}`))
	if err != nil || string(l.Value) != "null" {
		t.Fatalf("DecodeLabel: %+v %v", l, err)
	}
}
