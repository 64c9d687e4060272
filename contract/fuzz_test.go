package contract

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// seedRequests are the examples, the golden files and a handful of broken bodies.
func seedRequests(f *testing.F) {
	files, _ := filepath.Glob("examples/*.json")
	golden, _ := filepath.Glob("testdata/golden/*.json")
	for _, name := range append(files, golden...) {
		if strings.Contains(name, "reply") || strings.Contains(name, "record") {
			continue
		}
		b, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	for _, s := range []string{
		``, `{}`, `[]`, `null`, `{"state":"s","questions":{}}`,
		`{"state":{"a":1,"a":2},"questions":{"q":{"type":"noul","instructions":"?"}}}`,
		`{"state":"\ud800","questions":{}}`,
		`{"state":"s","questions":{"l":{"criteria":{"a":1},"type":"choice"}}}`,
		`{"state":` + strings.Repeat("[", 100) + `}`,
		`{"state":"s","questions":{"q":{"type":"noul","instructions":"?"}},"images":["iVBO","data:x",""],"keep_alive":5}`,
	} {
		f.Add([]byte(s))
	}
}

// FuzzDecodeRequest: decode + validate + resolve + encode never panics, and whatever decodes
// re-encodes canonically: the encoding decodes again (strictly and leniently) to the same bytes.
func FuzzDecodeRequest(f *testing.F) {
	seedRequests(f)
	pol := Policy{DefaultModel: "nimble", AllowedModels: []string{"clef"}, KeepAlive: "5m"}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, derr := DecodeRequest(body)
		if derr != nil {
			if derr.Code != CodeInvalidInput && derr.Code != CodeRequestTooLarge {
				t.Fatalf("unexpected code %s", derr.Code)
			}
			if !strings.HasPrefix(derr.Message, "["+string(derr.Code)+"] ") {
				t.Fatalf("message %q", derr.Message)
			}
			return
		}
		if res, rerr := pol.Resolve(req); rerr == nil {
			if _, err := res.MarshalJSON(); err != nil {
				t.Fatal(err)
			}
			_ = Redact(res)
		}
		b1, _ := req.MarshalJSON()
		again, derr := DecodeRequest(b1)
		if derr != nil {
			t.Fatalf("encoding of a valid request is invalid: %v\n%s", derr, b1)
		}
		b2, _ := again.MarshalJSON()
		if !bytes.Equal(b1, b2) {
			t.Fatalf("not canonical:\n%s\n%s", b1, b2)
		}
		var lenient Request
		if err := json.Unmarshal(b1, &lenient); err != nil {
			t.Fatalf("lenient read of a valid request: %v", err)
		}
		if b3, _ := lenient.MarshalJSON(); !bytes.Equal(b1, b3) {
			t.Fatalf("lenient round trip:\n%s\n%s", b1, b3)
		}
	})
}

// FuzzDecodeResponse: any provider body is either rejected as SYS1_UPSTREAM_ERROR or decodes
// to answers that re-encode, decode again identically, and survive the Result round trip.
func FuzzDecodeResponse(f *testing.F) {
	f.Add([]byte(ticketAnswer))
	f.Add([]byte(answers(goodLabel, goodRefund, goodUrgency)))
	f.Add([]byte(answers(goodLabel, goodRefund, `{"type":"score","score":2,"probabilities":{"0":0,"1":0,"2":1},"legend":["a","b","c"]}`)))
	f.Add([]byte(`{"answers":{"label":{"type":"choice","choice":"bug","probabilities":{"bug":1e999}}}}`))
	f.Add([]byte(`{"answers":[],"usage":{"input_tokens":-1}}`))
	f.Add([]byte(`{"x":{"a":1,"a":2}}`))
	in, err := os.ReadFile("examples/ticket.json")
	if err != nil {
		f.Fatal(err)
	}
	req, derr := DecodeRequest(in)
	if derr != nil {
		f.Fatal(derr)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		resp, derr := DecodeResponse(req, body)
		if derr != nil {
			if derr.Code != CodeUpstreamError {
				t.Fatalf("unexpected code %s", derr.Code)
			}
			return
		}
		if len(resp.Answers) != len(req.Questions) {
			t.Fatalf("%d answers for %d questions", len(resp.Answers), len(req.Questions))
		}
		for i := range resp.Answers {
			if resp.Answers[i].Name != req.Questions[i].Name || resp.Answers[i].Type != req.Questions[i].Type {
				t.Fatalf("answer %d is %s/%s", i, resp.Answers[i].Name, resp.Answers[i].Type)
			}
		}
		b1, _ := resp.MarshalJSON()
		again, derr := DecodeResponse(req, b1)
		if derr != nil {
			t.Fatalf("re-encoded response rejected: %v\n%s", derr, b1)
		}
		if b2, _ := again.MarshalJSON(); !bytes.Equal(b1, b2) {
			t.Fatalf("response not stable:\n%s\n%s", b1, b2)
		}
		r1, _ := resp.Result("ollama").MarshalJSON()
		var back Result
		if err := json.Unmarshal(r1, &back); err != nil {
			t.Fatalf("result read back: %v\n%s", err, r1)
		}
		if r2, _ := back.MarshalJSON(); !bytes.Equal(r1, r2) {
			t.Fatalf("result round trip:\n%s\n%s", r1, r2)
		}
	})
}

