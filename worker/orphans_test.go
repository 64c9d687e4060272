package worker_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/contract/wire"
	"github.com/sys1hq/sys1/worker/client"
	"github.com/sys1hq/sys1/worker/internal/orphans"
)

// plantedStream is a request stream holding one message its consumer's floor is past.
type plantedStream struct {
	msg     *jetstream.RawStreamMsg
	deleted int
}

func (p *plantedStream) Consumers(context.Context) ([]orphans.Consumer, error) {
	return []orphans.Consumer{{Name: "sys1-worker", Filters: []string{"sys1.decide.>"}, AckFloor: p.msg.Sequence + 10}}, nil
}

func (p *plantedStream) FirstSeq(context.Context) (uint64, error) { return p.msg.Sequence, nil }

func (p *plantedStream) NextMsg(_ context.Context, seq uint64, _ string) (*jetstream.RawStreamMsg, error) {
	if p.msg == nil || seq > p.msg.Sequence {
		return nil, jetstream.ErrMsgNotFound
	}
	return p.msg, nil
}

func (p *plantedStream) DeleteMsg(_ context.Context, seq uint64) error {
	p.deleted++
	return nil
}

// An orphaned request — below its consumer's floor, never answered — is answered through the
// pipeline like any delivery: one model call, a reply, a record; swept again (its removal
// lost), it is answered from its stored outcome without calling the model again.
func TestAnOrphanedRequestIsAnsweredOnceByTheSweep(t *testing.T) {
	h := newHarness(t)
	r := h.start(func(o *replicaOpts) { o.cfg.OrphanSweepInterval = time.Hour }) // swept by hand below
	inbox := "_INBOX.svc-a." + nats.NewInbox()[7:]
	sub, err := h.nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	hdr := nats.Header{}
	hdr.Set(wire.HeaderRunID, "orphan-1")
	hdr.Set(wire.HeaderReplyTo, inbox)
	planted := &plantedStream{msg: &jetstream.RawStreamMsg{Subject: "sys1.decide.svc-a", Sequence: 4242, Header: hdr,
		Data: []byte(ticket), Time: time.Now()}}
	ctx := context.Background()
	if rep, err := r.w.SweepOrphansOf(ctx, planted); err != nil || rep.Suspects != 1 || h.fake.Calls() != 0 {
		t.Fatalf("first sweep: %+v, %v, %d calls: want a suspect, not yet answered", rep, err, h.fake.Calls())
	}
	if rep, err := r.w.SweepOrphansOf(ctx, planted); err != nil || rep.Answered != 1 || planted.deleted != 1 {
		t.Fatalf("second sweep: %+v, %v, deleted %d: want it answered and removed", rep, err, planted.deleted)
	}
	m, err := sub.NextMsg(10 * time.Second)
	if err != nil {
		t.Fatalf("no reply: %v", err)
	}
	if rep, _ := client.ParseReply(m); rep.Status != contract.StatusSuccess || rep.RunID != "orphan-1" {
		t.Fatalf("reply %s", rep.Raw)
	}
	if rec := h.recordByRun("orphan-1"); rec.Status != contract.StatusSuccess {
		t.Fatalf("record %+v", rec)
	}
	// Its removal was lost: the next sweeps find it again and answer it from the gate.
	_, _ = r.w.SweepOrphansOf(ctx, planted)
	if rep, err := r.w.SweepOrphansOf(ctx, planted); err != nil || rep.Answered != 1 {
		t.Fatalf("sweeping it again: %+v, %v", rep, err)
	}
	if calls := h.fake.Calls(); calls != 1 {
		t.Fatalf("model called %d times, want once", calls)
	}
	if st := r.w.Stats(); st.Orphans != 2 || st.Replayed != 1 {
		t.Fatalf("stats %+v: want 2 orphans answered, one from the stored outcome", st)
	}
}
