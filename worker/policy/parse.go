package policy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"

	"github.com/sys1hq/sys1/contract"
)

// Limits of a policy file. Evaluation walks the rules on every decision; a file beyond these
// is a mistake (a generated file gone wrong), not a policy.
const (
	MaxFileBytes = 1 << 20
	MaxRules     = 1000
	maxNameBytes = 64
	maxProblems  = 50
)

// Problem is one bad line of a policy file.
type Problem struct {
	Line int // 1-based; 0 when the problem is the file as a whole
	// Rule is the rule's position (1-based) and Name its name when known; Field the field.
	Rule    int
	Name    string
	Field   string
	Message string
}

func (p Problem) String() string {
	var b strings.Builder
	if p.Line > 0 {
		fmt.Fprintf(&b, "line %d: ", p.Line)
	}
	if p.Rule > 0 {
		fmt.Fprintf(&b, "rule %d", p.Rule)
		if p.Name != "" {
			fmt.Fprintf(&b, " (%s)", strconv.Quote(p.Name))
		}
		b.WriteString(": ")
	}
	if p.Field != "" {
		b.WriteString(p.Field)
		b.WriteString(": ")
	}
	b.WriteString(p.Message)
	return b.String()
}

// ParseError is every problem of a policy file, in line order, in one error.
type ParseError struct {
	Problems []Problem
	// More counts problems left out after the first maxProblems.
	More int
}

func (e *ParseError) Error() string {
	var b strings.Builder
	if n := len(e.Problems) + e.More; n > 1 {
		fmt.Fprintf(&b, "policy has %d problems: ", n)
	} else {
		b.WriteString("policy: ")
	}
	for i, p := range e.Problems {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(p.String())
	}
	if e.More > 0 {
		fmt.Fprintf(&b, "; and %d more", e.More)
	}
	return b.String()
}

// The fields of a rule, in the order the documentation lists them.
var ruleFields = []string{
	"name", "caller", "question", "model",
	"min_confidence", "min_probability", "noul_abstain_between", "max_error",
	"review", "audit_sample", "use",
}

// errEmpty refuses an empty file. A file being written in place is empty for a moment (and
// `rules:` with nothing after it is a prefix of every policy): read then, it must not switch
// every rule off. A policy with no rules says so.
const errEmpty = "the file is empty: write `rules: []` for a policy with no rules"

// Parse reads a policy file: YAML (JSON is valid YAML) holding a mapping with one key,
// `rules`, a list of rules; `rules: []` is a policy with no rules, but an empty file is an
// error (errEmpty). Every problem is reported in one *ParseError, each naming its line and
// field.
func Parse(data []byte) (*Policy, error) {
	ps := &parser{}
	if len(data) > MaxFileBytes {
		ps.add(Problem{Message: fmt.Sprintf("the file is %d bytes; the limit is %d", len(data), MaxFileBytes)})
		return nil, ps.err()
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	switch err := dec.Decode(&doc); {
	case errors.Is(err, io.EOF):
		ps.add(Problem{Message: errEmpty})
		return nil, ps.err()
	case err != nil:
		ps.add(syntaxProblem(err, data))
		return nil, ps.err()
	}
	var extra yaml.Node
	switch err := dec.Decode(&extra); {
	case errors.Is(err, io.EOF):
	case err != nil:
		ps.add(syntaxProblem(err, data))
	default:
		ps.add(Problem{Line: extra.Line, Message: "a second YAML document: a policy file holds one"})
	}
	p := ps.document(&doc)
	if err := ps.err(); err != nil {
		return nil, err
	}
	return p, nil
}

var (
	yamlLine      = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)
	unknownAnchor = regexp.MustCompile(`^yaml: unknown anchor '(.*)' referenced$`)
	globLine      = regexp.MustCompile(`^\s*(-\s+)?(caller|question|model)\s*:\s*[*\[]`)
)

// globHint is added to YAML syntax errors on a glob field: an unquoted glob that starts with
// '*' reads as an alias and one that starts with '[' as a list.
const globHint = " (quote a glob that starts with * or [: question: \"*_label\")"

func syntaxProblem(err error, data []byte) Problem {
	msg := err.Error()
	lines := strings.Split(string(data), "\n")
	hint := func(line int) string {
		if line >= 1 && line <= len(lines) && globLine.MatchString(lines[line-1]) {
			return globHint
		}
		return ""
	}
	if m := yamlLine.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		return Problem{Line: line, Message: "not valid YAML: " + m[2] + hint(line)}
	}
	if m := unknownAnchor.FindStringSubmatch(msg); m != nil {
		// The parser names no line: find the alias.
		for i, l := range lines {
			if strings.Contains(l, "*"+m[1]) {
				return Problem{Line: i + 1, Message: "not valid YAML: *" + clipName(m[1]) + " is an alias to no anchor" + hint(i+1)}
			}
		}
	}
	return Problem{Message: "not valid YAML: " + strings.TrimPrefix(msg, "yaml: ")}
}

