package policy

import (
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/sys1hq/sys1/contract"
)

func TestExampleFilesLoad(t *testing.T) {
	var got [][]Rule
	for _, name := range []string{"testdata/example.yaml", "testdata/example.json"} {
		data, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		p, err := Parse(data)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		rules := p.Rules()
		for i := range rules {
			rules[i].Line = 0 // the two files lay the rules out differently
			rules[i].nameLine = 0
		}
		got = append(got, rules)
	}
	y := got[0]
	if len(y) != 4 {
		t.Fatalf("%d rules", len(y))
	}
	r := y[0]
	if r.Name != "refunds" || r.Caller != "billing-*" || r.Question != "refund_*" || r.Model != "" ||
		r.MinConfidence != nil || r.MinProbability != nil || *r.NoulAbstainBetween != [2]float64{0.2, 0.8} ||
		r.Review != contract.ReviewHold || r.AuditSample != 0 || r.Use != UseRaw {
		t.Fatalf("rule 1: %+v", r)
	}
	if r := y[1]; r.Caller != "*" || r.Question != "*" || *r.NoulAbstainBetween != [2]float64{0.35, 0.65} ||
		r.Use != UseCalibrated || r.Review != contract.ReviewNotify {
		t.Fatalf("rule 2 (defaults): %+v", r)
	}
	if r := y[2]; *r.MinConfidence != 0.7 || *r.MinProbability != 0.6 || r.NoulAbstainBetween != nil {
		t.Fatalf("rule 3: %+v", r)
	}
	if r := y[3]; r.AuditSample != 0.02 || *r.MinConfidence != 0.5 {
		t.Fatalf("rule 4: %+v", r)
	}
	// JSON (with tabs) is the same policy as YAML.
	if !reflect.DeepEqual(got[0], got[1]) {
		t.Fatalf("YAML and JSON differ:\n%+v\n%+v", got[0], got[1])
	}
}

func TestEmptyPolicies(t *testing.T) {
	// No rules, said explicitly.
	for _, src := range []string{"rules: []\n", "# off for now\nrules: []\n", `{"rules": []}`} {
		p, err := Parse([]byte(src))
		if err != nil || p == nil || p.Len() != 0 {
			t.Errorf("%q: %v %v", src, p, err)
		}
	}
	// An empty file is what a reader sees in the middle of an in-place write: refused, so the
	// last good policy stays.
	for _, src := range []string{"", "\n\n", "# nothing yet\n", "---\n", "~\n", "rules:\n", "rules: ~\n", "{}"} {
		_, err := Parse([]byte(src))
		if err == nil || !strings.Contains(err.Error(), "`rules: []` for a policy with no rules") {
			t.Errorf("%q: %v", src, err)
		}
	}
}

func TestRuleLinesAndDefaults(t *testing.T) {
	p := mustParse(t, "# policy\nrules:\n\n  - name: a\n    model: \"nimble*\"\n    min_confidence: 1\n  - {name: b, audit_sample: 0.5}\n")
	rules := p.Rules()
	if rules[0].Line != 4 || rules[1].Line != 7 {
		t.Fatalf("lines %d %d", rules[0].Line, rules[1].Line)
	}
	if rules[0].Model != "nimble*" || !rules[0].hasModel || rules[1].hasModel {
		t.Fatalf("model: %+v", rules)
	}
	// An audit-only rule matches every type; one with a threshold only its types.
	if !rules[1].forNoul || !rules[1].forChoiceScore || rules[0].forNoul || !rules[0].forChoiceScore {
		t.Fatalf("types: %+v", rules)
	}
	// Rules returns a copy.
	rules[0].Name = "changed"
	if p.Rules()[0].Name != "a" {
		t.Fatal("Rules shares its slice")
	}
}

