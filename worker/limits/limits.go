package limits

import (
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"

	"github.com/sys1hq/sys1/worker/livefile"
)

// Rule is one entry of the limits file: the limits of every caller its glob matches. A zero
// field is no limit of that kind. Each caller has its own counters: a rule for "team-*" gives
// every team its own budget, not one budget shared by all teams.
type Rule struct {
	// Name keys the rule's counters (with the caller); it defaults to the Caller glob. Editing
	// a limit keeps the name, so what was used today still counts against the new limit;
	// renaming a rule starts its callers' counters afresh.
	Name string
	// Caller is a glob over caller names: * matches any run of characters, ? one character,
	// \ makes the next one literal (see globMatch).
	Caller string
	Line   int // where the rule starts in the file

	DecisionsPerMinute int64   // admitted decisions per UTC minute
	InputTokensPerDay  int64   // input tokens per UTC day
	USDPerDay          float64 // spend per UTC day
	InFlight           int64   // calls in flight at once, across all replicas

	// Cache is the oldest cached answer the caller may be given (0: no rule; see CacheOff).
	Cache time.Duration
	// CacheOff forbids the cache to the caller, even when a request asks for it.
	CacheOff bool

	// Weight is the caller's share of the fleet's slots when callers compete for them
	// (worker/fair: weighted round robin; a caller of weight 3 gets three requests started
	// for every one of a caller of weight 1). 0 means the default, 1.
	Weight int
}

// Weight is caller's fair-share weight: the first matching rule's, 1 when none matches or
// the rule gives none. The nil *Limits weighs everyone 1.
func (l *Limits) Weight(caller string) int {
	if r, ok := l.Match(caller); ok && r.Weight > 0 {
		return r.Weight
	}
	return 1
}

// Limited reports whether the rule limits anything the budget counts.
func (r Rule) Limited() bool { return r.DayLimited() || r.InFlight > 0 }

// DayLimited reports whether the rule has a rate or a day budget (the counters kept per UTC
// day, the minute's rate among them).
func (r Rule) DayLimited() bool {
	return r.DecisionsPerMinute > 0 || r.InputTokensPerDay > 0 || r.USDPerDay > 0
}

// Limits is a parsed limits file. Rules are tried in file order and the first whose glob
// matches the caller applies; a caller no rule matches is not limited. Rules may overlap on
// purpose (a named caller before a catch-all "*"). The nil *Limits limits nobody.
type Limits struct {
	Rules []Rule
}

// Match is the rule that applies to caller: the first that matches.
func (l *Limits) Match(caller string) (Rule, bool) {
	if l == nil {
		return Rule{}, false
	}
	for _, r := range l.Rules {
		if globMatch(r.Caller, caller) {
			return r, true
		}
	}
	return Rule{}, false
}

// Rule is the rule named name, for reading counters back (sys1 status).
func (l *Limits) Rule(name string) (Rule, bool) {
	if l == nil {
		return Rule{}, false
	}
	for _, r := range l.Rules {
		if r.Name == name {
			return r, true
		}
	}
	return Rule{}, false
}

// LoadLimits reads the limits file at path and keeps it current (see livefile): call Watch on
// the result to follow edits; a bad edit keeps the last good limits.
func LoadLimits(path string) (*livefile.File[*Limits], error) {
	return livefile.Load(path, ParseLimits)
}

// Bounds of the numeric fields: far above any real limit, low enough that counters (USD in
// nano-dollars, one lease per call in flight) stay exact and small.
const (
	maxDecisionsPerMinute = 1_000_000_000
	maxTokensPerDay       = 1_000_000_000_000_000
	maxUSDPerDay          = 1_000_000_000
	maxInFlight           = 10_000
	maxWeight             = 1000
	minCache              = time.Second // JetStream's per-message TTL is whole seconds
	maxCache              = 365 * 24 * time.Hour
)

const ruleFields = "caller, name, decisions_per_minute, input_tokens_per_day, usd_per_day, in_flight, cache, weight"

// ParseLimits parses a limits file:
//
//	rules:              # first match wins
//	  - caller: billing
//	    usd_per_day: 5
//	    decisions_per_minute: 600
//	  - caller: "team-*"
//	    name: teams               # optional; counters are per caller and rule name
//	    input_tokens_per_day: 2000000
//	    in_flight: 8
//	    cache: 24h                # the exact cache, answers up to a day old (off: never)
//	    weight: 3                 # fair share: three slots for every one of a weight-1 caller
//	  - caller: "*"
//	    decisions_per_minute: 60
//
// The error, a *FileError, names every bad line and field: unknown fields, numbers that are
// not positive (omit a field for no limit), bad durations, bad globs, a rule no caller can
// reach because an earlier one has the same glob, two rules with one name.
func ParseLimits(data []byte) (*Limits, error) {
	probs := &problems{what: "limits file"}
	out := &Limits{}
	root := parseDocument(data, probs)
	if root == nil {
		if err := probs.err(); err != nil {
			return nil, err
		}
		return out, nil
	}
	if root.Kind != yaml.MappingNode {
		probs.add(root, "", "the file must be a mapping with a rules key, got %s", kindName(root))
		return nil, probs.err()
	}
	eachPair(root, "", probs, func(key string, k, v *yaml.Node) {
		if key != "rules" {
			probs.add(k, key, "unknown field (allowed: rules)")
			return
		}
		out.Rules = parseRules(v, probs)
	})
	if err := probs.err(); err != nil {
		return nil, err
	}
	return out, nil
}

