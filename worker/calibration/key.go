package calibration

import (
	"errors"
	"fmt"
	"strings"
)

// Key is the KV key of the fit for (model, caller, question): the three names escaped and
// joined with ".", e.g. Key("nimble:latest", "billing", "refund_requested") is
// "nimble=3Alatest.billing.refund_requested".
//
// The escape keeps A–Z, a–z, 0–9, "-" and "_" and writes every other byte as "=" and two
// upper-case hex digits; an empty name is a lone "=". Escaped names never contain ".", so
// the key splits back into exactly three names, and each escaped name decodes to one name
// only: the encoding is injective, and ParseKey is its inverse. Every key is a valid KV key
// (letters, digits, "-", "_", "=" and "." between non-empty tokens), and a valid file name.
func Key(model, caller, question string) string {
	var b strings.Builder
	b.Grow(len(model) + len(caller) + len(question) + 2)
	escapeTo(&b, model)
	b.WriteByte('.')
	escapeTo(&b, caller)
	b.WriteByte('.')
	escapeTo(&b, question)
	return b.String()
}

const hexDigits = "0123456789ABCDEF"

func keySafe(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_'
}

func escapeTo(b *strings.Builder, s string) {
	if s == "" {
		b.WriteByte('=')
		return
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if keySafe(c) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('=')
		b.WriteByte(hexDigits[c>>4])
		b.WriteByte(hexDigits[c&0xf])
	}
}

// ParseKey splits a key made by Key into its model, caller and question. Anything Key could
// not have produced (another number of tokens, a lower-case or truncated escape, a byte
// outside the alphabet) is an error.
func ParseKey(key string) (model, caller, question string, err error) {
	parts := strings.Split(key, ".")
	if len(parts) != 3 {
		return "", "", "", fmt.Errorf("key %q: want model.caller.question, got %d tokens", key, len(parts))
	}
	var names [3]string
	for i, p := range parts {
		if names[i], err = unescape(p); err != nil {
			return "", "", "", fmt.Errorf("key %q: %s: %w", key, [3]string{"model", "caller", "question"}[i], err)
		}
	}
	return names[0], names[1], names[2], nil
}

func unescape(s string) (string, error) {
	if s == "=" {
		return "", nil
	}
	if s == "" {
		return "", errors.New("empty token (an empty name is written =)")
	}
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		if keySafe(c) {
			b.WriteByte(c)
			continue
		}
		if c != '=' {
			return "", fmt.Errorf("byte %q is not allowed", c)
		}
		if i+2 >= len(s) {
			return "", errors.New("escape = needs two hex digits")
		}
		hi, lo := strings.IndexByte(hexDigits, s[i+1]), strings.IndexByte(hexDigits, s[i+2])
		if hi < 0 || lo < 0 {
			return "", fmt.Errorf("escape %q is not = and two upper-case hex digits", s[i:i+3])
		}
		v := byte(hi<<4 | lo)
		if keySafe(v) {
			// Key writes these bytes as themselves; an escaped one would be a second spelling.
			return "", fmt.Errorf("escape %q stands for %q, which is written as itself", s[i:i+3], v)
		}
		b.WriteByte(v)
		i += 2
	}
	return b.String(), nil
}
