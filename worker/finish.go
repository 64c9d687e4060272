package worker

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/worker/topology"
)

// finish ends a run with its answer (resp) or its error (cerr): it stores the outcome in the
// gate, publishes the record (awaiting JetStream's ack) and the reply, then acks (success) or
// terminates (failure) the delivery. If any step fails the delivery is nak'ed instead, and the
// stored outcome makes the next delivery answer identically without calling the provider.
func (r *run) finish(ctx context.Context, resp *contract.Response, cerr *contract.Error) {
	w := r.w
	finished := time.Now()
	reply, record := r.outcome(resp, cerr, finished)
	// The contract's encoders write the bytes directly. Going through json.Marshal would call
	// them and then re-scan and re-compact their whole output (a fifth of the worker's CPU at
	// zero provider latency) for nothing: the output is already compact, valid JSON.
	replyBytes, _ := reply.MarshalJSON()
	recordBytes, _ := record.MarshalJSON()
	err := r.conclude(ctx, reply.Status, replyBytes, recordBytes)
	if err != nil {
		if r.meta != nil {
			r.retryLater(err)
		} else {
			r.log.Error().Err(err).Msg("could not conclude a run without metadata")
		}
		return
	}

	ev := r.log.Info()
	if reply.Status == contract.StatusSuccess {
		w.stats.succeeded.Add(1)
		ev = r.log.Debug()
	} else {
		w.stats.failed.Add(1)
		ev = ev.Str("error_code", string(reply.Error.Code))
	}
	if r.recordID != r.runID {
		// Refused and conflicting runs are recorded under a derived id (see process).
		ev = ev.Str("record_id", r.recordID)
	}
	ev.Str("status", string(reply.Status)).Int("attempts", len(reply.Attempts)).
		Int64("queued_ms", reply.QueuedMS).Int64("latency_ms", reply.LatencyMS).Msg("run finished")
}

// conclude stores the outcome, publishes record and reply, and settles the delivery.
func (r *run) conclude(ctx context.Context, status contract.Status, reply, record []byte) error {
	subject := topology.RunsPrefix + string(status)
	if r.state != nil {
		r.state.Status = runDone
		r.state.Attempts = r.attempts
		r.state.ReplyTo, r.state.Reply, r.state.Record, r.state.Subject = r.replyTo, reply, record, subject
		rev, err := r.w.gate.save(ctx, r.runID, r.state, r.rev)
		if err != nil {
			return fmt.Errorf("store outcome: %w", err)
		}
		r.rev = rev
	}
	if err := r.publish(ctx, subject, record, reply, status); err != nil {
		return err
	}
	if r.meta == nil {
		return nil
	}
	// A plain ack, not a double ack: if it is lost, the redelivery finds the stored outcome
	// and answers again without scoring, so awaiting each ack would only cost a round trip.
	if status == contract.StatusSuccess {
		return r.msg.Ack()
	}
	return r.msg.Term()
}

// replay answers a finished run again from its stored outcome.
func (r *run) replay(ctx context.Context, st *runState) {
	r.w.stats.replayed.Add(1)
	status := contract.StatusSuccess
	if strings.HasSuffix(st.Subject, string(contract.StatusFailed)) {
		status = contract.StatusFailed
	}
	if err := r.publish(ctx, st.Subject, st.Record, st.Reply, status); err != nil {
		r.retryLater(err)
		return
	}
	r.log.Info().Msg("run already finished; answered from its stored outcome")
	_ = r.msg.Ack()
}

