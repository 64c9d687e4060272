package worker

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/contract/wire"
	"github.com/sys1hq/sys1/provider"
	"github.com/sys1hq/sys1/provider/chain"
	"github.com/sys1hq/sys1/provider/simulator"
	"github.com/sys1hq/sys1/worker/auth"
	"github.com/sys1hq/sys1/worker/calibration"
	"github.com/sys1hq/sys1/worker/internal/outbox"
	"github.com/sys1hq/sys1/worker/metrics"
	"github.com/sys1hq/sys1/worker/rungate/rungatetest"
	"github.com/sys1hq/sys1/worker/topology"
)

// The run's stages against fakes: an in-memory gate bucket, a recording publisher and
// request stream, a scripted provider. No NATS server: what these tests pin is the
// pipeline's order and its decisions (what is stored before what is sent, what is called,
// how the delivery ends). What crosses processes — redelivery, leader elections, replicas —
// is the end-to-end tests' (worker_test.go, cluster_test.go, killnode_test.go).

// events is what the fakes saw, in order.
type events struct {
	mu  sync.Mutex
	log []string
}

func (e *events) add(format string, args ...any) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.log = append(e.log, fmt.Sprintf(format, args...))
}

func (e *events) list() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.log...)
}

// state is runID's stored gate entry.
func (tp *testPipeline) state(t *testing.T, runID string) runState {
	t.Helper()
	st, ok, err := tp.bucket.State(runID)
	if err != nil || !ok {
		t.Fatalf("gate entry for %s: found %v, %v", runID, ok, err)
	}
	return st
}

// published is a message a fake publisher took.
type published struct {
	subject string
	header  nats.Header
	data    []byte
}

// recorder is both publishers: streams (awaiting an ack) and plain NATS.
type recorder struct {
	ev *events
	mu sync.Mutex
	// refuse, when set, is the error a stream publish to the subject gets.
	refuse func(subject string) error
	msgs   []published
}

func (p *recorder) PublishMsg(_ context.Context, m *nats.Msg, _ ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.refuse != nil {
		if err := p.refuse(m.Subject); err != nil {
			p.ev.add("refused %s", m.Subject)
			return nil, err
		}
	}
	p.msgs = append(p.msgs, published{subject: m.Subject, header: m.Header, data: m.Data})
	p.ev.add("store %s", m.Subject)
	return &jetstream.PubAck{}, nil
}

// core is the plain-NATS side of the recorder.
type core struct{ *recorder }

func (c core) PublishMsg(m *nats.Msg) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.msgs = append(c.msgs, published{subject: m.Subject, header: m.Header, data: m.Data})
	c.ev.add("send %s", m.Subject)
	return nil
}

func (core) MaxPayload() int64 { return 1 << 20 }

// on are the messages published on subject.
func (p *recorder) on(subject string) []published {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []published
	for _, m := range p.msgs {
		if m.subject == subject {
			out = append(out, m)
		}
	}
	return out
}

// noMessages is a request stream whose messages have all gone.
type noMessages struct{}

func (noMessages) GetMsg(context.Context, uint64, ...jetstream.GetMsgOpt) (*jetstream.RawStreamMsg, error) {
	return nil, jetstream.ErrMsgNotFound
}

// scripted is a provider that answers as the simulator does, or fails while fail says so.
type scripted struct {
	*simulator.Simulator
	calls atomic.Int64
	fail  func(call int64) error
}

func (s *scripted) Evaluate(ctx context.Context, req *contract.Request) (*contract.Response, error) {
	n := s.calls.Add(1)
	if s.fail != nil {
		if err := s.fail(n); err != nil {
			return nil, err
		}
	}
	return s.Simulator.Evaluate(ctx, req)
}

// fakeMsg is one delivery of a request message.
type fakeMsg struct {
	ev      *events
	subject string
	header  nats.Header
	data    []byte
	meta    jetstream.MsgMetadata
}

