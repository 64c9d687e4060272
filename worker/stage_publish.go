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

// publish answers a run that settle says is over: it stores the outcome in the gate, then
// publishes the record (awaiting JetStream's ack) and the reply. A run that had already
// finished is answered again from its stored outcome. If any step fails the error is
// returned, and the stored outcome makes the next delivery answer identically without calling
// the provider.
func (r *run) publish(ctx context.Context, runErr error) error {
	if isNotJetStream(runErr) {
		return nil // nothing to reply to, nothing to record under
	}
	if r.finished != nil {
		return r.replay(ctx, r.finished)
	}
	w := r.w
	var cerr *contract.Error
	if runErr != nil {
		var ok bool
		if cerr, ok = contract.AsError(runErr); !ok {
			cerr = contract.Wrap(contract.CodeInternal, runErr, "the run failed unexpectedly")
		}
	}
	reply, record := r.outcome(r.resp, cerr, time.Now())
	// The contract's encoders write the bytes directly. Going through json.Marshal would call
	// them and then re-scan and re-compact their whole output (a fifth of the worker's CPU at
	// zero provider latency) for nothing: the output is already compact, valid JSON.
	replyBytes, _ := reply.MarshalJSON()
	recordBytes, _ := record.MarshalJSON()
	if err := r.conclude(ctx, reply.Status, replyBytes, recordBytes); err != nil {
		return err
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
		// Refused and conflicting runs are recorded under a derived id (see admit).
		ev = ev.Str("record_id", r.recordID)
	}
	ev.Str("status", string(reply.Status)).Int("attempts", len(reply.Attempts)).
		Int64("queued_ms", reply.QueuedMS).Int64("latency_ms", reply.LatencyMS).Msg("run finished")
	return nil
}

// conclude stores the outcome, then publishes record and reply.
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
	return r.send(ctx, subject, record, reply, status)
}

// replay answers a finished run again from its stored outcome.
func (r *run) replay(ctx context.Context, st *runState) error {
	r.w.stats.replayed.Add(1)
	status := contract.StatusSuccess
	if strings.HasSuffix(st.Subject, string(contract.StatusFailed)) {
		status = contract.StatusFailed
	}
	if err := r.send(ctx, st.Subject, st.Record, st.Reply, status); err != nil {
		return err
	}
	r.log.Info().Msg("run already finished; answered from its stored outcome")
	return nil
}

// send writes the record to SYS1_RUNS (awaiting the stream's ack) and the reply to the
// caller's subject: through JetStream under sys1.replies., as plain NATS otherwise.
func (r *run) send(ctx context.Context, subject string, record, reply []byte, status contract.Status) error {
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
