package policy

import (
	"errors"
	"strings"
	"unicode/utf8"
)

// A glob matches caller ids, question names and model names. The syntax is path.Match's,
// except that no character is special to '*': model names such as "hf.co/org/m:q4" contain
// '/', and a rule saying `model: "hf.co/*"` must match them. In a pattern, '*' is any run of
// characters (the empty run included), '?' exactly one character, "[abc]" one of the
// characters listed ("[a-z]" a range, "[!abc]" or "[^abc]" any other one), and '\' quotes
// the next character ("\*" matches a star). Matching is case-sensitive and covers the whole
// name, as with path.Match.
type glob struct {
	src  string
	kind globKind
	// lit is the whole literal (globLiteral), or the part before the star; suf the part after.
	lit, suf string
	toks     []token // globGeneral
}

type globKind uint8

const (
	globAny     globKind = iota // "*"
	globLiteral                 // no metacharacter
	globPrefix                  // "abc*"
	globSuffix                  // "*abc"
	globAffix                   // "ab*cd"
	globGeneral                 // anything else
)

type tokKind uint8

const (
	tokRune  tokKind = iota
	tokOne           // ?
	tokStar          // *
	tokClass         // [...]
)

type token struct {
	kind   tokKind
	r      rune
	negate bool
	ranges []runeRange
}

type runeRange struct{ lo, hi rune }

var (
	errGlobEmpty    = errors.New("must not be empty")
	errGlobEscape   = errors.New(`ends in a lone '\'`)
	errGlobClass    = errors.New("has an unterminated '[' class")
	errGlobEmptyCl  = errors.New("has an empty '[]' class")
	errGlobRange    = errors.New("has a character range whose start is after its end")
	errGlobBadUTF8  = errors.New("is not valid UTF-8")
	errGlobTooLarge = errors.New("is longer than 256 bytes")
)

// maxGlob bounds a pattern: names it matches are short, and matching is O(len²) at worst.
const maxGlob = 256

// compileGlob checks pattern and prepares it for matching.
func compileGlob(pattern string) (glob, error) {
	switch {
	case pattern == "":
		return glob{}, errGlobEmpty
	case len(pattern) > maxGlob:
		return glob{}, errGlobTooLarge
	case !utf8.ValidString(pattern):
		return glob{}, errGlobBadUTF8
	}
	g := glob{src: pattern}
	if !strings.ContainsAny(pattern, `?[\`) {
		// The common shapes need no token machinery: "*", "lit", "pre*", "*suf", "pre*suf".
		switch n := strings.Count(pattern, "*"); {
		case pattern == "*" || (n > 0 && strings.Trim(pattern, "*") == ""):
			g.kind = globAny
			return g, nil
		case n == 0:
			g.kind, g.lit = globLiteral, pattern
			return g, nil
		case n == 1:
			i := strings.IndexByte(pattern, '*')
			g.lit, g.suf = pattern[:i], pattern[i+1:]
			switch {
			case g.suf == "":
				g.kind = globPrefix
			case g.lit == "":
				g.kind = globSuffix
			default:
				g.kind = globAffix
			}
			return g, nil
		}
	}
	toks, err := tokenize(pattern)
	if err != nil {
		return glob{}, err
	}
	g.kind, g.toks = globGeneral, toks
	return g, nil
}

func tokenize(p string) ([]token, error) {
	var toks []token
	for i := 0; i < len(p); {
		r, w := utf8.DecodeRuneInString(p[i:])
		i += w
		switch r {
		case '*':
			if len(toks) > 0 && toks[len(toks)-1].kind == tokStar {
				continue // "**" is "*"
			}
			toks = append(toks, token{kind: tokStar})
		case '?':
			toks = append(toks, token{kind: tokOne})
		case '\\':
			if i >= len(p) {
				return nil, errGlobEscape
			}
			r, w = utf8.DecodeRuneInString(p[i:])
			i += w
			toks = append(toks, token{kind: tokRune, r: r})
		case '[':
			t, n, err := parseClass(p[i:])
			if err != nil {
				return nil, err
			}
			i += n
			toks = append(toks, t)
		default:
			toks = append(toks, token{kind: tokRune, r: r})
		}
	}
	return toks, nil
}

// parseClass parses a class after its '[' and returns the bytes it used, ']' included.
func parseClass(p string) (token, int, error) {
	t := token{kind: tokClass}
	i := 0
	if i < len(p) && (p[i] == '!' || p[i] == '^') {
		t.negate = true
		i++
	}
	next := func() (rune, bool, error) {
		if i >= len(p) {
			return 0, false, errGlobClass
		}
		r, w := utf8.DecodeRuneInString(p[i:])
		i += w
		if r == '\\' {
			if i >= len(p) {
				return 0, false, errGlobClass
			}
			r, w = utf8.DecodeRuneInString(p[i:])
			i += w
			return r, true, nil
		}
		return r, false, nil
	}
	for {
		lo, escaped, err := next()
		if err != nil {
			return token{}, 0, err
		}
		if lo == ']' && !escaped {
			if len(t.ranges) == 0 {
				return token{}, 0, errGlobEmptyCl
			}
			return t, i, nil
		}
		hi := lo
		if i+1 < len(p) && p[i] == '-' && p[i+1] != ']' {
			i++
			if hi, _, err = next(); err != nil {
				return token{}, 0, err
			}
			if hi < lo {
				return token{}, 0, errGlobRange
			}
		}
		t.ranges = append(t.ranges, runeRange{lo, hi})
	}
}

// match reports whether name matches the whole pattern.
func (g *glob) match(name string) bool {
	switch g.kind {
	case globAny:
		return true
	case globLiteral:
		return name == g.lit
	case globPrefix:
		return strings.HasPrefix(name, g.lit)
	case globSuffix:
		return strings.HasSuffix(name, g.suf)
	case globAffix:
		return len(name) >= len(g.lit)+len(g.suf) && strings.HasPrefix(name, g.lit) && strings.HasSuffix(name, g.suf)
	}
	return matchTokens(g.toks, name)
}

// matchTokens is the classic wildcard walk: on a mismatch it retries from the last star with
// one more character swallowed by it. Earlier stars never need revisiting, so the walk is
// O(len(toks)·len(name)) at worst.
func matchTokens(toks []token, name string) bool {
	ti, ni := 0, 0
	starT, starN := -1, 0
	for ni < len(name) || ti < len(toks) {
		if ti < len(toks) {
			t := &toks[ti]
			if t.kind == tokStar {
				starT, starN = ti, ni
				ti++
				continue
			}
			if ni < len(name) {
				r, w := utf8.DecodeRuneInString(name[ni:])
				if t.accepts(r) {
					ti++
					ni += w
					continue
				}
			}
		}
		if starT < 0 || starN >= len(name) {
			return false
		}
		_, w := utf8.DecodeRuneInString(name[starN:])
		starN += w
		ti, ni = starT+1, starN
	}
	return true
}

func (t *token) accepts(r rune) bool {
	switch t.kind {
	case tokOne:
		return true
	case tokRune:
		return r == t.r
	case tokClass:
		in := false
		for _, rg := range t.ranges {
			if r >= rg.lo && r <= rg.hi {
				in = true
				break
			}
		}
		return in != t.negate
	}
	return false
}
