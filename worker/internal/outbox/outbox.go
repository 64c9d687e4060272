// Package outbox is how a worker writes what a delivery concludes: a run's outcome in the
// run-id gate, its record, its reply and its review items, a checked label and the label's
// reply, a released hold's reply. Every write goes through Writer.Store:
//
//   - A write that fails for a moment (a timeout while a stream or the gate's bucket elects a
//     leader, a reconnect) is retried in place for the store-retry time (SYS1_STORE_RETRY),
//     the delivery kept alive with InProgress meanwhile: an answer the model was already paid
//     for is stored once, never thrown away to be scored again.
//   - A failure no retry can fix ends at once: too large (ErrTooLarge), shutdown, a stream
//     that refuses for want of room or its caller's quota (*Refused, as the Room says), and
//     an error marked Final by the caller (another delivery took the run over).
//
// Records and durable replies carry a Nats-Msg-Id, so a write retried after its ack was lost,
// or written again by a later delivery, is stored once.
package outbox

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
	"github.com/sys1hq/sys1/worker/topology"
	"github.com/sys1hq/sys1/worker/tracing"
)

// StreamPublisher stores messages in streams, awaiting the stream's ack (jetstream.JetStream).
type StreamPublisher interface {
	PublishMsg(ctx context.Context, m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error)
}

// CorePublisher sends plain NATS messages (*nats.Conn): replies to inboxes.
type CorePublisher interface {
	PublishMsg(m *nats.Msg) error
}

// Room classifies each write's outcome into a stream: a refusal for room or quota comes back
// as a *Refused (and the replica says the stream is full); a success clears that. Nil: errors
// are taken as they are.
type Room interface {
	Note(stream string, err error) error
}

// Config is the outbox a replica shares between its deliveries.
type Config struct {
	Streams StreamPublisher
	Core    CorePublisher
	Room    Room
	// StoreRetry bounds how long one write is retried in place; AckWait is the request
	// consumer's, which the retries' keep-alives must beat.
	StoreRetry, AckWait time.Duration
	// RunsStream and RepliesStream are where records and durable replies go (their names
	// for the Room).
	RunsStream, RepliesStream string
}

// KeepAlive is the delivery being written for (jetstream.Msg): told it is in progress while a
// write is retried, so JetStream does not redeliver it meanwhile.
type KeepAlive interface {
	InProgress() error
}

// Writer writes for one delivery.
type Writer struct {
	cfg *Config
	msg KeepAlive
	log zerolog.Logger
}

// For is the writer for msg's delivery, logging its retries to log.
func (c *Config) For(msg KeepAlive, log zerolog.Logger) Writer {
	return Writer{cfg: c, msg: msg, log: log}
}

// AttemptTimeout bounds one try of a write, well under JetStream's 5 s request timeout: a
// write to a stream whose leader just died waits out the whole timeout, and the new leader is
// usually there sooner.
const AttemptTimeout = 2 * time.Second

// Store runs op, a step that writes the delivery's outcome into stream, until it succeeds,
// fails for good, or the store-retry time is spent (see the package doc).
func (w Writer) Store(ctx context.Context, what, stream string, op func(context.Context) error) error {
	deadline := time.Now().Add(w.cfg.StoreRetry)
	delay := 50 * time.Millisecond
	// Beat often enough that JetStream never redelivers while we retry.
	maxDelay := min(2*time.Second, max(w.cfg.AckWait/3, 10*time.Millisecond))
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, AttemptTimeout)
		err := op(actx)
		cancel()
		if w.cfg.Room != nil {
			err = w.cfg.Room.Note(stream, err)
		}
		if _, refused := RefusedBy(err); refused {
			return err
		}
		var final *finalError
		if err == nil || IsTooLarge(err) || errors.As(err, &final) || ctx.Err() != nil || !time.Now().Add(delay).Before(deadline) {
			if err != nil && IsTooLarge(err) {
				return fmt.Errorf("%w: %w", ErrTooLarge, err)
			}
			return err
		}
		w.log.Warn().Err(err).Int("attempt", attempt).Dur("retry_in", delay).Msg("could not " + what + "; retrying in place")
		_ = w.msg.InProgress()
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

