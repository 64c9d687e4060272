package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Dead letters. A request message that reached the request consumers' max deliver
// (SYS1_CONSUMER_MAX_DELIVER) is no longer delivered, but it stays in SYS1_REQUESTS, and
// JetStream publishes an advisory about it, which SYS1_DEAD_LETTERS keeps. Every replica
// reads those advisories from one shared consumer and answers each such run like any other —
// admit, gate, prepare — except that prepare finds its deliveries spent and answers it with
// its last error instead of calling the provider (or the gate finds it finished, and it is
// answered from its stored outcome). Then the message is removed from the stream. A dead
// letter that cannot be answered yet (NATS or KV trouble) is retried from its advisory.

// maxDeliveriesAdvisory is JetStream's io.nats.jetstream.advisory.v1.max_deliver.
type maxDeliveriesAdvisory struct {
	Stream     string `json:"stream"`
	Consumer   string `json:"consumer"`
	StreamSeq  uint64 `json:"stream_seq"`
	Deliveries uint64 `json:"deliveries"`
}

// deadLetters answers dead-lettered requests until ctx ends.
func (w *Worker) deadLetters(ctx context.Context, runCtx context.Context) {
	var fails int
	for ctx.Err() == nil {
		cons := w.deadCons.Load()
		// Bounded by the server's expiry, not a context (see pullWaiting).
		batch, err := pullWaiting(*cons, 4, w.opt.FetchWait)
		if err == nil {
			for m := range batch.Messages() {
				w.deadLetter(runCtx, m)
			}
			err = batch.Error()
		}
		if err != nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, nats.ErrTimeout) {
			fails++
			delay := min(time.Duration(fails)*200*time.Millisecond, 5*time.Second)
			w.log.Debug().Err(err).Dur("retry_in", delay).Msg("dead-letter pull failed")
			select {
			case <-time.After(delay):
			case <-ctx.Done():
			}
			continue
		}
		fails = 0
	}
}

// deadLetter answers the request one advisory names.
func (w *Worker) deadLetter(ctx context.Context, adv jetstream.Msg) {
	var a maxDeliveriesAdvisory
	if err := json.Unmarshal(adv.Data(), &a); err != nil || a.StreamSeq == 0 || a.Stream != w.opt.Topology.RequestsStream {
		w.log.Warn().Str("subject", adv.Subject()).Msg("not a max-deliveries advisory of the request stream; dropped")
		_ = adv.Term()
		return
	}
	log := w.log.With().Uint64("stream_seq", a.StreamSeq).Str("consumer", a.Consumer).Uint64("deliveries", a.Deliveries).Logger()
	raw, err := w.requests.GetMsg(ctx, a.StreamSeq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		_ = adv.Ack() // answered and removed already, or aged out
		return
	}
	if err != nil {
		log.Warn().Err(err).Msg("could not read a dead-lettered request; retrying")
		_ = adv.NakWithDelay(w.cfg.RetryBase)
		return
	}
	log.Warn().Msg("a request ran out of deliveries; answering it with its last error")
	msg := &deadMsg{w: w, adv: adv, raw: raw, meta: &jetstream.MsgMetadata{
		Sequence:     jetstream.SequencePair{Stream: raw.Sequence},
		NumDelivered: a.Deliveries + 1,
		Timestamp:    raw.Time,
		Stream:       a.Stream,
		Consumer:     a.Consumer,
	}}
	w.handle(ctx, msg)
	switch {
	case msg.settled && msg.removeErr == nil:
		w.stats.deadLetters.Add(1)
		_ = adv.Ack()
	case msg.settled:
		log.Warn().Err(msg.removeErr).Msg("answered a dead-lettered request but could not remove it; its record and reply may repeat")
		_ = adv.NakWithDelay(w.cfg.RetryBase)
	default:
		_ = adv.NakWithDelay(max(msg.delay, w.cfg.RetryBase))
	}
}

// deadMsg is a dead-lettered request message as a delivery: settling it removes it from the
// stream (Ack, Term) or hands it back to its advisory (Nak).
type deadMsg struct {
	w         *Worker
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
	err := m.w.requests.DeleteMsg(ctx, m.raw.Sequence)
	if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		m.removeErr = fmt.Errorf("remove dead-lettered request %d: %w", m.raw.Sequence, err)
	}
	return m.removeErr
}
