package worker

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/contract/wire"
)

// ValidRunID reports whether id is 1–128 of A-Za-z0-9._:- (SPEC §3; wire.ValidRunID).
func ValidRunID(id string) bool { return wire.ValidRunID(id) }

// derivedRunID names a run that carried no usable id: <stream>~<seq>~<epoch>. It contains
// '~', which SPEC §3 forbids in caller ids, so it can never collide with one; it is stable
// across redeliveries. The epoch (streamEpoch) names the stream's incarnation: a recreated
// stream numbers its messages from 1 again, and without it a new run would inherit an old
// run's id, so the gate would answer it with the old run's stored outcome and its record would
// replace the old one in ClickHouse.
// runIDOf is the run a request message names: its Sys1-Run-Id when that is valid, else
// derived (the message's derivedRunID).
func runIDOf(hdr nats.Header, derived string) string {
	if id := hdr.Get(wire.HeaderRunID); id != "" && ValidRunID(id) {
		return id
	}
	return derived
}

func derivedRunID(stream string, seq uint64, epoch string) string {
	return stream + "~" + strconv.FormatUint(seq, 10) + "~" + epoch
}

// streamEpoch is a stream's creation time, in nanoseconds since 1970, base 36 (12 characters
// until the 2090s).
func streamEpoch(created time.Time) string {
	return strconv.FormatInt(created.UnixNano(), 36)
}

// parseDeadline parses Sys1-Deadline (RFC 3339). set is false when the header is absent;
// any time that parses is a deadline, the zero time (0001-01-01T00:00:00Z) included — it is
// long past, not "none".
func parseDeadline(v string) (t time.Time, set bool, err error) {
	if v == "" {
		return time.Time{}, false, nil
	}
	t, err = time.Parse(time.RFC3339Nano, strings.TrimSpace(v))
	if err != nil {
		return time.Time{}, false, fmt.Errorf("%s: %q is not an RFC 3339 time", wire.HeaderDeadline, contract.Echo(v))
	}
	return t, true, nil
}
