package deadletter

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

type requests struct {
	msgs    map[uint64]*jetstream.RawStreamMsg
	deleted []uint64
}

func (r *requests) GetMsg(_ context.Context, seq uint64, _ ...jetstream.GetMsgOpt) (*jetstream.RawStreamMsg, error) {
	m, ok := r.msgs[seq]
	if !ok {
		return nil, jetstream.ErrMsgNotFound
	}
	return m, nil
}

func (r *requests) DeleteMsg(_ context.Context, seq uint64) error {
	if _, ok := r.msgs[seq]; !ok {
		return jetstream.ErrMsgNotFound
	}
	delete(r.msgs, seq)
	r.deleted = append(r.deleted, seq)
	return nil
}

// advisory is one max-deliveries advisory on the dead-letters consumer.
type advisory struct {
	jetstream.Msg
	data  string
	ended string
	delay time.Duration
}

func (a *advisory) Data() []byte { return []byte(a.data) }
func (a *advisory) Subject() string {
	return "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.SYS1_REQUESTS.c"
}
func (a *advisory) Ack() error        { a.ended = "ack"; return nil }
func (a *advisory) Term() error       { a.ended = "term"; return nil }
func (a *advisory) InProgress() error { return nil }
func (a *advisory) NakWithDelay(d time.Duration) error {
	a.ended, a.delay = "nak", d
	return nil
}

func answerer(r *requests, handle func(ctx context.Context, msg jetstream.Msg)) (*Answerer, *int) {
	answered := 0
	return &Answerer{RequestsStream: "SYS1_REQUESTS", Requests: func() Stream { return r }, Handle: handle,
		RetryBase: time.Second, Log: zerolog.Nop(), Answered: func() { answered++ }}, &answered
}

const adv42 = `{"stream":"SYS1_REQUESTS","consumer":"c","stream_seq":42,"deliveries":5}`

func TestAnAnsweredDeadLetterIsRemovedAndItsAdvisoryAcked(t *testing.T) {
	r := &requests{msgs: map[uint64]*jetstream.RawStreamMsg{42: {Subject: "sys1.decide.a", Sequence: 42, Data: []byte(`{}`)}}}
	var seen jetstream.Msg
	a, answered := answerer(r, func(_ context.Context, msg jetstream.Msg) {
		seen = msg
		meta, _ := msg.Metadata()
		if meta.NumDelivered != 6 || meta.Sequence.Stream != 42 || msg.Subject() != "sys1.decide.a" {
			t.Errorf("the pipeline got delivery %d of seq %d on %s: want the request as its 6th delivery", meta.NumDelivered, meta.Sequence.Stream, msg.Subject())
		}
		_ = msg.Term() // answered with its last error
	})
	adv := &advisory{data: adv42}
	a.Answer(context.Background(), adv)
	if seen == nil || adv.ended != "ack" || len(r.deleted) != 1 || *answered != 1 {
		t.Fatalf("advisory %q, deleted %v, answered %d: want the request answered, removed, its advisory acked", adv.ended, r.deleted, *answered)
	}
}

func TestADeadLetterThePipelineHandsBackComesBackFromItsAdvisory(t *testing.T) {
	r := &requests{msgs: map[uint64]*jetstream.RawStreamMsg{42: {Subject: "sys1.decide.a", Sequence: 42}}}
	a, answered := answerer(r, func(_ context.Context, msg jetstream.Msg) { _ = msg.NakWithDelay(3 * time.Second) })
	adv := &advisory{data: adv42}
	a.Answer(context.Background(), adv)
	if adv.ended != "nak" || adv.delay != 3*time.Second || len(r.deleted) != 0 || *answered != 0 {
		t.Fatalf("advisory %q after %s, deleted %v: want it nak'ed with the pipeline's delay and the request kept", adv.ended, adv.delay, r.deleted)
	}
}

func TestAdvisoriesWithNothingToAnswer(t *testing.T) {
	handled := false
	a, _ := answerer(&requests{msgs: map[uint64]*jetstream.RawStreamMsg{}}, func(context.Context, jetstream.Msg) { handled = true })
	for _, tc := range []struct{ name, data, want string }{
		{"already removed", adv42, "ack"},
		{"another stream", `{"stream":"OTHER","stream_seq":42}`, "term"},
		{"not an advisory", `{"stream":`, "term"},
	} {
		adv := &advisory{data: tc.data}
		a.Answer(context.Background(), adv)
		if adv.ended != tc.want {
			t.Errorf("%s: advisory ended %q, want %q", tc.name, adv.ended, tc.want)
		}
	}
	if handled {
		t.Fatal("the pipeline ran for an advisory with no request to answer")
	}
}
