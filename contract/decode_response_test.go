package contract

import (
	"fmt"
	"strings"
	"testing"
)

// answers builds a response body for the ticket example with the three answers given.
func answers(label, refund, urgency string) string {
	parts := []string{}
	if label != "" {
		parts = append(parts, `"label":`+label)
	}
	if refund != "" {
		parts = append(parts, `"refund_requested":`+refund)
	}
	if urgency != "" {
		parts = append(parts, `"urgency":`+urgency)
	}
	return `{"model":"nimble","answers":{` + strings.Join(parts, ",") + `},"usage":{"input_tokens":174,"output_tokens":1}}`
}

const (
	goodLabel   = `{"type":"choice","choice":"bug","probabilities":{"billing":0.0125,"bug":0.9781,"account":0.0093},"confidence":0.8906}`
	goodRefund  = `{"type":"noul","noul":0.99}`
	goodUrgency = `{"type":"score","score":1.7,"probabilities":{"0":0.1,"1":0.1,"2":0.8},"confidence":0.6,"legend":{"0":"calm","1":"annoyed","2":"angry"}}`
)

// TestDecodeResponseRules covers every response rule, valid and invalid.
func TestDecodeResponseRules(t *testing.T) {
	tests := []struct {
		name string
		body string
		want []string
	}{
		{"valid", answers(goodLabel, goodRefund, goodUrgency), nil},
		{"any order", `{"answers":{"urgency":` + goodUrgency + `,"refund_requested":` + goodRefund + `,"label":` + goodLabel + `}}`, nil},
		{"legend as array", answers(goodLabel, goodRefund, `{"type":"score","score":2,"probabilities":{"0":0,"1":0,"2":1},"legend":["calm","annoyed","angry"]}`), nil},
		{"sum within tolerance", answers(`{"type":"choice","choice":"bug","probabilities":{"billing":0.01,"bug":0.97,"account":0.0}}`, goodRefund, goodUrgency), nil},
		{"noul with probabilities", answers(goodLabel, `{"type":"noul","noul":0.25,"probabilities":{"true":0.25,"false":0.75}}`, goodUrgency), nil},
		{"confidence null", answers(goodLabel, `{"type":"noul","noul":0.5,"confidence":null}`, goodUrgency), nil},
		{"extra fields kept", `{"model":"m","answers":{"label":` + goodLabel + `,"refund_requested":{"type":"noul","noul":1,"why":[1]},"urgency":` + goodUrgency + `},"done":true}`, nil},
		{"usage optional", `{"answers":{"label":` + goodLabel + `,"refund_requested":` + goodRefund + `,"urgency":` + goodUrgency + `}}`, nil},

		{"not an object", `[]`, []string{"body: invalid JSON at byte 0: the response must be a JSON object"}},
		{"invalid UTF-8", "{\"model\":\"\xfe\"}", []string{"body: invalid UTF-8"}},
		{"too deep", `{"x":` + strings.Repeat("[", 70) + strings.Repeat("]", 70) + `}`, []string{"body: nesting deeper than 64 levels"}},
		{"answers missing", `{"model":"m"}`, []string{"answers: required"}},
		{"answers not object", `{"answers":[]}`, []string{"answers: must be an object of named answers, got an array"}},
		{"missing answer", answers(goodLabel, "", goodUrgency), []string{"answers.refund_requested: missing"}},
		{"unknown answer", `{"answers":{"label":` + goodLabel + `,"refund_requested":` + goodRefund + `,"urgency":` + goodUrgency + `,"mood":{"type":"noul","noul":1}}}`, []string{"answers.mood: answers no question of the request"}},
		{"duplicate answer", `{"answers":{"label":` + goodLabel + `,"label":` + goodLabel + `,"refund_requested":` + goodRefund + `,"urgency":` + goodUrgency + `}}`, []string{`answers: duplicate key "label"`}},
		{"duplicate top-level key", `{"model":"a","model":"b","answers":{"label":` + goodLabel + `,"refund_requested":` + goodRefund + `,"urgency":` + goodUrgency + `}}`, []string{"model: duplicate key"}},
		{"duplicate key in extra", `{"x":{"a":1,"a":2},"answers":{"label":` + goodLabel + `,"refund_requested":` + goodRefund + `,"urgency":` + goodUrgency + `}}`, []string{`x: duplicate key "a"`}},
		{"answer not object", answers(`"bug"`, goodRefund, goodUrgency), []string{"answers.label: must be an object, got a string"}},
		{"type missing", answers(`{"choice":"bug","probabilities":{"billing":0.0125,"bug":0.9781,"account":0.0093}}`, goodRefund, goodUrgency), []string{"answers.label.type: required"}},
		{"type differs", answers(goodRefund, goodRefund, goodUrgency), []string{`answers.label.type: must be "choice" (the question's type), got "noul"`}},
		{"choice not an option", answers(`{"type":"choice","choice":"sales","probabilities":{"billing":0.0125,"bug":0.9781,"account":0.0093}}`, goodRefund, goodUrgency), []string{`answers.label.choice: "sales" is not one of the options (billing, bug, account)`}},
		{"choice missing", answers(`{"type":"choice","probabilities":{"billing":0.0125,"bug":0.9781,"account":0.0093}}`, goodRefund, goodUrgency), []string{"answers.label.choice: required"}},
		{"choice wrong type", answers(`{"type":"choice","choice":1,"probabilities":{"billing":0.0125,"bug":0.9781,"account":0.0093}}`, goodRefund, goodUrgency), []string{"answers.label.choice: must be a string, got a number"}},
		{"probabilities missing", answers(`{"type":"choice","choice":"bug"}`, goodRefund, goodUrgency), []string{"answers.label.probabilities: required"}},
		{"probability key missing", answers(`{"type":"choice","choice":"bug","probabilities":{"billing":0.02,"bug":0.98}}`, goodRefund, goodUrgency), []string{`answers.label.probabilities: missing "account"`}},
		{"probability unknown key", answers(`{"type":"choice","choice":"bug","probabilities":{"billing":0.01,"bug":0.98,"account":0.01,"sales":0}}`, goodRefund, goodUrgency), []string{"answers.label.probabilities.sales: is not a key of the question"}},
		{"probability out of range", answers(`{"type":"choice","choice":"bug","probabilities":{"billing":-0.5,"bug":1.5,"account":0}}`, goodRefund, goodUrgency), []string{"answers.label.probabilities.billing: must be in [0, 1], got -0.5", "answers.label.probabilities.bug: must be in [0, 1], got 1.5"}},
		{"probability infinite", answers(`{"type":"choice","choice":"bug","probabilities":{"billing":1e999,"bug":0,"account":0}}`, goodRefund, goodUrgency), []string{"answers.label.probabilities.billing: must be in [0, 1], got +Inf"}},
		{"probability not a number", answers(`{"type":"choice","choice":"bug","probabilities":{"billing":"0.1","bug":0.9,"account":0}}`, goodRefund, goodUrgency), []string{"answers.label.probabilities.billing: must be a number, got a string"}},
		{"sum off", answers(`{"type":"choice","choice":"bug","probabilities":{"billing":0.1,"bug":0.8,"account":0.05}}`, goodRefund, goodUrgency), []string{"answers.label.probabilities: sum to 0.9500, not 1"}},
		{"duplicate probability", answers(`{"type":"choice","choice":"bug","probabilities":{"bug":0.5,"bug":0.5,"billing":0,"account":0}}`, goodRefund, goodUrgency), []string{`answers.label.probabilities: duplicate key "bug"`}},
		{"confidence out of range", answers(`{"type":"choice","choice":"bug","probabilities":{"billing":0.0125,"bug":0.9781,"account":0.0093},"confidence":1.2}`, goodRefund, goodUrgency), []string{"answers.label.confidence: must be in [0, 1], got 1.2"}},
		{"noul out of range", answers(goodLabel, `{"type":"noul","noul":1.01}`, goodUrgency), []string{"answers.refund_requested.noul: must be a probability in [0, 1], got 1.01"}},
		{"noul missing", answers(goodLabel, `{"type":"noul"}`, goodUrgency), []string{"answers.refund_requested.noul: required"}},
		{"noul wrong type", answers(goodLabel, `{"type":"noul","noul":true}`, goodUrgency), []string{"answers.refund_requested.noul: must be a number, got a boolean"}},
		{"noul bad probabilities", answers(goodLabel, `{"type":"noul","noul":0.5,"probabilities":{"yes":0.5,"no":0.5}}`, goodUrgency), []string{"answers.refund_requested.probabilities.yes: is not a key", "answers.refund_requested.probabilities.no: is not a key", `answers.refund_requested.probabilities: missing "true"`, `answers.refund_requested.probabilities: missing "false"`}},
		{"score above N-1", answers(goodLabel, goodRefund, `{"type":"score","score":2.5,"probabilities":{"0":0.1,"1":0.1,"2":0.8}}`), []string{"answers.urgency.score: must be in [0, 2], got 2.5"}},
		{"score negative", answers(goodLabel, goodRefund, `{"type":"score","score":-0.1,"probabilities":{"0":0.1,"1":0.1,"2":0.8}}`), []string{"answers.urgency.score: must be in [0, 2], got -0.1"}},
		{"score missing", answers(goodLabel, goodRefund, `{"type":"score","probabilities":{"0":0.1,"1":0.1,"2":0.8}}`), []string{"answers.urgency.score: required"}},
		{"score probability keys are indexes", answers(goodLabel, goodRefund, `{"type":"score","score":1,"probabilities":{"calm":0.1,"1":0.1,"2":0.8}}`), []string{"answers.urgency.probabilities.calm: is not a key of the question (0, 1, 2)", `answers.urgency.probabilities: missing "0"`}},
		{"legend bad index", answers(goodLabel, goodRefund, `{"type":"score","score":1,"probabilities":{"0":0.1,"1":0.1,"2":0.8},"legend":{"3":"x"}}`), []string{"answers.urgency.legend.3: is not a level index (0–2)"}},
		{"legend too long array", answers(goodLabel, goodRefund, `{"type":"score","score":1,"probabilities":{"0":0.1,"1":0.1,"2":0.8},"legend":["a","b","c","d"]}`), []string{"answers.urgency.legend.3: is not a level index (0–2)"}},
		{"legend wrong kind", answers(goodLabel, goodRefund, `{"type":"score","score":1,"probabilities":{"0":0.1,"1":0.1,"2":0.8},"legend":"calm"}`), []string{"answers.urgency.legend: must be an object or an array of level labels, got a string"}},
		{"legend label not string", answers(goodLabel, goodRefund, `{"type":"score","score":1,"probabilities":{"0":0.1,"1":0.1,"2":0.8},"legend":[1]}`), []string{"answers.urgency.legend[0]: must be a string, got a number"}},
		{"usage negative", `{"answers":{"label":` + goodLabel + `,"refund_requested":` + goodRefund + `,"urgency":` + goodUrgency + `},"usage":{"input_tokens":-1,"output_tokens":1.5}}`, []string{"usage.input_tokens: must be a non-negative integer, got -1", "usage.output_tokens: must be a non-negative integer, got 1.5"}},
		{"usage wrong type", `{"answers":{"label":` + goodLabel + `,"refund_requested":` + goodRefund + `,"urgency":` + goodUrgency + `},"usage":[]}`, []string{"usage: must be an object, got an array"}},
		{"model wrong type", `{"model":1,"answers":{"label":` + goodLabel + `,"refund_requested":` + goodRefund + `,"urgency":` + goodUrgency + `}}`, []string{"model: must be a string, got a number"}},
	}
	req := ticketRequest(t)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := DecodeResponse(req, []byte(tc.body))
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("want valid, got %v", err)
				}
				if len(resp.Answers) != 3 || resp.Answers[0].Name != "label" || resp.Answers[2].Name != "urgency" {
					t.Fatalf("answers not in request order: %+v", resp.Answers)
				}
				return
			}
			if err == nil {
				t.Fatalf("want %q, got a valid response", tc.want)
			}
			if err.Code != CodeUpstreamError || !err.Transient() || !strings.HasPrefix(err.Message, "[SYS1_UPSTREAM_ERROR] ") {
				t.Fatalf("want SYS1_UPSTREAM_ERROR, got %s %q", err.Code, err.Message)
			}
			expectProblems(t, err, tc.want)
		})
	}
}

