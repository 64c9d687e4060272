package worker

import (
	"fmt"
	"strings"
	"time"
)

// Header names of SPEC §3–§4.
const (
	HeaderRunID     = "Sys1-Run-Id"
	HeaderReplyTo   = "Sys1-Reply-To"
	HeaderDeadline  = "Sys1-Deadline"
	HeaderStatus    = "Sys1-Status"
	HeaderErrorCode = "Sys1-Error-Code"
	HeaderMsgID     = "Nats-Msg-Id"
)

// ValidRunID reports whether id is 1–128 of A-Za-z0-9._:- (SPEC §3).
func ValidRunID(id string) bool {
	if len(id) == 0 || len(id) > 128 {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '.', c == '_', c == ':', c == '-':
		default:
			return false
		}
	}
	return true
}

// derivedRunID names a run that carried no usable id. It contains '~', which SPEC §3 forbids
// in caller ids, so it can never collide with one; it is stable across redeliveries.
func derivedRunID(stream string, seq uint64) string {
	return fmt.Sprintf("%s~%d", stream, seq)
}

// parseDeadline parses Sys1-Deadline (RFC 3339); empty means none.
func parseDeadline(v string) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	t, err := time.Parse(time.RFC3339Nano, strings.TrimSpace(v))
	if err != nil {
		return time.Time{}, fmt.Errorf("%s: %q is not an RFC 3339 time", HeaderDeadline, v)
	}
	return t, nil
}