// FuzzUnmarshalRecord: the decoders the sink reads run records with (DecodeRecord, and the
// lenient Request and Result inside it) never panic on any bytes; whatever json.Unmarshal
// accepts encodes again, reads back to the same encoding, and DecodeRecord reads that encoding
// to the same record.
func FuzzUnmarshalRecord(f *testing.F) {
	for _, name := range []string{"examples/record.json", "testdata/record-v1.json", "examples/reply.json", "examples/reply-failed.json"} {
		b, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	for _, s := range []string{
		`{}`, `null`, `{"request":null,"result":null}`, `{"request":{"questions":{"q":{}}}}`,
		`{"result":{"answers":{"a":{"type":"score","legend":["x"],"probabilities":{"0":1}}}}}`,
		`{"request":{"images":[{"sha256":"ab","bytes":-1},"iVBOR"]}}`,
		`{"result":{"answers":{"a":1}}}`, `{"attempts":[{"started_at":"x"}]}`,
		`{"verdicts":{"q":{"status":"reviewed","label":[1, 2],"calibrated":{"probabilities":{"a":1},"temperature":2}}},"cost_usd":0,"cache_hit":true}`,
		`{"review":{"status":"pending"},"review":{"item":"x"},"cost_usd":null,"record_state":"hash"}`,
	} {
		f.Add([]byte(s))
	}
	full, _ := json.Marshal(fullRecord(f))
	f.Add(full)
	f.Fuzz(func(t *testing.T, data []byte) {
		_, _ = DecodeRecord(data) // never panics, whatever the bytes
		var rec RunRecord
		if err := json.Unmarshal(data, &rec); err != nil {
			return
		}
		b1 := rec.AppendJSON(nil)
		// The sink's fast decoder reads the canonical encoding to the same record.
		fast, err := DecodeRecord(b1)
		if err != nil {
			t.Fatalf("DecodeRecord refuses what json.Unmarshal read: %v\n%s", err, b1)
		}
		if b3 := fast.AppendJSON(nil); !bytes.Equal(b1, b3) {
			t.Fatalf("DecodeRecord differs from json.Unmarshal:\n%s\n%s", b1, b3)
		}
		if !json.Valid(b1) {
			t.Fatalf("re-encoding is not JSON: %s", b1)
		}
		var again RunRecord
		if err := json.Unmarshal(b1, &again); err != nil {
			t.Fatalf("re-encoding does not decode: %v\n%s", err, b1)
		}
		if b2 := again.AppendJSON(nil); !bytes.Equal(b1, b2) {
			t.Fatalf("not stable:\n%s\n%s", b1, b2)
		}
	})
}

// FuzzUnmarshalReply: whatever json.Unmarshal reads into a Reply (the Go client's decoder:
// verdicts, review and all) encodes again, and reads back to the same encoding.
func FuzzUnmarshalReply(f *testing.F) {
	for _, name := range []string{"examples/reply.json", "examples/reply-failed.json"} {
		b, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	full, _ := json.Marshal(Reply{RunID: "r", Status: StatusSuccess, Result: fullResult(), Verdicts: fullVerdicts(), Review: fullReview(), Attempts: fullAttempts()})
	f.Add(full)
	for _, s := range []string{`{}`, `{"verdicts":null}`, `{"verdicts":{"a":{"label":{"x":1}}},"review":null}`, `{"verdicts":{"a":{},"a":{}}}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var r Reply
		if err := json.Unmarshal(data, &r); err != nil {
			return
		}
		b1 := r.AppendJSON(nil)
		if !json.Valid(b1) {
			t.Fatalf("re-encoding is not JSON: %s", b1)
		}
		var again Reply
		if err := json.Unmarshal(b1, &again); err != nil {
			t.Fatalf("re-encoding does not decode: %v\n%s", err, b1)
		}
		if b2 := again.AppendJSON(nil); !bytes.Equal(b1, b2) {
			t.Fatalf("not stable:\n%s\n%s", b1, b2)
		}
	})
}

// labelAnswers are one answer of each type, to check fuzzed labels against.
var labelAnswers = []Answer{
	{Name: "label", Type: TypeChoice, Choice: "bug", Probabilities: []Probability{{"billing", 0.1}, {"bug", 0.8}, {"a\"b", 0.1}}},
	{Name: "refund", Type: TypeNoul, Noul: 0.3},
	{Name: "urgency", Type: TypeScore, Score: 1.2, Probabilities: []Probability{{"0", 0.2}, {"1", 0.4}, {"2", 0.4}}},
}

// FuzzDecodeLabel: any submitted label is refused with SYS1_INVALID_INPUT or
// SYS1_REQUEST_TOO_LARGE, or decodes to a label whose encoding decodes again to the same bytes;
// checking it against an answer of each type never panics, and what passes reads as its
// canonical text.
func FuzzDecodeLabel(f *testing.F) {
	if b, err := os.ReadFile("examples/label.json"); err == nil {
		f.Add(b)
	}
	full, _ := json.Marshal(fullLabel())
	f.Add(full)
	for _, s := range []string{
		``, `{}`, `[]`, `null`, `{"run_id":"r","question":"q","label":"bug"}`, `{"run_id":"r","question":"q","label":2}`,
		`{"run_id":"r","question":" q ","label":false,"labelled_at":"2026-01-01T00:00:00+01:00"}`,
		`{"run_id":"r","run_id":"s","question":"q","label":[1]}`, `{"run_id":"a b","question":"","label":{},"x":1}`,
		`{"run_id":"r","question":"q","label":"\u00e9\ud83d\ude00","reviewer":"\u0007"}`, `{"run_id":"r","question":"q","label":1e400}`,
		`{"run_id":"SYS1_REQUESTS~7~1700000000","question":"q","label":-0,"source":"review","item":"rv-1"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		l, derr := DecodeLabel(data)
		if derr != nil {
			if derr.Code != CodeInvalidInput && derr.Code != CodeRequestTooLarge {
				t.Fatalf("unexpected code %s", derr.Code)
			}
			if !strings.HasPrefix(derr.Message, "["+string(derr.Code)+"] ") {
				t.Fatalf("message %q", derr.Message)
			}
			return
		}
		b1 := l.AppendJSON(nil)
		again, derr := DecodeLabel(b1)
		if derr != nil {
			t.Fatalf("the encoding of a valid label is invalid: %v\n%s", derr, b1)
		}
		if b2 := again.AppendJSON(nil); !bytes.Equal(b1, b2) {
			t.Fatalf("not stable:\n%s\n%s", b1, b2)
		}
		for _, a := range labelAnswers {
			text, cerr := CheckLabel(a, l.Value)
			if cerr != nil {
				if cerr.Code != CodeInvalidInput {
					t.Fatalf("CheckLabel code %s", cerr.Code)
				}
				continue
			}
			if got, ok := LabelText(l.Value); !ok || got != text {
				t.Fatalf("CheckLabel says %q, LabelText %q (%v) for %s", text, got, ok, l.Value)
			}
		}
	})
}

// FuzzUnmarshalReviewItem: any bytes either fail to decode as a review item or decode to one
// whose encoding decodes again to the same bytes.
func FuzzUnmarshalReviewItem(f *testing.F) {
	if b, err := os.ReadFile("examples/review-item.json"); err == nil {
		f.Add(b)
	}
	full, _ := json.Marshal(fullReviewItem())
	f.Add(full)
	for _, s := range []string{`{}`, `{"options":{"a":null,"b":"x"},"probabilities":{"a":1}}`, `{"images":[{"sha256":"x","bytes":1}],"verdict":null}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var it ReviewItem
		if err := json.Unmarshal(data, &it); err != nil {
			return
		}
		b1, _ := it.MarshalJSON()
		var again ReviewItem
		if err := json.Unmarshal(b1, &again); err != nil {
			t.Fatalf("re-encoding does not decode: %v\n%s", err, b1)
		}
		if b2, _ := again.MarshalJSON(); !bytes.Equal(b1, b2) {
			t.Fatalf("not stable:\n%s\n%s", b1, b2)
		}
	})
}
