package policy

import (
	"strconv"
	"strings"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/contract/wire"
)

// ParseMinConfidence parses a Sys1-Min-Confidence value: a decimal number in [0, 1] such as
// 0.7. An empty value means none and returns 0, as does 0 itself (it tightens nothing). A
// malformed value is a SYS1_INVALID_INPUT error the worker returns as the run's outcome,
// before any provider is called: a producer that asked for a threshold must not get answers
// judged without it.
func ParseMinConfidence(v string) (float64, *contract.Error) {
	s := strings.TrimSpace(v)
	if s == "" {
		return 0, nil
	}
	// Decimal digits only: ParseFloat would also take "NaN", "Inf", "0x1p-1" and "1_0"...
	// which no producer means, and a length bound keeps "0.7000…0001" from costing anything.
	ok := len(s) <= 32
	for i := 0; ok && i < len(s); i++ {
		c := s[i]
		ok = (c >= '0' && c <= '9') || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-'
	}
	var f float64
	if ok {
		var err error
		f, err = strconv.ParseFloat(s, 64)
		ok = err == nil && f >= 0 && f <= 1
	}
	if !ok {
		return 0, contract.Errorf(contract.CodeInvalidInput,
			"%s: %s is not a number in [0, 1] (for example 0.7)", wire.HeaderMinConfidence, quoteClipped(v))
	}
	return f, nil
}

// quoteClipped quotes a caller's header value for an error message, cut short.
func quoteClipped(v string) string {
	const limit = 32
	if len(v) > limit {
		return strconv.Quote(v[:limit]) + "…"
	}
	return strconv.Quote(v)
}