// Each bad file names the line and field of every problem, in one error.
func TestBadFiles(t *testing.T) {
	cases := []struct {
		name string
		src  string
		want []string // each a problem's text, in order
	}{
		{"not YAML", "rules:\n  - name: a\n    min_confidence: [0.5\n", []string{"not valid YAML: "}},
		{"unquoted glob with a star", "rules:\n  - name: a\n    question: *_label\n    min_confidence: 0.5\n", []string{`line 3: not valid YAML: *_label is an alias to no anchor (quote a glob that starts with * or [: question: "*_label")`}},
		{"unquoted glob with a class", "rules:\n  - name: a\n    caller: [ab]*\n    min_confidence: 0.5\n", []string{`line 3: not valid YAML: did not find expected alphabetic or numeric character (quote a glob`}},
		{"tab indentation", "rules:\n\t- name: a\n", []string{"line 2: not valid YAML: found character that cannot start any token"}},
		{"top level a list", "- name: a\n", []string{"line 1: the file must be a mapping with a `rules` list, not a list"}},
		{"top level a string", "hello\n", []string{`line 1: the file must be a mapping with a ` + "`rules`" + ` list, not the string "hello"`}},
		{"unknown top-level field", "rule:\n  - name: a\n", []string{`line 1: unknown field "rule" (did you mean rules?)`}},
		{"rules a mapping", "rules:\n  name: a\n", []string{"line 2: rules: must be a list of rules, not a mapping"}},
		{"rule a string", "rules:\n  - strict\n", []string{`line 2: rule 1: a rule must be a mapping of fields, not the string "strict"`}},
		{"unknown field with a suggestion", "rules:\n  - name: a\n    min_confidance: 0.5\n", []string{`line 3: rule 1 ("a"): unknown field "min_confidance" (did you mean min_confidence?)`}},
		{"unknown field without one", "rules:\n  - name: a\n    min_confidence: 0.5\n    colour: red\n", []string{`line 4: rule 1 ("a"): unknown field "colour"; a rule's fields are name, caller, question, model, min_confidence, min_probability, noul_abstain_between, max_error, review, audit_sample, use`}},
		{"field twice", "rules:\n  - name: a\n    min_confidence: 0.5\n    min_confidence: 0.6\n", []string{`line 4: rule 1 ("a"): min_confidence: given twice (first on line 3)`}},
		{"name missing", "rules:\n  - min_confidence: 0.5\n", []string{"line 2: rule 1: name is required"}},
		{"name blank", "rules:\n  - name: \" \"\n    min_confidence: 0.5\n", []string{"line 2: rule 1 (\" \"): name: must not be blank"}},
		{"name padded", "rules:\n  - name: \"a \"\n    min_confidence: 0.5\n", []string{"line 2: rule 1 (\"a \"): name: must not start or end with spaces"}},
		{"name a number", "rules:\n  - name: 12\n    min_confidence: 0.5\n", []string{"line 2: rule 1: name: must be a string, not the number 12 (quote it)"}},
		{"name null", "rules:\n  - name:\n    min_confidence: 0.5\n", []string{"line 2: rule 1: name: must be a string, not null (nothing)"}},
		{"name reserved", "rules:\n  - name: header\n    min_confidence: 0.5\n", []string{`line 2: rule 1 ("header"): name: "header" is reserved for verdicts of Sys1-Min-Confidence alone`}},
		{"name too long", "rules:\n  - name: " + strings.Repeat("n", 65) + "\n    min_confidence: 0.5\n", []string{"name: is 65 bytes; the limit is 64"}},
		{"name with a control character", "rules:\n  - name: \"a\\tb\"\n    min_confidence: 0.5\n", []string{"name: must not contain control characters or invalid UTF-8"}},
		{"duplicate names", "rules:\n  - name: a\n    min_confidence: 0.5\n  - name: a\n    min_confidence: 0.6\n", []string{`line 4: rule 2 ("a"): name: duplicate rule name (first on line 2)`}},
		{"number above 1", "rules:\n  - name: a\n    min_confidence: 1.5\n", []string{`line 3: rule 1 ("a"): min_confidence: 1.5 is not in [0, 1]`}},
		{"negative number", "rules:\n  - name: a\n    min_probability: -0.1\n", []string{`line 3: rule 1 ("a"): min_probability: -0.1 is not in [0, 1]`}},
		{"NaN", "rules:\n  - name: a\n    min_confidence: .nan\n", []string{`line 3: rule 1 ("a"): min_confidence: .nan is not in [0, 1]`}},
		{"infinity", "rules:\n  - name: a\n    audit_sample: .inf\n", []string{`line 3: rule 1 ("a"): audit_sample: .inf is not in [0, 1]`}},
		{"huge", "rules:\n  - name: a\n    min_confidence: 1e400\n", []string{`line 3: rule 1 ("a"): min_confidence: `}},
		{"quoted number", "rules:\n  - name: a\n    min_confidence: \"0.5\"\n", []string{`line 3: rule 1 ("a"): min_confidence: must be a number in [0, 1], not the string "0.5"`}},
		{"boolean number", "rules:\n  - name: a\n    min_confidence: true\n", []string{`line 3: rule 1 ("a"): min_confidence: must be a number in [0, 1], not the boolean true`}},
		{"list for a number", "rules:\n  - name: a\n    min_confidence: [0.5]\n", []string{`line 3: rule 1 ("a"): min_confidence: must be a number in [0, 1], not a list`}},
		{"band lo > hi", "rules:\n  - name: a\n    noul_abstain_between: [0.8, 0.2]\n", []string{`line 3: rule 1 ("a"): noul_abstain_between: lo 0.8 is above hi 0.2`}},
		{"band of one", "rules:\n  - name: a\n    noul_abstain_between: [0.3]\n", []string{`line 3: rule 1 ("a"): noul_abstain_between: must be a list of two probabilities [lo, hi], not a list`}},
		{"band a number", "rules:\n  - name: a\n    noul_abstain_between: 0.3\n", []string{`noul_abstain_between: must be a list of two probabilities [lo, hi], not the number 0.3`}},
		{"band element out of range", "rules:\n  - name: a\n    noul_abstain_between:\n      - 0.3\n      - 7\n", []string{`line 5: rule 1 ("a"): noul_abstain_between: 7 is not in [0, 1]`}},
		{"bad glob", "rules:\n  - name: a\n    caller: \"billing-[\"\n    min_confidence: 0.5\n", []string{`line 3: rule 1 ("a"): caller: glob "billing-[" has an unterminated '[' class`}},
		{"bad question glob", "rules:\n  - name: a\n    question: 'x\\'\n    min_confidence: 0.5\n", []string{`line 3: rule 1 ("a"): question: glob "x\\" ends in a lone '\'`}},
		{"empty model glob", "rules:\n  - name: a\n    model: \"\"\n    min_confidence: 0.5\n", []string{`line 3: rule 1 ("a"): model: glob "" must not be empty`}},
		{"reversed range", "rules:\n  - name: a\n    caller: \"[z-a]\"\n    min_confidence: 0.5\n", []string{`caller: glob "[z-a]" has a character range whose start is after its end`}},
		{"bad review", "rules:\n  - name: a\n    min_confidence: 0.5\n    review: maybe\n", []string{`line 4: rule 1 ("a"): review: "maybe" is not a review mode: none, notify or hold`}},
		{"review no (YAML 1.1 boolean)", "rules:\n  - name: a\n    min_confidence: 0.5\n    review: no\n", []string{`review: "no" is not a review mode: none, notify or hold`}},
		{"bad use", "rules:\n  - name: a\n    min_confidence: 0.5\n    use: fitted\n", []string{`line 4: rule 1 ("a"): use: "fitted" is not raw or calibrated`}},
		{"nothing to do", "rules:\n  - name: idle\n    question: refund_*\n", []string{`line 2: rule 1 ("idle"): the rule has nothing to do: set min_confidence, min_probability, noul_abstain_between, max_error or audit_sample`}},
		{"audit zero only", "rules:\n  - name: idle\n    audit_sample: 0\n", []string{`rule 1 ("idle"): the rule has nothing to do`}},
		{"review without a threshold", "rules:\n  - name: a\n    audit_sample: 0.1\n    review: hold\n", []string{`line 2: rule 1 ("a"): review: has no effect: the rule sets no threshold, so it never abstains (audit samples are always queued as notify)`}},
		{"use without a threshold", "rules:\n  - name: a\n    audit_sample: 0.1\n    use: calibrated\n", []string{`line 2: rule 1 ("a"): use: has no effect: the rule sets no threshold`}},
		{"alias", "rules:\n  - name: a\n    min_confidence: &m 0.5\n  - name: b\n    min_confidence: *m\n", []string{`line 5: rule 2 ("b"): min_confidence: aliases (*m) are not supported: write the value out`}},
		{"two documents", "rules: []\n---\nrules: []\n", []string{"line 2: a second YAML document: a policy file holds one"}},
		{"key a list", "rules:\n  - name: a\n    [x]: 1\n    min_confidence: 0.5\n", []string{`line 3: rule 1 ("a"): a key must be a field name, not a list`}},
		{"custom tag", "rules:\n  - name: !secret a\n    min_confidence: 0.5\n", []string{`line 2: rule 1: name: must be a string, not a value tagged !secret (quote it)`}},
		{"too big", "rules: []\n" + strings.Repeat("#", MaxFileBytes), []string{"the file is 1048586 bytes; the limit is 1048576"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, err := Parse([]byte(c.src))
			if err == nil {
				t.Fatalf("accepted: %+v", p.Rules())
			}
			var pe *ParseError
			if !errors.As(err, &pe) {
				t.Fatalf("error %T %v", err, err)
			}
			if len(pe.Problems) != len(c.want) {
				t.Fatalf("%d problems, want %d: %v", len(pe.Problems), len(c.want), err)
			}
			for i, w := range c.want {
				if got := pe.Problems[i].String(); !strings.Contains(got, w) {
					t.Errorf("problem %d:\n got %s\nwant %s", i, got, w)
				}
			}
		})
	}
}

