package wire_test

import (
	"strings"
	"testing"

	"github.com/sys1hq/sys1/contract/wire"
)

func TestSubjectBuilders(t *testing.T) {
	for got, want := range map[string]string{
		wire.Decide("billing"):           "sys1.decide.billing",
		wire.Batch("billing", "b-7"):     "sys1.batch.billing.b-7",
		wire.BatchOf("billing"):          "sys1.batch.billing.*",
		wire.Runs("success"):             "sys1.runs.success",
		wire.Replies("billing", "r-1"):   "sys1.replies.billing.r-1",
		wire.RepliesOf("billing"):        "sys1.replies.billing.>",
		wire.Review("billing"):           "sys1.review.billing",
		wire.Label("billing"):            "sys1.labels.billing",
		wire.LabelAccepted("billing"):    "sys1.labels.billing.accepted",
		wire.LabelRejected("billing"):    "sys1.labels.billing.rejected",
		wire.Inbox("billing"):            "_INBOX.billing",
		wire.Arrival("sys1.decide.a.eu"): "sys1.arrivals.sys1.decide.a.eu",
		wire.PingSubject:                 "$SRV.PING.sys1",
	} {
		if got != want {
			t.Errorf("%q, want %q", got, want)
		}
	}
}

func TestCallerOf(t *testing.T) {
	for subject, want := range map[string]string{
		"sys1.decide.billing": "billing", "sys1.decide.billing.eu": "billing", "sys1.batch.a.b1": "a",
		"sys1.labels.svc-a": "svc-a", "sys1.decide.a*b": "a*b",
		"sys1.decide.*": "", "sys1.decide.>": "", "sys1.decide.": "", "sys1.runs.success": "", "sys1.decide.a b": "",
	} {
		got, ok := wire.CallerOf(subject)
		if ok != (want != "") || ok && got != want {
			t.Errorf("CallerOf(%q) = %q %v, want %q", subject, got, ok, want)
		}
	}
}

func TestValidRunID(t *testing.T) {
	for id, want := range map[string]bool{
		"r-1": true, "batch:item.2_x": true, "": false, "a~b": false, "a b": false, "é": false,
		strings.Repeat("a", wire.MaxRunIDLen): true, strings.Repeat("a", wire.MaxRunIDLen+1): false,
	} {
		if got := wire.ValidRunID(id); got != want {
			t.Errorf("ValidRunID(%q) = %v, want %v", id, got, want)
		}
	}
}
