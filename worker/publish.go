package worker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/contract/wire"
	"github.com/sys1hq/sys1/worker/tracing"
)

// Publishing. Everything a delivery writes — a run's outcome in the gate, its record, its
// reply and its review items, a checked label and the label's reply, a released hold's reply —
// goes through an outbox: each write is retried in place (store), the delivery kept alive
// meanwhile, and a refusal for room is classified once (storage.go). A run's outbox is
// r.out(); the label and hold loops take one for their own deliveries.

// outbox writes for one delivery.
type outbox struct {
	p   *pipeline
	msg jetstream.Msg // kept alive (InProgress) while a write is retried
	log zerolog.Logger
}

// outbox is the writer for msg's delivery, logging to log.
func (p *pipeline) outbox(msg jetstream.Msg, log zerolog.Logger) outbox {
	return outbox{p: p, msg: msg, log: log}
}

// publish stores m in stream (its subject's), retried in place; msgID de-duplicates a
// retry whose ack was lost, and a delivery that writes it again.
func (o outbox) publish(ctx context.Context, what, stream string, m *nats.Msg, opts ...jetstream.PublishOpt) error {
	return o.store(ctx, what, stream, func(ctx context.Context) error {
		_, err := o.p.streams.PublishMsg(ctx, m, opts...)
		return err
	})
}

// record writes a run record to SYS1_RUNS under recordID, awaiting the stream's ack. The
// record id de-duplicates a record written again (store's retries, a replay) within the
// stream's window.
func (o outbox) record(ctx context.Context, subject, recordID string, record []byte, status contract.Status) error {
	rm := &nats.Msg{Subject: subject, Data: record, Header: nats.Header{}}
	rm.Header.Set(wire.HeaderRunID, recordID)
	rm.Header.Set(wire.HeaderStatus, string(status))
	tracing.Inject(ctx, rm.Header) // the sink links its insert to the run's trace
	if err := o.publish(ctx, "publish the record", o.p.topo.RunsStream, rm, jetstream.WithMsgID("record:"+recordID)); err != nil {
		return fmt.Errorf("publish record: %w", err)
	}
	return nil
}

// reply answers m's subject: through JetStream under sys1.replies. (stored, de-duplicated by
// msgID), as plain NATS otherwise.
func (o outbox) reply(ctx context.Context, m *nats.Msg, msgID string) error {
	if strings.HasPrefix(m.Subject, wire.RepliesPrefix) {
		if err := o.publish(ctx, "publish the durable reply", o.p.topo.RepliesStream, m, jetstream.WithMsgID(msgID)); err != nil {
			return fmt.Errorf("publish durable reply: %w", err)
		}
		return nil
	}
	// A plain publish only fails when the connection is closed; while it reconnects nats.go
	// buffers it.
	if err := o.p.core.PublishMsg(m); err != nil {
		return fmt.Errorf("publish reply: %w", err)
	}
	return nil
}

// runReply is a run's reply message: its run id, status, review status and error code in
// headers, so callers can route on them without decoding the body.
func runReply(replyTo, runID string, reply []byte, status contract.Status) *nats.Msg {
	m := &nats.Msg{Subject: replyTo, Data: reply, Header: nats.Header{}}
	m.Header.Set(wire.HeaderRunID, runID)
	m.Header.Set(wire.HeaderStatus, string(status))
	if status := reviewStatus(reply); status != "" {
		m.Header.Set(wire.HeaderReview, status) // pending, or reviewed once a held run is released
	}
	if status == contract.StatusFailed {
		var env struct {
			Error struct {
				Code string `json:"code"`
			} `json:"error"`
		}
		if json.Unmarshal(reply, &env) == nil && env.Error.Code != "" {
			m.Header.Set(wire.HeaderErrorCode, env.Error.Code)
		}
	}
	return m
}

// reviewStatus is the status of a reply's "review" field (pending, reviewed), or "" without
// one, read without decoding the reply: replays send stored bytes. The encoder writes
// "review" as an object whose first member is its status; answers cannot hold that text
// outside a JSON string, where its quotes would be escaped.
func reviewStatus(reply []byte) string {
	for _, status := range []string{contract.ReviewPending, contract.ReviewReviewed, contract.ReviewNotQueued} {
		if bytes.Contains(reply, []byte(`"review":{"status":"`+status+`"`)) {
			return status
		}
	}
	return ""
}

// store runs op, a step that writes a delivery's outcome into stream, until it succeeds, fails for
// good, or the store-retry time (SYS1_STORE_RETRY) is spent, keeping the delivery alive with
// InProgress meanwhile. A store that failed for a moment (a timeout while a stream or the
// gate's bucket elects a leader, a reconnect) must not throw away an answer the model was
// already paid for: retried here, the run is stored once; nak'ed, it would be scored again.
// A failure that retrying cannot fix ends at once: too large, shutdown, and a stream that
// refuses for want of room or the caller's quota (a *storeRefused; see storage.go), which
// waiting in place would only turn into a wedge.
func (o outbox) store(ctx context.Context, what, stream string, op func(context.Context) error) error {
	p := o.p
	budget := time.Now().Add(p.cfg.StoreRetry)
	delay := 50 * time.Millisecond
	// Beat often enough that JetStream never redelivers while we retry.
	maxDelay := min(2*time.Second, max(p.topo.AckWait/3, 10*time.Millisecond))
	for attempt := 1; ; attempt++ {
		// Each try is bounded well under JetStream's 5 s request timeout: a write to a stream
		// whose leader just died waits out the whole timeout, and the new leader is usually
		// there sooner.
		actx, cancel := context.WithTimeout(ctx, storeAttemptTimeout)
		err := p.room.noteStore(stream, op(actx))
		cancel()
		if _, refused := refusedBy(err); refused {
			return err
		}
		if err == nil || isTooLarge(err) || errors.Is(err, errRunTaken) || ctx.Err() != nil || !time.Now().Add(delay).Before(budget) {
			if err != nil && isTooLarge(err) {
				return fmt.Errorf("%w: %w", errTooLarge, err)
			}
			return err
		}
		o.log.Warn().Err(err).Int("attempt", attempt).Dur("retry_in", delay).Msg("could not " + what + "; retrying in place")
		_ = o.msg.InProgress()
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return err
		}
		delay = min(2*delay, maxDelay)
	}
}

// errRunTaken: another delivery took the run over (this one's lease lapsed while the gate
// could not be reached) or finished it; this delivery's outcome is not stored, and the next
// delivery answers from the gate.
var errRunTaken = errors.New("another delivery took the run over; this one's outcome is not stored")

// storeAttemptTimeout bounds one try of store.
const storeAttemptTimeout = 2 * time.Second

// errTooLarge marks an outcome NATS cannot store: over max_payload, the stream's max message
// size, or the gate's.
var errTooLarge = errors.New("too large to store")

func isTooLarge(err error) bool {
	return err != nil && (errors.Is(err, errTooLarge) || errors.Is(err, nats.ErrMaxPayload) ||
		errors.Is(err, jetstream.ErrStreamMessageExceedsMaximum))
}
