package contract

import (
	"strings"
	"unicode/utf8"
)

// MaxEcho bounds a value quoted back in an error message: replies, records and the run-id
// gate repeat the message, so an unbounded value would be stored several times over.
const MaxEcho = 64

// Echo is a value a sender gave (a header, a question name) fit to quote in an error message:
// at most MaxEcho bytes, cut on a rune boundary and marked with "…", invalid UTF-8 replaced.
func Echo(v string) string {
	v = strings.ToValidUTF8(v, "\uFFFD")
	if len(v) <= MaxEcho {
		return v
	}
	i := MaxEcho - len("…")
	for i > 0 && !utf8.RuneStart(v[i]) {
		i--
	}
	return v[:i] + "…"
}
