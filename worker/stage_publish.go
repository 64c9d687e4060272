package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/contract/wire"
	"github.com/sys1hq/sys1/worker/internal/outbox"
)

// publish answers a run that settle says is over. Its outcome is stored in the gate first,
// then the record is published (awaiting JetStream's ack), then the reply: a delivery that
// dies anywhere after the first step is answered again from the stored outcome, never scored
// again. A run that had already finished is answered from its stored outcome (replay).
//
// Storing is retried in place (store): the answer in hand must survive a NATS or KV hiccup
// such as a leader election. An outcome too large to store is not retried: the run is
// answered SYS1_REQUEST_TOO_LARGE instead, with a record that leaves out the request.
func (r *run) publish(ctx context.Context, runErr error) error {
	if isNotJetStream(runErr) {
		return nil // nothing to reply to, nothing to record under
	}
	if r.finished != nil {
		return r.replay(ctx, r.finished)
	}
	var cerr *contract.Error
	if runErr != nil {
		var ok bool
		if cerr, ok = contract.AsError(runErr); !ok {
			cerr = contract.Wrap(contract.CodeInternal, runErr, "the run failed unexpectedly")
		}
	}
	finished := time.Now()
	prov := r.provenanceNow()
	reply := r.replyFor(r.resp, cerr, finished)
	record := r.recordFor(&reply, finished, prov)
	// The contract's encoders write the bytes directly. Going through json.Marshal would call
	// them and then re-scan and re-compact their whole output (a fifth of the worker's CPU at
	// zero provider latency) for nothing: the output is already compact, valid JSON.
	replyBytes, _ := reply.MarshalJSON()
	recordBytes, _ := record.MarshalJSON()
	if limit := r.p.storeLimit(); len(recordBytes) <= limit && len(replyBytes) <= limit {
		// The review item goes first (the reply points at it); one that cannot be stored
		// changes what the reply says about it. Before it, the answer it shows is kept in the
		// gate: a delivery that dies after queueing it leaves the next one that answer to
		// finish the run with (stage_resume.go).
		if r.reviewRun(finished) != nil && !r.reviewQueued {
			if err := r.keepAnswer(ctx); err != nil {
				return err
			}
		}
		changed, err := r.queueReview(ctx, finished)
		if err != nil {
			return err
		}
		if changed {
			reply = r.replyFor(r.resp, cerr, finished)
			record = r.recordFor(&reply, finished, prov)
			replyBytes, _ = reply.MarshalJSON()
			recordBytes, _ = record.MarshalJSON()
		}
	}
	err := r.conclude(ctx, reply.Status, replyBytes, recordBytes, finished, prov)
	if outbox.IsTooLarge(err) {
		// The outcome cannot be stored as it is: answer that, in a form that can.
		r.log.Warn().Err(err).Int("record_bytes", len(recordBytes)).Int("reply_bytes", len(replyBytes)).
			Msg("the run's outcome is too large to store; answering SYS1_REQUEST_TOO_LARGE")
		r.omitRequest, prov = true, r.provenanceNow()
		cerr = contract.Errorf(contract.CodeRequestTooLarge, "the run's outcome (a %d-byte record, a %d-byte reply) is over the %d bytes NATS can store (max_payload, SYS1_MAX_MSG_SIZE); the answer could not be kept: send less state or shorter options, or raise both limits",
			len(recordBytes), len(replyBytes), r.p.storeLimit())
		r.resp = nil
		reply = r.replyFor(nil, cerr, finished)
		record = r.recordFor(&reply, finished, prov)
		replyBytes, _ = reply.MarshalJSON()
		recordBytes, _ = record.MarshalJSON()
		err = r.conclude(ctx, reply.Status, replyBytes, recordBytes, finished, prov)
	}
	if err != nil {
		return err
	}
	r.logFinished(&reply)
	return nil
}