// publish writes the record to SYS1_RUNS (awaiting the stream's ack) and the reply to the
// caller's subject: through JetStream under sys1.replies., as plain NATS otherwise.
func (r *run) publish(ctx context.Context, subject string, record, reply []byte, status contract.Status) error {
	w := r.w
	rm := &nats.Msg{Subject: subject, Data: record, Header: nats.Header{}}
	rm.Header.Set(HeaderRunID, r.recordID)
	rm.Header.Set(HeaderStatus, string(status))
	// The record id de-duplicates republished records (replays) within the stream's window.
	if _, err := w.opt.JS.PublishMsg(ctx, rm, jetstream.WithMsgID("record:"+r.recordID)); err != nil {
		return fmt.Errorf("publish record: %w", err)
	}
	if r.replyTo == "" {
		return nil
	}
	m := &nats.Msg{Subject: r.replyTo, Data: reply, Header: nats.Header{}}
	m.Header.Set(HeaderRunID, r.runID)
	m.Header.Set(HeaderStatus, string(status))
	if status == contract.StatusFailed {
		var env struct {
			Error struct {
				Code string `json:"code"`
			} `json:"error"`
		}
		if json.Unmarshal(reply, &env) == nil && env.Error.Code != "" {
			m.Header.Set(HeaderErrorCode, env.Error.Code)
		}
	}
	if strings.HasPrefix(r.replyTo, topology.RepliesPrefix) {
		if _, err := w.opt.JS.PublishMsg(ctx, m, jetstream.WithMsgID("reply:"+r.recordID)); err != nil {
			return fmt.Errorf("publish durable reply: %w", err)
		}
		return nil
	}
	if err := w.opt.NC.PublishMsg(m); err != nil {
		return fmt.Errorf("publish reply: %w", err)
	}
	return nil
}

// outcome builds the reply and the run record.
func (r *run) outcome(resp *contract.Response, cerr *contract.Error, finished time.Time) (contract.Reply, contract.RunRecord) {
	w := r.w
	started := r.start
	if r.state != nil && !r.state.StartedAt.IsZero() {
		started = r.state.StartedAt
	}
	var published time.Time
	var seq uint64
	var deliveries int
	if r.meta != nil {
		published, seq, deliveries = r.meta.Timestamp, r.meta.Sequence.Stream, int(r.meta.NumDelivered)
	}
	queued := max(started.Sub(published).Milliseconds(), 0)
	if published.IsZero() {
		queued = 0
	}
	reply := contract.Reply{
		RunID:     r.runID,
		Attempts:  r.attempts,
		QueuedMS:  queued,
		LatencyMS: max(finished.Sub(started).Milliseconds(), 0),
	}
	if reply.Attempts == nil {
		reply.Attempts = []contract.Attempt{}
	}
	rec := contract.RunRecord{
		SchemaVersion:  contract.RecordSchemaVersion,
		RunID:          r.recordID,
		Caller:         r.identity.Caller,
		CallerKind:     r.identity.Kind,
		Roles:          r.identity.Roles,
		Scopes:         r.identity.Scopes,
		Subject:        r.msg.Subject(),
		StreamSeq:      seq,
		Deliveries:     deliveries,
		PublishedAt:    published.UTC(),
		StartedAt:      started.UTC(),
		FinishedAt:     finished.UTC(),
		QueuedMS:       reply.QueuedMS,
		LatencyMS:      reply.LatencyMS,
		Provider:       w.opt.Provider.Name(),
		RequestedModel: r.requested,
		Attempts:       reply.Attempts,
		ReplyTo:        r.replyTo,
		Worker:         w.cfg.ID,
		Version:        w.opt.Version,
	}
	if rec.CallerKind == "" {
		// Refused before any caller was verified: SPEC §6 knows only subject, jwt and
		// anonymous, and an unverified caller is anonymous (its caller stays empty).
		rec.CallerKind = contract.CallerKindAnonymous
	}
	if rec.Roles == nil {
		rec.Roles = []string{}
	}
	if rec.Scopes == nil {
		rec.Scopes = []string{}
	}
	if r.resolved != nil {
		redacted := contract.Redact(r.resolved)
		rec.Request = redacted
		rec.Model = r.resolved.Model
		rec.Images = make([]contract.ImageRef, 0, len(redacted.Images))
		for _, im := range redacted.Images {
			rec.Images = append(rec.Images, im.Ref())
		}
	}
	if cerr == nil && resp != nil {
		model := resp.Model
		if model == "" && r.resolved != nil {
			model = r.resolved.Model
		}
		res := &contract.Result{Provider: w.opt.Provider.Name(), Model: model, Answers: resp.Answers, Usage: resp.Usage}
		reply.Status, reply.Result = contract.StatusSuccess, res
		rec.Status, rec.Result = contract.StatusSuccess, res
		return reply, rec
	}
	if cerr == nil {
		cerr = contract.Errorf(contract.CodeInternal, "the run ended without an answer or an error")
	}
	reply.Status, reply.Error = contract.StatusFailed, cerr
	rec.Status = contract.StatusFailed
	rec.ErrorCode, rec.ErrorStatus, rec.ErrorMessage = cerr.Code, cerr.Status, cerr.Message
	return reply, rec
}