// Publish stores m in its subject's stream (named stream, for the Room), retried in place.
func (w Writer) Publish(ctx context.Context, what, stream string, m *nats.Msg, opts ...jetstream.PublishOpt) error {
	return w.Store(ctx, what, stream, func(ctx context.Context) error {
		_, err := w.cfg.Streams.PublishMsg(ctx, m, opts...)
		return err
	})
}

// Record writes a run record to the runs stream under recordID, awaiting the stream's ack.
// The record id de-duplicates a record written again (a retry, a replay) within the stream's
// window.
func (w Writer) Record(ctx context.Context, subject, recordID string, record []byte, status contract.Status) error {
	m := &nats.Msg{Subject: subject, Data: record, Header: nats.Header{}}
	m.Header.Set(wire.HeaderRunID, recordID)
	m.Header.Set(wire.HeaderStatus, string(status))
	tracing.Inject(ctx, m.Header) // the sink links its insert to the run's trace
	if err := w.Publish(ctx, "publish the record", w.cfg.RunsStream, m, jetstream.WithMsgID("record:"+recordID)); err != nil {
		return fmt.Errorf("publish record: %w", err)
	}
	return nil
}

// Reply answers m's subject: through JetStream under sys1.replies. (stored, de-duplicated by
// msgID), as plain NATS otherwise.
func (w Writer) Reply(ctx context.Context, m *nats.Msg, msgID string) error {
	if strings.HasPrefix(m.Subject, wire.RepliesPrefix) {
		if err := w.Publish(ctx, "publish the durable reply", w.cfg.RepliesStream, m, jetstream.WithMsgID(msgID)); err != nil {
			return fmt.Errorf("publish durable reply: %w", err)
		}
		return nil
	}
	// A plain publish only fails when the connection is closed; while it reconnects nats.go
	// buffers it.
	if err := w.cfg.Core.PublishMsg(m); err != nil {
		return fmt.Errorf("publish reply: %w", err)
	}
	return nil
}

// RunReply is a run's reply message to replyTo: its run id, status, review status and error
// code in headers, so callers can route on them without decoding the body.
func RunReply(replyTo, runID string, reply []byte, status contract.Status) *nats.Msg {
	m := &nats.Msg{Subject: replyTo, Data: reply, Header: nats.Header{}}
	m.Header.Set(wire.HeaderRunID, runID)
	m.Header.Set(wire.HeaderStatus, string(status))
	if status := ReviewStatus(reply); status != "" {
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

// ReviewStatus is the status of a reply's "review" field (pending, reviewed, not_queued), or
// "" without one, read without decoding the reply: replays send stored bytes. The encoder
// writes "review" as an object whose first member is its status; answers cannot hold that
// text outside a JSON string, where its quotes would be escaped.
func ReviewStatus(reply []byte) string {
	for _, status := range []string{contract.ReviewPending, contract.ReviewReviewed, contract.ReviewNotQueued} {
		if bytes.Contains(reply, []byte(`"review":{"status":"`+status+`"`)) {
			return status
		}
	}
	return ""
}

// ErrTooLarge marks an outcome NATS cannot store: over max_payload, the stream's max message
// size, or the gate's.
var ErrTooLarge = errors.New("too large to store")

// IsTooLarge reports whether err says the message is too large to store.
func IsTooLarge(err error) bool {
	return err != nil && (errors.Is(err, ErrTooLarge) || errors.Is(err, nats.ErrMaxPayload) ||
		errors.Is(err, jetstream.ErrStreamMessageExceedsMaximum))
}

// Final marks err as one no retry in place can fix (Store returns it at once).
func Final(err error) error { return &finalError{err} }

type finalError struct{ err error }

func (e *finalError) Error() string { return e.err.Error() }
func (e *finalError) Unwrap() error { return e.err }

// Refused is a write JetStream refused for want of room (or the caller's quota): retrying in
// place cannot help.
type Refused struct {
	Stream  string
	Refusal topology.Refusal
	Err     error
}

func (e *Refused) Error() string {
	return fmt.Sprintf("%s refused the message (%s): %v", e.Stream, e.Refusal, e.Err)
}

func (e *Refused) Unwrap() error { return e.Err }

// RefusedBy reports the refusal behind err, if any.
func RefusedBy(err error) (*Refused, bool) {
	var r *Refused
	return r, errors.As(err, &r)
}
