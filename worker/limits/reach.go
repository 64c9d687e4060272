package limits

import (
	"fmt"
	"strings"
)

// Warnings says which rules of l cannot do what they appear to in the given auth mode
// (SYS1_AUTH_MODE): rules no caller can ever reach, and, in mode none, rules naming callers
// nobody verifies. None of these makes the file wrong — a catch-all rule left above a named
// one is legal — so they are warnings, logged at start-up and on each reload, each naming its
// rule and line.
//
//   - A rule after a rule whose glob matches every caller ("*", "**", …) is never reached:
//     the first match wins.
//   - In modes none and subject the caller is a subject token, which never holds '.', '>'
//     or white space: a glob that needs one of them (literally) matches nobody.
//   - In mode none every caller is the unverified subject token: a rule naming callers
//     applies to whoever publishes on sys1.decide.<caller>, which is fine in development and
//     exactly why production uses mode subject or jwt.
func (l *Limits) Warnings(authMode string) []string {
	if l == nil {
		return nil
	}
	var out []string
	catchAll := 0 // line of the first rule matching everyone
	for _, r := range l.Rules {
		name := fmt.Sprintf("rule %q (line %d)", r.Name, r.Line)
		switch {
		case catchAll > 0:
			out = append(out, fmt.Sprintf("%s can never match: the rule at line %d matches every caller and comes first", name, catchAll))
			continue
		case matchesEveryone(r.Caller):
			catchAll = r.Line
			continue
		}
		if authMode == "none" || authMode == "subject" {
			if c, ok := impossibleInToken(r.Caller); ok {
				out = append(out, fmt.Sprintf("%s can never match: its caller glob %q needs a %q, which no subject token (the caller in SYS1_AUTH_MODE=%s) holds", name, r.Caller, c, authMode))
				continue
			}
		}
		if authMode == "none" {
			out = append(out, fmt.Sprintf("%s names callers (%q), but SYS1_AUTH_MODE=none verifies nobody: it applies to whoever publishes on sys1.decide.<caller> under a matching token", name, r.Caller))
		}
	}
	return out
}

// matchesEveryone reports whether a glob is stars only.
func matchesEveryone(glob string) bool {
	return glob != "" && strings.Trim(glob, "*") == ""
}

// impossibleInToken finds a character the glob needs literally that a subject token cannot
// hold. Wildcards (* and ?) never need one; an escaped character is literal.
func impossibleInToken(glob string) (rune, bool) {
	for i := 0; i < len(glob); i++ {
		c := glob[i]
		switch c {
		case '*', '?':
			continue
		case '\\':
			if i+1 < len(glob) {
				i++
				c = glob[i]
			}
		}
		if strings.IndexByte(".> \t\r\n", c) >= 0 {
			return rune(c), true
		}
	}
	return 0, false
}
