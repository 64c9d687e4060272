// Package deadletter answers dead-lettered requests. A request message that reached the request consumers' max deliver
// (SYS1_CONSUMER_MAX_DELIVER) is no longer delivered, but it stays in SYS1_REQUESTS, and
// JetStream publishes an advisory about it, which SYS1_DEAD_LETTERS keeps. Every replica
// reads those advisories from one shared consumer and answers each such run like any other —
// admit, gate, prepare — except that prepare finds its deliveries spent and answers it with
// its last error instead of calling the provider (or the gate finds it finished, and it is
// answered from its stored outcome). Then the message is removed from the stream. A dead
// letter that cannot be answered yet (NATS or KV trouble) is retried from its advisory.

package deadletter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// Stream is the request stream (jetstream.Stream): where a dead-lettered request is read
// and, once answered, removed.
type Stream interface {
	GetMsg(ctx context.Context, seq uint64, opts ...jetstream.GetMsgOpt) (*jetstream.RawStreamMsg, error)
	DeleteMsg(ctx context.Context, seq uint64) error
}

// Answerer answers the requests max-deliveries advisories name.
type Answerer struct {
	// RequestsStream is the request stream's name: advisories of other streams are dropped.
	RequestsStream string
	// Requests is the request stream, as the replica has it now.
	Requests func() Stream
	// Handle runs a delivery through the replica's pipeline.
	Handle func(ctx context.Context, msg jetstream.Msg)
	// RetryBase is the least delay before an advisory that could not be answered comes back.
	RetryBase time.Duration
	Log       zerolog.Logger
	// Answered, if set, is told of each dead letter answered and removed.
	Answered func()
}

// maxDeliveriesAdvisory is JetStream's io.nats.jetstream.advisory.v1.max_deliver.
type maxDeliveriesAdvisory struct {
	Stream     string `json:"stream"`
	Consumer   string `json:"consumer"`
	StreamSeq  uint64 `json:"stream_seq"`
	Deliveries uint64 `json:"deliveries"`
}

// Answer answers the request one advisory names, and settles the advisory: acked once the
// request is answered and removed, nak'ed to come back when it could not be (yet).
func (a *Answerer) Answer(ctx context.Context, adv jetstream.Msg) {
	requests := a.Requests()
	var ad maxDeliveriesAdvisory
	if err := json.Unmarshal(adv.Data(), &ad); err != nil || ad.StreamSeq == 0 || ad.Stream != a.RequestsStream {
		a.Log.Warn().Str("subject", adv.Subject()).Msg("not a max-deliveries advisory of the request stream; dropped")
		_ = adv.Term()
		return
	}
	log := a.Log.With().Uint64("stream_seq", ad.StreamSeq).Str("consumer", ad.Consumer).Uint64("deliveries", ad.Deliveries).Logger()
	raw, err := requests.GetMsg(ctx, ad.StreamSeq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		_ = adv.Ack() // answered and removed already, or aged out
		return
	}
	if err != nil {
		log.Warn().Err(err).Msg("could not read a dead-lettered request; retrying")
		_ = adv.NakWithDelay(a.RetryBase)
		return
	}
	log.Warn().Msg("a request ran out of deliveries; answering it with its last error")
	msg := &deadMsg{requests: requests, adv: adv, raw: raw, meta: &jetstream.MsgMetadata{
		Sequence:     jetstream.SequencePair{Stream: raw.Sequence},
		NumDelivered: ad.Deliveries + 1,
		Timestamp:    raw.Time,
		Stream:       ad.Stream,
		Consumer:     ad.Consumer,
	}}
	a.Handle(ctx, msg)
	switch {
	case msg.settled && msg.removeErr == nil:
		if a.Answered != nil {
			a.Answered()
		}
		_ = adv.Ack()
	case msg.settled:
		log.Warn().Err(msg.removeErr).Msg("answered a dead-lettered request but could not remove it; its record and reply may repeat")
		_ = adv.NakWithDelay(a.RetryBase)
	default:
		_ = adv.NakWithDelay(max(msg.delay, a.RetryBase))
	}
}

// deadMsg is a dead-lettered request message as a delivery: settling it removes it from the
// stream (Ack, Term) or hands it back to its advisory (Nak).
type deadMsg struct {
	requests  Stream
	adv       jetstream.Msg
	raw       *jetstream.RawStreamMsg
	meta      *jetstream.MsgMetadata
	settled   bool
	removeErr error
	delay     time.Duration
}

func (m *deadMsg) Metadata() (*jetstream.MsgMetadata, error) { return m.meta, nil }
func (m *deadMsg) Data() []byte                              { return m.raw.Data }
func (m *deadMsg) Headers() nats.Header                      { return m.raw.Header }
func (m *deadMsg) Subject() string                           { return m.raw.Subject }
func (m *deadMsg) Reply() string                             { return "" }
func (m *deadMsg) Ack() error                                { return m.remove() }
func (m *deadMsg) DoubleAck(context.Context) error           { return m.remove() }
func (m *deadMsg) Term() error                               { return m.remove() }
func (m *deadMsg) TermWithReason(string) error               { return m.remove() }
func (m *deadMsg) Nak() error                                { return nil }
func (m *deadMsg) InProgress() error                         { return m.adv.InProgress() }

func (m *deadMsg) NakWithDelay(d time.Duration) error {
	m.delay = d
	return nil
}

func (m *deadMsg) remove() error {
	m.settled = true
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := m.requests.DeleteMsg(ctx, m.raw.Sequence)
	if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		m.removeErr = fmt.Errorf("remove dead-lettered request %d: %w", m.raw.Sequence, err)
	}
	return m.removeErr
}