// A file with many problems reports all of them at once, in line order, each with its line
// and field, and loads no rule.
func TestBadFileReportsEveryProblem(t *testing.T) {
	data, err := os.ReadFile("testdata/bad.yaml")
	if err != nil {
		t.Fatal(err)
	}
	_, err = Parse(data)
	var pe *ParseError
	if !errors.As(err, &pe) {
		t.Fatalf("%v", err)
	}
	want := []struct {
		line  int
		field string
		text  string
	}{
		{3, "min_confidence", "1.5 is not in [0, 1]"},
		{4, "review", `"maybe" is not a review mode`},
		{5, "name", "duplicate rule name (first on line 2)"},
		{6, "", `unknown field "min_confidance" (did you mean min_confidence?)`},
		{7, "caller", "unterminated '[' class"},
		{7, "", "name is required"},
		{8, "noul_abstain_between", "lo 0.8 is above hi 0.2"},
		{10, "min_probability", `not the string "0.6"`},
		{11, "use", `"sometimes" is not raw or calibrated`},
		{12, "", "the rule has nothing to do"},
	}
	if len(pe.Problems) != len(want) {
		t.Fatalf("%d problems, want %d:\n%v", len(pe.Problems), len(want), err)
	}
	for i, w := range want {
		p := pe.Problems[i]
		if p.Line != w.line || p.Field != w.field || !strings.Contains(p.Message, w.text) {
			t.Errorf("problem %d: %+v, want line %d field %q %q", i, p, w.line, w.field, w.text)
		}
	}
	msg := err.Error()
	if !strings.HasPrefix(msg, "policy has 10 problems: line 3: ") {
		t.Fatalf("message: %s", msg)
	}
	for _, w := range want {
		if !strings.Contains(msg, w.text) {
			t.Errorf("message lacks %q", w.text)
		}
	}
}

func TestProblemCountIsBounded(t *testing.T) {
	var b strings.Builder
	b.WriteString("rules:\n")
	for i := 0; i < 200; i++ {
		b.WriteString("  - name: x\n    min_confidence: 2\n")
	}
	_, err := Parse([]byte(b.String()))
	var pe *ParseError
	if !errors.As(err, &pe) || len(pe.Problems) != maxProblems || pe.More == 0 {
		t.Fatalf("%v", err)
	}
	if !strings.HasSuffix(err.Error(), "more") || !strings.Contains(err.Error(), "problems") {
		t.Fatalf("message: %.200s", err.Error())
	}
	b.Reset()
	b.WriteString("rules:\n")
	for i := 0; i <= MaxRules; i++ {
		b.WriteString("  - {name: r, min_confidence: 0.5}\n")
	}
	if _, err := Parse([]byte(b.String())); err == nil || !strings.Contains(err.Error(), "the limit is 1000") {
		t.Fatalf("too many rules: %.200v", err)
	}
}
