package worker

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/provider"
	"github.com/sys1hq/sys1/worker/auth"
)

// run is one delivery of one request message, from headers to ack.
type run struct {
	w     *Worker
	msg   jetstream.Msg
	meta  *jetstream.MsgMetadata
	log   zerolog.Logger
	start time.Time

	runID    string // the id replies carry (the caller's, or derived)
	recordID string // the id the record is stored under (derived when the caller may not own runID)
	replyTo  string
	identity auth.Identity

	// gate state, once claimed
	state *runState
	rev   uint64

	requested string            // the model the caller asked for
	resolved  *contract.Request // the request as sent to the provider
	attempts  []contract.Attempt
}

// handle processes one delivery. It never panics: a panic becomes SYS1_INTERNAL.
func (w *Worker) handle(ctx context.Context, msg jetstream.Msg) {
	r := &run{w: w, msg: msg, start: time.Now(), log: w.log}
	defer func() {
		if p := recover(); p != nil {
			// The stack goes to the log (it has no request content); the reply says only that
			// the worker failed.
			r.log.Error().Str("panic", fmt.Sprint(p)).Str("stack", string(debug.Stack())).Msg("run panicked")
			r.failAfterPanic(ctx)
		}
	}()
	r.process(ctx)
}

func (r *run) process(ctx context.Context) {
	w := r.w
	meta, err := r.msg.Metadata()
	if err != nil {
		// Not a JetStream delivery at all: nothing to reply to, nothing to record under.
		r.log.Error().Err(err).Msg("message without JetStream metadata; terminating it")
		_ = r.msg.Term()
		return
	}
	r.meta = meta
	hdr := r.msg.Headers()
	derived := derivedRunID(w.opt.Topology.RequestsStream, meta.Sequence.Stream, *w.requestsEpoch.Load())
	r.runID, r.recordID = derived, derived
	if id := hdr.Get(HeaderRunID); id != "" && ValidRunID(id) {
		r.runID, r.recordID = id, id
	}
	r.log = w.log.With().Str("run_id", r.runID).Uint64("stream_seq", meta.Sequence.Stream).Uint64("delivery", meta.NumDelivered).Logger()

	// Identity first: nothing else about a request matters until we know who sent it.
	// The authenticator logs through the context's logger (a JWKS refresh a token caused), so
	// its lines carry this run's run_id.
	identity, aerr := w.opt.Auth.Authenticate(r.log.WithContext(ctx), r.msg.Subject(), hdr)
	if aerr != nil && (aerr.Code != contract.CodeForbidden || identity.Kind != contract.CallerKindJWT || identity.Caller == "") {
		// Only a verified jwt caller refused for its roles and scopes keeps its identity (the
		// record says who was refused); any other refusal has no verified caller.
		identity = auth.Identity{}
	}
	if identity.Subject == "" {
		// A refused caller comes back without an identity; its subject still bounds where it
		// may be answered (CheckReplyTo).
		identity.Subject = r.msg.Subject()
	}
	r.identity = identity
	r.replyTo = hdr.Get(HeaderReplyTo)
	if cerr := auth.CheckReplyTo(identity, r.replyTo); cerr != nil {
		r.replyTo = "" // never answer on a subject we refused
		r.recordID = derived
		r.finish(ctx, nil, cerr)
		return
	}
	if aerr != nil {
		// The caller is unverified or not allowed, so it cannot own the run id it sent: record
		// under the derived id so a forged or refused request can never overwrite a real run's
		// record.
		r.recordID = derived
		r.finish(ctx, nil, aerr)
		return
	}
	r.log = r.log.With().Str("caller", identity.Caller).Logger()
	if id := hdr.Get(HeaderRunID); id != "" && !ValidRunID(id) {
		r.finish(ctx, nil, contract.Errorf(contract.CodeInvalidInput, "%s: must be 1–128 of A-Za-z0-9._:- (got %d bytes); the run was recorded as %s", HeaderRunID, len(id), derived))
		return
	}

	// The run-id gate.
	claim, st, rev, err := w.gate.claim(ctx, r.runID, identity.Caller, meta.Sequence.Stream, r.start)
	if err != nil {
		r.retryLater(err)
		return
	}
	switch claim {
	case claimConflict:
		r.recordID = derived
		r.finish(ctx, nil, contract.Errorf(contract.CodeRunIDConflict, "run id %q belongs to another caller's run; that run is untouched; use a fresh run id", r.runID))
		return
	case claimFinished:
		r.replay(ctx, st)
		return
	case claimDuplicate:
		// Another message with this id owns the run. While it is still queued or in flight,
		// answer once it has finished; if it is gone (aged out of the stream unfinished), this
		// message takes the run over, or it would wait for good.
		gone, err := w.messageGone(ctx, st.StreamSeq)
		if err != nil {
			// Not knowing is not "gone": taking the run over could score it twice. Try again.
			r.log.Warn().Err(err).Uint64("owner_seq", st.StreamSeq).Dur("retry_in", w.cfg.RetryBase).
				Msg("could not look up the message that owns this run id; the run will be retried")
			_ = r.msg.NakWithDelay(w.cfg.RetryBase)
			return
		}
		if !gone {
			r.log.Info().Uint64("owner_seq", st.StreamSeq).Msg("run id is in flight from another message; answering once it finishes")
			_ = r.msg.NakWithDelay(w.cfg.RetryBase)
			return
		}
		st.StreamSeq = meta.Sequence.Stream
		if rev, err = w.gate.save(ctx, r.runID, st, rev); err != nil {
			r.retryLater(fmt.Errorf("take over run from a vanished message: %w", err))
			return
		}
		r.log.Warn().Msg("the message that owned this run id left the stream unfinished; this one takes the run over")
	}
	r.state, r.rev = st, rev
	r.attempts = append(r.attempts, st.Attempts...)

	deadline, err := parseDeadline(hdr.Get(HeaderDeadline))
	if err != nil {
		r.finish(ctx, nil, contract.Errorf(contract.CodeInvalidInput, "%v", err))
		return
	}
	if !deadline.IsZero() && !time.Now().Before(deadline) {
		r.finish(ctx, nil, contract.Errorf(contract.CodeExpired, "deadline %s passed before the provider was called", deadline.UTC().Format(time.RFC3339Nano)))
		return
	}

	req, cerr := contract.DecodeRequest(r.msg.Data())
	if cerr != nil {
		r.finish(ctx, nil, cerr)
		return
	}
	r.requested = req.Model
	resolved, cerr := w.opt.Policy.Resolve(req)
	if cerr != nil {
		r.finish(ctx, nil, cerr)
		return
	}
	r.resolved = resolved

	if int(meta.NumDelivered) > w.cfg.MaxDeliver {
		// Earlier deliveries died without finishing (crashed replicas); stop here.
		r.finish(ctx, nil, r.lastError(fmt.Sprintf("no delivery finished the run in %d deliveries", meta.NumDelivered)))
		return
	}

	resp, perr := r.callProvider(ctx, deadline)
	switch {
	case perr == nil:
		r.finish(ctx, resp, nil)
	case ctx.Err() != nil:
		// Shutdown ran out of grace: not finished, so not acknowledged.
		r.log.Warn().Msg("run cancelled by shutdown; nak'ed for redelivery")
		r.saveAttempts(context.WithoutCancel(ctx))
		_ = r.msg.Nak()
	default:
		cerr, _ := contract.AsError(perr)
		if cerr == nil {
			cerr = contract.Wrap(contract.CodeInternal, perr, "provider failed unexpectedly")
		}
		delay := w.cfg.retryDelay(int(meta.NumDelivered), cerr.RetryAfter)
		if cerr.Transient() && int(meta.NumDelivered) < w.cfg.MaxDeliver &&
			(deadline.IsZero() || time.Now().Add(delay).Before(deadline)) {
			if err := r.saveAttempts(ctx); err != nil {
				r.log.Warn().Err(err).Msg("could not store the attempt; it will be missing from the record")
			}
			w.stats.retried.Add(1)
			r.log.Info().Str("error_code", string(cerr.Code)).Dur("retry_in", delay).Msg("transient provider error; redelivering")
			_ = r.msg.NakWithDelay(delay)
			return
		}
		r.finish(ctx, nil, cerr)
	}
}

