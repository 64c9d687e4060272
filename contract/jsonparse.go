package contract

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// This file holds a small JSON reader written for the contract's needs, which encoding/json
// cannot meet: objects are walked in arrival order (never through a map), duplicate keys are
// detected at any depth, raw values are located byte for byte (so state, instructions and
// answers are forwarded exactly as sent), and every position can be named by a path.

// MaxDepth is the deepest nesting a request or response may have; the root object is level 1.
const MaxDepth = 64

// JSON value kinds, named by their first byte.
const (
	kindEnd    byte = 0
	kindString byte = '"'
	kindObject byte = '{'
	kindArray  byte = '['
	kindNumber byte = '0'
	kindTrue   byte = 't'
	kindFalse  byte = 'f'
	kindNull   byte = 'n'
)

// kindName names a kind for error messages.
func kindName(k byte) string {
	switch k {
	case kindString:
		return "a string"
	case kindObject:
		return "an object"
	case kindArray:
		return "an array"
	case kindNumber:
		return "a number"
	case kindTrue, kindFalse:
		return "a boolean"
	case kindNull:
		return "null"
	}
	return "nothing"
}

// syntaxError is a malformed document; parsing stops at the first one.
type syntaxError struct {
	pos int
	msg string
}

func (e *syntaxError) Error() string { return fmt.Sprintf("invalid JSON at byte %d: %s", e.pos, e.msg) }

// pathSeg is one step of a path: an object key (as text or as bytes) or an array index.
type pathSeg struct {
	key   string
	keyB  []byte
	index int // -1 for a key
}

// parser reads one JSON document. strict makes skipped values check for duplicate keys.
type parser struct {
	data []byte
	// text, when set, is string(data): strings without escapes are sliced from it, so a
	// request's names, keys and descriptions cost no allocation each.
	text string
	// the span of the key being visited by object's member callback
	keyS, keyE int
	keyEsc     bool
	pos        int
	depth      int
	strict     bool
	// path is the position of the value being read, for problem messages inside raw values.
	path []pathSeg
	// dupes collects duplicate-key problems found while skipping raw values; past
	// maxKeptProblems they are only counted.
	dupes        []Problem
	dupesDropped int
}

// checkDepth reports whether b nests no deeper than max. It allocates nothing and runs before
// any parsing, so a 10,000-deep or huge body costs only one pass over its bytes.
func checkDepth(b []byte, max int) bool {
	depth := 0
	inString := false
	for i := 0; i < len(b); i++ {
		c := b[i]
		if inString {
			switch c {
			case '\\':
				i++
			case '"':
				inString = false
			}
			continue
		}
		switch c {
		case '"':
			inString = true
		case '{', '[':
			depth++
			if depth > max {
				return false
			}
		case '}', ']':
			depth--
		}
	}
	return true
}

func (p *parser) fail(msg string) error { return &syntaxError{pos: p.pos, msg: msg} }

func (p *parser) skipWS() {
	for p.pos < len(p.data) {
		switch p.data[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.pos++
		default:
			return
		}
	}
}

// kind skips white space and names the next value's kind without consuming it.
func (p *parser) kind() byte {
	p.skipWS()
	if p.pos >= len(p.data) {
		return kindEnd
	}
	switch c := p.data[p.pos]; c {
	case '"', '{', '[', 't', 'f', 'n':
		return c
	case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		return kindNumber
	}
	return p.data[p.pos]
}

// end checks that only white space follows the document.
func (p *parser) end() error {
	p.skipWS()
	if p.pos != len(p.data) {
		return p.fail("unexpected data after the top-level value")
	}
	return nil
}

// stringSpan reads a string at pos, returning the span of its contents (without quotes) and
// whether it holds escapes. Escapes are checked, including UTF-16 surrogate pairs.
func (p *parser) stringSpan() (start, end int, escaped bool, err error) {
	if p.pos >= len(p.data) || p.data[p.pos] != '"' {
		return 0, 0, false, p.fail("expected a string")
	}
	p.pos++
	start = p.pos
	for p.pos < len(p.data) {
		c := p.data[p.pos]
		switch {
		case c == '"':
			end = p.pos
			p.pos++
			return start, end, escaped, nil
		case c == '\\':
			escaped = true
			if err := p.checkEscape(); err != nil {
				return 0, 0, false, err
			}
		case c < 0x20:
			return 0, 0, false, p.fail("control character in string")
		default:
			p.pos++
		}
	}
	return 0, 0, false, p.fail("unterminated string")
}

// checkEscape validates the escape at pos and moves past it.
func (p *parser) checkEscape() error {
	if p.pos+1 >= len(p.data) {
		return p.fail("unterminated escape")
	}
	switch p.data[p.pos+1] {
	case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		p.pos += 2
		return nil
	case 'u':
		r, ok := hex4(p.data, p.pos+2)
		if !ok {
			return p.fail("invalid \\u escape")
		}
		if utf16.IsSurrogate(r) {
			// A high surrogate must be followed by a low one; anything else is not UTF-8.
			r2, ok2 := rune(-1), false
			if p.pos+8 <= len(p.data) && p.data[p.pos+6] == '\\' && p.data[p.pos+7] == 'u' {
				r2, ok2 = hex4(p.data, p.pos+8)
			}
			if r >= 0xDC00 || !ok2 || utf16.DecodeRune(r, r2) == utf8.RuneError {
				return p.fail("invalid UTF-16 surrogate in \\u escape")
			}
			p.pos += 12
			return nil
		}
		p.pos += 6
		return nil
	}
	return p.fail("invalid escape")
}

