package policy

import (
	"path"
	"strings"
	"testing"
)

func TestGlob(t *testing.T) {
	cases := []struct {
		pattern, name string
		match         bool
	}{
		{"*", "", true},
		{"*", "anything at all", true},
		{"**", "x", true},
		{"svc", "svc", true},
		{"svc", "svc2", false},
		{"svc", "Svc", false},
		{"svc-*", "svc-", true},
		{"svc-*", "svc-a", true},
		{"svc-*", "svc", false},
		{"*_label", "ticket_label", true},
		{"*_label", "_label", true},
		{"*_label", "label", false},
		{"a*z", "az", true},
		{"a*z", "abcz", true},
		{"a*z", "a", false},     // pre and suf must not overlap
		{"ab*ba", "aba", false}, // nor here
		{"a*b*c", "axxbyyc", true},
		{"a*b*c", "axxbyy", false},
		{"a*b*c", "abcbc", true},
		{"*a*", "bab", true},
		{"*a*", "bbb", false},
		{"?", "é", true},
		{"?", "", false},
		{"??", "é", false},
		{"v?", "v1", true},
		{"[abc]", "b", true},
		{"[abc]", "d", false},
		{"[a-c]x", "bx", true},
		{"[!a-c]x", "bx", false},
		{"[^a-c]x", "dx", true},
		{"[a-]", "-", true}, // a '-' before ']' is itself
		{`[\]]`, "]", true},
		{`\*`, "*", true},
		{`\*`, "a", false},
		{`a\?`, "a?", true},
		{`a\?`, "ab", false},
		{"hf.co/*", "hf.co/org/model:q4", true},
		{"*/*", "a/b/c", true},
		{"*:70b", "llama3:70b", true},
		{"*x*x*x*x*x*y", strings.Repeat("x", 200), false}, // many stars, no blow-up
		{"*????", "႙00", false},                           // three characters, not five bytes
		{"*???", "႙00", true},
		{"*?0", "႙00", true},
	}
	for _, c := range cases {
		g, err := compileGlob(c.pattern)
		if err != nil {
			t.Errorf("%q: %v", c.pattern, err)
			continue
		}
		if got := g.match(c.name); got != c.match {
			t.Errorf("%q ~ %q = %v, want %v", c.pattern, c.name, got, c.match)
		}
	}
	for _, bad := range []string{"", "[", "[a", "[]", "[!]", `\`, `a\`, "[z-a]", `[\`, "\xff", strings.Repeat("a", 257)} {
		if _, err := compileGlob(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// FuzzGlob holds the matcher to path.Match wherever both accept the pattern, except where the
// two mean to differ: '/' (not special here), "[!...]" (a negated class here, as in a shell;
// path.Match knows only "[^...]"), and names beyond ASCII: after a star path.Match retries at
// every byte, mid-character, so "*????" matches the three characters "႙00" there (its star
// takes one byte of "႙" and the ?s the other two bytes and "00"), and not here.
func FuzzGlob(f *testing.F) {
	for _, s := range [][2]string{{"a*b", "axb"}, {"[a-c]?*", "bxy"}, {`\*x`, "*x"}, {"[!x]", "y"}, {"*a*b*", "ab"}, {"[^a]é", "bé"}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, pattern, name string) {
		if len(pattern) > 64 || len(name) > 64 {
			return
		}
		g, err := compileGlob(pattern)
		if err != nil {
			return
		}
		got := g.match(name)
		if strings.Contains(name, "/") || strings.Contains(pattern, "/") || strings.Contains(pattern, "!") || !isASCII(name) {
			return
		}
		want, err := path.Match(pattern, name)
		if err != nil {
			return // path.Match refuses some classes we accept, such as [a-]
		}
		if got != want {
			t.Fatalf("%q ~ %q: %v, path.Match says %v", pattern, name, got, want)
		}
	})
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}
