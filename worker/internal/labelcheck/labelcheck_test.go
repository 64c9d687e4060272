package labelcheck

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/contract/wire"
	"github.com/sys1hq/sys1/worker/auth"
	"github.com/sys1hq/sys1/worker/internal/outbox"
	"github.com/sys1hq/sys1/worker/rungate"
	"github.com/sys1hq/sys1/worker/rungate/rungatetest"
)

// bus records what the checker stores and sends.
type bus struct {
	stored  []*nats.Msg
	replies []*nats.Msg
	fail    error // every stream write fails with it, when set
}

func (b *bus) PublishMsg(_ context.Context, m *nats.Msg, _ ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	if b.fail != nil {
		return nil, b.fail
	}
	b.stored = append(b.stored, m)
	return &jetstream.PubAck{}, nil
}

type inbox struct{ b *bus }

func (i inbox) PublishMsg(m *nats.Msg) error { i.b.replies = append(i.b.replies, m); return nil }

// submission is one delivery of a label on the submissions consumer (only what the checker
// uses is implemented).
type submission struct {
	jetstream.Msg
	subject string
	header  nats.Header
	data    []byte
	n       uint64
	ended   string
}

func (s *submission) Subject() string      { return s.subject }
func (s *submission) Headers() nats.Header { return s.header }
func (s *submission) Data() []byte         { return s.data }
func (s *submission) Metadata() (*jetstream.MsgMetadata, error) {
	return &jetstream.MsgMetadata{Sequence: jetstream.SequencePair{Stream: 7}, NumDelivered: s.n, Timestamp: time.Unix(1_700_000_000, 0)}, nil
}
func (s *submission) Ack() error                       { s.ended = "ack"; return nil }
func (s *submission) Term() error                      { s.ended = "term"; return nil }
func (s *submission) NakWithDelay(time.Duration) error { s.ended = "nak"; return nil }
func (s *submission) InProgress() error                { return nil }

// checker checks labels in auth mode subject; caller a has finished run r1 with a choice
// answer to "topic", and r2 is still running.
func checker(t *testing.T) (*Checker, *bus) {
	t.Helper()
	authn, err := auth.New(context.Background(), auth.Config{Mode: auth.ModeSubject}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	b := rungatetest.New()
	reply := `{"run_id":"r1","status":"success","result":{"model":"nimble","answers":{"topic":{"type":"choice","choice":"spam","confidence":0.9,"probabilities":{"spam":0.9,"ham":0.1}}}},"error":null,"attempts":[],"queued_ms":0,"latency_ms":1}`
	for id, st := range map[string]rungate.State{
		"r1": {Caller: "a", Status: rungate.StatusDone, Reply: json.RawMessage(reply)},
		"r2": {Caller: "a", Status: rungate.StatusRunning},
	} {
		value, _ := json.Marshal(st)
		if _, err := b.Create(context.Background(), rungate.Key(id), value); err != nil {
			t.Fatal(err)
		}
	}
	out := &bus{}
	return &Checker{Auth: authn, Gate: b.Gate(), Log: zerolog.Nop(), MaxDeliver: 3,
		Out:   &outbox.Config{Streams: out, Core: inbox{out}, StoreRetry: 0, AckWait: time.Second},
		Retry: func(int) time.Duration { return time.Second }, RunIDTTL: 24 * time.Hour,
		LabelsStream: "SYS1_LABELS", RejectedMaxAge: time.Hour}, out
}

func submit(caller, body string) *submission {
	return &submission{subject: wire.Label(caller), data: []byte(body), n: 1,
		header: nats.Header{wire.HeaderReplyTo: []string{"_INBOX." + caller + ".x"}}}
}

func TestALabelOfTheSendersFinishedRunIsAccepted(t *testing.T) {
	c, out := checker(t)
	s := submit("a", `{"run_id":"r1","question":"topic","label":"ham"}`)
	c.Check(context.Background(), s)
	if s.ended != "ack" || len(out.stored) != 1 || out.stored[0].Subject != wire.LabelAccepted("a") {
		t.Fatalf("ended %q, stored %d: want the label accepted on %s and the submission acked", s.ended, len(out.stored), wire.LabelAccepted("a"))
	}
	var l contract.Label
	if err := json.Unmarshal(out.stored[0].Data, &l); err != nil {
		t.Fatal(err)
	}
	if l.Caller != "a" || l.Source != contract.LabelSourceProducer || string(l.Value) != `"ham"` || l.Reviewer != "a" {
		t.Fatalf("accepted label %+v", l)
	}
	if len(out.replies) != 1 || out.replies[0].Header.Get(wire.HeaderStatus) != contract.LabelAccepted {
		t.Fatalf("replies %v: want the sender told accepted", out.replies)
	}
}

func TestRejectionsSayWhyAndTellNothingOfOthersRuns(t *testing.T) {
	for _, tc := range []struct{ name, caller, body, want string }{
		{"another caller's run reads as none", "b", `{"run_id":"r1","question":"topic","label":"ham"}`, `no run "r1" of yours`},
		{"unknown run", "a", `{"run_id":"r9","question":"topic","label":"ham"}`, `no run "r9" of yours`},
		{"not finished", "a", `{"run_id":"r2","question":"topic","label":"ham"}`, "has not finished yet"},
		{"no such question", "a", `{"run_id":"r1","question":"tone","label":"ham"}`, `no question "tone" (its questions: topic)`},
		{"not an option", "a", `{"run_id":"r1","question":"topic","label":"eggs"}`, "label"},
		{"review source", "a", `{"run_id":"r1","question":"topic","label":"ham","source":"review"}`, "from the review page only"},
		{"not JSON", "a", `{"run_id":`, "label"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, out := checker(t)
			s := submit(tc.caller, tc.body)
			c.Check(context.Background(), s)
			if s.ended != "ack" || len(out.stored) != 1 || out.stored[0].Subject != wire.LabelRejected(tc.caller) {
				t.Fatalf("ended %q, stored %d: want the rejection stored on %s and the submission acked", s.ended, len(out.stored), wire.LabelRejected(tc.caller))
			}
			if len(out.replies) != 1 || out.replies[0].Header.Get(wire.HeaderErrorCode) != string(contract.CodeInvalidInput) {
				t.Fatalf("replies %v: want one saying %s", out.replies, contract.CodeInvalidInput)
			}
			var reply contract.LabelReply
			if err := json.Unmarshal(out.replies[0].Data, &reply); err != nil || reply.Error == nil || !strings.Contains(reply.Error.Message, tc.want) {
				t.Fatalf("reply %s (%v): want its error saying %q", out.replies[0].Data, err, tc.want)
			}
		})
	}
}

func TestNATSTroubleRedeliversUntilTheLastDelivery(t *testing.T) {
	c, out := checker(t)
	out.fail = nats.ErrTimeout
	s := submit("a", `{"run_id":"r1","question":"topic","label":"ham"}`)
	c.Check(context.Background(), s)
	if s.ended != "nak" {
		t.Fatalf("a label whose outcome could not be stored ended %q, want nak (redelivered)", s.ended)
	}
	s.n = 3 // the consumer's last delivery: nothing is left to retry
	c.Check(context.Background(), s)
	if s.ended != "term" {
		t.Fatalf("on its last delivery it ended %q, want term", s.ended)
	}
}
