package worker

import (
	"context"
	"sync"
	"time"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/provider/limit"
)

// call asks the provider chain, heartbeating the delivery while it waits for a slot and while
// the calls run, and records every attempt (calls and skips).
func (r *run) call(ctx context.Context) error {
	if r.resp != nil {
		return nil // answered from the cache
	}
	p := r.p
	callCtx := ctx
	if !r.deadline.IsZero() {
		// The chain calls no provider once the deadline has passed (SYS1_EXPIRED), and a call
		// the deadline cuts short is SYS1_EXPIRED too.
		var cancel context.CancelFunc
		callCtx, cancel = context.WithDeadline(ctx, r.deadline)
		defer cancel()
	}
	// Tell JetStream we are alive whenever a call runs past a third of AckWait, so a slow
	// model is not mistaken for a dead replica.
	// A timer, not a goroutine with a ticker: most calls end long before the first beat, and
	// a timer costs nothing until it fires.
	// A call that long also renews the run's lease in the gate (renewLease), so no second
	// delivery of the message takes the run over while this one still waits for the model.
	beat := newHeartbeat(max(p.topo.AckWait/3, 10*time.Millisecond), func() {
		_ = r.msg.InProgress()
		r.renewLease(ctx)
	})
	defer beat.stop()

	if r.batchID == "" {
		// Interactive first, also for the provider's slots: an interactive run takes the next
		// one before batch items already waiting for it.
		callCtx = limit.Urgent(callCtx)
	}
	// Providers log through the context's logger, so their lines carry this run's run_id.
	res, err := p.chain.Evaluate(r.log.WithContext(callCtx), r.resolved, int(r.meta.NumDelivered))
	r.attempts = append(r.attempts, res.Attempts...)
	r.newAttempts = r.newAttempts || len(res.Attempts) > 0
	switch {
	case err == nil:
		r.resp, r.answeredBy, r.answeredModel = res.Response, res.Provider, res.Model
		return nil
	case ctx.Err() != nil:
		// Shutdown ran out of grace: not finished, so not acknowledged.
		return ErrShutdown
	}
	if _, ok := contract.AsError(err); !ok {
		return contract.Wrap(contract.CodeInternal, err, "provider failed unexpectedly")
	}
	return err
}

// heartbeat calls beat every interval until stopped; stop waits for a beat under way, so
// nothing the beat touches is used by both.
type heartbeat struct {
	mu      sync.Mutex
	t       *time.Timer
	stopped bool
}

func newHeartbeat(interval time.Duration, beat func()) *heartbeat {
	h := &heartbeat{}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.t = time.AfterFunc(interval, func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		if h.stopped {
			return
		}
		beat()
		h.t.Reset(interval)
	})
	return h
}

func (h *heartbeat) stop() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.stopped = true
	h.t.Stop()
}
