package orphans

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/sys1hq/sys1/worker/natsconn/natstest"
)

// stream is a request stream in memory: messages by sequence, each on a subject.
type stream struct {
	msgs      map[uint64]*jetstream.RawStreamMsg
	consumers []Consumer
	deleteErr error
	deleted   []uint64
	lookups   int // NextMsg calls since the last FirstSeq
}

func (s *stream) Consumers(context.Context) ([]Consumer, error) { return s.consumers, nil }

func (s *stream) FirstSeq(context.Context) (uint64, error) {
	s.lookups = 0
	var first uint64
	for q := range s.msgs {
		if first == 0 || q < first {
			first = q
		}
	}
	return first, nil
}

func (s *stream) NextMsg(_ context.Context, seq uint64, subject string) (*jetstream.RawStreamMsg, error) {
	s.lookups++
	var best *jetstream.RawStreamMsg
	for q, m := range s.msgs {
		if q >= seq && (subject == ">" || m.Subject == subject) && (best == nil || q < best.Sequence) {
			best = m
		}
	}
	if best == nil {
		return nil, jetstream.ErrMsgNotFound
	}
	return best, nil
}

func (s *stream) DeleteMsg(_ context.Context, seq uint64) error {
	if s.deleteErr != nil {
		return s.deleteErr
	}
	delete(s.msgs, seq)
	s.deleted = append(s.deleted, seq)
	return nil
}

func (s *stream) put(seq uint64, subject string) {
	if s.msgs == nil {
		s.msgs = map[uint64]*jetstream.RawStreamMsg{}
	}
	s.msgs[seq] = &jetstream.RawStreamMsg{Subject: subject, Sequence: seq, Data: []byte("{}")}
}

// clock is a manual clock.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

type delivery struct {
	seq, num uint64
	consumer string
}

func sweeper(s *stream, c *clock, settle func(jetstream.Msg)) (*Sweeper, *[]delivery, *int) {
	var got []delivery
	answered := 0
	return &Sweeper{Requests: func() Stream { return s }, StreamName: "SYS1_REQUESTS",
		Handle: func(_ context.Context, m jetstream.Msg) {
			meta, _ := m.Metadata()
			got = append(got, delivery{seq: meta.Sequence.Stream, num: meta.NumDelivered, consumer: meta.Consumer})
			settle(m)
		},
		RetryBase: time.Second, Log: zerolog.Nop(), Now: c.now, Answered: func() { answered++ }}, &got, &answered
}

func TestAMessageBelowItsConsumersFloorIsAnsweredOnTheSecondSweepAndRemoved(t *testing.T) {
	s := &stream{consumers: []Consumer{
		{Name: "plain", Filters: []string{"sys1.decide.plain"}, AckFloor: 10},
		{Name: "other", Filters: []string{"sys1.decide.other"}, AckFloor: 3},
	}}
	s.put(5, "sys1.decide.plain")  // below plain's floor: an orphan
	s.put(11, "sys1.decide.plain") // above it: still the consumer's to deliver
	s.put(6, "sys1.decide.other")  // above other's floor
	c := &clock{t: time.Unix(1000, 0)}
	sw, got, answered := sweeper(s, c, func(m jetstream.Msg) { _ = m.Ack() })

	rep, err := sw.Sweep(context.Background())
	if err != nil || rep.Consumers != 2 || rep.Suspects != 1 || len(*got) != 0 {
		t.Fatalf("first sweep: %+v, %v, deliveries %v: want one suspect, nothing answered yet", rep, err, *got)
	}
	c.t = c.t.Add(time.Minute)
	rep, err = sw.Sweep(context.Background())
	if err != nil || rep.Answered != 1 || *answered != 1 {
		t.Fatalf("second sweep: %+v, %v", rep, err)
	}
	if want := []delivery{{seq: 5, num: 1, consumer: "plain"}}; len(*got) != 1 || (*got)[0] != want[0] {
		t.Fatalf("deliveries %v, want %v", *got, want)
	}
	if _, ok := s.msgs[5]; ok || len(s.deleted) != 1 {
		t.Fatalf("the answered orphan is still in the stream (deleted %v)", s.deleted)
	}
	if _, ok := s.msgs[11]; !ok {
		t.Fatal("a message above its consumer's floor was removed")
	}
}

