package synth

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"testing"

	"github.com/sys1hq/sys1/contract"
)

var ticket = []Question{
	{Name: "label", Type: TypeChoice, Keys: []string{"billing", "bug", "account"}},
	{Name: "refund", Type: TypeNoul},
	{Name: "urgency", Type: TypeScore, Keys: []string{"calm", "annoyed", "blocked"}},
}

// request builds the contract request matching qs, so answers can be checked by the real
// response contract.
func request(t testing.TB, model string, state string, qs []Question) *contract.Request {
	t.Helper()
	var b bytes.Buffer
	fmt.Fprintf(&b, `{"model":%q,"state":%s,"questions":{`, model, state)
	for i, q := range qs {
		if i > 0 {
			b.WriteByte(',')
		}
		b.Write(AppendString(nil, q.Name))
		fmt.Fprintf(&b, `:{"type":%q,"instructions":"decide"`, q.Type)
		switch q.Type {
		case TypeChoice:
			b.WriteString(`,"criteria":{`)
			for j, k := range q.Keys {
				if j > 0 {
					b.WriteByte(',')
				}
				b.Write(AppendString(nil, k))
				b.WriteString(`:"an option"`)
			}
			b.WriteString("}")
		case TypeScore:
			levels, _ := json.Marshal(q.Keys)
			fmt.Fprintf(&b, `,"criteria":%s`, levels)
		}
		b.WriteString("}")
	}
	b.WriteString("}}")
	req, err := contract.DecodeRequest(b.Bytes())
	if err != nil {
		t.Fatalf("DecodeRequest(%s): %v", b.String(), err)
	}
	return req
}

func TestAnswersPassTheResponseContractInOrder(t *testing.T) {
	req := request(t, "nimble", `{"ticket":"checkout fails"}`, ticket)
	body := Append(nil, Response{Model: "nimble", State: req.State, Questions: ticket, InputTokens: 40, OutputTokens: 1})
	resp, err := contract.DecodeResponse(req, body)
	if err != nil {
		t.Fatalf("DecodeResponse: %v\n%s", err, body)
	}
	if resp.Model != "nimble" || resp.Usage.InputTokens != 40 || resp.Usage.OutputTokens != 1 {
		t.Fatalf("model/usage = %q %+v", resp.Model, resp.Usage)
	}
	for i, a := range resp.Answers {
		if a.Name != ticket[i].Name || string(a.Type) != ticket[i].Type {
			t.Fatalf("answer %d = %s/%s, want %s/%s", i, a.Name, a.Type, ticket[i].Name, ticket[i].Type)
		}
	}
	noul := resp.Answers[1]
	if noul.Confidence != nil {
		t.Errorf("noul answers carry no confidence, got %v", *noul.Confidence)
	}
	score := resp.Answers[2]
	if len(score.Legend) != 3 || score.Legend[0].Key != "0" || score.Legend[2].Label != "blocked" {
		t.Errorf("legend = %+v", score.Legend)
	}
	var expected float64
	for i, p := range score.Probabilities {
		if p.Key != strconv.Itoa(i) {
			t.Errorf("score probability %d keyed %q", i, p.Key)
		}
		expected += float64(i) * p.P
	}
	if math.Abs(expected-score.Score) > 1e-12 {
		t.Errorf("score = %v, want Σ i·pᵢ = %v", score.Score, expected)
	}
}

func TestDeterministicAndSensitiveToEveryInput(t *testing.T) {
	base := Response{Model: "nimble", State: []byte(`"a"`), Questions: ticket, InputTokens: 1, OutputTokens: 1}
	a, b := Append(nil, base), Append(nil, base)
	if !bytes.Equal(a, b) {
		t.Fatal("same input, different answers")
	}
	variants := map[string]Response{}
	v := base
	v.Model = "clef"
	variants["model"] = v
	v = base
	v.State = []byte(`"b"`)
	variants["state"] = v
	v = base
	v.Questions = []Question{{Name: "label2", Type: TypeChoice, Keys: ticket[0].Keys}, ticket[1], ticket[2]}
	variants["question name"] = v
	for name, r := range variants {
		// compare the distributions, not the bytes: the model name itself is in the body
		p0, _, _ := Distribution(base.Model, base.State, base.Questions[0])
		p1, _, _ := Distribution(r.Model, r.State, r.Questions[0])
		if fmt.Sprint(p0) == fmt.Sprint(p1) {
			t.Errorf("changing the %s did not change the answer", name)
		}
	}
}