type parser struct {
	problems []Problem
	more     int
}

func (ps *parser) add(p Problem) {
	if len(ps.problems) >= maxProblems {
		ps.more++
		return
	}
	ps.problems = append(ps.problems, p)
}

func (ps *parser) err() error {
	if len(ps.problems) == 0 {
		return nil
	}
	sort.SliceStable(ps.problems, func(i, j int) bool { return ps.problems[i].Line < ps.problems[j].Line })
	return &ParseError{Problems: ps.problems, More: ps.more}
}

func (ps *parser) document(doc *yaml.Node) *Policy {
	p := &Policy{}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) == 0 {
		return p
	}
	root := doc.Content[0]
	if isNull(root) {
		ps.add(Problem{Line: root.Line, Message: errEmpty})
		return p
	}
	if root.Kind != yaml.MappingNode {
		ps.add(Problem{Line: root.Line, Message: "the file must be a mapping with a `rules` list, not " + describe(root)})
		return p
	}
	var rules *yaml.Node
	skipped := ps.fields(root, Problem{}, []string{"rules"}, func(key string, _, val *yaml.Node) {
		rules = val
	})
	switch {
	case rules == nil && skipped > 0:
		return p // a misspelt or aliased "rules", reported
	case rules == nil:
		ps.add(Problem{Line: root.Line, Message: "rules is required (`rules: []` for a policy with no rules)"})
		return p
	case isNull(rules):
		ps.add(Problem{Line: rules.Line, Field: "rules", Message: "is empty: write `rules: []` for a policy with no rules"})
		return p
	}
	if rules.Kind != yaml.SequenceNode {
		ps.add(Problem{Line: rules.Line, Field: "rules", Message: "must be a list of rules, not " + describe(rules)})
		return p
	}
	if len(rules.Content) > MaxRules {
		ps.add(Problem{Line: rules.Line, Field: "rules", Message: fmt.Sprintf("has %d rules; the limit is %d", len(rules.Content), MaxRules)})
		return p
	}
	firstLine := map[string]int{}
	for i, n := range rules.Content {
		r, ok := ps.rule(i+1, n)
		if r.Name != "" && checkName(r.Name) == "" {
			if line, dup := firstLine[r.Name]; dup {
				ps.add(Problem{Line: r.nameLine, Rule: i + 1, Name: r.Name, Field: "name", Message: fmt.Sprintf("duplicate rule name (first on line %d)", line)})
				ok = false
			} else {
				firstLine[r.Name] = r.nameLine
			}
		}
		if ok {
			p.rules = append(p.rules, r)
		}
	}
	return p
}

// fields walks a mapping, reporting aliases, non-string keys, duplicate and unknown keys, and
// calls fn for each good key in order. It returns how many keys it skipped with a problem.
func (ps *parser) fields(m *yaml.Node, at Problem, known []string, fn func(key string, k, v *yaml.Node)) (skipped int) {
	seen := map[string]int{}
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, v := m.Content[i], m.Content[i+1]
		prob := at
		prob.Line = k.Line
		if k.Kind != yaml.ScalarNode || k.ShortTag() != "!!str" {
			prob.Message = "a key must be a field name, not " + describe(k)
			ps.add(prob)
			skipped++
			continue
		}
		key := k.Value
		prob.Field = clipName(key)
		if line, dup := seen[key]; dup {
			prob.Message = fmt.Sprintf("given twice (first on line %d)", line)
			ps.add(prob)
			skipped++
			continue
		}
		seen[key] = k.Line
		if !contains(known, key) {
			prob.Field = ""
			prob.Message = "unknown field " + strconv.Quote(clipName(key))
			switch s := suggest(key, known); {
			case s != "":
				prob.Message += " (did you mean " + s + "?)"
			case len(known) > 1:
				prob.Message += "; a rule's fields are " + strings.Join(known, ", ")
			default:
				prob.Message += "; the only top-level field is " + known[0]
			}
			ps.add(prob)
			skipped++
			continue
		}
		if v.Kind == yaml.AliasNode {
			prob.Line = v.Line
			prob.Message = "aliases (*" + clipName(v.Value) + ") are not supported: write the value out"
			if key == "caller" || key == "question" || key == "model" {
				prob.Message += globHint
			}
			ps.add(prob)
			skipped++
			continue
		}
		fn(key, k, v)
	}
	return skipped
}