func TestAMessageAcknowledgedBetweenSweepsIsNotAnswered(t *testing.T) {
	s := &stream{consumers: []Consumer{{Name: "all", AckFloor: 10}}}
	s.put(4, "sys1.decide.a")
	c := &clock{t: time.Unix(1000, 0)}
	sw, got, _ := sweeper(s, c, func(m jetstream.Msg) { _ = m.Ack() })
	if rep, _ := sw.Sweep(context.Background()); rep.Suspects != 1 {
		t.Fatalf("first sweep: %+v", rep)
	}
	delete(s.msgs, 4) // the stream applied its acknowledgement after all
	s.put(7, "sys1.decide.a")
	if rep, _ := sw.Sweep(context.Background()); rep.Answered != 0 || rep.Suspects != 1 || len(*got) != 0 {
		t.Fatalf("second sweep: %+v, deliveries %v: want only a new suspect", rep, *got)
	}
	if len(sw.seen) != 1 || sw.seen[4] != nil {
		t.Fatalf("remembers %v: want only sequence 7", sw.seen)
	}
}

func TestANakedOrphanWaitsItsDelayAndCountsItsDeliveries(t *testing.T) {
	s := &stream{consumers: []Consumer{{Name: "plain", Filters: []string{"sys1.decide.plain"}, AckFloor: 10}}}
	s.put(5, "sys1.decide.plain")
	c := &clock{t: time.Unix(1000, 0)}
	nak := true
	sw, got, _ := sweeper(s, c, func(m jetstream.Msg) {
		if nak {
			_ = m.NakWithDelay(20 * time.Second)
			return
		}
		_ = m.Term()
	})
	sw.LastDelivery = func(context.Context, *jetstream.RawStreamMsg) int { return 2 } // the gate recorded delivery 2
	_, _ = sw.Sweep(context.Background())
	c.t = c.t.Add(time.Minute)
	if rep, _ := sw.Sweep(context.Background()); rep.Retrying != 1 || len(*got) != 1 || (*got)[0].num != 3 {
		t.Fatalf("second sweep: %+v, deliveries %v: want delivery 3, nak'ed", rep, *got)
	}
	c.t = c.t.Add(10 * time.Second)
	if rep, _ := sw.Sweep(context.Background()); rep.Retrying != 1 || len(*got) != 1 {
		t.Fatalf("within the delay: %+v, deliveries %v: want no delivery", rep, *got)
	}
	c.t = c.t.Add(11 * time.Second)
	nak = false
	// The gate still says 2 (the nak'ed try recorded nothing): this replica's own count goes on.
	if rep, _ := sw.Sweep(context.Background()); rep.Answered != 1 || len(*got) != 2 || (*got)[1].num != 3 {
		t.Fatalf("after the delay: %+v, deliveries %v", rep, *got)
	}
	sw.LastDelivery = nil
	s.put(6, "sys1.decide.plain")
	_, _ = sw.Sweep(context.Background())
	for range 3 {
		nak = true
		c.t = c.t.Add(time.Minute)
		_, _ = sw.Sweep(context.Background())
	}
	if n := len(*got); n != 5 || (*got)[2].num != 1 || (*got)[3].num != 2 || (*got)[4].num != 3 {
		t.Fatalf("deliveries %v: without a gate record, want 1, 2, 3", *got)
	}
}

func TestAnOrphanThatCannotBeRemovedIsTriedAgain(t *testing.T) {
	s := &stream{consumers: []Consumer{{Name: "plain", AckFloor: 10}}, deleteErr: errors.New("nats: timeout")}
	s.put(5, "sys1.decide.plain")
	c := &clock{t: time.Unix(1000, 0)}
	sw, got, answered := sweeper(s, c, func(m jetstream.Msg) { _ = m.Ack() })
	_, _ = sw.Sweep(context.Background())
	c.t = c.t.Add(time.Minute)
	if rep, _ := sw.Sweep(context.Background()); rep.Retrying != 1 || *answered != 0 {
		t.Fatalf("%+v: want retrying", rep)
	}
	s.deleteErr = nil
	c.t = c.t.Add(time.Minute)
	if rep, _ := sw.Sweep(context.Background()); rep.Answered != 1 || len(*got) != 2 {
		t.Fatalf("%+v, deliveries %v", rep, *got)
	}
}

func TestConsumersWhoseFloorIsBelowTheOldestMessageAreNotLookedUp(t *testing.T) {
	s := &stream{consumers: []Consumer{{Name: "a", Filters: []string{"sys1.decide.a"}, AckFloor: 4}, {Name: "b", AckFloor: 0},
		{Name: "c", Filters: []string{"sys1.decide.c"}, AckFloor: 9}}}
	s.put(5, "sys1.decide.a")
	s.put(9, "sys1.decide.c")
	sw, _, _ := sweeper(s, &clock{t: time.Unix(1000, 0)}, func(m jetstream.Msg) { _ = m.Ack() })
	if rep, _ := sw.Sweep(context.Background()); rep.Suspects != 1 || s.lookups != 1 {
		t.Fatalf("%+v after %d look-ups: want c's message found with one look-up", rep, s.lookups)
	}
	delete(s.msgs, 5)
	delete(s.msgs, 9)
	if rep, _ := sw.Sweep(context.Background()); rep.Suspects != 0 || s.lookups != 0 {
		t.Fatalf("empty stream: %+v after %d look-ups", rep, s.lookups)
	}
}

