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

func sampleReviewRun() ReviewRun {
	first := sampleReviewItem()
	second := sampleReviewItem()
	second.Question, second.ID, second.Type = "urgent", ReviewItemID("r-1", "urgent"), TypeNoul
	second.Options, second.Probabilities, second.Choice, second.Confidence = nil, nil, "", nil
	return ReviewRun{RunID: first.RunID, Caller: first.Caller, Provider: first.Provider, Model: first.Model,
		State: first.State, Images: first.Images, CreatedAt: first.CreatedAt, Items: []ReviewItem{first, second}}
}

// TestReviewRunCarriesTheStateOnce: a run's review message holds its state once however many
// questions it sends, and decodes back into whole items that each show it.
func TestReviewRunCarriesTheStateOnce(t *testing.T) {
	rr := sampleReviewRun()
	b, err := rr.MarshalJSON()
	if err != nil || !json.Valid(b) {
		t.Fatalf("encode: %v\n%s", err, b)
	}
	if n := bytes.Count(b, []byte(`refund please`)); n != 1 {
		t.Errorf("the state appears %d times in the message", n)
	}
	back, legacy, err := DecodeReviewMessage(b)
	if err != nil || legacy {
		t.Fatalf("decode: %v (legacy %v)\n%s", err, legacy, b)
	}
	if !reflect.DeepEqual(back.Expand(), rr.Expand()) {
		t.Errorf("round trip changed the items:\n got %+v\nwant %+v", back.Expand(), rr.Expand())
	}
	for _, it := range back.Items {
		if string(it.State) != string(rr.State) || it.RunID != "r-1" || it.Caller != "billing" {
			t.Errorf("item %s lacks the run's fields: %+v", it.Question, it)
		}
	}
	// An item of the earlier format still decodes: as a run of one.
	old, _ := sampleReviewItem().MarshalJSON()
	one, legacy, err := DecodeReviewMessage(old)
	if err != nil || !legacy || len(one.Items) != 1 || !reflect.DeepEqual(one.Items[0], sampleReviewItem()) {
		t.Errorf("an earlier item: %+v, legacy %v, %v", one, legacy, err)
	}
}

func TestDecodeReviewMessageIsStrict(t *testing.T) {
	good, _ := sampleReviewRun().MarshalJSON()
	replace := func(old, new string) string { return strings.Replace(string(good), old, new, 1) }
	many := sampleReviewRun()
	for len(many.Items) <= MaxQuestions {
		many.Items = append(many.Items, many.Items[0])
	}
	tooMany, _ := many.MarshalJSON()
	for _, tc := range []struct{ name, in, want string }{
		{"unknown field", replace(`{"run_id"`, `{"extra":1,"run_id"`), `field "extra": unknown field`},
		{"unknown item field", replace(`{"id":`, `{"state":1,"id":`), `items": [0]: field "state": unknown field`},
		{"item without an id", replace(`{"id":"`+ReviewItemID("r-1", "label")+`",`, `{`), `items": [0]: field "id" is required`},
		{"no items", replace(`"items":[`, `"items":[],"x":[`), `unknown field`},
		{"items not an array", replace(`"items":[`, `"items":{"a":[`), `must be an array`},
		{"too many items", string(tooMany), "more than 64 items"},
		{"duplicate key in an item", replace(`{"id":`, `{"question":"x","id":`), `duplicate key`},
		{"missing created_at", replace(`"created_at":"2026-11-30T10:00:00.123Z",`, ``), `field "created_at" is required`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := DecodeReviewMessage([]byte(tc.in))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.want)
			}
		})
	}
	empty := replace(string(good[strings.Index(string(good), `"items":[`)+len(`"items":[`):len(good)-2]), ``)
	if _, _, err := DecodeReviewMessage([]byte(empty)); err == nil || !strings.Contains(err.Error(), "items must not be empty") {
		t.Errorf("empty items: %v", err)
	}
}

func FuzzDecodeReviewMessage(f *testing.F) {
	good, _ := sampleReviewRun().MarshalJSON()
	old, _ := sampleReviewItem().MarshalJSON()
	f.Add(good)
	f.Add(old)
	f.Add([]byte(`{"run_id":"r","caller":"c","created_at":"2026-01-01T00:00:00Z","items":[{"id":"x","question":"q","type":"noul","verdict":{}}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		rr, legacy, err := DecodeReviewMessage(data)
		if err != nil {
			return
		}
		var b []byte
		if legacy {
			b, err = rr.Items[0].MarshalJSON()
		} else {
			b, err = rr.MarshalJSON()
		}
		if err != nil {
			t.Fatalf("accepted message does not encode: %v", err)
		}
		back, legacy2, err := DecodeReviewMessage(b)
		if err != nil || legacy2 != legacy {
			t.Fatalf("re-decode: %v (legacy %v → %v)\n%s", err, legacy, legacy2, b)
		}
		if !reflect.DeepEqual(back.Expand(), rr.Expand()) {
			t.Fatalf("round trip changed the message:\n%+v\n%+v", back, rr)
		}
	})
}