// callProvider makes one provider attempt, heartbeating the delivery while it runs, and
// appends the attempt.
func (r *run) callProvider(ctx context.Context, deadline time.Time) (*contract.Response, error) {
	w := r.w
	callCtx := ctx
	if !deadline.IsZero() {
		var cancel context.CancelFunc
		callCtx, cancel = context.WithDeadline(ctx, deadline)
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
		return nil, ctx.Err()
	}
	if !deadline.IsZero() && !time.Now().Before(deadline) {
		<-w.providerSlots
		return nil, contract.Errorf(contract.CodeExpired, "deadline %s passed before the provider was called", deadline.UTC().Format(time.RFC3339Nano))
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
		if !deadline.IsZero() && errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			// The caller's deadline, not our provider timeout, cut the call short.
			err = contract.Errorf(contract.CodeExpired, "deadline %s passed while the provider was running", deadline.UTC().Format(time.RFC3339Nano))
			a.ErrorCode, a.Detail, a.Outcome = contract.CodeExpired, err.Error(), contract.OutcomeTimeout
		}
	}
	r.attempts = append(r.attempts, a)
	return resp, err
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

// lastError is the error of the last attempt, or SYS1_INTERNAL with why when there is none.
func (r *run) lastError(why string) *contract.Error {
	for i := len(r.attempts) - 1; i >= 0; i-- {
		if c := r.attempts[i].ErrorCode; c != "" {
			return contract.Errorf(c, "%s (last error: %s)", why, r.attempts[i].Detail)
		}
	}
	return contract.Errorf(contract.CodeInternal, "%s", why)
}

// saveAttempts persists the attempts so far in the gate, so the next delivery (on any
// replica) continues the same record.
func (r *run) saveAttempts(ctx context.Context) error {
	if r.state == nil {
		return nil
	}
	r.state.Attempts = r.attempts
	rev, err := r.w.gate.save(ctx, r.runID, r.state, r.rev)
	if err != nil {
		return err
	}
	r.rev = rev
	return nil
}

// retryLater naks a delivery that hit infrastructure trouble (NATS, KV) before finishing.
func (r *run) retryLater(err error) {
	r.w.requestRepair(err)
	delay := r.w.cfg.retryDelay(int(r.meta.NumDelivered), 0)
	r.log.Warn().Err(err).Dur("retry_in", delay).Msg("could not finish the run; redelivering")
	_ = r.msg.NakWithDelay(delay)
}

// failAfterPanic answers SYS1_INTERNAL after a recovered panic. If concluding panics too, the
// delivery is nak'ed rather than taking the replica down.
func (r *run) failAfterPanic(ctx context.Context) {
	defer func() {
		if p := recover(); p != nil {
			r.log.Error().Str("panic", fmt.Sprint(p)).Msg("concluding a panicked run panicked; nak'ed")
			_ = r.msg.NakWithDelay(r.w.cfg.RetryMax)
		}
	}()
	r.finish(ctx, nil, contract.Errorf(contract.CodeInternal, "internal error in the worker; the run was not completed"))
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