// TestDecodeResponseCopiesBody: the caller may reuse its buffer once DecodeResponse returns.
func TestDecodeResponseCopiesBody(t *testing.T) {
	req := ticketRequest(t)
	body := []byte(answers(goodLabel, goodRefund, goodUrgency))
	resp, err := DecodeResponse(req, body)
	if err != nil {
		t.Fatal(err)
	}
	for i := range body {
		body[i] = 'x'
	}
	if string(resp.Answers[0].Raw) != goodLabel {
		t.Fatalf("Raw aliases the caller's buffer: %s", resp.Answers[0].Raw)
	}
}

// TestDecodeResponseBoundsHostileCounts: oversized distributions and legends are rejected
// without keeping every entry.
func TestDecodeResponseBoundsHostileCounts(t *testing.T) {
	var probs, legend strings.Builder
	for i := 0; i < 100000; i++ {
		if i > 0 {
			probs.WriteByte(',')
			legend.WriteByte(',')
		}
		fmt.Fprintf(&probs, `"k%d":0`, i)
		legend.WriteString(`"x"`)
	}
	req := ticketRequest(t)
	for name, tc := range map[string]struct{ body, want string }{
		"probabilities": {answers(`{"type":"choice","choice":"bug","probabilities":{`+probs.String()+`}}`, goodRefund, goodUrgency), "answers.label.probabilities: more than 26 entries"},
		"legend":        {answers(goodLabel, goodRefund, `{"type":"score","score":1,"probabilities":{"0":0.1,"1":0.1,"2":0.8},"legend":[`+legend.String()+`]}`), "answers.urgency.legend: more than 26 levels"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := DecodeResponse(req, []byte(tc.body))
			if err == nil || !strings.Contains(err.Message, tc.want) {
				t.Fatalf("want %q, got %v", tc.want, err)
			}
		})
	}
}