// rule parses one rule; ok is false when it had a problem (already reported).
func (ps *parser) rule(idx int, n *yaml.Node) (Rule, bool) {
	r := Rule{Line: n.Line, Caller: "*", Question: "*", Review: contract.ReviewNotify, Use: UseRaw}
	before := len(ps.problems) + ps.more
	if n.Kind != yaml.MappingNode {
		ps.add(Problem{Line: n.Line, Rule: idx, Message: "a rule must be a mapping of fields, not " + describe(n)})
		return r, false
	}
	// The name first, so every other problem of the rule can quote it; and whether the rule
	// tries to do anything, even with a bad value (that problem is then the one to report).
	var hasName, hasReview, hasUse, hasWork bool
	for i := 0; i+1 < len(n.Content); i += 2 {
		k := n.Content[i]
		if k.Kind != yaml.ScalarNode {
			continue
		}
		switch k.Value {
		case "name":
			if v := n.Content[i+1]; r.nameLine == 0 && v.Kind == yaml.ScalarNode && v.ShortTag() == "!!str" {
				r.Name, r.nameLine = v.Value, v.Line
			}
		case "min_confidence", "min_probability", "noul_abstain_between", "max_error", "audit_sample":
			hasWork = true
		}
	}
	at := Problem{Rule: idx, Name: clipName(r.Name)}
	var audit float64
	skipped := ps.fields(n, at, ruleFields, func(key string, k, v *yaml.Node) {
		prob := at
		prob.Line, prob.Field = v.Line, key
		bad := func(msg string) { prob.Message = msg; ps.add(prob) }
		switch key {
		case "name":
			hasName = true
			s, ok := ps.str(v, prob)
			if !ok {
				return
			}
			if msg := checkName(s); msg != "" {
				bad(msg)
			}
		case "caller", "question", "model":
			s, ok := ps.str(v, prob)
			if !ok {
				return
			}
			g, err := compileGlob(s)
			if err != nil {
				bad("glob " + strconv.Quote(clipName(s)) + " " + err.Error())
				return
			}
			switch key {
			case "caller":
				r.Caller, r.caller = s, g
			case "question":
				r.Question, r.question = s, g
			default:
				r.Model, r.model, r.hasModel = s, g, true
			}
		case "min_confidence", "min_probability":
			f, ok := ps.probability(v, prob)
			if !ok {
				return
			}
			if key == "min_confidence" {
				r.MinConfidence, r.minConf = &f, newThreshold(f).withText()
			} else {
				r.MinProbability, r.minProb = &f, newThreshold(f).withText()
			}
		case "max_error":
			f, ok := ps.probability(v, prob)
			if !ok {
				return
			}
			if f <= 0 || f >= 1 {
				bad(clipName(v.Value) + " is not in (0, 1): the share of decided answers allowed to be wrong, e.g. 0.02")
				return
			}
			r.MaxError, r.maxErr, r.maxErrText = &f, newThreshold(f), fmtNum(f)
		case "noul_abstain_between":
			if v.Kind != yaml.SequenceNode || len(v.Content) != 2 {
				bad("must be a list of two probabilities [lo, hi], not " + describe(v))
				return
			}
			lo, ok1 := ps.probability(v.Content[0], prob)
			hi, ok2 := ps.probability(v.Content[1], prob)
			if !ok1 || !ok2 {
				return
			}
			if lo > hi {
				bad(fmt.Sprintf("lo %s is above hi %s", fmtNum(lo), fmtNum(hi)))
				return
			}
			r.NoulAbstainBetween, r.lo, r.hi = &[2]float64{lo, hi}, newThreshold(lo).withText(), newThreshold(hi).withText()
		case "review":
			hasReview = true
			s, ok := ps.str(v, prob)
			if !ok {
				return
			}
			switch s {
			case contract.ReviewNone, contract.ReviewNotify, contract.ReviewHold:
				r.Review = s
			default:
				bad(strconv.Quote(clipName(s)) + " is not a review mode: none, notify or hold")
			}
		case "audit_sample":
			if f, ok := ps.probability(v, prob); ok {
				audit = f
			}
		case "use":
			hasUse = true
			s, ok := ps.str(v, prob)
			if !ok {
				return
			}
			switch s {
			case UseRaw, UseCalibrated:
				r.Use = s
			default:
				bad(strconv.Quote(clipName(s)) + " is not raw or calibrated")
			}
		}
	})
	if !hasName {
		ps.add(Problem{Line: n.Line, Rule: idx, Message: "name is required"})
	}
	r.AuditSample = audit
	thresholds := r.MinConfidence != nil || r.MinProbability != nil || r.NoulAbstainBetween != nil
	risk := r.MaxError != nil
	switch {
	case !hasWork && skipped > 0:
		// A misspelt threshold is the likely cause; its problem is already reported.
	case hasWork && !thresholds && !risk && audit == 0 && len(ps.problems)+ps.more > before:
		// A bad threshold value, reported already.
	case !thresholds && !risk && audit == 0:
		ps.add(Problem{Line: n.Line, Rule: idx, Name: at.Name, Message: "the rule has nothing to do: set min_confidence, min_probability, noul_abstain_between, max_error or audit_sample"})
	case !thresholds && !risk && hasReview:
		ps.add(Problem{Line: n.Line, Rule: idx, Name: at.Name, Field: "review", Message: "has no effect: the rule sets no threshold, so it never abstains (audit samples are always queued as notify)"})
	case !thresholds && risk && hasUse:
		ps.add(Problem{Line: n.Line, Rule: idx, Name: at.Name, Field: "use", Message: "has no effect: max_error compares the values its risk fit was made on (calibrated when the fit has a temperature)"})
	case !thresholds && hasUse:
		ps.add(Problem{Line: n.Line, Rule: idx, Name: at.Name, Field: "use", Message: "has no effect: the rule sets no threshold"})
	}
	if len(ps.problems)+ps.more > before {
		return r, false
	}
	if r.caller.src == "" {
		r.caller, _ = compileGlob(r.Caller)
	}
	if r.question.src == "" {
		r.question, _ = compileGlob(r.Question)
	}
	// max_error has something to say about every type; a rule with only audit_sample too.
	r.forChoiceScore = r.MinConfidence != nil || r.MinProbability != nil || risk || !thresholds
	r.forNoul = r.NoulAbstainBetween != nil || risk || !thresholds
	r.useCalibrated = r.Use == UseCalibrated
	r.auditText = strconv.FormatFloat(audit, 'f', -1, 64)
	return r, true
}

