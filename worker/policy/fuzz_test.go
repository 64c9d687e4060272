package policy

import (
	"errors"
	"math"
	"os"
	"strings"
	"testing"

	"github.com/sys1hq/sys1/contract"
)

// FuzzParsePolicy feeds the parser arbitrary files. It must never panic; a refused file
// is one *ParseError of bounded size; an accepted one holds only valid rules, parses the same
// again, and evaluates any answer without panicking.
func FuzzParsePolicy(f *testing.F) {
	for _, name := range []string{"testdata/example.yaml", "testdata/example.json", "testdata/bad.yaml"} {
		data, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	for _, s := range []string{
		"rules: []",
		"rules:\n  - {name: a, min_confidence: 0.5, review: hold}\n",
		"rules:\n  - name: a\n    noul_abstain_between: [0.2, 0.8]\n    use: calibrated\n",
		"rules:\n  - name: a\n    caller: 'x[!a-c]\\*?'\n    audit_sample: 0.5\n",
		"rules:\n  - {name: a, max_error: 0.02, audit_sample: 0.05}\n  - {name: b, max_error: 1e-9, min_confidence: 0.5}\n",
		"rules:\n  - &r {name: a, min_confidence: 0.5}\n  - *r\n",
		"rules:\n  - name: a\n    <<: {min_confidence: 0.5}\n",
		"rules: [{name: a, min_probability: 1e-3}, {name: b, min_probability: 0x1}]",
		"%YAML 1.2\n---\nrules: []\n...\n",
		"rules:\n  - name: \"\\u0000\"\n    min_confidence: .5\n",
		"rules: [[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]",
	} {
		f.Add([]byte(s))
	}
	qs := []contract.Question{{Name: "c", Type: contract.TypeChoice}, {Name: "n", Type: contract.TypeNoul}, {Name: "s", Type: contract.TypeScore}, {Name: "x", Type: "other"}}
	as := []contract.Answer{
		{Name: "c", Type: contract.TypeChoice, Choice: "a", Confidence: f64(math.NaN()), Probabilities: []contract.Probability{{Key: "a", P: 2}}},
		{Name: "n", Type: contract.TypeNoul, Noul: math.Inf(1)},
		{Name: "s", Type: contract.TypeScore, Confidence: f64(1.5), Probabilities: []contract.Probability{{Key: "0", P: math.NaN()}}},
	}
	cal := []*contract.Calibrated{{Confidence: f64(-1)}, {Noul: f64(math.NaN())}, nil}
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := Parse(data)
		if err != nil {
			var pe *ParseError
			if !errors.As(err, &pe) || len(pe.Problems) == 0 || len(pe.Problems) > maxProblems {
				t.Fatalf("error %T with %v", err, err)
			}
			if p != nil {
				t.Fatal("a policy returned with an error")
			}
			return
		}
		names := map[string]bool{}
		for _, r := range p.Rules() {
			if checkName(r.Name) != "" || names[r.Name] {
				t.Fatalf("bad or repeated name %q accepted", r.Name)
			}
			names[r.Name] = true
			for _, v := range []*float64{r.MinConfidence, r.MinProbability} {
				if v != nil && !validProbability(*v) {
					t.Fatalf("threshold %v accepted", *v)
				}
			}
			if m := r.MaxError; m != nil && !(*m > 0 && *m < 1) {
				t.Fatalf("max_error %v accepted", *m)
			}
			if b := r.NoulAbstainBetween; b != nil && (!validProbability(b[0]) || !validProbability(b[1]) || b[0] > b[1]) {
				t.Fatalf("band %v accepted", *b)
			}
			if !validProbability(r.AuditSample) || (!r.forChoiceScore && !r.forNoul) {
				t.Fatalf("rule %+v accepted", r)
			}
		}
		again, err := Parse(data)
		if err != nil || again.Len() != p.Len() {
			t.Fatalf("second parse differs: %v", err)
		}
		out := p.Evaluate(&Input{RunID: "r", Caller: "c", Model: "m", Questions: qs, Answers: as, Calibrated: cal, MinConfidence: 0.5,
			Risk: []RiskFit{fakeRisk{t: 0.5, certified: 0}, fakeRisk{t: 0.5, certified: 0, calibrated: true}, fakeRisk{t: 0.5, certified: 0, probability: true}}})
		if len(out.Verdicts) != len(qs) {
			t.Fatalf("%d verdicts", len(out.Verdicts))
		}
		for _, v := range out.Verdicts[:3] {
			// Every figure above is bad: whatever judged it must abstain.
			// A rule without a threshold decides anything; its reason says so (and may go on
			// to say the answer was sampled for audit).
			if v.Rule != "" && v.Status != contract.VerdictAbstained && !strings.HasPrefix(v.Reason, "no threshold set") {
				t.Fatalf("bad figures decided: %+v", v)
			}
		}
	})
}
