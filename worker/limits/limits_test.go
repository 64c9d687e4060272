package limits

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const goodLimits = `# first match wins
rules:
  - caller: billing
    usd_per_day: 5
    decisions_per_minute: 600
    cache: off
  - caller: "team-*"
    name: teams
    input_tokens_per_day: 2e6
    in_flight: 8
    cache: 24h
  - caller: "svc/*@example.com"
    usd_per_day: "0.25"
  - caller: "exempt"
  - caller: "*"
    decisions_per_minute: 60
    cache: 90m
`

func TestLimitsFirstMatchWins(t *testing.T) {
	l, err := ParseLimits([]byte(goodLimits))
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Rules) != 5 {
		t.Fatalf("%d rules", len(l.Rules))
	}
	for _, c := range []struct {
		caller, rule string
	}{
		{"billing", "billing"},
		{"team-a", "teams"},
		{"team-", "teams"},
		{"teams", "*"}, // "team-*" needs the dash
		{"svc/reports@example.com", "svc/*@example.com"},
		{"exempt", "exempt"},
		{"anyone", "*"},
		{"", "*"},
	} {
		r, ok := l.Match(c.caller)
		if !ok || r.Name != c.rule {
			t.Errorf("Match(%q) = %q %v, want rule %q", c.caller, r.Name, ok, c.rule)
		}
	}
	b, _ := l.Match("billing")
	if b.USDPerDay != 5 || b.DecisionsPerMinute != 600 || !b.CacheOff || b.Cache != 0 || b.Line != 3 || !b.Limited() {
		t.Errorf("billing rule: %+v", b)
	}
	tm, _ := l.Match("team-x")
	if tm.InputTokensPerDay != 2_000_000 || tm.InFlight != 8 || tm.Cache != 24*time.Hour || tm.CacheOff || tm.DayLimited() != true {
		t.Errorf("teams rule: %+v", tm)
	}
	sv, _ := l.Match("svc/x@example.com")
	if sv.USDPerDay != 0.25 {
		t.Errorf("quoted number: %+v", sv)
	}
	ex, _ := l.Match("exempt")
	if ex.Limited() {
		t.Errorf("a rule with no limits limits nothing: %+v", ex)
	}
	if r, ok := l.Rule("teams"); !ok || r.Caller != "team-*" {
		t.Errorf("Rule(teams): %+v %v", r, ok)
	}
	if _, ok := l.Rule("team-*"); ok {
		t.Error("a named rule is found by its name, not its glob")
	}

	// No catch-all: unmatched callers are not limited; no file limits nobody.
	l2, err := ParseLimits([]byte("rules:\n  - caller: a\n    in_flight: 1\n"))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := l2.Match("b"); ok {
		t.Error("b matched a rule for a")
	}
	var none *Limits
	if _, ok := none.Match("a"); ok {
		t.Error("nil limits matched")
	}
}

func TestGlobMatch(t *testing.T) {
	for _, c := range []struct {
		glob, s string
		want    bool
	}{
		{"*", "", true},
		{"*", "a.b/c d", true},
		{"a*", "a", true},
		{"a*", "ba", false},
		{"*a", "bba", true},
		{"a*b*c", "aXXbYYc", true},
		{"a*b*c", "aXXbYY", false},
		{"a?c", "abc", true},
		{"a?c", "ac", false},
		{"a?c", "aéc", true}, // ? is one character, not one byte
		{`a\*`, "a*", true},
		{`a\*`, "ab", false},
		{`a\?`, "a?", true},
		{`a\\b`, `a\b`, true},
		{"*.example.com", "svc.example.com", true},
		{"**x", "x", true},
		{"*x*y*z", strings.Repeat("x", 1000) + "yz", true},
		{"*x*y*z*w", strings.Repeat("xyz", 300), false},
	} {
		if got := globMatch(c.glob, c.s); got != c.want {
			t.Errorf("globMatch(%q, %q) = %v", c.glob, c.s, got)
		}
	}
}

