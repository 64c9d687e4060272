package review

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// shown is a raw JSON value (state, instructions) prepared for a reader: a JSON string as its
// text, anything else indented, and either cut at a limit so a huge value never reaches the
// browser whole. The work is bounded by the limit too, not by the value's size.
type shown struct {
	Text      string
	JSON      bool // Text is indented JSON (else plain text)
	Truncated bool
	Total     int // the value's size in bytes, as stored
}

// Size describes the value's size for a person.
func (s shown) Size() string { return humanBytes(s.Total) }

// Shown describes the shown part's size.
func (s shown) Shown() string { return humanBytes(len(s.Text)) }

func humanBytes(n int) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d bytes", n)
}

// show prepares raw for display within limit bytes of text. raw is valid JSON (the item
// decoder checked it).
func show(raw json.RawMessage, limit int) shown {
	s := shown{Total: len(raw)}
	if len(raw) == 0 {
		return s
	}
	if raw[0] == '"' {
		s.Text, s.Truncated = unquoteLimited(raw, limit)
		return s
	}
	s.JSON = true
	s.Text, s.Truncated = indentLimited(raw, limit)
	return s
}

// unquoteLimited decodes a JSON string value, stopping after limit bytes of output.
func unquoteLimited(raw []byte, limit int) (string, bool) {
	var b strings.Builder
	b.Grow(min(len(raw), limit+4))
	for i := 1; i < len(raw)-1; {
		if b.Len() >= limit {
			return b.String(), true
		}
		c := raw[i]
		if c != '\\' {
			// Copy the run up to the next escape, the end, or the limit.
			j := i
			for j < len(raw)-1 && raw[j] != '\\' && b.Len()+(j-i) < limit {
				j++
			}
			for j > i && j < len(raw)-1 && !utf8RuneStart(raw[j]) { // never split a character
				j--
			}
			if j == i {
				return b.String(), true // the next character does not fit
			}
			b.Write(raw[i:j])
			i = j
			continue
		}
		switch raw[i+1] {
		case 'n':
			b.WriteByte('\n')
		case 't':
			b.WriteByte('\t')
		case 'r':
			b.WriteByte('\r')
		case 'b':
			b.WriteByte('\b')
		case 'f':
			b.WriteByte('\f')
		case 'u':
			r := hexRune(raw[i+2 : i+6])
			if utf16.IsSurrogate(r) && i+12 <= len(raw) {
				r = utf16.DecodeRune(r, hexRune(raw[i+8:i+12]))
				i += 6
			}
			b.WriteRune(r)
			i += 6
			continue
		default: // '"', '\\', '/'
			b.WriteByte(raw[i+1])
		}
		i += 2
	}
	return b.String(), false
}

func hexRune(h []byte) rune {
	var r rune
	for _, c := range h {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return utf8.RuneError
		}
	}
	return r
}

// indentLimited re-indents a JSON value (two spaces), stopping after limit bytes of output.
// Strings are copied as they are (escapes included), so the output is JSON when not cut.
func indentLimited(raw []byte, limit int) (string, bool) {
	var b strings.Builder
	b.Grow(min(len(raw)+len(raw)/2, limit+64))
	depth := 0
	newline := func() {
		b.WriteByte('\n')
		for range depth {
			b.WriteString("  ")
		}
	}
	for i := 0; i < len(raw); i++ {
		if b.Len() >= limit {
			return cutUTF8(b.String(), limit), true
		}
		c := raw[i]
		switch c {
		case ' ', '\t', '\n', '\r':
		case '"':
			j := i + 1
			for j < len(raw) && raw[j] != '"' {
				if raw[j] == '\\' {
					j++
				}
				j++
			}
			end := min(j+1, len(raw))
			if room := limit - b.Len(); end-i > room {
				e := i + room
				for e > i && !utf8RuneStart(raw[e]) { // never split a character
					e--
				}
				b.Write(raw[i:e])
				return b.String(), true
			}
			b.Write(raw[i:end])
			i = j
		case '{', '[':
			// An empty object or array stays on one line.
			k := i + 1
			for k < len(raw) && (raw[k] == ' ' || raw[k] == '\t' || raw[k] == '\n' || raw[k] == '\r') {
				k++
			}
			if k < len(raw) && (raw[k] == '}' || raw[k] == ']') {
				b.WriteByte(c)
				b.WriteByte(raw[k])
				i = k
				continue
			}
			b.WriteByte(c)
			depth++
			newline()
		case '}', ']':
			depth--
			newline()
			b.WriteByte(c)
		case ',':
			b.WriteByte(',')
			newline()
		case ':':
			b.WriteString(": ")
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), false
}

// cutUTF8 cuts s to at most n bytes without splitting a character.
func cutUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
