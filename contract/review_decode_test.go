package contract

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"
)

func sampleReviewItem() ReviewItem {
	desc := func(s string) *string { return &s }
	conf, noul := 0.31, 0.4
	return ReviewItem{
		ID: ReviewItemID("r-1", "label"), RunID: "r-1", Caller: "billing", Provider: "ollama", Model: "nimble",
		Question: "label", Type: TypeChoice, Instructions: json.RawMessage(`{"z":"<b>first</b>","a":1}`),
		// Deliberately not in alphabetical order: order must survive.
		Options:       []Option{{Key: "zeta", Description: desc("last letter")}, {Key: "alpha", Description: nil}, {Key: "mid", Description: desc("a \"quoted\" <i>one</i>")}},
		Probabilities: []Probability{{Key: "zeta", P: 0.5}, {Key: "alpha", P: 0.3}, {Key: "mid", P: 0.2}},
		Confidence:    &conf, Noul: &noul, Choice: "zeta",
		Verdict: Verdict{Status: VerdictAbstained, Rule: "low", Reason: "confidence 0.31 < 0.50",
			Calibrated: &Calibrated{Probabilities: []Probability{{Key: "zeta", P: 0.4}, {Key: "alpha", P: 0.6}}, Confidence: &conf, Temperature: 1.5}},
		Mode: ReviewNotify, Audit: true, State: json.RawMessage(`{"ticket":"refund please","b":[1,2]}`),
		Images:    []ImageRef{{SHA256: strings.Repeat("ab", 32), Bytes: 1234}},
		CreatedAt: time.Date(2026, 11, 30, 10, 0, 0, 123000000, time.UTC),
	}
}

func TestReviewItemRoundTripKeepsOrder(t *testing.T) {
	it := sampleReviewItem()
	// MarshalJSON itself: json.Marshal would re-escape '<' in state and instructions.
	b, err := it.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	if !json.Valid(b) {
		t.Fatalf("not valid JSON: %s", b)
	}
	for _, want := range []string{`"options":{"zeta":"last letter","alpha":null,"mid":"a \"quoted\" <i>one</i>"}`,
		`"probabilities":{"zeta":0.5,"alpha":0.3,"mid":0.2}`, `"instructions":{"z":"<b>first</b>","a":1}`,
		`"calibrated":{"probabilities":{"zeta":0.4,"alpha":0.6},"confidence":0.31,"temperature":1.5}`} {
		if !bytes.Contains(b, []byte(want)) {
			t.Errorf("encoding lacks %s:\n%s", want, b)
		}
	}
	var back ReviewItem
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatalf("decode: %v\n%s", err, b)
	}
	if !reflect.DeepEqual(back, it) {
		t.Errorf("round trip changed the item:\n got %+v\nwant %+v", back, it)
	}
}

func TestDecodeReviewItemIsStrict(t *testing.T) {
	good, _ := sampleReviewItem().MarshalJSON()
	replace := func(old, new string) string { return strings.Replace(string(good), old, new, 1) }
	for _, tc := range []struct{ name, in, want string }{
		{"unknown field", replace(`{"id"`, `{"extra":1,"id"`), `field "extra": unknown field`},
		{"duplicate field", replace(`{"id"`, `{"caller":"x","id"`), `field "caller": duplicate key`},
		{"duplicate key inside state", replace(`"state":{`, `"state":{"b":0,`), `duplicate key "b"`},
		{"duplicate option", replace(`"alpha":null`, `"zeta":null`), `duplicate option "zeta"`},
		{"wrong type", replace(`"caller":"billing"`, `"caller":7`), `field "caller": must be a string, got a number`},
		{"bad question type", replace(`"type":"choice"`, `"type":"essay"`), `must be choice, noul or score`},
		{"probability above one", replace(`"zeta":0.5`, `"zeta":1.5`), `must be within [0, 1]`},
		{"description not a string", replace(`"alpha":null`, `"alpha":3`), `description must be a string or null`},
		{"missing required", replace(`"run_id":"r-1",`, ``), `field "run_id" is required`},
		{"bad time", replace(`"created_at":"2026-11-30T10:00:00.123Z"`, `"created_at":"yesterday"`), `RFC 3339`},
		{"unknown verdict field", replace(`"status":"abstained"`, `"status":"abstained","why":1`), `"why": unknown field`},
		{"trailing data", string(good) + "{}", "unexpected data after the top-level value"},
		{"invalid UTF-8", replace(`refund please`, "refund \xff please"), "invalid UTF-8 at byte"},
		{"too deep", replace(`"state":{`, `"state":{"d":`+strings.Repeat("[", 70)+strings.Repeat("]", 70)+`,`), "nesting deeper than 64 levels"},
		{"not an object", `[1]`, "expected an object"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeReviewItem([]byte(tc.in))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

func FuzzDecodeReviewItem(f *testing.F) {
	good, _ := sampleReviewItem().MarshalJSON()
	f.Add(good)
	f.Add([]byte(`{"id":"x","run_id":"r","caller":"c","question":"q","type":"noul","verdict":{},"created_at":"2026-01-01T00:00:00Z"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		it, err := DecodeReviewItem(data)
		if err != nil {
			return
		}
		b, err := it.MarshalJSON()
		if err != nil {
			t.Fatalf("accepted item does not encode: %v", err)
		}
		back, err := DecodeReviewItem(b)
		if err != nil {
			t.Fatalf("re-decode: %v\n%s", err, b)
		}
		if !reflect.DeepEqual(back, it) {
			t.Fatalf("round trip changed the item:\n%+v\n%+v", back, it)
		}
	})
}

// FuzzDecodeLabel: likewise for labels.
