package worker

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sys1hq/sys1/contract"
)

// TestSettleEveryCodeDeliveryAndDeadline walks every error code through every delivery and
// deadline case: settle alone decides how a delivery ends, so this table is the policy.
func TestSettleEveryCodeDeliveryAndDeadline(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	retry := RetryPolicy{Base: time.Second, Max: 8 * time.Second}
	const maxDeliver = 4
	deadlines := []struct {
		name string
		at   time.Time
	}{
		{"no deadline", time.Time{}},
		{"deadline far ahead", now.Add(time.Hour)},
		{"deadline before the next try", now.Add(500 * time.Millisecond)},
		{"deadline passed", now.Add(-time.Second)},
	}
	for _, code := range append(contract.Codes(), contract.Code("SYS1_SOMETHING_NEW")) {
		for deliveries := 1; deliveries <= maxDeliver+1; deliveries++ {
			for _, dl := range deadlines {
				t.Run(fmt.Sprintf("%s/delivery %d/%s", code, deliveries, dl.name), func(t *testing.T) {
					got := settle(SettleInput{Err: contract.Errorf(code, "x"), Deliveries: deliveries, MaxDeliver: maxDeliver, Deadline: dl.at, Retry: retry, Now: now})
					want := Settlement{Disposition: Term}
					delay := retry.Delay(deliveries, 0)
					if code.Transient() && deliveries < maxDeliver && (dl.at.IsZero() || now.Add(delay).Before(dl.at)) {
						want = Settlement{Disposition: Nak, Delay: delay}
					}
					if got != want {
						t.Fatalf("settle = %+v, want %+v", got, want)
					}
					if got.Answers() != (want.Disposition != Nak) {
						t.Fatalf("Answers() = %v for %v", got.Answers(), got.Disposition)
					}
				})
			}
		}
	}
}

func TestSettleOtherOutcomes(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	retry := RetryPolicy{Base: time.Second, Max: 8 * time.Second}
	busy := contract.Errorf(contract.CodeProviderBusy, "busy")
	busy.RetryAfter = 5 * time.Second
	longHint := contract.Errorf(contract.CodeProviderBusy, "busy")
	longHint.RetryAfter = time.Hour
	for _, tt := range []struct {
		name       string
		err        error
		deliveries int
		deadline   time.Time
		want       Settlement
	}{
		{"answered", nil, 1, time.Time{}, Settlement{Disposition: Ack}},
		{"answered on the last delivery", nil, 4, now.Add(-time.Hour), Settlement{Disposition: Ack}},
		{"shutdown hands the message back at once", ErrShutdown, 2, time.Time{}, Settlement{Disposition: Nak}},
		{"wrapped shutdown", fmt.Errorf("call: %w", ErrShutdown), 2, time.Time{}, Settlement{Disposition: Nak}},
		{"infrastructure trouble backs off", errors.New("run-id gate: create: nats: timeout"), 1, time.Time{}, Settlement{Disposition: Nak, Delay: time.Second}},
		{"infrastructure trouble backs off more", errors.New("publish record: nats: timeout"), 3, time.Time{}, Settlement{Disposition: Nak, Delay: 4 * time.Second}},
		{"infrastructure trouble is never answered, even past max deliver", errors.New("no responders"), 9, now.Add(-time.Hour), Settlement{Disposition: Nak, Delay: 8 * time.Second}},
		{"a duplicate waits for its owner", &waitError{ownerSeq: 3, why: "in flight"}, 2, time.Time{}, Settlement{Disposition: Nak, Delay: 2 * time.Second}},
		{"a second delivery waits out the first one's lease", &waitError{ownerSeq: 3, why: "leased", until: now.Add(25 * time.Second)}, 2, time.Time{}, Settlement{Disposition: Nak, Delay: 25 * time.Second}},
		{"a lease about to end: looked at again shortly", &waitError{ownerSeq: 3, why: "leased", until: now.Add(time.Millisecond)}, 6, time.Time{}, Settlement{Disposition: Nak, Delay: leaseRecheck}},
		{"a Retry-After hint lengthens the delay", busy, 1, time.Time{}, Settlement{Disposition: Nak, Delay: 5 * time.Second}},
		{"a hint is capped by the retry policy", longHint, 1, time.Time{}, Settlement{Disposition: Nak, Delay: 8 * time.Second}},
		{"a hint past the deadline answers now", busy, 1, now.Add(3 * time.Second), Settlement{Disposition: Term}},
		{"a wrapped contract error is the run's own", fmt.Errorf("call: %w", contract.Errorf(contract.CodeTimeout, "t")), 1, time.Time{}, Settlement{Disposition: Nak, Delay: time.Second}},
		{"a message without metadata ends", errNotJetStream, 1, time.Time{}, Settlement{Disposition: Term}},
		{"a rate-limited run comes back when its window frees", &delayError{until: now.Add(7 * time.Second), why: "rate"}, 3, time.Time{}, Settlement{Disposition: Nak, Delay: 7 * time.Second}},
		{"a slot that freed already: back at once", &delayError{until: now.Add(-time.Second), why: "slot"}, 1, time.Time{}, Settlement{Disposition: Nak}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := settle(SettleInput{Err: tt.err, Deliveries: tt.deliveries, MaxDeliver: 4, Deadline: tt.deadline, Retry: retry, Now: now})
			if got != tt.want {
				t.Fatalf("settle = %+v, want %+v", got, tt.want)
			}
		})
	}
}
