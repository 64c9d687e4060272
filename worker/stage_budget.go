package worker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/worker/budget"
)

// budget admits the run under its caller's limits (SYS1_LIMITS_FILE), exactly across every
// replica (compare-and-set counters in KV sys1-limits): over a rate limit or an in-flight
// cap the run waits — redelivered when the window or a slot frees, within its deadline —
// and over a day budget it is refused SYS1_BUDGET_EXCEEDED, saying which and when it resets.
// Token and USD budgets are charged an estimate now and corrected to what the call used
// (settleBudget). A run answered from the cache uses no budget.
func (r *run) budget(ctx context.Context) error {
	p := r.p
	if p.budget == nil || r.resp != nil && !r.resumed {
		return nil // no call, no charge (a cache hit); a resumed answer closes its open admission
	}
	rule, ok := p.limitsNow().Match(r.identity.Caller)
	if !ok || !rule.Limited() {
		return nil
	}
	d, err := p.budget.Admit(ctx, r.identity.Caller, rule, r.estimate())
	if err != nil {
		return fmt.Errorf("budget: %w", err) // NATS trouble: nothing was admitted; try again
	}
	switch d.Outcome {
	case budget.Admitted:
		r.ticket = d.Ticket
		return nil
	case budget.Exceeded:
		return contract.Errorf(contract.CodeBudgetExceeded, "%s", d.Exceeded.Error())
	}
	// Delayed: a rate limit's window or an in-flight slot. An in-flight slot is looked for
	// again sooner at first, then less often (up to every 5 s), so a long wait costs few
	// deliveries (each counts against SYS1_CONSUMER_MAX_DELIVER).
	if d.Reason == budget.KindInFlight && r.state != nil {
		d.Until = d.Until.Add(min(time.Duration(1<<min(r.state.Waits, 5))*250*time.Millisecond, 5*time.Second))
	}
	if !r.deadline.IsZero() && !d.Until.Before(r.deadline) {
		return contract.Errorf(contract.CodeExpired, "deadline %s passes before the caller's %s frees (at %s); the provider was not called",
			r.deadline.UTC().Format(time.RFC3339Nano), d.Reason.Label(), d.Until.UTC().Format(time.RFC3339))
	}
	return &delayError{until: d.Until, why: "over the caller's " + d.Reason.Label() + "; redelivered when it frees"}
}

// estimate is what the run is likely to use, charged to the day budgets until the call says
// what it used: about four bytes of text a token, and the price of the provider the chain
// would ask first. It carries the run's id, so the run is charged once however many of its
// deliveries are admitted before one settles.
func (r *run) estimate() budget.Estimate {
	text := len(r.msg.Data())
	for _, im := range r.resolved.Images {
		text -= len(im.Data)
	}
	// Named by the run: a delivery whose replica died before settling leaves its charge open,
	// and the run's next delivery is admitted on it instead of paying twice.
	est := budget.Estimate{InputTokens: int64(max(text, 0)/4 + 16*len(r.resolved.Questions)), ID: r.runID}
	if routes := r.p.chain.Routes(r.resolved.Model); len(routes) > 0 {
		usage := contract.Usage{InputTokens: est.InputTokens, OutputTokens: int64(len(r.resolved.Questions))}
		if c := r.p.pricesNow().Cost(routes[0].Provider, routes[0].Model, usage); c != nil {
			est.USD = *c
		}
	}
	return est
}

// settleBudget corrects the budgets to what the run used and frees its in-flight slot, once
// the delivery is over however it ended (answered, redelivered, refused).
func (r *run) settleBudget(ctx context.Context) {
	t := r.ticket
	if t == nil {
		return
	}
	r.ticket = nil
	ctx = context.WithoutCancel(ctx)
	var actual budget.Actual
	if r.resp != nil && !r.cacheHit {
		actual = budget.Actual{InputTokens: r.resp.Usage.InputTokens, USD: r.costUSD()}
	}
	if r.retried {
		// The run goes on in a later delivery, which is admitted on this same charge and
		// settles it in the end. Closing it here would charge that delivery again — or refuse
		// it, once the budget is spent, for a run already paid for (the soak found one such
		// run). The charge stays open and at least its estimate, so the budget the run holds
		// is not admitted to another run meanwhile (the 60-minute soak found that refunding it
		// here overspent the budget).
		if err := t.Hold(ctx, actual); err != nil {
			r.log.Warn().Err(err).Msg("could not correct the caller's budget to what this delivery used")
		}
		if err := t.Release(ctx); err != nil {
			r.log.Warn().Err(err).Msg("could not free the run's in-flight slot; it lapses with its lease")
		}
		return
	}
	if err := t.Settle(ctx, actual); err != nil {
		r.log.Warn().Err(err).Msg("could not correct the caller's budget to what the run used")
	}
	if err := t.Release(ctx); err != nil {
		r.log.Warn().Err(err).Msg("could not free the run's in-flight slot; it lapses with its lease")
	}
}

// costUSD is what the answer cost (SYS1_PRICES_FILE), from the attempt that answered: nil
// when that model is unpriced (never a made-up 0), 0 for an answer from the cache (no call).
func (r *run) costUSD() *float64 {
	if r.cacheHit {
		zero := 0.0
		return &zero
	}
	if r.resp == nil {
		return nil
	}
	return r.p.pricesNow().Cost(r.answeredBy, r.answeredModel, r.resp.Usage)
}

// delayError is a run that must wait (a rate limit, an in-flight cap): not a failure, never
// answered; settle naks it until then.
type delayError struct {
	until time.Time
	why   string
}

func (e *delayError) Error() string { return e.why }

func isDelay(err error) (*delayError, bool) {
	var d *delayError
	ok := errors.As(err, &d)
	return d, ok
}