// str reads a string field; YAML's other scalars (numbers, booleans, null) are refused so
// that `name: 1e3` or `review: no` cannot mean something nobody wrote.
func (ps *parser) str(v *yaml.Node, prob Problem) (string, bool) {
	if v.Kind != yaml.ScalarNode || v.ShortTag() != "!!str" {
		prob.Message = "must be a string, not " + describe(v)
		if v.Kind == yaml.ScalarNode && v.ShortTag() != "!!null" {
			prob.Message += " (quote it)"
		}
		ps.add(prob)
		return "", false
	}
	return v.Value, true
}

// probability reads a number in [0, 1].
func (ps *parser) probability(v *yaml.Node, prob Problem) (float64, bool) {
	prob.Line = v.Line
	tag := v.ShortTag()
	if v.Kind != yaml.ScalarNode || (tag != "!!int" && tag != "!!float") {
		prob.Message = "must be a number in [0, 1], not " + describe(v)
		ps.add(prob)
		return 0, false
	}
	var f float64
	if err := v.Decode(&f); err != nil {
		prob.Message = "must be a number in [0, 1], not " + describe(v)
		ps.add(prob)
		return 0, false
	}
	if !(f >= 0 && f <= 1) {
		prob.Message = clipName(v.Value) + " is not in [0, 1]"
		ps.add(prob)
		return 0, false
	}
	return f, true
}

func checkName(s string) string {
	switch {
	case strings.TrimSpace(s) == "":
		return "must not be blank"
	case strings.TrimSpace(s) != s:
		return "must not start or end with spaces"
	case len(s) > maxNameBytes:
		return fmt.Sprintf("is %d bytes; the limit is %d", len(s), maxNameBytes)
	case s == HeaderRule:
		return strconv.Quote(HeaderRule) + " is reserved for verdicts of Sys1-Min-Confidence alone"
	}
	for _, r := range s {
		if r == utf8.RuneError || unicode.IsControl(r) {
			return "must not contain control characters or invalid UTF-8"
		}
	}
	return ""
}

func isNull(n *yaml.Node) bool { return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" }

// describe names what a node is, for "must be X, not Y".
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	case yaml.DocumentNode:
		return "a document"
	}
	switch n.ShortTag() {
	case "!!null":
		return "null (nothing)"
	case "!!bool":
		return "the boolean " + n.Value
	case "!!int", "!!float":
		return "the number " + clipName(n.Value)
	case "!!str":
		return "the string " + strconv.Quote(clipName(n.Value))
	}
	return "a value tagged " + clipName(n.Tag)
}

// clipName bounds a file's text quoted in an error (log lines stay readable).
func clipName(s string) string {
	const limit = 40
	if len(s) <= limit {
		return s
	}
	cut := limit
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

func fmtNum(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// suggest returns the known field closest to key when it is a likely typo.
func suggest(key string, known []string) string {
	if len(key) > 64 {
		return ""
	}
	best, bestD := "", 3
	for _, k := range known {
		if d := editDistance(strings.ToLower(key), k); d < bestD {
			best, bestD = k, d
		}
	}
	return best
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
