package contract

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite golden files")

// TestGoldenRoundTrip: canonical requests come back byte for byte through decode → encode, on
// both the strict and the lenient path, so key order of questions, options and state, and the
// spelling of numbers in state, survive.
func TestGoldenRoundTrip(t *testing.T) {
	files, err := filepath.Glob("testdata/golden/*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no golden files: %v", err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			in, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			req, derr := DecodeRequest(in)
			if derr != nil {
				t.Fatalf("DecodeRequest: %v", derr)
			}
			out, err := req.MarshalJSON()
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(out, in) {
				t.Fatalf("strict round trip changed bytes:\n in: %s\nout: %s", in, out)
			}
			var lenient Request
			if err := json.Unmarshal(in, &lenient); err != nil {
				t.Fatalf("UnmarshalJSON: %v", err)
			}
			out2, _ := json.Marshal(&lenient)
			if !bytes.Equal(out2, in) {
				t.Fatalf("lenient round trip changed bytes:\n in: %s\nout: %s", in, out2)
			}
		})
	}
}

// TestNormalizeGolden: a pretty, untrimmed request with keep_alive encodes to its canonical
// form (names trimmed, keep_alive dropped, white space outside state/instructions removed).
func TestNormalizeGolden(t *testing.T) {
	in := []byte(`{
  "keep_alive": "10m",
  "state": {"b": 1,   "a": 2},
  "questions": {
    "  label ": {"criteria": {" x ": "X", "y": null}, "instructions": "Pick", "type": "choice"}
  },
  "model": " nimble "
}`)
	req, derr := DecodeRequest(in)
	if derr != nil {
		t.Fatal(derr)
	}
	got, _ := req.MarshalJSON()
	golden := filepath.Join("testdata", "normalized.golden")
	if *update {
		if err := os.WriteFile(golden, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
	if req.KeepAlive != nil {
		t.Fatalf("caller keep_alive kept: %s", req.KeepAlive)
	}
}

// TestLenientReadsRedactedRecord: the form stored in run records (redacted images,
// keep_alive absent) reads back and re-encodes identically.
func TestLenientReadsRedactedRecord(t *testing.T) {
	in, _ := os.ReadFile("testdata/golden/image.json")
	req, derr := DecodeRequest(in)
	if derr != nil {
		t.Fatal(derr)
	}
	red := Redact(req)
	stored, _ := json.Marshal(red)
	if strings.Contains(string(stored), req.Images[0].Data) {
		t.Fatal("redacted request still holds base64")
	}
	want := `"images":[{"sha256":"` + req.Images[0].SHA256 + `","bytes":` + itoa(req.Images[0].Bytes) + `}]`
	if !strings.Contains(string(stored), want) {
		t.Fatalf("redacted form %s lacks %s", stored, want)
	}
	var back Request
	if err := json.Unmarshal(stored, &back); err != nil {
		t.Fatal(err)
	}
	again, _ := json.Marshal(&back)
	if !bytes.Equal(again, stored) {
		t.Fatalf("re-encoded %s\nwant %s", again, stored)
	}
	if back.Images[0].SHA256 != req.Images[0].SHA256 || back.Images[0].Bytes != req.Images[0].Bytes || !back.Images[0].Redacted() {
		t.Fatalf("image ref not read back: %+v", back.Images[0])
	}
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

// TestRedactNeverMutates proves the argument still holds its base64 and keep_alive.
func TestRedactNeverMutates(t *testing.T) {
	in, _ := os.ReadFile("testdata/golden/image.json")
	req, derr := DecodeRequest(in)
	if derr != nil {
		t.Fatal(derr)
	}
	res, rerr := Policy{DefaultModel: "nimble", KeepAlive: "300"}.Resolve(req)
	if rerr != nil {
		t.Fatal(rerr)
	}
	data := res.Images[0].Data
	red := Redact(res)
	if res.Images[0].Data != data || data == "" {
		t.Fatal("Redact modified its argument's image")
	}
	if string(res.KeepAlive) != "300" {
		t.Fatalf("Redact modified keep_alive: %s", res.KeepAlive)
	}
	if red.Images[0].Data != "" || red.KeepAlive != nil {
		t.Fatalf("redacted copy still holds data or keep_alive: %+v", red)
	}
	if red.Images[0].SHA256 != res.Images[0].SHA256 || red.Images[0].Bytes != res.Images[0].Bytes {
		t.Fatal("redacted copy lost the image identity")
	}
	if got := red.ImageRefs(); len(got) != 1 || got[0] != res.Images[0].Ref() {
		t.Fatalf("ImageRefs = %+v", got)
	}
}

const ticketAnswer = `{"model":"nimble","answers":{` +
	`"urgency":{"type":"score","score":1.7,"probabilities":{"0":0.1,"1":0.1,"2":0.8},"confidence":0.6,"legend":{"0":"calm","1":"annoyed","2":"angry"}},` +
	`"label":{"type":"choice","choice":"bug","probabilities":{"billing":0.0125,"bug":0.9781,"account":0.0093},"confidence":0.8906,"rationale":"kept verbatim"},` +
	`"refund_requested":{"type":"noul","noul":0.99}},` +
	`"usage":{"input_tokens":174,"output_tokens":1},"served_by":{"node":"a"}}`

func ticketRequest(t testing.TB) *Request {
	t.Helper()
	in, err := os.ReadFile("examples/ticket.json")
	if err != nil {
		t.Fatal(err)
	}
	req, derr := DecodeRequest(in)
	if derr != nil {
		t.Fatal(derr)
	}
	return req
}

// TestResponseAndResultRoundTrip: answers come back in request order with their bytes intact,
// typed fields are filled, and a Result survives encode → decode → encode.
func TestResponseAndResultRoundTrip(t *testing.T) {
	req := ticketRequest(t)
	resp, derr := DecodeResponse(req, []byte(ticketAnswer))
	if derr != nil {
		t.Fatal(derr)
	}
	var names []string
	for _, a := range resp.Answers {
		names = append(names, a.Name)
	}
	if got := strings.Join(names, ","); got != "label,refund_requested,urgency" {
		t.Fatalf("answers not in request order: %s", got)
	}
	label := resp.Answers[0]
	if label.Choice != "bug" || label.Confidence == nil || *label.Confidence != 0.8906 ||
		len(label.Probabilities) != 3 || label.Probabilities[0].Key != "billing" {
		t.Fatalf("choice answer fields: %+v", label)
	}
	if !strings.Contains(string(label.Raw), `"rationale":"kept verbatim"`) {
		t.Fatalf("unknown answer field lost: %s", label.Raw)
	}
	if resp.Answers[1].Noul != 0.99 || resp.Answers[1].Confidence != nil {
		t.Fatalf("noul answer: %+v", resp.Answers[1])
	}
	u := resp.Answers[2]
	if u.Score != 1.7 || len(u.Legend) != 3 || u.Legend[2].Label != "angry" {
		t.Fatalf("score answer: %+v", u)
	}
	if len(resp.Extra) != 1 || resp.Extra[0].Key != "served_by" || string(resp.Extra[0].Value) != `{"node":"a"}` {
		t.Fatalf("extra: %+v", resp.Extra)
	}
	if resp.Usage != (Usage{InputTokens: 174, OutputTokens: 1}) {
		t.Fatalf("usage: %+v", resp.Usage)
	}
	enc, _ := resp.MarshalJSON()
	wantResp := `{"model":"nimble","answers":{"label":` + string(label.Raw) + `,"refund_requested":{"type":"noul","noul":0.99},"urgency":` +
		string(u.Raw) + `},"usage":{"input_tokens":174,"output_tokens":1},"served_by":{"node":"a"}}`
	if string(enc) != wantResp {
		t.Fatalf("response encoding:\n got %s\nwant %s", enc, wantResp)
	}

	res := resp.Result("ollama")
	b1, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	wantPrefix := `{"provider":"ollama","model":"nimble","answers":{"label":{"type":"choice","choice":"bug"`
	if !strings.HasPrefix(string(b1), wantPrefix) {
		t.Fatalf("result encoding: %s", b1)
	}
	var back Result
	if err := json.Unmarshal(b1, &back); err != nil {
		t.Fatal(err)
	}
	b2, _ := json.Marshal(&back)
	if !bytes.Equal(b1, b2) {
		t.Fatalf("result round trip:\n%s\n%s", b1, b2)
	}
	if back.Answers[0].Choice != "bug" || back.Answers[2].Score != 1.7 || back.Answers[1].Noul != 0.99 ||
		back.Answers[0].Type != TypeChoice || back.Usage.InputTokens != 174 {
		t.Fatalf("typed fields not filled on read back: %+v", back)
	}
}

// TestAnswerBuiltInGo: answers without Raw are encoded from their typed fields and read back.
func TestAnswerBuiltInGo(t *testing.T) {
	c := 0.75
	res := Result{Provider: "sim", Model: "nimble", Answers: []Answer{
		{Name: "label", Type: TypeChoice, Choice: "b", Confidence: &c, Probabilities: []Probability{{"b", 0.875}, {"a", 0.125}}},
		{Name: "yes", Type: TypeNoul, Noul: 1e-7},
		{Name: "lvl", Type: TypeScore, Score: 1, Probabilities: []Probability{{"0", 0}, {"1", 1}}, Legend: []LegendEntry{{"0", "lo"}, {"1", "hi"}}},
	}}
	b, _ := json.Marshal(&res)
	want := `{"provider":"sim","model":"nimble","answers":{` +
		`"label":{"type":"choice","choice":"b","probabilities":{"b":0.875,"a":0.125},"confidence":0.75},` +
		`"yes":{"type":"noul","noul":1e-7},` +
		`"lvl":{"type":"score","score":1,"probabilities":{"0":0,"1":1},"legend":{"0":"lo","1":"hi"}}},` +
		`"usage":{"input_tokens":0,"output_tokens":0}}`
	if string(b) != want {
		t.Fatalf("got  %s\nwant %s", b, want)
	}
	var back Result
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if back.Answers[1].Noul != 1e-7 || back.Answers[0].Probabilities[1].P != 0.125 {
		t.Fatalf("read back: %+v", back)
	}
}