func (r *run) logFinished(reply *contract.Reply) {
	r.observeFinished(reply)
	ev := r.log.Info()
	if reply.Status == contract.StatusSuccess {
		r.p.stats.succeeded.Add(1)
		ev = r.log.Debug()
	} else {
		r.p.stats.failed.Add(1)
		ev = ev.Str("error_code", string(reply.Error.Code))
	}
	if r.recordID != r.runID {
		// Refused and conflicting runs are recorded under a derived id (see admit).
		ev = ev.Str("record_id", r.recordID)
	}
	ev.Str("status", string(reply.Status)).Int("attempts", len(reply.Attempts)).
		Int64("queued_ms", reply.QueuedMS).Int64("latency_ms", reply.LatencyMS).Msg("run finished")
}

// conclude stores the outcome, then publishes record and reply.
func (r *run) conclude(ctx context.Context, status contract.Status, reply, record []byte, finished time.Time, p provenance) error {
	if limit := r.p.storeLimit(); len(record) > limit || len(reply) > limit {
		return fmt.Errorf("outcome of %d + %d bytes: %w", len(record), len(reply), outbox.ErrTooLarge)
	}
	subject := wire.Runs(string(status))
	if r.state != nil {
		st := *r.state
		st.Status, st.Attempts = runDone, r.attempts
		st.Owner, st.LeaseUntil = "", time.Time{} // finished: no delivery holds it any more
		st.ReplyTo, st.Reply, st.Subject, st.Record = r.replyTo, reply, subject, nil
		st.Held = r.heldQuestions()
		st.Answer = nil // the outcome holds it now
		st.Finished = &finishedState{
			At: finished, Deliveries: p.deliveries, CallerKind: p.identity.CallerKind,
			Roles: p.identity.Roles, Scopes: p.identity.Scopes,
			Provider: p.provider, Worker: p.worker, Version: p.version, OmitRequest: r.omitRequest,
			CostUSD: p.costUSD, CacheHit: p.cacheHit,
		}
		err := r.saveState(ctx, "store the outcome", &st)
		if err != nil {
			return fmt.Errorf("store outcome: %w", err)
		}
		*r.state = st
	}
	if err := r.sendRecord(ctx, subject, record, status); err != nil {
		if _, full := outbox.RefusedBy(err); full && !r.hold && r.state != nil {
			// SYS1_RUNS is full: the outcome is stored, so answer now; the delivery is not
			// acknowledged, and its redelivery writes the record (and, replies being at least
			// once, sends the same reply again) once there is room.
			if rerr := r.sendReply(ctx, reply, status); rerr != nil {
				r.log.Warn().Err(rerr).Msg("could not send the reply of a run whose record waits for room")
			}
		}
		return err
	}
	if r.hold {
		r.log.Info().Strs("held", r.heldQuestions()).Msg("reply held until a person labels the held questions")
		return nil
	}
	return r.sendReply(ctx, reply, status)
}

// heldQuestions are the questions whose review holds the reply (none when the review could
// not be queued: nobody could release them).
func (r *run) heldQuestions() []string {
	if r.reviewRefused {
		return nil
	}
	var held []string
	for _, rv := range r.reviews {
		if rv.Mode == contract.ReviewHold {
			held = append(held, rv.Question)
		}
	}
	return held
}

// replay answers a finished run again from its stored outcome. Only the run's own message,
// delivered again, writes the record again (it may never have been written: the delivery that
// finished the run died after storing it); any other message with the same run id only gets
// the reply — the record exists, and appending it again would only grow SYS1_RUNS.
func (r *run) replay(ctx context.Context, st *runState) error {
	r.p.stats.replayed.Add(1)
	status := contract.StatusSuccess
	if strings.HasSuffix(st.Subject, string(contract.StatusFailed)) {
		status = contract.StatusFailed
	}
	if r.meta != nil && st.StreamSeq == r.meta.Sequence.Stream {
		record := []byte(st.Record) // entries written before Finished held the whole record
		if len(record) == 0 {
			var err error
			if record, err = r.rebuildRecord(st); err != nil {
				return err
			}
		}
		if err := r.sendRecord(ctx, st.Subject, record, status); err != nil {
			return err
		}
	}
	if len(st.Held) > 0 {
		r.log.Info().Strs("held", st.Held).Msg("run already finished; its reply waits for review")
		return nil
	}
	if err := r.sendReply(ctx, st.Reply, status); err != nil {
		return err
	}
	r.log.Info().Msg("run already finished; answered from its stored outcome")
	return nil
}

