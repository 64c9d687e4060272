// Package orphans answers requests their consumer has moved past without finishing them.
//
// In a work-queue stream a message leaves the stream when its consumer acknowledges it, so a
// request still in SYS1_REQUESTS at or below its consumer's acknowledgement floor is one the
// consumer will never deliver again and nobody finished. nats-server leaves a request there
// when it runs out of deliveries (SYS1_CONSUMER_MAX_DELIVER): its max-deliveries advisory
// normally gets it answered within seconds (worker/internal/deadletter), but an advisory is
// not guaranteed — one published while SYS1_DEAD_LETTERS has no leader is gone. And a soak
// found 27 requests left so after a whole-cluster crash though their workers had seen only two
// deliveries each and no advisory came (deploy/reliability.md, finding 11). Without this sweep
// they would sit in the stream unanswered until they aged out.
//
// A Sweeper looks for them from outside the consumers: for each consumer of the request
// stream and each of its filters, the first messages at or below its floor. A message seen so
// on two sweeps an interval apart is an orphan (one seen once may be a message whose
// acknowledgement the stream is still applying), and is answered like any delivery, through
// the replica's pipeline; settling it removes it from the stream. Several replicas may sweep
// at once: the run-id gate lets only one delivery run a run at a time, and a finished run is
// answered from its stored outcome, so the model is never asked twice.
package orphans

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/sys1hq/sys1/worker/internal/storedmsg"
)

// Consumer is one consumer of the request stream, as far as the sweep needs it.
type Consumer struct {
	Name string
	// Filters are its filter subjects; none means every subject of the stream.
	Filters []string
	// AckFloor is the stream sequence at and below which it has settled every message.
	AckFloor uint64
}

// Stream is the request stream.
type Stream interface {
	// FirstSeq is the sequence of the stream's oldest message (no consumer whose floor is
	// below it can have an orphan: most are skipped without a look-up).
	FirstSeq(ctx context.Context) (uint64, error)
	// Consumers lists the stream's consumers (an error if any could not be read: a sweep
	// with a consumer missing would miss its orphans, not find false ones, but says so).
	Consumers(ctx context.Context) ([]Consumer, error)
	// NextMsg is the first message at or after seq on subject (a filter, wildcards allowed);
	// jetstream.ErrMsgNotFound when there is none.
	NextMsg(ctx context.Context, seq uint64, subject string) (*jetstream.RawStreamMsg, error)
	// DeleteMsg removes an answered orphan.
	DeleteMsg(ctx context.Context, seq uint64) error
}

// Sweeper finds orphaned requests and answers them. Sweep is called from one goroutine.
type Sweeper struct {
	// Requests is the request stream, as the replica has it now.
	Requests func() Stream
	// StreamName names the request stream in the deliveries' metadata.
	StreamName string
	// Handle runs a delivery through the replica's pipeline.
	Handle func(ctx context.Context, msg jetstream.Msg)
	// LastDelivery is the delivery number of the run's last recorded attempt (0 when none
	// is known): an orphan's delivery continues the run's count, so SYS1_MAX_DELIVER still
	// bounds how often its model is asked.
	LastDelivery func(ctx context.Context, msg *jetstream.RawStreamMsg) int
	// MaxPerConsumer bounds how many orphans one consumer's filter yields per sweep
	// (default 32): a sweep answers them one after another.
	MaxPerConsumer int
	// RetryBase is the least time before an orphan whose delivery was nak'ed is tried again.
	RetryBase time.Duration
	Log       zerolog.Logger
	// Answered, if set, is told of each orphan answered and removed.
	Answered func()
	// Now is the clock (time.Now by default).
	Now func() time.Time

	seen map[uint64]*sighting
}

// sighting is what the sweeper remembers of a message it found orphaned.
type sighting struct {
	first     time.Time
	tries     int // deliveries this replica gave it
	notBefore time.Time
}

// Report is what one sweep did.
type Report struct {
	Consumers int // consumers read
	Suspects  int // messages found at or below a floor for the first time
	Answered  int // orphans answered and removed
	Retrying  int // orphans whose delivery was nak'ed or could not be removed: tried again later
}

// Sweep looks for orphans once and answers those seen on an earlier sweep too.
func (s *Sweeper) Sweep(ctx context.Context) (Report, error) {
	var rep Report
	if s.seen == nil {
		s.seen = map[uint64]*sighting{}
	}
	now := s.now()
	stream := s.Requests()
	consumers, err := stream.Consumers(ctx)
	if err != nil {
		return rep, fmt.Errorf("list the request consumers: %w", err)
	}
	rep.Consumers = len(consumers)
	found, err := s.find(ctx, stream, consumers)
	if err != nil {
		return rep, err
	}
	// Forget messages no longer orphaned (answered elsewhere, acknowledged after all).
	for seq := range s.seen {
		if _, ok := found[seq]; !ok {
			delete(s.seen, seq)
		}
	}
	for seq, o := range found {
		sg, known := s.seen[seq]
		if !known {
			s.seen[seq] = &sighting{first: now}
			rep.Suspects++
			continue
		}
		if now.Before(sg.notBefore) {
			rep.Retrying++
			continue
		}
		if ctx.Err() != nil {
			break
		}
		if s.answer(ctx, stream, o, sg) {
			delete(s.seen, seq)
			rep.Answered++
		} else {
			rep.Retrying++
		}
	}
	return rep, nil
}

