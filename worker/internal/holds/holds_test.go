package holds

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/contract/wire"
	"github.com/sys1hq/sys1/worker/internal/outbox"
	"github.com/sys1hq/sys1/worker/rungate"
	"github.com/sys1hq/sys1/worker/rungate/rungatetest"
)

type inbox struct{ msgs []*nats.Msg }

func (i *inbox) PublishMsg(m *nats.Msg) error { i.msgs = append(i.msgs, m); return nil }

type noStreams struct{}

func (noStreams) PublishMsg(context.Context, *nats.Msg, ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	return nil, errors.New("no streams here")
}

type alive struct{}

func (alive) InProgress() error { return nil }

// heldRun stores a finished run of caller "a" whose reply waits for labels of q1 and q2.
func heldRun(t *testing.T, b *rungatetest.Bucket, status string) {
	t.Helper()
	reply := contract.Reply{RunID: "r1", Status: contract.StatusSuccess,
		Verdicts: contract.Verdicts{
			{Question: "q1", Status: contract.VerdictAbstained, Rule: "strict", Reason: "confidence 0.31 < 0.50"},
			{Question: "q2", Status: contract.VerdictAbstained, Rule: "strict", Reason: "confidence 0.20 < 0.50"},
		},
		Review: &contract.ReviewRef{Status: contract.ReviewPending, Item: "rv-1"}}
	body, err := reply.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	st := rungate.State{Caller: "a", Status: status, StartedAt: time.Now(), Reply: body, ReplyTo: "_INBOX.a", Held: []string{"q1", "q2"}}
	value, _ := json.Marshal(st)
	if _, err := b.Create(context.Background(), rungate.Key("r1"), value); err != nil {
		t.Fatal(err)
	}
}

func releaser(b *rungatetest.Bucket, in *inbox) (*Releaser, outbox.Writer) {
	out := &outbox.Config{Streams: noStreams{}, Core: in, StoreRetry: time.Second, AckWait: time.Second}
	return &Releaser{Gate: b.Gate(), Out: out, Log: zerolog.Nop(), Retry: func(int) time.Duration { return time.Second }},
		out.For(alive{}, zerolog.Nop())
}

func label(question, caller string) *contract.Label {
	return &contract.Label{RunID: "r1", Question: question, Value: json.RawMessage(`"spam"`), Reviewer: "ana",
		Source: contract.LabelSourceReview, Caller: caller}
}

func TestTheReplyGoesOutOnceEveryHeldQuestionIsLabelled(t *testing.T) {
	ctx := context.Background()
	b, in := rungatetest.New(), &inbox{}
	heldRun(t, b, rungate.StatusDone)
	h, o := releaser(b, in)

	if err := h.apply(ctx, o, zerolog.Nop(), label("q1", "a")); err != nil {
		t.Fatal(err)
	}
	if st, _, _ := b.State("r1"); len(in.msgs) != 0 || len(st.Held) != 1 || st.Held[0] != "q2" {
		t.Fatalf("after q1's label: %d replies sent, held %v; want none sent and q2 still held", len(in.msgs), st.Held)
	}
	if err := h.apply(ctx, o, zerolog.Nop(), label("q2", "a")); err != nil {
		t.Fatal(err)
	}
	if len(in.msgs) != 1 {
		t.Fatalf("%d replies after the last held question's label, want 1", len(in.msgs))
	}
	m := in.msgs[0]
	if m.Subject != "_INBOX.a" || m.Header.Get(wire.HeaderReview) != contract.ReviewReviewed || m.Header.Get(wire.HeaderRunID) != "r1" {
		t.Fatalf("released reply to %s with headers %v", m.Subject, m.Header)
	}
	var got contract.Reply
	if err := json.Unmarshal(m.Data, &got); err != nil {
		t.Fatal(err)
	}
	for _, v := range got.Verdicts {
		if v.Status != contract.VerdictReviewed || string(v.Label) != `"spam"` || v.Reviewer != "ana" || v.Rule != "strict" {
			t.Fatalf("verdict %s after release: %+v (want reviewed, labelled, rule kept)", v.Question, v)
		}
	}
	if st, _, _ := b.State("r1"); len(st.Held) != 0 || outbox.ReviewStatus(st.Reply) != contract.ReviewReviewed {
		t.Fatalf("stored entry after release: held %v", st.Held)
	}

	// The label delivered again finds nothing held: nothing is sent twice.
	if err := h.apply(ctx, o, zerolog.Nop(), label("q2", "a")); err != nil || len(in.msgs) != 1 {
		t.Fatalf("a redelivered label: %v, %d replies; want nothing more sent", err, len(in.msgs))
	}
}

func TestAnotherCallersLabelReleasesNothing(t *testing.T) {
	b, in := rungatetest.New(), &inbox{}
	heldRun(t, b, rungate.StatusDone)
	h, o := releaser(b, in)
	for _, q := range []string{"q1", "q2"} {
		if err := h.apply(context.Background(), o, zerolog.Nop(), label(q, "b")); err != nil {
			t.Fatal(err)
		}
	}
	if st, _, _ := b.State("r1"); len(in.msgs) != 0 || len(st.Held) != 2 {
		t.Fatalf("caller b's labels on caller a's run: %d replies, held %v; want the hold untouched", len(in.msgs), st.Held)
	}
}

func TestALabelForARunStillFinishingComesBack(t *testing.T) {
	b, in := rungatetest.New(), &inbox{}
	heldRun(t, b, rungate.StatusRunning)
	h, o := releaser(b, in)
	if err := h.apply(context.Background(), o, zerolog.Nop(), label("q1", "a")); !errors.Is(err, errRunFinishing) {
		t.Fatalf("apply = %v, want errRunFinishing (the label is redelivered later)", err)
	}
}
