// Package storedmsg runs a request read from its stream by sequence — not delivered by a
// consumer — through the pipeline as a delivery. Dead letters (worker/internal/deadletter) and
// orphans (worker/internal/orphans) are such requests: no consumer will deliver them again,
// so settling one removes it from the stream, and a nak only records the delay asked for;
// whoever read it decides when to try again.
package storedmsg

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Remover removes a message from its stream (jetstream.Stream).
type Remover interface {
	DeleteMsg(ctx context.Context, seq uint64) error
}

// Msg is a stored request as a jetstream.Msg.
type Msg struct {
	stream    Remover
	raw       *jetstream.RawStreamMsg
	meta      *jetstream.MsgMetadata
	progress  func() error
	settled   bool
	removeErr error
	delay     time.Duration
}

// New is raw, from stream, as a delivery with meta. progress, if not nil, is what InProgress
// extends (a dead letter's advisory, whose consumer waits for it).
func New(stream Remover, raw *jetstream.RawStreamMsg, meta *jetstream.MsgMetadata, progress func() error) *Msg {
	return &Msg{stream: stream, raw: raw, meta: meta, progress: progress}
}

// Settled reports whether the delivery was settled (acked or terminated): the request was
// answered, and removed unless RemoveErr says otherwise.
func (m *Msg) Settled() bool { return m.settled }

// RemoveErr is why a settled request could not be removed from its stream (its record and
// reply may repeat when it is read again), or nil.
func (m *Msg) RemoveErr() error { return m.removeErr }

// Delay is the delay the last nak asked for.
func (m *Msg) Delay() time.Duration { return m.delay }

func (m *Msg) Metadata() (*jetstream.MsgMetadata, error) { return m.meta, nil }
func (m *Msg) Data() []byte                              { return m.raw.Data }
func (m *Msg) Headers() nats.Header                      { return m.raw.Header }
func (m *Msg) Subject() string                           { return m.raw.Subject }
func (m *Msg) Reply() string                             { return "" }
func (m *Msg) Ack() error                                { return m.remove() }
func (m *Msg) DoubleAck(context.Context) error           { return m.remove() }
func (m *Msg) Term() error                               { return m.remove() }
func (m *Msg) TermWithReason(string) error               { return m.remove() }
func (m *Msg) Nak() error                                { return nil }

func (m *Msg) NakWithDelay(d time.Duration) error {
	m.delay = d
	return nil
}

func (m *Msg) InProgress() error {
	if m.progress == nil {
		return nil // no consumer waits on it
	}
	return m.progress()
}

func (m *Msg) remove() error {
	m.settled = true
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := m.stream.DeleteMsg(ctx, m.raw.Sequence)
	if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		m.removeErr = fmt.Errorf("remove request %d from its stream: %w", m.raw.Sequence, err)
	}
	return m.removeErr
}