// rebuildRecord writes the record of a finished run again from its stored reply and
// provenance and from its message's request, resolved as prepare did.
func (r *run) rebuildRecord(st *runState) ([]byte, error) {
	var reply contract.Reply
	if err := json.Unmarshal(st.Reply, &reply); err != nil {
		return nil, fmt.Errorf("decode the stored reply of a finished run: %w", err)
	}
	f := st.Finished
	if f == nil {
		f = &finishedState{At: st.StartedAt}
	}
	r.omitRequest = f.OmitRequest
	if req, cerr := contract.DecodeRequest(r.msg.Data()); cerr == nil {
		r.requested = req.Model
		if resolved, cerr := r.p.models.Resolve(req); cerr == nil {
			r.resolved = resolved
		}
	}
	p := provenance{deliveries: f.Deliveries, provider: f.Provider, worker: f.Worker, version: f.Version, replyTo: st.ReplyTo,
		costUSD: f.CostUSD, cacheHit: f.CacheHit}
	p.identity.Caller, p.identity.CallerKind, p.identity.Roles, p.identity.Scopes = st.Caller, f.CallerKind, f.Roles, f.Scopes
	rec := r.recordFor(&reply, f.At, p)
	b, err := rec.MarshalJSON()
	if err != nil {
		return nil, fmt.Errorf("encode the record of a finished run: %w", err)
	}
	return b, nil
}

// revisionMoved says what to do when the gate entry moved on under this delivery: if it is
// still this delivery's (a renewal of its lease whose answer was lost), store again on the new
// revision; if another delivery took the run over or finished it, errRunTaken.
func (r *run) revisionMoved(ctx context.Context) error {
	e, err := r.p.gate.Get(ctx, r.state.Key)
	if err != nil {
		return fmt.Errorf("run-id gate: re-read after a revision mismatch: %w", err)
	}
	var st runState
	if err := json.Unmarshal(e.Value, &st); err != nil {
		return fmt.Errorf("run-id gate: decode entry: %w", err)
	}
	if st.Status == runRunning && st.Owner == r.owner {
		r.rev = e.Revision
		return errors.New("run-id gate: the entry moved on (this delivery's own lease renewal); storing again")
	}
	r.log.Warn().Str("status", st.Status).Str("owner", st.Owner).Msg("another delivery took the run over, or finished it, while this one held an answer; its outcome stands")
	return outbox.Final(errRunTaken)
}

// saveAttempts persists the attempts so far in the gate, so the next delivery (on any
// replica) continues the same record.
func (r *run) saveAttempts(ctx context.Context) error {
	if r.state == nil {
		return nil
	}
	r.state.Attempts = r.attempts
	rev, err := r.p.gate.Save(ctx, r.runID, r.state, r.rev)
	if err != nil {
		return err
	}
	r.rev = rev
	return nil
}

// out is the run's writer (publish.go).
func (r *run) out() outbox.Writer { return r.p.outbox(r.msg, r.log) }

// store retries op in place (outbox.Writer.Store).
func (r *run) store(ctx context.Context, what, stream string, op func(context.Context) error) error {
	return r.out().Store(ctx, what, stream, op)
}

// sendRecord writes the run's record under its record id.
func (r *run) sendRecord(ctx context.Context, subject string, record []byte, status contract.Status) error {
	return r.out().Record(ctx, subject, r.recordID, record, status)
}

// sendReply answers the caller's subject, if it named one.
func (r *run) sendReply(ctx context.Context, reply []byte, status contract.Status) error {
	if r.replyTo == "" {
		return nil
	}
	return r.out().Reply(ctx, outbox.RunReply(r.replyTo, r.runID, reply, status), "reply:"+r.recordID)
}

// errRunTaken: another delivery took the run over (this one's lease lapsed while the gate
// could not be reached) or finished it; this delivery's outcome is not stored, and the next
// delivery answers from the gate.
var errRunTaken = errors.New("another delivery took the run over; this one's outcome is not stored")
