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
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/sys1hq/sys1/worker/internal/storedmsg"
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
	msg := storedmsg.New(requests, raw, &jetstream.MsgMetadata{
		Sequence:     jetstream.SequencePair{Stream: raw.Sequence},
		NumDelivered: ad.Deliveries + 1,
		Timestamp:    raw.Time,
		Stream:       ad.Stream,
		Consumer:     ad.Consumer,
	}, adv.InProgress)
	a.Handle(ctx, msg)
	switch {
	case msg.Settled() && msg.RemoveErr() == nil:
		if a.Answered != nil {
			a.Answered()
		}
		_ = adv.Ack()
	case msg.Settled():
		log.Warn().Err(msg.RemoveErr()).Msg("answered a dead-lettered request but could not remove it; its record and reply may repeat")
		_ = adv.NakWithDelay(a.RetryBase)
	default:
		_ = adv.NakWithDelay(max(msg.Delay(), a.RetryBase))
	}
}