func (m *fakeMsg) Metadata() (*jetstream.MsgMetadata, error) { return &m.meta, nil }
func (m *fakeMsg) Data() []byte                              { return m.data }
func (m *fakeMsg) Headers() nats.Header                      { return m.header }
func (m *fakeMsg) Subject() string                           { return m.subject }
func (m *fakeMsg) Reply() string                             { return "" }
func (m *fakeMsg) Ack() error                                { m.ev.add("ack"); return nil }
func (m *fakeMsg) DoubleAck(context.Context) error           { m.ev.add("ack"); return nil }
func (m *fakeMsg) Nak() error                                { m.ev.add("nak"); return nil }
func (m *fakeMsg) NakWithDelay(time.Duration) error          { m.ev.add("nak"); return nil }
func (m *fakeMsg) InProgress() error                         { return nil }
func (m *fakeMsg) Term() error                               { m.ev.add("term"); return nil }
func (m *fakeMsg) TermWithReason(string) error               { m.ev.add("term"); return nil }

// testPipeline is a pipeline over fakes, in auth mode subject.
type testPipeline struct {
	*pipeline
	ev     *events
	bucket *rungatetest.Bucket
	out    *recorder
	model  *scripted
}

func newTestPipeline(t *testing.T) *testPipeline {
	t.Helper()
	ev := &events{}
	tp := &testPipeline{ev: ev, bucket: rungatetest.New(),
		out: &recorder{ev: ev}, model: &scripted{Simulator: simulator.New(0)}}
	tp.bucket.OnWrite = func(op, key, status string) {
		if op == "update" {
			ev.add("gate update %s %s", key, status)
		} else {
			ev.add("gate create %s", key)
		}
	}
	cfg := DefaultConfig()
	cfg.ID = "w1"
	cfg = cfg.withDefaults()
	lim, err := cfg.newLimiter()
	if err != nil {
		t.Fatal(err)
	}
	ch, err := chain.New(chain.Config{Logger: zerolog.Nop()}, chain.Link{Name: "fake", Provider: tp.model, Limiter: lim})
	if err != nil {
		t.Fatal(err)
	}
	authn, err := auth.New(context.Background(), auth.Config{Mode: auth.ModeSubject}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	zero := func() float64 { return 0 }
	m, err := metrics.NewWorker(metrics.WorkerOptions{Replica: "w1",
		InFlight: zero, ProviderPeak: zero, Redeliveries: zero, Replays: zero, DeadLetters: zero, Orphans: zero, Paused: zero,
		Providers: func() []metrics.ProviderState { return nil }, Fits: func() []metrics.FitReading { return nil },
		Streams: func() []metrics.StreamState { return nil }, QuotaAtLimit: func() map[string]int { return nil },
		Queues: func() []metrics.QueueState { return nil }}, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	var fits atomic.Pointer[calibration.Store]
	room, topo := &storage{log: zerolog.Nop()}, topology.Default()
	tp.pipeline = &pipeline{
		cfg: cfg, topo: topo, version: "test", log: zerolog.Nop(),
		auth: authn, models: contract.Policy{DefaultModel: "nimble"}, fits: &fits,
		gate: tp.bucket.Gate(), requests: noMessages{}, epoch: func() string { return "e1" },
		chain: ch, room: room, maxPayload: core{tp.out}.MaxPayload,
		out: &outbox.Config{Streams: tp.out, Core: core{tp.out}, Room: room, StoreRetry: cfg.StoreRetry,
			AckWait: topo.AckWait, RunsStream: topo.RunsStream, RepliesStream: topo.RepliesStream},
		stats: &stats{}, metrics: m, tracer: noop.NewTracerProvider().Tracer("test"),
		background: &sync.WaitGroup{}, repair: func(error) {},
	}
	return tp
}

const pipelineRequest = `{"model":"nimble","state":{"subject":"Checkout broken"},"questions":{"urgent":{"type":"noul","instructions":"Is it urgent?"}}}`

// deliver hands the pipeline delivery n of the message at stream sequence seq, from caller
// on sys1.decide.<caller>, with headers h (name, value pairs), and returns what the fakes
// saw during it.
func (tp *testPipeline) deliver(t *testing.T, caller string, seq, n uint64, h ...string) []string {
	t.Helper()
	hdr := nats.Header{}
	for i := 0; i+1 < len(h); i += 2 {
		hdr.Set(h[i], h[i+1])
	}
	before := len(tp.ev.list())
	tp.handle(context.Background(), &fakeMsg{ev: tp.ev, subject: wire.Decide(caller), header: hdr, data: []byte(pipelineRequest),
		meta: jetstream.MsgMetadata{Sequence: jetstream.SequencePair{Stream: seq}, NumDelivered: n, Timestamp: time.Now(),
			Stream: "SYS1_REQUESTS", Consumer: "sys1-worker"}})
	tp.background.Wait()
	return tp.ev.list()[before:]
}

func equalEvents(t *testing.T, what string, got, want []string) {
	t.Helper()
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("%s:\n got  %q\n want %q", what, got, want)
	}
}

// reply decodes the one reply published on subject.
func (tp *testPipeline) reply(t *testing.T, subject string) contract.Reply {
	t.Helper()
	msgs := tp.out.on(subject)
	if len(msgs) == 0 {
		t.Fatalf("no reply on %s", subject)
	}
	var r contract.Reply
	if err := json.Unmarshal(msgs[len(msgs)-1].data, &r); err != nil {
		t.Fatal(err)
	}
	return r
}

// TestPipelineStoresTheOutcomeBeforeItAnswers pins a run's order: the run id is claimed, the
// model called once, the outcome stored in the gate, then the record and the reply are
// published, then the delivery is acknowledged; a delivery that died anywhere after the
// store is answered again from the stored outcome, never scored again.
func TestPipelineStoresTheOutcomeBeforeItAnswers(t *testing.T) {
	tp := newTestPipeline(t)
	got := tp.deliver(t, "acme", 7, 1, wire.HeaderRunID, "order-1", wire.HeaderReplyTo, "sys1.replies.acme")
	key := GateKey("order-1")
	equalEvents(t, "first delivery", got, []string{
		"gate create " + key, "gate update " + key + " done",
		"store sys1.runs.success", "store sys1.replies.acme", "ack"})
	if n := tp.model.calls.Load(); n != 1 {
		t.Fatalf("model called %d times, want 1", n)
	}
	r := tp.reply(t, "sys1.replies.acme")
	if r.Status != contract.StatusSuccess || r.RunID != "order-1" || len(r.Attempts) != 1 {
		t.Fatalf("reply: %+v", r)
	}

	// The same message again (its ack was lost): answered from the gate, record and reply
	// written again under the same ids (JetStream de-duplicates them), the model not called.
	got = tp.deliver(t, "acme", 7, 2, wire.HeaderRunID, "order-1", wire.HeaderReplyTo, "sys1.replies.acme")
	equalEvents(t, "redelivery", got, []string{"store sys1.runs.success", "store sys1.replies.acme", "ack"})
	if n := tp.model.calls.Load(); n != 1 {
		t.Fatalf("model called %d times after a redelivery, want 1", n)
	}
	if again := tp.reply(t, "sys1.replies.acme"); again.RunID != r.RunID || len(again.Attempts) != len(r.Attempts) {
		t.Fatalf("replayed reply differs: %+v, first %+v", again, r)
	}
}

// TestPipelineNaksATransientFailureAndKeepsItsAttempts: a provider that is down gives a
// transient error with deliveries left: nothing is answered, the delivery is handed back, and
// its attempt is kept in the gate with the lease released, so the next delivery (on any
// replica) takes the run at once and its record shows both attempts.
func TestPipelineNaksATransientFailureAndKeepsItsAttempts(t *testing.T) {
	tp := newTestPipeline(t)
	tp.model.fail = func(call int64) error {
		if call == 1 {
			return contract.Errorf(contract.CodeProviderUnavailable, "connection refused")
		}
		return nil
	}
	got := tp.deliver(t, "acme", 3, 1, wire.HeaderRunID, "r-3", wire.HeaderReplyTo, "sys1.replies.acme")
	key := GateKey("r-3")
	equalEvents(t, "failed delivery", got, []string{"gate create " + key, "gate update " + key + " running", "nak"})
	st := tp.state(t, "r-3")
	if st.Owner != "" || len(st.Attempts) != 1 || st.Attempts[0].ErrorCode != contract.CodeProviderUnavailable {
		t.Fatalf("gate after the failed delivery: owner %q, attempts %+v", st.Owner, st.Attempts)
	}

	got = tp.deliver(t, "acme", 3, 2, wire.HeaderRunID, "r-3", wire.HeaderReplyTo, "sys1.replies.acme")
	equalEvents(t, "second delivery", got, []string{
		"gate update " + key + " running", "gate update " + key + " done",
		"store sys1.runs.success", "store sys1.replies.acme", "ack"})
	r := tp.reply(t, "sys1.replies.acme")
	if r.Status != contract.StatusSuccess || len(r.Attempts) != 2 || r.Attempts[0].ErrorCode != contract.CodeProviderUnavailable {
		t.Fatalf("reply after the retry: status %s, attempts %+v", r.Status, r.Attempts)
	}
}

// TestPipelineRefusesAnotherCallersRunID: a run id belongs to the caller that first used it.
// Another caller's request with the same id is answered SYS1_RUN_ID_CONFLICT without calling
// the model, and recorded under its derived id, so it can never overwrite the owner's record.
func TestPipelineRefusesAnotherCallersRunID(t *testing.T) {
	tp := newTestPipeline(t)
	tp.deliver(t, "acme", 1, 1, wire.HeaderRunID, "shared-id", wire.HeaderReplyTo, "sys1.replies.acme")
	owner := tp.state(t, "shared-id")

	got := tp.deliver(t, "mallory", 2, 1, wire.HeaderRunID, "shared-id", wire.HeaderReplyTo, "sys1.replies.mallory")
	equalEvents(t, "conflicting delivery", got, []string{"store sys1.runs.failed", "store sys1.replies.mallory", "term"})
	if n := tp.model.calls.Load(); n != 1 {
		t.Fatalf("model called %d times, want 1 (the owner's run only)", n)
	}
	r := tp.reply(t, "sys1.replies.mallory")
	if r.Error == nil || r.Error.Code != contract.CodeRunIDConflict {
		t.Fatalf("reply: %+v", r)
	}
	rec := tp.out.on("sys1.runs.failed")[0]
	if id := rec.header.Get(wire.HeaderRunID); id == "shared-id" || id != derivedRunID("SYS1_REQUESTS", 2, "e1") {
		t.Fatalf("the refusal was recorded under %q, want the derived id", id)
	}
	if after := tp.state(t, "shared-id"); after.Caller != owner.Caller || after.StreamSeq != owner.StreamSeq || after.Status != runDone {
		t.Fatalf("the owner's gate entry changed: %+v", after)
	}
}

// TestPipelineNeverAnswersIntoAnotherCallersSubject: a reply subject in another caller's
// namespace is refused (SYS1_FORBIDDEN): recorded under the derived id, answered nowhere,
// the model not called.
func TestPipelineNeverAnswersIntoAnotherCallersSubject(t *testing.T) {
	tp := newTestPipeline(t)
	got := tp.deliver(t, "mallory", 4, 1, wire.HeaderRunID, "x", wire.HeaderReplyTo, "sys1.replies.acme")
	equalEvents(t, "spoofed reply subject", got, []string{"store sys1.runs.failed", "term"})
	rec := tp.out.on("sys1.runs.failed")[0]
	var record struct {
		ErrorCode contract.Code `json:"error_code"`
		ReplyTo   string        `json:"reply_to"`
	}
	if err := json.Unmarshal(rec.data, &record); err != nil || record.ErrorCode != contract.CodeForbidden || record.ReplyTo != "" {
		t.Fatalf("record: %s (%v)", rec.data, err)
	}
	if tp.model.calls.Load() != 0 {
		t.Fatal("the model was called for a refused request")
	}
}

// TestPipelineDoesNotCallThePastDeadline: a request whose deadline has passed is answered
// SYS1_EXPIRED before the model is called.
func TestPipelineDoesNotCallThePastDeadline(t *testing.T) {
	tp := newTestPipeline(t)
	past := time.Now().Add(-time.Second).UTC().Format(time.RFC3339Nano)
	tp.deliver(t, "acme", 5, 1, wire.HeaderRunID, "late", wire.HeaderReplyTo, "sys1.replies.acme", wire.HeaderDeadline, past)
	if r := tp.reply(t, "sys1.replies.acme"); r.Error == nil || r.Error.Code != contract.CodeExpired {
		t.Fatalf("reply: %+v", r)
	}
	if tp.model.calls.Load() != 0 {
		t.Fatal("the model was called past the deadline")
	}
}

// TestPipelineAnswersWhileTheRunsStreamIsFull: SYS1_RUNS refusing for room is an operating
// state. The outcome is stored, the caller answered, and the delivery handed back (not
// acknowledged) until the record can be written; once there is room, the redelivery writes it
// from the stored outcome — the model is not called again.
func TestPipelineAnswersWhileTheRunsStreamIsFull(t *testing.T) {
	tp := newTestPipeline(t)
	full := &jetstream.APIError{Code: 503, ErrorCode: 10077, Description: "maximum bytes exceeded"}
	tp.out.refuse = func(subject string) error {
		if strings.HasPrefix(subject, "sys1.runs.") {
			return full
		}
		return nil
	}
	got := tp.deliver(t, "acme", 9, 1, wire.HeaderRunID, "r-9", wire.HeaderReplyTo, "sys1.replies.acme")
	key := GateKey("r-9")
	equalEvents(t, "with SYS1_RUNS full", got, []string{
		"gate create " + key, "gate update " + key + " done",
		"refused sys1.runs.success", "store sys1.replies.acme", "nak"})
	if !tp.room.isFull(tp.topo.RunsStream) {
		t.Fatal("the refusal did not mark SYS1_RUNS full")
	}

	tp.out.refuse = nil
	got = tp.deliver(t, "acme", 9, 2, wire.HeaderRunID, "r-9", wire.HeaderReplyTo, "sys1.replies.acme")
	equalEvents(t, "with room again", got, []string{"store sys1.runs.success", "store sys1.replies.acme", "ack"})
	if n := tp.model.calls.Load(); n != 1 {
		t.Fatalf("model called %d times, want 1", n)
	}
	if tp.room.isFull(tp.topo.RunsStream) {
		t.Fatal("SYS1_RUNS still marked full after a record was stored")
	}
}

// TestPipelineGivesUpAfterMaxDeliver: with the model failing on every delivery, the last
// delivery SYS1_MAX_DELIVER allows answers the run with its last error and terminates it.
func TestPipelineGivesUpAfterMaxDeliver(t *testing.T) {
	tp := newTestPipeline(t)
	tp.model.fail = func(int64) error { return contract.Errorf(contract.CodeProviderBusy, "busy") }
	var last []string
	for n := uint64(1); n <= uint64(tp.cfg.MaxDeliver); n++ {
		last = tp.deliver(t, "acme", 11, n, wire.HeaderRunID, "r-11", wire.HeaderReplyTo, "sys1.replies.acme")
		if n < uint64(tp.cfg.MaxDeliver) && last[len(last)-1] != "nak" {
			t.Fatalf("delivery %d ended %q, want nak", n, last[len(last)-1])
		}
	}
	if end := last[len(last)-1]; end != "term" && end != "ack" {
		t.Fatalf("the last delivery ended %q, want it answered", end)
	}
	r := tp.reply(t, "sys1.replies.acme")
	if r.Error == nil || r.Error.Code != contract.CodeProviderBusy || len(r.Attempts) != tp.cfg.MaxDeliver {
		t.Fatalf("reply: error %+v, %d attempts (want %d)", r.Error, len(r.Attempts), tp.cfg.MaxDeliver)
	}
	if n := tp.model.calls.Load(); n != int64(tp.cfg.MaxDeliver) {
		t.Fatalf("model called %d times, want %d", n, tp.cfg.MaxDeliver)
	}
}

var _ provider.Provider = (*scripted)(nil)