func parseRules(v *yaml.Node, probs *problems) []Rule {
	if v.Kind == yaml.ScalarNode && v.ShortTag() == "!!null" {
		return nil
	}
	if v.Kind != yaml.SequenceNode {
		probs.add(v, "rules", "must be a list of rules (- caller: ...), got %s", kindName(v))
		return nil
	}
	var rules []Rule
	globLine := map[string]int{}
	nameLine := map[string]int{}
	for i, item := range v.Content {
		item = deref(item)
		p := fmt.Sprintf("rules[%d]", i)
		r, ok := parseRule(item, p, probs)
		// A rule with problems still claims its glob and name, so the problems of the rules
		// after it are all reported in this pass.
		if r.Caller != "" {
			if line, dup := globLine[r.Caller]; dup {
				probs.add(item, join(p, "caller"), "%s is never reached: the rule at line %d has the same glob and comes first", quote(r.Caller), line)
				ok = false
			} else {
				globLine[r.Caller] = r.Line
				if line, dup := nameLine[r.Name]; dup {
					probs.add(item, join(p, "name"), "%s is the name of the rule at line %d too (counters are kept per rule name, so names must differ)", quote(r.Name), line)
					ok = false
				} else {
					nameLine[r.Name] = r.Line
				}
			}
		}
		if !ok {
			continue
		}
		rules = append(rules, r)
	}
	return rules
}

func parseRule(v *yaml.Node, p string, probs *problems) (Rule, bool) {
	if v.Kind != yaml.MappingNode {
		probs.add(v, p, "must be a mapping (caller: ... and its limits), got %s", kindName(v))
		return Rule{}, false
	}
	r := Rule{Line: v.Line}
	ok, haveCaller := true, false
	bad := func(n *yaml.Node, field, format string, args ...any) {
		probs.add(n, field, format, args...)
		ok = false
	}
	eachPair(v, p, probs, func(key string, k, fv *yaml.Node) {
		field := join(p, key)
		switch key {
		case "caller":
			haveCaller = true
			if fv.Kind != yaml.ScalarNode || fv.ShortTag() == "!!null" {
				bad(fv, field, "must be a caller glob (a string), got %s", kindName(fv))
				return
			}
			if msg := globProblem(fv.Value); msg != "" {
				bad(fv, field, "%s %s", quote(fv.Value), msg)
				return
			}
			r.Caller = fv.Value
		case "name":
			if fv.Kind != yaml.ScalarNode || fv.ShortTag() == "!!null" || strings.TrimSpace(fv.Value) == "" {
				bad(fv, field, "must be a non-blank string, got %s", describe(fv))
				return
			}
			if len(fv.Value) > 128 {
				bad(fv, field, "is %d bytes long; at most 128", len(fv.Value))
				return
			}
			r.Name = fv.Value
		case "decisions_per_minute":
			if n, good := wholeIn(fv, maxDecisionsPerMinute); good {
				r.DecisionsPerMinute = n
			} else {
				bad(fv, field, "%s", wholeProblem(fv, maxDecisionsPerMinute, "decisions"))
			}
		case "input_tokens_per_day":
			if n, good := wholeIn(fv, maxTokensPerDay); good {
				r.InputTokensPerDay = n
			} else {
				bad(fv, field, "%s", wholeProblem(fv, maxTokensPerDay, "tokens"))
			}
		case "in_flight":
			if n, good := wholeIn(fv, maxInFlight); good {
				r.InFlight = n
			} else {
				bad(fv, field, "%s", wholeProblem(fv, maxInFlight, "calls"))
			}
		case "usd_per_day":
			f, isNum := number(fv)
			switch {
			case !isNum:
				bad(fv, field, "must be a number of USD, got %s", describe(fv))
			case f <= 0:
				bad(fv, field, "must be positive, got %s (omit the field for no USD budget)", fv.Value)
			case f > maxUSDPerDay:
				bad(fv, field, "%s USD is more than the most a budget may be (%d)", fv.Value, maxUSDPerDay)
			default:
				r.USDPerDay = f
			}
		case "weight":
			if n, good := wholeIn(fv, maxWeight); good {
				r.Weight = int(n)
			} else {
				bad(fv, field, "%s", wholeProblem(fv, maxWeight, "shares"))
			}
		case "cache":
			d, off, msg := parseCache(fv)
			if msg != "" {
				bad(fv, field, "%s", msg)
				return
			}
			r.Cache, r.CacheOff = d, off
		default:
			bad(k, field, "unknown field (allowed: %s)", ruleFields)
		}
	})
	if !haveCaller {
		bad(v, join(p, "caller"), "required: the glob of the callers this rule limits (\"*\" for everyone)")
	}
	if r.Name == "" {
		r.Name = r.Caller
	}
	return r, ok
}

