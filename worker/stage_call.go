package worker

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/provider"
)

// call makes one provider attempt, heartbeating the delivery while it waits for a slot and
// while the call runs, and records the attempt.
func (r *run) call(ctx context.Context) error {
	w := r.w
	callCtx := ctx
	if !r.deadline.IsZero() {
		var cancel context.CancelFunc
		callCtx, cancel = context.WithDeadline(ctx, r.deadline)
		defer cancel()
	}
	// Tell JetStream we are alive whenever a call runs past a third of AckWait, so a slow
	// model is not mistaken for a dead replica.
	// A timer, not a goroutine with a ticker: most calls end long before the first beat, and
	// a timer costs nothing until it fires.
	beat := newHeartbeat(max(w.opt.Topology.AckWait/3, 10*time.Millisecond), func() { _ = r.msg.InProgress() })
	defer beat.stop()

	// Providers log through the context's logger, so their lines carry this run's run_id.
	callCtx = r.log.WithContext(callCtx)
	// Wait for a provider slot (heartbeating meanwhile, above). The wait can outlast the
	// caller's deadline: then the provider is not called, as if it had passed before.
	select {
	case w.providerSlots <- struct{}{}:
	case <-ctx.Done():
		return ErrShutdown
	}
	if !r.deadline.IsZero() && !time.Now().Before(r.deadline) {
		<-w.providerSlots
		return expiredBeforeCall(r.deadline)
	}
	started := time.Now()
	resp, err := w.evaluate(callCtx, r.resolved)
	a := contract.Attempt{
		Provider:  w.opt.Provider.Name(),
		Outcome:   provider.Outcome(err),
		LatencyMS: time.Since(started).Milliseconds(),
		Delivery:  int(r.meta.NumDelivered),
		StartedAt: started.UTC(),
	}
	if err != nil {
		if cerr, ok := contract.AsError(err); ok {
			a.ErrorCode = cerr.Code
			a.Detail = cerr.Message
		} else if errors.Is(err, context.Canceled) {
			a.Detail = "cancelled"
		} else {
			a.Detail = "unexpected provider error"
		}
		if !r.deadline.IsZero() && errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			// The caller's deadline, not our provider timeout, cut the call short.
			err = contract.Errorf(contract.CodeExpired, "deadline %s passed while the provider was running", r.deadline.UTC().Format(time.RFC3339Nano))
			a.ErrorCode, a.Detail, a.Outcome = contract.CodeExpired, err.Error(), contract.OutcomeTimeout
		}
	}
	r.attempts = append(r.attempts, a)
	r.newAttempts = true
	switch {
	case err == nil:
		r.resp = resp
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

// evaluate makes the provider call in a slot the caller has taken, and gives the slot back
// even if the provider panics (the run's recover turns that into SYS1_INTERNAL; a lost slot
// would shrink the replica for good).
func (w *Worker) evaluate(ctx context.Context, req *contract.Request) (*contract.Response, error) {
	w.stats.providerStart()
	defer func() {
		w.stats.providerNow.Add(-1)
		<-w.providerSlots
	}()
	return w.opt.Provider.Evaluate(ctx, req)
}

// heartbeat calls beat every interval until stopped.
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
		beat()
		h.mu.Lock()
		defer h.mu.Unlock()
		if !h.stopped {
			h.t.Reset(interval)
		}
	})
	return h
}

func (h *heartbeat) stop() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.stopped = true
	h.t.Stop()
}
