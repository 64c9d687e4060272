package storedmsg

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

type remover struct {
	err     error
	removed []uint64
}

func (r *remover) DeleteMsg(_ context.Context, seq uint64) error {
	r.removed = append(r.removed, seq)
	return r.err
}

func msg(r *remover, progress func() error) *Msg {
	return New(r, &jetstream.RawStreamMsg{Subject: "sys1.decide.a", Sequence: 7, Data: []byte("{}")},
		&jetstream.MsgMetadata{NumDelivered: 3}, progress)
}

func TestSettlingRemovesTheRequest(t *testing.T) {
	for name, settle := range map[string]func(*Msg) error{
		"ack": (*Msg).Ack, "term": (*Msg).Term,
		"double ack":       func(m *Msg) error { return m.DoubleAck(context.Background()) },
		"term with reason": func(m *Msg) error { return m.TermWithReason("bad") },
	} {
		r := &remover{}
		m := msg(r, nil)
		if err := settle(m); err != nil || !m.Settled() || m.RemoveErr() != nil || len(r.removed) != 1 || r.removed[0] != 7 {
			t.Errorf("%s: err %v, settled %v, removed %v", name, err, m.Settled(), r.removed)
		}
	}
	// Removed already (answered by another replica): settled, nothing to repeat.
	r := &remover{err: jetstream.ErrMsgNotFound}
	if m := msg(r, nil); m.Ack() != nil || m.RemoveErr() != nil {
		t.Errorf("a request gone already: %v", m.RemoveErr())
	}
	r = &remover{err: errors.New("nats: timeout")}
	if m := msg(r, nil); m.Ack() == nil || !m.Settled() || m.RemoveErr() == nil {
		t.Error("a failed removal must be reported")
	}
}

func TestANakOnlyRecordsItsDelay(t *testing.T) {
	r := &remover{}
	m := msg(r, nil)
	if m.NakWithDelay(20*time.Second) != nil || m.Nak() != nil || m.Settled() || m.Delay() != 20*time.Second || len(r.removed) != 0 {
		t.Fatalf("settled %v, delay %s, removed %v", m.Settled(), m.Delay(), r.removed)
	}
	if meta, _ := m.Metadata(); meta.NumDelivered != 3 || m.Subject() != "sys1.decide.a" || m.Reply() != "" {
		t.Fatalf("metadata %+v, subject %q", meta, m.Subject())
	}
}

func TestInProgressExtendsWhatWaits(t *testing.T) {
	if err := msg(&remover{}, nil).InProgress(); err != nil {
		t.Fatal(err)
	}
	extended := 0
	if err := msg(&remover{}, func() error { extended++; return nil }).InProgress(); err != nil || extended != 1 {
		t.Fatalf("err %v, extended %d", err, extended)
	}
}