// wholeIn reads a whole number in [1, most].
func wholeIn(v *yaml.Node, most int64) (int64, bool) {
	n, ok := wholeNumber(v)
	return n, ok && n >= 1 && n <= most
}

// wholeProblem says why v is not a whole number in [1, most] of unit.
func wholeProblem(v *yaml.Node, most int64, unit string) string {
	f, isNum := number(v)
	switch {
	case !isNum:
		return "must be a whole number of " + unit + ", got " + describe(v)
	case f <= 0:
		return fmt.Sprintf("must be positive, got %s (omit the field for no limit)", v.Value)
	case f > float64(most):
		return fmt.Sprintf("%s is more than the most this limit may be (%d)", v.Value, most)
	}
	return "must be a whole number of " + unit + ", got " + v.Value
}

// globProblem says what is wrong with a caller glob, or "" when it is good.
func globProblem(g string) string {
	switch {
	case strings.TrimSpace(g) == "":
		return "is blank (write \"*\" to match every caller)"
	case len(g) > maxGlobBytes:
		return fmt.Sprintf("is longer than %d bytes", maxGlobBytes)
	case strings.IndexFunc(g, unicode.IsControl) >= 0:
		return "contains control characters, which no caller name does"
	case trailingEscape(g):
		return "ends in a lone \\ (write \\\\ for a backslash, \\* for a literal *)"
	}
	return ""
}

// maxGlobBytes is the longest glob: callers are at most 256 bytes (a JWT sub's bound), and a
// glob may escape every one of their characters.
const maxGlobBytes = 512

// trailingEscape reports whether g ends in an escape with nothing to escape.
func trailingEscape(g string) bool {
	escaped := false
	for i := 0; i < len(g); i++ {
		switch {
		case escaped:
			escaped = false
		case g[i] == '\\':
			escaped = true
		}
	}
	return escaped
}

// globMatch matches a caller against a glob: * is any run of characters (none included), ? is
// one character, \ makes the next character literal; every other character matches itself.
// Callers are subject tokens or JWT subjects, which may hold '.', '/' or spaces, so nothing is
// special about those (unlike path.Match, where * stops at '/').
func globMatch(glob, s string) bool {
	// The classic two-pointer match with one backtrack point: linear-time in practice and
	// O(len(glob)·len(s)) at worst, with no recursion.
	gi, si := 0, 0
	starG, starS := -1, 0
	for si < len(s) {
		if gi < len(glob) {
			switch c := glob[gi]; c {
			case '*':
				starG, starS = gi, si
				gi++
				continue
			case '?':
				_, n := utf8.DecodeRuneInString(s[si:])
				gi, si = gi+1, si+n
				continue
			case '\\':
				if gi+1 < len(glob) && glob[gi+1] == s[si] {
					gi, si = gi+2, si+1
					continue
				}
			default:
				if c == s[si] {
					gi, si = gi+1, si+1
					continue
				}
			}
		}
		if starG < 0 {
			return false
		}
		// Let the last * take one more character and retry from there.
		_, n := utf8.DecodeRuneInString(s[starS:])
		starS += n
		gi, si = starG+1, starS
	}
	for gi < len(glob) && glob[gi] == '*' {
		gi++
	}
	return gi == len(glob)
}

// parseCache reads the cache field: a duration of at least a second ("24h", "90m"), or off.
func parseCache(v *yaml.Node) (d time.Duration, off bool, problem string) {
	if v.Kind != yaml.ScalarNode || v.ShortTag() == "!!null" {
		return 0, false, "must be a duration like 24h or 90m, or off, got " + kindName(v)
	}
	s := strings.TrimSpace(v.Value)
	if s == "off" || v.ShortTag() == "!!bool" && s == "false" {
		return 0, true, ""
	}
	d, err := time.ParseDuration(s)
	switch {
	case err != nil:
		return 0, false, fmt.Sprintf("must be a duration like 24h or 90m (units h, m, s), or off, got %s", quote(v.Value))
	case d < minCache:
		return 0, false, fmt.Sprintf("must be at least %s (write off for no cache), got %s", minCache, v.Value)
	case d > maxCache:
		return 0, false, fmt.Sprintf("must be at most %dh (a year), got %s", int(maxCache.Hours()), v.Value)
	}
	return d, false, ""
}
