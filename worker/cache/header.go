package cache

import (
	"strconv"
	"strings"
	"time"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/contract/wire"
	"github.com/sys1hq/sys1/worker/limits"
)

// MaxAge is the oldest cached answer a request may be given, and the TTL its own answer is
// stored with; 0 means the request does not use the cache at all. It combines the caller's
// rule (the limits file's cache field), the request's Sys1-Cache header and the ceiling (the
// cache bucket's TTL, which no entry outlives):
//
//   - cache: off in the rule: never, whatever the header says.
//   - a header: its age (0 or off: no cache for this request), never more than the rule's
//     cache, or the ceiling when the rule sets none. The header is an allowance, so one
//     longer than the rule's is cut to it, not refused.
//   - no header: the rule's cache (none: the caller has not opted in).
//
// A header that is not a duration, is negative or is under a second (but not 0) is
// SYS1_INVALID_INPUT, whatever the rule.
func MaxAge(rule limits.Rule, header string, ceiling time.Duration) (time.Duration, *contract.Error) {
	h, given, err := ParseHeader(header)
	if err != nil {
		return 0, err
	}
	if rule.CacheOff || ceiling <= 0 {
		return 0, nil
	}
	if !given {
		return min(rule.Cache, ceiling), nil
	}
	limit := ceiling
	if rule.Cache > 0 {
		limit = min(rule.Cache, ceiling)
	}
	return min(h, limit), nil
}

// ParseHeader reads a Sys1-Cache value: a Go duration of at least a second ("24h", "90m",
// "3600s"), a bare number of seconds ("3600"), or 0 / off for no cache. given is false for an
// empty value (no header).
func ParseHeader(v string) (age time.Duration, given bool, _ *contract.Error) {
	s := strings.TrimSpace(v)
	if s == "" {
		return 0, false, nil
	}
	bad := func(why string) *contract.Error {
		return contract.Errorf(contract.CodeInvalidInput, "%s: %s %s (like 24h or 90m, or 0 for no cache)", wire.HeaderCache, quoteClipped(v), why)
	}
	if s == "0" || strings.EqualFold(s, "off") {
		return 0, true, nil
	}
	var d time.Duration
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		if n > int64(maxHeader/time.Second) {
			return maxHeader, true, nil
		}
		d = time.Duration(n) * time.Second
	} else {
		var perr error
		if d, perr = time.ParseDuration(s); perr != nil {
			return 0, true, bad("is not a duration")
		}
	}
	switch {
	case d < 0:
		return 0, true, bad("is negative")
	case d == 0:
		return 0, true, nil
	case d < time.Second:
		return 0, true, bad("is under a second")
	}
	return d, true, nil
}

// maxHeader stands in for an age too long to represent: the rule or ceiling cuts it anyway.
const maxHeader = 100 * 365 * 24 * time.Hour

// quoteClipped quotes a header value for an error message, clipped: headers are the caller's
// and unbounded.
func quoteClipped(v string) string {
	if len(v) > 64 {
		cut := 64
		for cut > 0 && v[cut]&0xC0 == 0x80 {
			cut--
		}
		return strconv.Quote(v[:cut] + "…")
	}
	return strconv.Quote(v)
}
