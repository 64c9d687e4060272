package contract

import (
	"math"
	"strconv"
	"unicode/utf8"
)

// The encoders append bytes directly: they run on the worker's hot path for every request,
// reply and record, and reflection-based encoding would also sort nothing we need sorted while
// escaping '<', '>' and '&', which would change the caller's bytes.

const hexDigits = "0123456789abcdef"

// AppendJSONString appends s as a JSON string with minimal escaping (quote, backslash, control
// characters; '<', '>' and '&' are left alone, unlike encoding/json); invalid UTF-8 becomes
// U+FFFD, as encoding/json does. Every hand-written JSON encoder in sys1 uses it.
func AppendJSONString(b []byte, s string) []byte { return appendString(b, s) }

// appendString is AppendJSONString.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, "\ufffd"...)
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// appendFloat appends f the way encoding/json spells float64 (shortest representation,
// exponent only for very small or large magnitudes). Non-finite values, which JSON cannot
// carry, are written as 0; validated data never holds them.
func appendFloat(b []byte, f float64) []byte {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return append(b, '0')
	}
	abs := math.Abs(f)
	format := byte('f')
	if abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	b = strconv.AppendFloat(b, f, format, -1, 64)
	if format == 'e' {
		// clean up e-09 to e-9, as encoding/json does
		n := len(b)
		if n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	return b
}

// appendRaw appends a raw JSON value, or null when it is empty.
func appendRaw(b []byte, raw []byte) []byte {
	if len(raw) == 0 {
		return append(b, "null"...)
	}
	return append(b, raw...)
}

// appendUsage appends the usage object.
func appendUsage(b []byte, u Usage) []byte {
	b = append(b, `{"input_tokens":`...)
	b = strconv.AppendInt(b, u.InputTokens, 10)
	b = append(b, `,"output_tokens":`...)
	b = strconv.AppendInt(b, u.OutputTokens, 10)
	return append(b, '}')
}