func TestAtMostMaxPerConsumerOrphansASweep(t *testing.T) {
	s := &stream{consumers: []Consumer{{Name: "plain", AckFloor: 100}}}
	for q := uint64(1); q <= 10; q++ {
		s.put(q, "sys1.decide.plain")
	}
	sw, _, _ := sweeper(s, &clock{t: time.Unix(1000, 0)}, func(m jetstream.Msg) { _ = m.Ack() })
	sw.MaxPerConsumer = 4
	if rep, _ := sw.Sweep(context.Background()); rep.Suspects != 4 {
		t.Fatalf("%+v: want 4 suspects", rep)
	}
}

// TestJetStreamFindsARequestLeftBelowTheFloor plants an orphan in a real work-queue stream
// and sweeps it through the adapter. nats-server 2.15 leaves a message that ran out of
// deliveries in a work-queue stream, below its consumer's floor once a later message is
// acknowledged — finding 11's end state (floor past, nothing pending, one redelivered);
// with its max-deliveries advisory lost, nothing else would ever answer it.
func TestJetStreamFindsARequestLeftBelowTheFloor(t *testing.T) {
	srv := natstest.Start(t)
	_, js := natstest.Connect(t, srv)
	ctx := context.Background()
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "REQ", Subjects: []string{"sys1.decide.>"}, Retention: jetstream.WorkQueuePolicy})
	if err != nil {
		t.Fatal(err)
	}
	cons, err := st.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: "plain", FilterSubject: "sys1.decide.plain",
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: 200 * time.Millisecond, MaxDeliver: 2})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: "other", FilterSubject: "sys1.decide.other", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	for _, subj := range []string{"sys1.decide.plain", "sys1.decide.other"} { // sequences 1, 2
		if _, err := js.Publish(ctx, subj, []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
	// Take sequence 1 and never settle it, until the consumer stops delivering it.
	natstest.WaitFor(t, 20*time.Second, "sequence 1 to run out of deliveries", func() bool {
		b, err := cons.Fetch(1, jetstream.FetchMaxWait(300*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		for range b.Messages() { // the fetch is over (no pull left waiting for sequence 3)
		}
		ci, err := cons.Info(ctx)
		return err == nil && ci.NumAckPending == 0 && ci.NumRedelivered == 1
	})
	if _, err := js.Publish(ctx, "sys1.decide.plain", []byte(`{}`)); err != nil { // sequence 3
		t.Fatal(err)
	}
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for m := range batch.Messages() {
		if err := m.DoubleAck(ctx); err != nil {
			t.Fatal(err)
		}
	}
	natstest.WaitFor(t, 10*time.Second, "the consumer's floor to pass sequence 1", func() bool {
		ci, err := cons.Info(ctx)
		return err == nil && ci.AckFloor.Stream >= 3
	})
	var handled []uint64
	sw := &Sweeper{Requests: func() Stream { return JetStream(st) }, StreamName: "REQ", RetryBase: time.Second, Log: zerolog.Nop(),
		Handle: func(_ context.Context, m jetstream.Msg) {
			meta, _ := m.Metadata()
			handled = append(handled, meta.Sequence.Stream)
			_ = m.Ack()
		}}
	if rep, err := sw.Sweep(ctx); err != nil || rep.Consumers != 2 || rep.Suspects != 1 {
		t.Fatalf("first sweep: %+v, %v: want 2 consumers read, one suspect (sequence 1 below plain's floor; 2 above other's)", rep, err)
	}
	if rep, err := sw.Sweep(ctx); err != nil || rep.Answered != 1 || len(handled) != 1 || handled[0] != 1 {
		t.Fatalf("second sweep: %+v, %v, handled %v: want sequence 1 answered", rep, err, handled)
	}
	if _, err := st.GetMsg(ctx, 1); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Fatalf("the answered orphan is still in the stream: %v", err)
	}
	info, _ := st.Info(ctx)
	if info.State.Msgs != 1 {
		t.Fatalf("stream holds %d messages, want the 1 its consumers still have to deliver", info.State.Msgs)
	}
}
