package ollamatest

import (
	"fmt"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// scanner is a small JSON reader for the fake's request decoding. encoding/json cannot walk
// objects in order without its token API, which allocates per token and made the fake the
// slowest part of a benchmark round trip; this walks the body once, allocating only for the
// strings it returns.
type scanner struct {
	data  []byte
	pos   int
	depth int
}

// maxDepth bounds nesting, as Ollama's decoder does, so a hostile body cannot blow the stack.
const maxDepth = 128

func (s *scanner) fail(format string, args ...any) error {
	return badf("invalid JSON at byte %d: %s", s.pos, fmt.Sprintf(format, args...))
}

func (s *scanner) ws() {
	for s.pos < len(s.data) {
		switch s.data[s.pos] {
		case ' ', '\t', '\n', '\r':
			s.pos++
		default:
			return
		}
	}
}

// peek returns the first byte of the next value (after white space), or 0 at the end.
func (s *scanner) peek() byte {
	s.ws()
	if s.pos >= len(s.data) {
		return 0
	}
	return s.data[s.pos]
}

// end checks that only white space follows the document.
func (s *scanner) end() error {
	if s.ws(); s.pos < len(s.data) {
		return s.fail("data after the end of the value")
	}
	return nil
}

// object calls fn for each key in order; fn must consume the value.
func (s *scanner) object(fn func(key string) error) error {
	if s.peek() != '{' {
		return s.fail("expected an object")
	}
	if s.depth++; s.depth > maxDepth {
		return s.fail("nesting too deep")
	}
	s.pos++
	if s.peek() == '}' {
		s.pos++
		s.depth--
		return nil
	}
	for {
		if s.peek() != '"' {
			return s.fail("expected a key")
		}
		key, err := s.str()
		if err != nil {
			return err
		}
		if s.peek() != ':' {
			return s.fail("expected ':' after a key")
		}
		s.pos++
		if err := fn(key); err != nil {
			return err
		}
		switch s.peek() {
		case ',':
			s.pos++
		case '}':
			s.pos++
			s.depth--
			return nil
		default:
			return s.fail("expected ',' or '}'")
		}
	}
}

// array calls fn for each element in order; fn must consume the value.
func (s *scanner) array(fn func(i int) error) error {
	if s.peek() != '[' {
		return s.fail("expected an array")
	}
	if s.depth++; s.depth > maxDepth {
		return s.fail("nesting too deep")
	}
	s.pos++
	if s.peek() == ']' {
		s.pos++
		s.depth--
		return nil
	}
	for i := 0; ; i++ {
		if err := fn(i); err != nil {
			return err
		}
		switch s.peek() {
		case ',':
			s.pos++
		case ']':
			s.pos++
			s.depth--
			return nil
		default:
			return s.fail("expected ',' or ']'")
		}
	}
}

// raw skips one value, checking its syntax, and returns its bytes.
func (s *scanner) raw() ([]byte, error) {
	start := s.pos
	if err := s.skip(); err != nil {
		return nil, err
	}
	return s.data[start:s.pos], nil
}

func (s *scanner) skip() error {
	switch c := s.peek(); {
	case c == '{':
		return s.object(func(string) error { return s.skip() })
	case c == '[':
		return s.array(func(int) error { return s.skip() })
	case c == '"':
		return s.skipString()
	case c == '-' || (c >= '0' && c <= '9'):
		_, err := s.number()
		return err
	case c == 't':
		return s.literal("true")
	case c == 'f':
		return s.literal("false")
	case c == 'n':
		return s.literal("null")
	case c == 0:
		return s.fail("unexpected end of input")
	default:
		return s.fail("unexpected character %q", c)
	}
}

func (s *scanner) literal(word string) error {
	if len(s.data)-s.pos < len(word) || string(s.data[s.pos:s.pos+len(word)]) != word {
		return s.fail("invalid literal")
	}
	s.pos += len(word)
	return nil
}

// number reads a JSON number and returns its text.
func (s *scanner) number() ([]byte, error) {
	start := s.pos
	d := s.data
	i := s.pos
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
		s.pos = i
		return nil, s.fail("invalid number")
	}
	if i < len(d) && d[i] == '.' {
		i++
		if i >= len(d) || d[i] < '0' || d[i] > '9' {
			s.pos = i
			return nil, s.fail("invalid number")
		}
		for i < len(d) && d[i] >= '0' && d[i] <= '9' {
			i++
		}
	}
	if i < len(d) && (d[i] == 'e' || d[i] == 'E') {
		i++
		if i < len(d) && (d[i] == '+' || d[i] == '-') {
			i++
		}
		if i >= len(d) || d[i] < '0' || d[i] > '9' {
			s.pos = i
			return nil, s.fail("invalid number")
		}
		for i < len(d) && d[i] >= '0' && d[i] <= '9' {
			i++
		}
	}
	s.pos = i
	return d[start:i], nil
}

// skipString checks a string's syntax.
func (s *scanner) skipString() error {
	_, err := s.strBytes()
	return err
}

// str reads a string value.
func (s *scanner) str() (string, error) {
	b, err := s.strBytes()
	return string(b), err
}

// strBytes reads a string and returns its decoded bytes: a sub-slice of the input when there
// are no escapes, so callers must copy before keeping them.
func (s *scanner) strBytes() ([]byte, error) {
	d := s.data
	i := s.pos + 1 // after the quote
	start := i
	escaped := false
	for {
		if i >= len(d) {
			s.pos = i
			return nil, s.fail("unterminated string")
		}
		c := d[i]
		switch {
		case c == '"':
			s.pos = i + 1
			if !escaped {
				return validUTF8(d[start:i]), nil
			}
			return s.unescape(d[start:i])
		case c == '\\':
			escaped = true
			i += 2
		case c < 0x20:
			s.pos = i
			return nil, s.fail("control character in a string")
		default:
			i++
		}
	}
}

func (s *scanner) unescape(in []byte) ([]byte, error) {
	out := make([]byte, 0, len(in))
	for i := 0; i < len(in); {
		c := in[i]
		if c != '\\' {
			out = append(out, c)
			i++
			continue
		}
		if i+1 >= len(in) {
			return nil, s.fail("invalid escape")
		}
		switch e := in[i+1]; e {
		case '"', '\\', '/':
			out = append(out, e)
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
			r, n, ok := readU(in[i:])
			if !ok {
				return nil, s.fail("invalid \\u escape")
			}
			if utf16.IsSurrogate(r) {
				r2, n2, ok2 := readU(in[i+n:])
				if dec := utf16.DecodeRune(r, r2); ok2 && dec != utf8.RuneError {
					r = dec
					n += n2
				} else {
					r = utf8.RuneError
				}
			}
			out = utf8.AppendRune(out, r)
			i += n
			continue
		default:
			return nil, s.fail("invalid escape")
		}
		i += 2
	}
	return validUTF8(out), nil
}

// validUTF8 replaces each invalid byte with U+FFFD, as Go's encoding/json (and so Ollama)
// does, rather than rejecting the string.
func validUTF8(b []byte) []byte {
	if utf8.Valid(b) {
		return b
	}
	out := make([]byte, 0, len(b)+8)
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		out = utf8.AppendRune(out, r)
		b = b[n:]
	}
	return out
}

// readU reads a \uXXXX escape at the start of b.
func readU(b []byte) (rune, int, bool) {
	if len(b) < 6 || b[0] != '\\' || b[1] != 'u' {
		return 0, 0, false
	}
	v, err := strconv.ParseUint(string(b[2:6]), 16, 32)
	if err != nil {
		return 0, 0, false
	}
	return rune(v), 6, true
}