func TestLimitsErrorNamesEveryBadLineAndField(t *testing.T) {
	doc := `rules:
  - caller: a
    usd_per_day: -1
    decisions_per_minute: 0
    input_tokens_per_day: 1.5
    in_flight: many
    cache: 1 day
    burst: 3
  - usd_per_day: 1
  - caller: "b\\"
    cache: 500ms
  - caller: a
    in_flight: 2
  - caller: c
    name: shared
  - caller: d
    name: shared
    cache: 9000h
  - caller: ""
    in_flight: 20000
  - 7
limits: {}
`
	_, err := ParseLimits([]byte(doc))
	var fe *FileError
	if !errors.As(err, &fe) {
		t.Fatalf("want a *FileError, got %v", err)
	}
	msg := err.Error()
	for _, want := range []string{
		`line 3: rules[0].usd_per_day: must be positive, got -1 (omit the field for no USD budget)`,
		`line 4: rules[0].decisions_per_minute: must be positive, got 0 (omit the field for no limit)`,
		`line 5: rules[0].input_tokens_per_day: must be a whole number of tokens, got 1.5`,
		`line 6: rules[0].in_flight: must be a whole number of calls, got "many"`,
		`line 7: rules[0].cache: must be a duration like 24h or 90m (units h, m, s), or off, got "1 day"`,
		`line 8: rules[0].burst: unknown field (allowed: caller, name, decisions_per_minute, input_tokens_per_day, usd_per_day, in_flight, cache, weight)`,
		`line 9: rules[1].caller: required`,
		`line 10: rules[2].caller: "b\\" ends in a lone \`,
		`line 11: rules[2].cache: must be at least 1s (write off for no cache), got 500ms`,
		`line 12: rules[3].caller: "a" is never reached: the rule at line 2 has the same glob and comes first`,
		`line 16: rules[5].name: "shared" is the name of the rule at line 14 too`,
		`line 18: rules[5].cache: must be at most 8760h (a year), got 9000h`,
		`line 19: rules[6].caller: "" is blank`,
		`line 20: rules[6].in_flight: 20000 is more than the most this limit may be (10000)`,
		`line 21: rules[7]: must be a mapping (caller: ... and its limits), got a number`,
		`line 22: limits: unknown field (allowed: rules)`,
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("error lacks %q:\n%s", want, strings.ReplaceAll(msg, "; ", "\n"))
		}
	}
	if len(fe.Problems) != 16 {
		t.Errorf("%d problems, want 16:\n%s", len(fe.Problems), strings.ReplaceAll(msg, "; ", "\n"))
	}
}

func TestLimitsCacheForms(t *testing.T) {
	for doc, want := range map[string]struct {
		d   time.Duration
		off bool
	}{
		"cache: 24h":   {24 * time.Hour, false},
		"cache: 1h30m": {90 * time.Minute, false},
		"cache: 1s":    {time.Second, false},
		"cache: off":   {0, true},
		"cache: false": {0, true},
	} {
		l, err := ParseLimits([]byte("rules:\n  - caller: x\n    " + doc + "\n"))
		if err != nil {
			t.Errorf("%s: %v", doc, err)
			continue
		}
		if r := l.Rules[0]; r.Cache != want.d || r.CacheOff != want.off {
			t.Errorf("%s: %v %v", doc, r.Cache, r.CacheOff)
		}
	}
	for _, doc := range []string{"cache: 0", "cache: -1h", "cache: yes", "cache: no", "cache: [1h]", "cache:", "cache: 10"} {
		if _, err := ParseLimits([]byte("rules:\n  - caller: x\n    " + doc + "\n")); err == nil || !strings.Contains(err.Error(), "line 3: rules[0].cache: ") {
			t.Errorf("%s: %v", doc, err)
		}
	}
}

func TestLimitsEmptyAndBadDocuments(t *testing.T) {
	for _, doc := range []string{"", "# no limits\n", "rules:\n", "rules: []\n"} {
		l, err := ParseLimits([]byte(doc))
		if err != nil || len(l.Rules) != 0 {
			t.Errorf("%q: %v %v", doc, l, err)
		}
	}
	for doc, want := range map[string]string{
		"rules: {caller: a}\n":                                  "line 1: rules: must be a list of rules",
		"rules:\n  - caller: [a]\n":                             "line 2: rules[0].caller: must be a caller glob (a string), got a list",
		"rules:\n  - caller: a\n  - caller: a\n    caller: b\n": "line 4: rules[1].caller: duplicate key (first at line 3)",
		"rules:\n- caller: a\n  in_flight: 1\n bad":             "line ",
		"just text": "the file must be a mapping with a rules key, got a string",
	} {
		if _, err := ParseLimits([]byte(doc)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: got %v, want %q", doc, err, want)
		}
	}
}

// TestLoadLimitsReloadsAndKeepsLastGood checks the livefile wiring: an edit changes the
// limits, a bad edit is refused with its line and the last good limits stay in force.
func TestLoadLimitsReloadsAndKeepsLastGood(t *testing.T) {
	path := filepath.Join(t.TempDir(), "limits.yaml")
	base := time.Now().Add(-time.Hour)
	write := func(s string, at time.Time) {
		t.Helper()
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(path, at, at); err != nil {
			t.Fatal(err)
		}
	}
	write("rules:\n  - caller: a\n    decisions_per_minute: 10\n", base)
	f, err := LoadLimits(path)
	if err != nil {
		t.Fatal(err)
	}
	if r, _ := f.Current().Match("a"); r.DecisionsPerMinute != 10 {
		t.Fatalf("loaded %+v", r)
	}
	write("rules:\n  - caller: a\n    decisions_per_minute: 20\n", base.Add(time.Second))
	if changed, err := f.Check(); !changed || err != nil {
		t.Fatalf("reload: %v %v", changed, err)
	}
	if r, _ := f.Current().Match("a"); r.DecisionsPerMinute != 20 {
		t.Fatalf("after edit %+v", r)
	}
	write("rules:\n  - caller: a\n    decisions_per_minute: -5\n", base.Add(2*time.Second))
	if _, err := f.Check(); err == nil || !strings.Contains(err.Error(), path+": limits file: 1 problem: line 3: rules[0].decisions_per_minute") {
		t.Fatalf("bad edit: %v", err)
	}
	if r, _ := f.Current().Match("a"); r.DecisionsPerMinute != 20 {
		t.Fatalf("a bad edit must keep the last good limits: %+v", r)
	}
	if _, err := LoadLimits(filepath.Join(t.TempDir(), "missing.yaml")); err == nil {
		t.Error("a missing file loaded")
	}

	pp := filepath.Join(t.TempDir(), "prices.yaml")
	if err := os.WriteFile(pp, []byte(goodPrices), 0o600); err != nil {
		t.Fatal(err)
	}
	pf, err := LoadPrices(pp)
	if err != nil || pf.Current().Len() != 4 {
		t.Fatalf("LoadPrices: %v", err)
	}
}

func TestWeightsAreTheFirstMatchingRules(t *testing.T) {
	l, err := ParseLimits([]byte(`rules:
  - caller: billing
    weight: 3
    usd_per_day: 5
  - caller: "team-*"
    in_flight: 2
  - caller: "*"
    weight: 2
`))
	if err != nil {
		t.Fatal(err)
	}
	for caller, want := range map[string]int{"billing": 3, "team-a": 1, "anyone": 2} {
		if got := l.Weight(caller); got != want {
			t.Errorf("Weight(%q) = %d, want %d", caller, got, want)
		}
	}
	if r, _ := l.Match("anyone"); r.Limited() {
		t.Errorf("a rule with only a weight limits nothing the budget counts: %+v", r)
	}
	var none *Limits
	if none.Weight("x") != 1 {
		t.Errorf("no limits file: weight %d, want 1", none.Weight("x"))
	}
	for _, bad := range []string{"0", "-1", "1.5", "1001", "heavy"} {
		_, err := ParseLimits([]byte("rules:\n  - caller: a\n    weight: " + bad + "\n"))
		if err == nil || !strings.Contains(err.Error(), "rules[0].weight") {
			t.Errorf("weight %s: %v, want an error naming rules[0].weight", bad, err)
		}
	}
}

func TestRulesThatCanNeverMatchAreNamed(t *testing.T) {
	l, err := ParseLimits([]byte(`rules:
  - caller: billing
    usd_per_day: 5
  - caller: "svc.reports"
    in_flight: 2
  - caller: "*"
    decisions_per_minute: 60
  - caller: "team-*"
    weight: 3
`))
	if err != nil {
		t.Fatal(err)
	}
	subject := l.Warnings("subject")
	if len(subject) != 2 || !strings.Contains(subject[0], `rule "svc.reports" (line 4) can never match`) ||
		!strings.Contains(subject[1], `rule "team-*" (line 8) can never match: the rule at line 6 matches every caller`) {
		t.Fatalf("mode subject: %q", subject)
	}
	jwt := l.Warnings("jwt") // a JWT's sub may hold a dot
	if len(jwt) != 1 || !strings.Contains(jwt[0], `"team-*"`) {
		t.Fatalf("mode jwt: %q", jwt)
	}
	none := l.Warnings("none")
	if len(none) != 3 || !strings.Contains(none[0], `rule "billing" (line 2) names callers ("billing"), but SYS1_AUTH_MODE=none verifies nobody`) {
		t.Fatalf("mode none: %q", none)
	}
	var nilLimits *Limits
	if nilLimits.Warnings("none") != nil {
		t.Error("no limits file, warnings")
	}
}
