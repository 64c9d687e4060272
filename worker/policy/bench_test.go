package policy

import (
	"fmt"
	"strings"
	"testing"

	"github.com/sys1hq/sys1/contract"
)

// benchPolicy is 20 rules of the shapes operators write: callers and questions by prefix,
// suffix and literal, a model rule, classes, and a catch-all with an audit sample last.
func benchPolicySource() string {
	var b strings.Builder
	b.WriteString("rules:\n")
	for i := 0; i < 6; i++ {
		fmt.Fprintf(&b, "  - name: team-%d\n    caller: team-%d-*\n    question: \"q%d_*\"\n    min_confidence: 0.8\n    review: hold\n", i, i, i)
	}
	for i := 0; i < 6; i++ {
		fmt.Fprintf(&b, "  - name: suffix-%d\n    caller: \"*-eu\"\n    question: \"*_kind%d\"\n    min_confidence: 0.6\n    min_probability: 0.5\n", i, i)
	}
	for i := 0; i < 4; i++ {
		fmt.Fprintf(&b, "  - name: noul-%d\n    question: \"flag%d_*\"\n    noul_abstain_between: [0.3, 0.7]\n    use: calibrated\n", i, i)
	}
	b.WriteString("  - name: big-model\n    model: \"hf.co/*:70b\"\n    min_confidence: 0.4\n")
	b.WriteString("  - name: smoke\n    caller: \"smoke-[0-9]\"\n    min_confidence: 0\n    review: none\n")
	b.WriteString("  - name: noul-default\n    noul_abstain_between: [0.4, 0.6]\n")
	b.WriteString("  - name: default\n    min_confidence: 0.5\n    audit_sample: 0.02\n")
	return b.String()
}

func benchPolicy(tb testing.TB) *Policy { return mustParse(tb, benchPolicySource()) }

// benchRun is a 64-question run, a third each of choice, noul and score, named so that they
// spread over the rules above, as contract decodes it: the request and the provider's
// response body.
func benchRun(tb testing.TB) (*contract.Request, []byte) {
	var qs, as strings.Builder
	for i := 0; i < 64; i++ {
		if i > 0 {
			qs.WriteByte(',')
			as.WriteByte(',')
		}
		switch i % 3 {
		case 0:
			name := fmt.Sprintf("t%d_kind%d", i, i%9)
			fmt.Fprintf(&qs, `"%s":{"type":"choice","instructions":"Which team?","criteria":{"billing":"Payments","bug":"Errors","account":"Access"}}`, name)
			top := 0.5 + float64(i%5)/10
			fmt.Fprintf(&as, `"%s":{"type":"choice","choice":"bug","probabilities":{"billing":%g,"bug":%g,"account":0},"confidence":%g}`, name, 1-top, top, 0.3+float64(i%7)/10)
		case 1:
			name := fmt.Sprintf("flag%d_refund_%d", i%6, i)
			fmt.Fprintf(&qs, `"%s":{"type":"noul","instructions":"Money back?"}`, name)
			fmt.Fprintf(&as, `"%s":{"type":"noul","noul":%g}`, name, float64(i%10)/10)
		default:
			name := fmt.Sprintf("severity_%d", i)
			fmt.Fprintf(&qs, `"%s":{"type":"score","instructions":"How urgent?","criteria":["calm","annoyed","blocked","down"]}`, name)
			fmt.Fprintf(&as, `"%s":{"type":"score","score":1.7,"probabilities":{"0":0.1,"1":0.2,"2":0.6,"3":0.1},"confidence":%g}`, name, 0.2+float64(i%8)/10)
		}
	}
	req, derr := contract.DecodeRequest([]byte(`{"model":"nimble","state":"ticket","questions":{` + qs.String() + `}}`))
	if derr != nil {
		tb.Fatal(derr)
	}
	return req, []byte(`{"model":"nimble","answers":{` + as.String() + `},"usage":{"input_tokens":900,"output_tokens":64}}`)
}

func benchInput(tb testing.TB) *Input {
	req, body := benchRun(tb)
	resp, derr := contract.DecodeResponse(req, body)
	if derr != nil {
		tb.Fatal(derr)
	}
	in := &Input{RunID: "r-YhlsbmS4hMIXDNDrvRpmZ5", Caller: "support-eu", Model: "nimble", MinConfidence: 0.55,
		Questions: req.Questions, Answers: resp.Answers}
	for i, a := range resp.Answers {
		var c *contract.Calibrated
		if i%4 == 0 { // some questions have a fit
			c = &contract.Calibrated{Noul: f64(0.5), Confidence: f64(0.6), Probabilities: a.Probabilities, Temperature: 1.5}
		}
		in.Calibrated = append(in.Calibrated, c)
	}
	return in
}

// BenchmarkEvaluate64x20 is one decision's policy stage: 64 questions against 20 rules.
// Compare it with BenchmarkDecodeResponse64, run beside it.
func BenchmarkEvaluate64x20(b *testing.B) {
	p, in := benchPolicy(b), benchInput(b)
	out := p.Evaluate(in)
	rules := map[string]int{}
	for _, v := range out.Verdicts {
		rules[v.Rule]++
	}
	if len(rules) < 5 {
		b.Fatalf("the input exercises too few rules: %v", rules)
	}
	b.ReportAllocs()
	cpu := startCPU()
	for b.Loop() {
		p.Evaluate(in)
	}
	cpu.report(b)
}

// BenchmarkParse is one reload of the 20-rule file.
func BenchmarkParse(b *testing.B) {
	data := []byte(benchPolicySource())
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse(data); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecodeResponse64 is the reference for BenchmarkEvaluate64x20: decoding and checking
// the same run's provider response, which every decision does before the policy stage.
func BenchmarkDecodeResponse64(b *testing.B) {
	req, body := benchRun(b)
	b.ReportAllocs()
	cpu := startCPU()
	for b.Loop() {
		if _, err := contract.DecodeResponse(req, body); err != nil {
			b.Fatal(err)
		}
	}
	cpu.report(b)
}

// BenchmarkEvaluateTicket is the common case: the three questions of the ticket example
// against the 20 rules.
func BenchmarkEvaluateTicket(b *testing.B) {
	p, full := benchPolicy(b), benchInput(b)
	in := *full
	in.Questions, in.Answers, in.Calibrated = full.Questions[:3], full.Answers[:3], full.Calibrated[:3]
	b.ReportAllocs()
	cpu := startCPU()
	for b.Loop() {
		p.Evaluate(&in)
	}
	cpu.report(b)
}