func hex4(b []byte, i int) (rune, bool) {
	if i+4 > len(b) {
		return 0, false
	}
	var r rune
	for _, c := range b[i : i+4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

// unescape decodes the contents of an already validated string span.
func unescape(s []byte) []byte {
	out := make([]byte, 0, len(s))
	for i := 0; i < len(s); {
		c := s[i]
		if c != '\\' {
			out = append(out, c)
			i++
			continue
		}
		switch s[i+1] {
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			r, _ := hex4(s, i+2)
			if utf16.IsSurrogate(r) {
				r2, _ := hex4(s, i+8)
				out = utf8.AppendRune(out, utf16.DecodeRune(r, r2))
				i += 12
				continue
			}
			out = utf8.AppendRune(out, r)
			i += 6
			continue
		default: // '"', '\\', '/'
			out = append(out, s[i+1])
		}
		i += 2
	}
	return out
}

// str reads a string value and returns its decoded text.
func (p *parser) str() (string, error) {
	s, e, esc, err := p.stringSpan()
	if err != nil {
		return "", err
	}
	if !esc {
		if p.text != "" {
			return p.text[s:e], nil
		}
		return string(p.data[s:e]), nil
	}
	return string(unescape(p.data[s:e])), nil
}

// keyString returns the key being visited by an object member callback as a string.
func (p *parser) keyString() string {
	if !p.keyEsc {
		if p.text != "" {
			return p.text[p.keyS:p.keyE]
		}
		return string(p.data[p.keyS:p.keyE])
	}
	return string(unescape(p.data[p.keyS:p.keyE]))
}

// number reads a JSON number and returns its span, checking the grammar exactly.
func (p *parser) number() (start, end int, err error) {
	start = p.pos
	i := p.pos
	d := p.data
	if i < len(d) && d[i] == '-' {
		i++
	}
	switch {
	case i < len(d) && d[i] == '0':
		i++
	case i < len(d) && d[i] >= '1' && d[i] <= '9':
		for i < len(d) && d[i] >= '0' && d[i] <= '9' {
			i++
		}
	default:
		p.pos = i
		return 0, 0, p.fail("invalid number")
	}
	if i < len(d) && d[i] == '.' {
		i++
		j := i
		for i < len(d) && d[i] >= '0' && d[i] <= '9' {
			i++
		}
		if i == j {
			p.pos = i
			return 0, 0, p.fail("invalid number: no digits after '.'")
		}
	}
	if i < len(d) && (d[i] == 'e' || d[i] == 'E') {
		i++
		if i < len(d) && (d[i] == '+' || d[i] == '-') {
			i++
		}
		j := i
		for i < len(d) && d[i] >= '0' && d[i] <= '9' {
			i++
		}
		if i == j {
			p.pos = i
			return 0, 0, p.fail("invalid number: no digits in exponent")
		}
	}
	p.pos = i
	return start, i, nil
}

// float reads a number value as a float64.
func (p *parser) float() (float64, error) {
	s, e, err := p.number()
	if err != nil {
		return 0, err
	}
	var num string
	if p.text != "" {
		num = p.text[s:e]
	} else {
		num = string(p.data[s:e])
	}
	f, perr := strconv.ParseFloat(num, 64)
	if perr != nil {
		// Out of range: keep the infinity ParseFloat returns; callers reject non-finite values.
		return f, nil
	}
	return f, nil
}

func (p *parser) literal(word string) error {
	if !bytes.HasPrefix(p.data[p.pos:], []byte(word)) {
		return p.fail("invalid literal")
	}
	p.pos += len(word)
	return nil
}

// skip reads any value and returns its span. In strict mode it records duplicate keys in
// p.dupes with their path.
func (p *parser) skip() (start, end int, err error) {
	k := p.kind()
	start = p.pos
	switch k {
	case kindString:
		if _, _, _, err = p.stringSpan(); err != nil {
			return 0, 0, err
		}
	case kindNumber:
		if _, _, err = p.number(); err != nil {
			return 0, 0, err
		}
	case kindTrue:
		err = p.literal("true")
	case kindFalse:
		err = p.literal("false")
	case kindNull:
		err = p.literal("null")
	case kindObject:
		err = p.skipObject()
	case kindArray:
		i := 0
		err = p.array(func() error {
			p.path = append(p.path, pathSeg{index: i})
			_, _, err := p.skip()
			p.path = p.path[:len(p.path)-1]
			i++
			return err
		})
	case kindEnd:
		return 0, 0, p.fail("unexpected end of input")
	default:
		return 0, 0, p.fail(fmt.Sprintf("unexpected character %q", p.data[p.pos]))
	}
	if err != nil {
		return 0, 0, err
	}
	return start, p.pos, nil
}

// skipObject skips an object, checking for duplicate keys when strict.
func (p *parser) skipObject() error {
	var small [8][]byte
	seen := small[:0]
	var big map[string]struct{}
	return p.object(func(key []byte) error {
		if p.strict {
			dup := false
			if big != nil {
				_, dup = big[string(key)]
				if !dup {
					big[string(key)] = struct{}{}
				}
			} else {
				for _, s := range seen {
					if bytes.Equal(s, key) {
						dup = true
						break
					}
				}
				if !dup {
					seen = append(seen, key)
					if len(seen) > 16 {
						big = make(map[string]struct{}, 32)
						for _, s := range seen {
							big[string(s)] = struct{}{}
						}
					}
				}
			}
			if dup {
				if len(p.dupes) < maxKeptProblems {
					p.dupes = append(p.dupes, Problem{Path: p.pathString(), Message: fmt.Sprintf("duplicate key %q", key)})
				} else {
					p.dupesDropped++
				}
			}
		}
		p.path = append(p.path, pathSeg{keyB: key, index: -1})
		_, _, err := p.skip()
		p.path = p.path[:len(p.path)-1]
		return err
	})
}

// object reads an object, calling member for each key in arrival order; member must consume
// the value. The key may alias the input and is only valid during the call.
func (p *parser) object(member func(key []byte) error) error {
	if p.kind() != kindObject {
		return p.fail("expected an object")
	}
	p.depth++
	if p.depth > MaxDepth {
		return p.fail(fmt.Sprintf("nesting deeper than %d levels", MaxDepth))
	}
	p.pos++
	if p.kind() == '}' {
		p.pos++
		p.depth--
		return nil
	}
	for {
		if p.kind() != kindString {
			return p.fail("expected a string key")
		}
		s, e, esc, err := p.stringSpan()
		if err != nil {
			return err
		}
		key := p.data[s:e]
		if esc {
			key = unescape(key)
		}
		if p.kind() != ':' {
			return p.fail("expected ':' after object key")
		}
		p.pos++
		p.keyS, p.keyE, p.keyEsc = s, e, esc
		if err := member(key); err != nil {
			return err
		}
		switch p.kind() {
		case ',':
			p.pos++
		case '}':
			p.pos++
			p.depth--
			return nil
		default:
			return p.fail("expected ',' or '}' in object")
		}
	}
}

// array reads an array, calling elem for each element; elem must consume the value.
func (p *parser) array(elem func() error) error {
	if p.kind() != kindArray {
		return p.fail("expected an array")
	}
	p.depth++
	if p.depth > MaxDepth {
		return p.fail(fmt.Sprintf("nesting deeper than %d levels", MaxDepth))
	}
	p.pos++
	if p.kind() == ']' {
		p.pos++
		p.depth--
		return nil
	}
	for {
		if err := elem(); err != nil {
			return err
		}
		switch p.kind() {
		case ',':
			p.pos++
		case ']':
			p.pos++
			p.depth--
			return nil
		default:
			return p.fail("expected ',' or ']' in array")
		}
	}
}

// rawCopy returns a copy of the value just skipped; callers must not alias input buffers they
// do not own (encoding/json reuses them).
func rawCopy(b []byte) []byte {
	out := make([]byte, len(b))
	copy(out, b)
	return out
}

// pathString renders p.path like state.items[2].name.
func (p *parser) pathString() string {
	var sb strings.Builder
	for i, s := range p.path {
		if s.index >= 0 {
			sb.WriteByte('[')
			sb.WriteString(strconv.Itoa(s.index))
			sb.WriteByte(']')
			continue
		}
		if i > 0 {
			sb.WriteByte('.')
		}
		if s.keyB != nil {
			sb.Write(s.keyB)
		} else {
			sb.WriteString(s.key)
		}
	}
	return sb.String()
}

// isBlankJSONString reports whether a raw JSON string value (with quotes) holds only space.
func isBlankJSONString(raw []byte) bool {
	inner := raw[1 : len(raw)-1]
	if bytes.IndexByte(inner, '\\') >= 0 {
		inner = unescape(inner)
	}
	return len(bytes.TrimSpace(inner)) == 0
}

// keySet detects repeated keys: a scan over a fixed array while small, a map once large, so
// typical objects cost no allocation and a hostile one with a million keys costs linear time.
type keySet struct {
	small [16]string
	n     int
	big   map[string]struct{}
}

// add records k and reports whether it was already there.
func (s *keySet) add(k string) bool {
	if s.big != nil {
		if _, ok := s.big[k]; ok {
			return true
		}
		s.big[k] = struct{}{}
		return false
	}
	for _, prev := range s.small[:s.n] {
		if prev == k {
			return true
		}
	}
	if s.n < len(s.small) {
		s.small[s.n] = k
		s.n++
		return false
	}
	s.big = make(map[string]struct{}, 64)
	for _, prev := range s.small {
		s.big[prev] = struct{}{}
	}
	s.big[k] = struct{}{}
	return false
}
