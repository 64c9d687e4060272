package worker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sys1hq/sys1/contract"
)

// Disposition is how a delivery ends.
type Disposition int

const (
	// Ack: the run is answered (a success, or a finished run answered again).
	Ack Disposition = iota
	// Term: the run is answered with its error and the message is done with.
	Term
	// Nak: the message comes back after Settlement.Delay, to this or another replica.
	Nak
)

func (d Disposition) String() string {
	switch d {
	case Ack:
		return "ack"
	case Term:
		return "term"
	case Nak:
		return "nak"
	}
	return fmt.Sprintf("Disposition(%d)", int(d))
}

// Settlement is settle's decision.
type Settlement struct {
	Disposition Disposition
	Delay       time.Duration // for Nak
}

// Answers reports whether the run is answered (reply and record) before the delivery ends:
// always for Ack and Term, never for Nak (the run is not over).
func (s Settlement) Answers() bool { return s.Disposition != Nak }

// RetryPolicy shapes redelivery delays: Base·2^(n−1) after the n-th delivery, capped at Max,
// or a provider's Retry-After hint when it is longer (still capped).
type RetryPolicy struct {
	Base, Max time.Duration
}

// Delay is the wait before the delivery after the given number of deliveries.
func (p RetryPolicy) Delay(deliveries int, hint time.Duration) time.Duration {
	d := p.Base
	for i := 1; i < deliveries && d < p.Max; i++ {
		d *= 2
	}
	d = min(d, p.Max)
	if hint > d {
		d = min(hint, p.Max)
	}
	return d
}

// SettleInput is everything settle decides from.
type SettleInput struct {
	// Err is how the run went: nil (answered, or answered again from its stored outcome), a
	// *contract.Error (the run's own failure), ErrShutdown, or any other error (NATS or KV
	// trouble, or a duplicate waiting for its run's owner), which never answers.
	Err        error
	Deliveries int       // this delivery's number, 1-based
	MaxDeliver int       // SYS1_MAX_DELIVER: deliveries a transient failure may take
	Deadline   time.Time // Sys1-Deadline; zero when none
	Retry      RetryPolicy
	Now        time.Time
}

// leaseRecheck is the shortest wait for another delivery's lease.
const leaseRecheck = 100 * time.Millisecond

// ErrShutdown marks a run cut short by the shutdown grace running out: not finished, so handed
// back at once for another replica.
var ErrShutdown = errors.New("run cancelled by shutdown")

// settle decides how a delivery ends. It is the only place that does: every stage reports
// what happened as an error (or nil), and this maps it to Ack, Term or Nak with a delay.
//
//   - nil: Ack.
//   - a permanent *contract.Error: Term (answered with it).
//   - a transient *contract.Error: Nak with the growing delay while deliveries remain and the
//     deadline allows the next try; otherwise Term, answered with it.
//   - ErrShutdown: Nak at once.
//   - a run that must wait for its caller's rate limit or in-flight slot: Nak until then
//     (the budget stage answered SYS1_EXPIRED already if that is past the deadline).
//   - anything else is trouble that answering cannot fix (NATS, KV, a duplicate whose run is
//     still in flight): Nak with the growing delay. Such naks are bounded by the consumer's own
//     max deliver (SYS1_CONSUMER_MAX_DELIVER), after which JetStream stops redelivering and the
//     dead-letter handler answers the run (deadletter.go).
func settle(in SettleInput) Settlement {
	if in.Err == nil {
		return Settlement{Disposition: Ack}
	}
	if errors.Is(in.Err, ErrShutdown) || errors.Is(in.Err, context.Canceled) {
		return Settlement{Disposition: Nak}
	}
	if d, ok := isDelay(in.Err); ok {
		// Waiting for a rate limit's window or an in-flight slot: back exactly then.
		return Settlement{Disposition: Nak, Delay: max(d.until.Sub(in.Now), 0)}
	}
	var wait *waitError
	if errors.As(in.Err, &wait) && !wait.until.IsZero() {
		// Another delivery's lease on the run: back when it ends (it is then renewed, or lapsed
		// and taken over), not on the retry schedule, whose short first delays would spend the
		// message's deliveries while the lease lasts.
		return Settlement{Disposition: Nak, Delay: max(wait.until.Sub(in.Now), leaseRecheck)}
	}
	cerr, ok := contract.AsError(in.Err)
	if !ok {
		return Settlement{Disposition: Nak, Delay: in.Retry.Delay(in.Deliveries, 0)}
	}
	if !cerr.Transient() {
		return Settlement{Disposition: Term}
	}
	delay := in.Retry.Delay(in.Deliveries, cerr.RetryAfter)
	if in.Deliveries < in.MaxDeliver && (in.Deadline.IsZero() || in.Now.Add(delay).Before(in.Deadline)) {
		return Settlement{Disposition: Nak, Delay: delay}
	}
	return Settlement{Disposition: Term}
}