func TestDistributionRules(t *testing.T) {
	for n := 2; n <= 26; n++ {
		keys := make([]string, n)
		for i := range keys {
			keys[i] = "opt" + strconv.Itoa(i)
		}
		q := Question{Name: "q", Type: TypeChoice, Keys: keys}
		probs, top, conf := Distribution("nimble", []byte(`"s"`), q)
		var sum, entropy float64
		for i, p := range probs {
			sum += p
			entropy -= p * math.Log(p)
			if p > probs[top] || (p == probs[top] && i < top) {
				t.Fatalf("n=%d: top %d is not the first most likely option (%d)", n, top, i)
			}
		}
		if math.Abs(sum-1) > 1e-9 {
			t.Fatalf("n=%d: probabilities sum to %v", n, sum)
		}
		want := 1 - entropy/math.Log(float64(n))
		if conf != 0 && math.Abs(conf-want) > 1e-9 {
			t.Fatalf("n=%d: confidence %v, want 1 - H/ln N = %v", n, conf, want)
		}
	}
}

func TestExactTieTakesTheFirstOptionWithZeroConfidence(t *testing.T) {
	// Logits are quantised, so some states tie the two options exactly; find one.
	q := Question{Name: "q", Type: TypeChoice, Keys: []string{"left", "right"}}
	for i := 0; i < 100000; i++ {
		state := []byte(strconv.Quote("state " + strconv.Itoa(i)))
		probs, top, conf := Distribution("nimble", state, q)
		if probs[0] != probs[1] {
			continue
		}
		if top != 0 || conf != 0 {
			t.Fatalf("tie: top=%d confidence=%v, want 0 and 0", top, conf)
		}
		body := Append(nil, Response{Model: "nimble", State: state, Questions: []Question{q}})
		if !bytes.Contains(body, []byte(`"choice":"left"`)) || !bytes.Contains(body, []byte(`"confidence":0}`)) {
			t.Fatalf("tie answer = %s", body)
		}
		return
	}
	t.Fatal("no tie found in 100000 states: logits are not quantised as documented")
}

func TestCorruptionsBreakTheResponseContract(t *testing.T) {
	for _, c := range []Corruption{CorruptWrongType, CorruptMissingAnswer, CorruptBadSum, CorruptNaN, CorruptExtraAnswer} {
		for _, first := range []int{0, 1, 2} { // corrupt each question type in turn
			qs := append([]Question{ticket[first]}, ticket[:first]...)
			qs = append(qs, ticket[first+1:]...)
			req := request(t, "nimble", `"s"`, qs)
			body := Append(nil, Response{Model: "nimble", State: req.State, Questions: qs, Corrupt: c})
			if _, err := contract.DecodeResponse(req, body); err == nil {
				t.Errorf("corruption %d on a %s question passed the contract: %s", c, qs[0].Type, body)
			}
		}
	}
}

func TestAppendStringMatchesEncodingJSON(t *testing.T) {
	for _, s := range []string{"", "plain", `quo"te`, `back\slash`, "tab\tnew\nline\r", "\x00\x1f", "é ünïcode 🚀", "bad \xff utf8", "<html>&"} {
		got := AppendString(nil, s)
		var back string
		if err := json.Unmarshal(got, &back); err != nil {
			t.Fatalf("AppendString(%q) = %s: not JSON: %v", s, got, err)
		}
		want, _ := json.Marshal(s)
		var wantBack string
		_ = json.Unmarshal(want, &wantBack)
		if back != wantBack {
			t.Errorf("AppendString(%q) decodes to %q, encoding/json to %q", s, back, wantBack)
		}
	}
}

func BenchmarkAppend(b *testing.B) {
	r := Response{Model: "nimble", State: bytes.Repeat([]byte("x"), 2048), Questions: ticket, InputTokens: 500, OutputTokens: 1}
	buf := make([]byte, 0, 4096)
	b.ReportAllocs()
	for b.Loop() {
		buf = Append(buf[:0], r)
	}
}
