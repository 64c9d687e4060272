package chain

import (
	"fmt"
	"time"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/provider/internal/upstream"
)

// refusal collects why providers were skipped without a call (open circuits, absences), for
// the error of a request no provider was called for. The most specific reason wins, so a
// request keeps its own code: a route opened by its model's failures (their code), then a
// remembered absence (SYS1_MODEL_UNAVAILABLE), then an open provider
// (SYS1_PROVIDER_UNAVAILABLE). Its RetryAfter is the soonest any of them allows a trial.
type refusal struct {
	best      *contract.Error
	rank      int
	model     string // the requested model, for the provider-level message
	reopensIn time.Duration
}

// Ranks of refusal reasons: higher is more specific to the request.
const (
	rankProviderOpen = iota + 1
	rankAbsent
	rankRouteOpen
)

// providerOpen notes a provider skipped for its own open circuit.
func (r *refusal) providerOpen(model string, a admission) {
	r.model = model
	r.note(rankProviderOpen, nil, a.reopensIn)
}

// routeClosed notes a route skipped (open, or its model absent) and returns the skipped
// attempt's detail.
func (r *refusal) routeClosed(providerName, model string, a admission) string {
	if a.state == BreakerAbsent {
		msg := fmt.Sprintf("model %q is not available on %s", model, providerName)
		if a.last != nil {
			msg = upstream.TrimCode(a.last.Message)
		}
		r.note(rankAbsent, contract.Errorf(contract.CodeModelUnavailable, "%s; remembered, %s", msg, nextTrial(a.reopensIn, "asked again")), a.reopensIn)
		return "model not found here (a 404, remembered)"
	}
	code, last := contract.CodeUpstreamError, "none recorded"
	if a.last != nil {
		code, last = a.last.Code, upstream.TrimCode(a.last.Message)
	}
	r.note(rankRouteOpen, contract.Errorf(code, "circuit open for model %q on %s after %d consecutive failures (last: %s); %s",
		model, providerName, a.failures, last, nextTrial(a.reopensIn, "next trial")), a.reopensIn)
	return "circuit open for this model"
}

// note keeps the more specific reason; of two as specific, a transient one (a redelivery may
// find that provider again), else the later.
func (r *refusal) note(rank int, e *contract.Error, reopensIn time.Duration) {
	if rank > r.rank || rank == r.rank && (e == nil || e.Transient() || !r.best.Transient()) {
		r.rank, r.best = rank, e
	}
	if reopensIn > 0 && (r.reopensIn == 0 || reopensIn < r.reopensIn) {
		r.reopensIn = reopensIn
	}
}

// err is the request's error, nil when nothing was refused.
func (r *refusal) err() *contract.Error {
	if r.rank == 0 {
		return nil
	}
	e := r.best
	if r.rank == rankProviderOpen {
		e = contract.Errorf(contract.CodeProviderUnavailable, "every provider that serves model %q has its circuit open after repeated failures", r.model)
	}
	e.RetryAfter = r.reopensIn
	return e
}

// nextTrial says when the next call may go: in a whole number of seconds (rounded up), or
// that one is running.
func nextTrial(in time.Duration, what string) string {
	if in <= 0 {
		return "a trial call is running"
	}
	return fmt.Sprintf("%s in %s", what, (in + time.Second - 1).Truncate(time.Second))
}
