package policy

import (
	"os"
	"strings"
	"testing"

	"github.com/sys1hq/sys1/contract"
)

// The README's walk-through: the example policy judging the ticket example
// (contract/examples/ticket.json) for two callers.
func TestReadmeExample(t *testing.T) {
	src, err := os.ReadFile("testdata/example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	p := mustParse(t, string(src))
	body, err := os.ReadFile("../../contract/examples/ticket.json")
	if err != nil {
		t.Fatal(err)
	}
	req, derr := contract.DecodeRequest(body)
	if derr != nil {
		t.Fatal(derr)
	}
	const answer = `{"model":"nimble","answers":{` +
		`"label":{"type":"choice","choice":"bug","probabilities":{"billing":0.31,"bug":0.64,"account":0.05},"confidence":0.62},` +
		`"refund_requested":{"type":"noul","noul":0.55},` +
		`"urgency":{"type":"score","score":1.7,"probabilities":{"0":0.1,"1":0.1,"2":0.8},"confidence":0.6}},` +
		`"usage":{"input_tokens":174,"output_tokens":1}}`
	resp, derr := contract.DecodeResponse(req, []byte(answer))
	if derr != nil {
		t.Fatal(derr)
	}
	judge := func(caller string, header float64) string {
		out := p.Evaluate(&Input{RunID: "r-YhlsbmS4hMIXDNDrvRpmZ5", Caller: caller, Model: req.Model,
			Questions: req.Questions, Answers: resp.Answers, MinConfidence: header})
		var b strings.Builder
		for _, v := range out.Verdicts {
			b.WriteString(v.Question + ": " + string(v.Status) + " by " + v.Rule + ": " + v.Reason + "\n")
		}
		for _, r := range out.Review {
			b.WriteString("review " + r.Question + " " + r.Mode + "\n")
		}
		return b.String()
	}
	cases := []struct {
		caller string
		header float64
		want   string
	}{
		{"billing-eu", 0, `label: abstained by routing: confidence 0.62 < 0.70
refund_requested: abstained by refunds: P(yes) 0.55 in [0.20, 0.80]
urgency: decided by default: confidence 0.60 >= 0.50
review label notify
review refund_requested hold
`},
		{"support", 0, `label: abstained by routing: confidence 0.62 < 0.70
refund_requested: abstained by yes-no: P(yes) 0.55 in [0.35, 0.65] (raw: no calibration fit)
urgency: decided by default: confidence 0.60 >= 0.50
review label notify
review refund_requested notify
`},
		{"support", 0.65, `label: abstained by routing: confidence 0.62 < 0.70
refund_requested: abstained by yes-no: P(yes) 0.55 in [0.35, 0.65] (raw: no calibration fit)
urgency: abstained by default: confidence 0.60 < 0.65 (Sys1-Min-Confidence)
review label notify
review refund_requested notify
review urgency notify
`},
	}
	for _, c := range cases {
		if got := judge(c.caller, c.header); got != c.want {
			t.Errorf("caller %s, header %v:\n%s\nwant:\n%s", c.caller, c.header, got, c.want)
		}
	}
}
