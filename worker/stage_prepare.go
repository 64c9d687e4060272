package worker

import (
	"context"
	"fmt"
	"time"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/contract/wire"
	"github.com/sys1hq/sys1/worker/policy"
)

// prepare reads the deadline, decodes and validates the request and resolves it against the
// model policy, and stops a run that earlier deliveries could not finish.
func (r *run) prepare(context.Context) error {
	p := r.p
	hdr := r.msg.Headers()
	deadline, set, err := parseDeadline(hdr.Get(wire.HeaderDeadline))
	if err != nil {
		return contract.Errorf(contract.CodeInvalidInput, "%v", err)
	}
	// A run whose answer an earlier delivery kept (stage_resume.go) was asked in time and is
	// past questions of deadline and tries: it is finished with that answer.
	kept := r.keptAnswer() != nil
	if set && !time.Now().Before(deadline) && !kept {
		return expiredBeforeCall(deadline)
	}
	r.deadline = deadline
	req, cerr := contract.DecodeRequest(r.msg.Data())
	if cerr != nil {
		return cerr
	}
	r.requested = req.Model
	resolved, cerr := p.models.Resolve(req)
	if cerr != nil {
		return cerr
	}
	r.resolved = resolved
	if p.abstention != nil {
		// A producer may tighten its thresholds for this request; a bad value is refused
		// before the model is called. Without a policy the header means nothing.
		if r.minConfidence, cerr = policy.ParseMinConfidence(hdr.Get(wire.HeaderMinConfidence)); cerr != nil {
			return cerr
		}
	}
	if ok, size := storable(resolved, len(r.msg.Data()), p.storeLimit(), p.cfg.MaxDeliver); !ok {
		// Refused without calling the model: its answer could never be stored. The record of
		// the refusal leaves the request out for the same reason.
		r.omitRequest = true
		return contract.Errorf(contract.CodeRequestTooLarge, "the run's record would take about %d bytes (the request as recorded plus its answers), over the %d bytes NATS can store (max_payload, SYS1_MAX_MSG_SIZE); send less state or fewer, shorter options, or raise both limits; the model was not called",
			size, p.storeLimit())
	}
	if r.tries() > p.cfg.MaxDeliver && !kept {
		// Earlier deliveries died without finishing (crashed replicas); stop here.
		return r.lastError(fmt.Sprintf("no delivery finished the run in %d deliveries", r.meta.NumDelivered))
	}
	return nil
}

func expiredBeforeCall(deadline time.Time) *contract.Error {
	return contract.Errorf(contract.CodeExpired, "deadline %s passed before the provider was called", deadline.UTC().Format(time.RFC3339Nano))
}

// lastError is the error of the last attempt; with none, SYS1_BUDGET_EXCEEDED when the run
// spent its deliveries waiting for its caller's limits, else SYS1_INTERNAL with why.
func (r *run) lastError(why string) *contract.Error {
	for i := len(r.attempts) - 1; i >= 0; i-- {
		if c := r.attempts[i].ErrorCode; c != "" {
			return contract.Errorf(c, "%s (last error: %s)", why, r.attempts[i].Detail)
		}
	}
	if r.state != nil && r.state.Waits > 0 {
		return contract.Errorf(contract.CodeBudgetExceeded, "%s: it waited %d times for the caller's rate limit or in-flight cap and was not run", why, r.state.Waits)
	}
	return contract.Errorf(contract.CodeInternal, "%s", why)
}