// orphan is a message found at or below its consumer's floor.
type orphan struct {
	raw      *jetstream.RawStreamMsg
	consumer string
}

// find lists the messages at or below their consumer's floor.
func (s *Sweeper) find(ctx context.Context, stream Stream, consumers []Consumer) (map[uint64]orphan, error) {
	limit := s.MaxPerConsumer
	if limit <= 0 {
		limit = 32
	}
	first, err := stream.FirstSeq(ctx)
	if err != nil {
		return nil, fmt.Errorf("read the request stream's first sequence: %w", err)
	}
	found := map[uint64]orphan{}
	for _, c := range consumers {
		if first == 0 || c.AckFloor < first {
			continue // empty stream, or every message above the floor: the consumer's to deliver
		}
		filters := c.Filters
		if len(filters) == 0 {
			filters = []string{">"}
		}
		for _, f := range filters {
			seq := first
			for range limit {
				if seq > c.AckFloor {
					break
				}
				raw, err := stream.NextMsg(ctx, seq, f)
				if errors.Is(err, jetstream.ErrMsgNotFound) {
					break
				}
				if err != nil {
					return nil, fmt.Errorf("read consumer %s's first message on %s: %w", c.Name, f, err)
				}
				if raw.Sequence > c.AckFloor {
					break
				}
				found[raw.Sequence] = orphan{raw: raw, consumer: c.Name}
				seq = raw.Sequence + 1
			}
		}
	}
	return found, nil
}

// answer runs one orphan through the pipeline; true once it is answered and removed.
func (s *Sweeper) answer(ctx context.Context, stream Stream, o orphan, sg *sighting) bool {
	delivery := max(sg.tries+1, 1)
	if s.LastDelivery != nil {
		delivery = max(delivery, s.LastDelivery(ctx, o.raw)+1)
	}
	sg.tries++
	log := s.Log.With().Uint64("stream_seq", o.raw.Sequence).Str("consumer", o.consumer).Int("delivery", delivery).Logger()
	log.Warn().Time("found", sg.first).Msg("a request below its consumer's acknowledgement floor was never answered; answering it now")
	msg := storedmsg.New(stream, o.raw, &jetstream.MsgMetadata{
		Sequence:     jetstream.SequencePair{Stream: o.raw.Sequence},
		NumDelivered: uint64(delivery),
		Timestamp:    o.raw.Time,
		Stream:       s.StreamName,
		Consumer:     o.consumer,
	}, nil)
	s.Handle(ctx, msg)
	switch {
	case msg.Settled() && msg.RemoveErr() == nil:
		if s.Answered != nil {
			s.Answered()
		}
		return true
	case msg.Settled():
		log.Warn().Err(msg.RemoveErr()).Msg("answered an orphaned request but could not remove it; its record and reply may repeat")
		sg.notBefore = s.now().Add(s.RetryBase)
	default:
		sg.notBefore = s.now().Add(max(msg.Delay(), s.RetryBase))
	}
	return false
}

func (s *Sweeper) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

// JetStream adapts a jetstream.Stream to Stream.
func JetStream(s jetstream.Stream) Stream { return jsStream{s} }

type jsStream struct{ s jetstream.Stream }

func (j jsStream) FirstSeq(ctx context.Context) (uint64, error) {
	info, err := j.s.Info(ctx)
	if err != nil {
		return 0, err
	}
	if info.State.Msgs == 0 {
		return 0, nil
	}
	return info.State.FirstSeq, nil
}

func (j jsStream) Consumers(ctx context.Context) ([]Consumer, error) {
	l := j.s.ListConsumers(ctx)
	var out []Consumer
	for ci := range l.Info() {
		c := Consumer{Name: ci.Name, Filters: ci.Config.FilterSubjects, AckFloor: ci.AckFloor.Stream}
		if ci.Config.FilterSubject != "" {
			c.Filters = append(c.Filters, ci.Config.FilterSubject)
		}
		out = append(out, c)
	}
	return out, l.Err()
}

func (j jsStream) NextMsg(ctx context.Context, seq uint64, subject string) (*jetstream.RawStreamMsg, error) {
	return j.s.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subject))
}

func (j jsStream) DeleteMsg(ctx context.Context, seq uint64) error { return j.s.DeleteMsg(ctx, seq) }
