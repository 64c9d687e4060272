package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/provider"
	"github.com/sys1hq/sys1/worker"
	"github.com/sys1hq/sys1/worker/client"
)

// tinyPNG is a valid 2×2 PNG: with an image, the contract accepts requests up to 32 MiB.
const tinyPNG = "iVBORw0KGgoAAAANSUhEUgAAAAIAAAACCAIAAAD91JpzAAAAEElEQVR4nGP4z8AARAwQCgAf7gP9i18U1AAAAABJRU5ErkJggg=="

// bigRequest is a valid request with an image, about stateBytes of state and a choice whose
// options have keys of keyBytes each.
func bigRequest(t *testing.T, stateBytes, options, keyBytes int, tag string) []byte {
	t.Helper()
	criteria := map[string]string{}
	for i := range options {
		k := fmt.Sprintf("%c%s", 'a'+i, strings.Repeat("k", keyBytes-1))
		criteria[k] = "option " + k[:1]
	}
	body := map[string]any{
		"state": tag + strings.Repeat("s", stateBytes),
		"questions": map[string]any{
			"q": map[string]any{"type": "choice", "instructions": "pick", "criteria": criteria},
		},
		"images": []string{tinyPNG},
	}
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestOutcomesTooLargeToStoreNeverWedgeTheFleet: requests the contract accepts but whose
// records could never be stored are answered SYS1_REQUEST_TOO_LARGE at once, without calling
// the model, and terminated — six of them cannot fill SYS1_MAX_ACK_PENDING=6 and starve a
// normal request behind them.
func TestOutcomesTooLargeToStoreNeverWedgeTheFleet(t *testing.T) {
	h := newHarnessWith(t, func(o *server.Options) { o.MaxPayload = 1 << 20 })
	h.topo.MaxMsgSize = 1 << 20
	h.topo.MaxAckPending = 6
	h.start(func(o *replicaOpts) { o.cfg.Concurrency, o.cfg.FetchBatch = 3, 3 })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var subs []*nats.Subscription
	for i := range 6 {
		// About 950 KiB of state and 26 options of 2 KiB keys: the message fits in 1 MiB, its
		// record (the request once and the keys twice more in the answer) does not.
		body := bigRequest(t, 950<<10, 26, 2<<10, fmt.Sprint(i))
		if len(body) >= 1<<20 {
			t.Fatalf("test request of %d bytes does not fit the stream", len(body))
		}
		inbox := "_INBOX.svc-a." + nats.NewInbox()[7:]
		sub, err := h.nc.SubscribeSync(inbox)
		if err != nil {
			t.Fatal(err)
		}
		subs = append(subs, sub)
		if _, err := h.cl.Publish(ctx, client.Request{Caller: "svc-a", Body: body, ReplyTo: inbox, RunID: fmt.Sprintf("huge-%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	if rep := h.decide("svc-a", []byte(ticket)); rep.Status != contract.StatusSuccess {
		t.Fatalf("the normal request: %s", rep.Raw)
	}
	for i, sub := range subs {
		m, err := sub.NextMsg(20 * time.Second)
		if err != nil {
			t.Fatalf("huge-%d: no reply: %v", i, err)
		}
		rep, _ := client.ParseReply(m)
		if rep.Status != contract.StatusFailed || rep.Error.Code != contract.CodeRequestTooLarge || !strings.Contains(rep.Error.Message, "model was not called") {
			t.Errorf("huge-%d: %.400s", i, rep.Raw)
		}
		if len(m.Data) > 4<<10 {
			t.Errorf("huge-%d: a %d-byte reply", i, len(m.Data))
		}
	}
	if calls := h.fake.Calls(); calls != 1 {
		t.Errorf("provider calls = %d, want 1 (the normal request only)", calls)
	}
	waitFor(t, "seven records", 10*time.Second, func() bool { return len(h.records()) == 7 })
	for _, rec := range h.records() {
		if rec.ErrorCode == contract.CodeRequestTooLarge && rec.Request != nil {
			t.Errorf("%s: the refusal's record keeps the request it could not store", rec.RunID)
		}
	}
	waitFor(t, "every request settled", 10*time.Second, func() bool { return h.pending() == 0 })
}

// inflating answers like its provider, with every answer padded past what NATS can store.
type inflating struct {
	provider.Provider
	pad int
}

func (p inflating) Evaluate(ctx context.Context, req *contract.Request) (*contract.Response, error) {
	resp, err := p.Provider.Evaluate(ctx, req)
	if err != nil {
		return nil, err
	}
	for i, a := range resp.Answers {
		raw := strings.TrimSuffix(string(a.Raw), "}") + `,"pad":"` + strings.Repeat("p", p.pad) + `"}`
		resp.Answers[i].Raw = json.RawMessage(raw)
	}
	return resp, nil
}

// TestAnswerTooLargeToStoreIsAnsweredNotRetried: an answer that outgrows every estimate
// (upstream padding it) is answered SYS1_REQUEST_TOO_LARGE with a bounded record and
// terminated; the model is called once, not on every delivery.
func TestAnswerTooLargeToStoreIsAnsweredNotRetried(t *testing.T) {
	h := newHarnessWith(t, func(o *server.Options) { o.MaxPayload = 1 << 20 })
	h.topo.MaxMsgSize = 1 << 20
	h.start(func(o *replicaOpts) { o.provider = inflating{Provider: h.ollama(5 * time.Second), pad: 1 << 20} })
	rep := h.decide("svc-a", []byte(ticket), func(r *client.Request) { r.RunID = "padded-1" })
	if rep.Status != contract.StatusFailed || rep.Error.Code != contract.CodeRequestTooLarge || !strings.Contains(rep.Error.Message, "could not be kept") {
		t.Fatalf("reply %.500s", rep.Raw)
	}
	if calls := h.fake.Calls(); calls != 1 {
		t.Errorf("provider calls = %d, want 1", calls)
	}
	rec := h.recordByRun("padded-1")
	if rec.Request != nil || rec.Result != nil || len(rec.Attempts) != 1 || rec.Attempts[0].Outcome != contract.OutcomeOK {
		t.Errorf("record: request %v result %v attempts %+v", rec.Request != nil, rec.Result != nil, rec.Attempts)
	}
	waitFor(t, "the request settled", 10*time.Second, func() bool { return h.pending() == 0 })
}

// TestReplaysDoNotAppendTheRecordAgain: a finished run asked again (a new message with the
// same run id, after the dedupe window) is answered from its stored outcome; SYS1_RUNS keeps
// one record, not one per replay.
func TestReplaysDoNotAppendTheRecordAgain(t *testing.T) {
	h := newHarness(t)
	h.start()
	first := h.decide("svc-a", []byte(ticket), func(r *client.Request) { r.RunID = "asked-thrice" })
	if first.Status != contract.StatusSuccess {
		t.Fatalf("first: %s", first.Raw)
	}
	for i := range 3 {
		again := h.decide("svc-a", []byte(ticket), func(r *client.Request) { r.RunID, r.MsgID = "asked-thrice", fmt.Sprint("again-", i) })
		if string(again.Raw) != string(first.Raw) {
			t.Fatalf("replay %d differs:\n%s\n%s", i, again.Raw, first.Raw)
		}
	}
	if n := len(h.rawRecords()); n != 1 {
		t.Errorf("SYS1_RUNS holds %d records for one run, want 1", n)
	}
	if calls := h.fake.Calls(); calls != 1 {
		t.Errorf("provider calls = %d", calls)
	}
}

// blockRuns makes SYS1_RUNS unreachable for new records (nothing answers a publish on
// sys1.runs.>, as while a stream elects a leader) until the returned function lets it take
// them again: a stand-in for NATS trouble while a run stores its outcome. (A full stream is
// another matter, with no in-place retries: see bounds_test.go.)
func (h *harness) blockRuns() (unblock func()) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := h.js.Stream(ctx, h.topo.RunsStream)
	if err != nil {
		h.t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	blocked := cfg
	blocked.Subjects = []string{"sys1.runs-blocked.>"}
	if _, err := h.js.UpdateStream(ctx, blocked); err != nil {
		h.t.Fatal(err)
	}
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := h.js.UpdateStream(ctx, cfg); err != nil {
			h.t.Fatal(err)
		}
	}
}

// TestAnswerSurvivesAStoreHiccupWithoutScoringAgain: when storing the outcome fails for a
// moment, the worker retries in place (keeping the delivery alive) and the run is scored
// once, finished in its first delivery.
func TestAnswerSurvivesAStoreHiccupWithoutScoringAgain(t *testing.T) {
	h := newHarness(t)
	h.topo.AckWait = time.Second
	h.start(func(o *replicaOpts) { o.cfg.StoreRetry = time.Minute })
	if rep := h.decide("svc-a", []byte(ticket)); rep.Status != contract.StatusSuccess {
		t.Fatalf("warm-up: %s", rep.Raw)
	}
	unblock := h.blockRuns()
	inbox := "_INBOX.svc-a." + nats.NewInbox()[7:]
	sub, _ := h.nc.SubscribeSync(inbox)
	if _, err := h.cl.Publish(context.Background(), client.Request{Caller: "svc-a", Body: []byte(ticket), RunID: "hiccup-1", ReplyTo: inbox}); err != nil {
		t.Fatal(err)
	}
	// Held past AckWait: only the in-place retries' heartbeats keep JetStream from
	// redelivering it meanwhile.
	waitFor(t, "a store retried in place", 10*time.Second, func() bool {
		return strings.Count(h.logs.String(), "could not publish the record; retrying in place") >= 3
	})
	time.Sleep(1500 * time.Millisecond) // longer than AckWait: the behaviour under test
	unblock()
	m, err := sub.NextMsg(20 * time.Second)
	if err != nil {
		t.Fatalf("no reply: %v", err)
	}
	if rep, _ := client.ParseReply(m); rep.Status != contract.StatusSuccess {
		t.Fatalf("reply %s", rep.Raw)
	}
	if calls := h.fake.Calls(); calls != 2 {
		t.Errorf("provider calls = %d, want 2 (the warm-up and this run once)", calls)
	}
	if rec := h.recordByRun("hiccup-1"); rec.Deliveries != 1 || len(rec.Attempts) != 1 {
		t.Errorf("record: %d deliveries, %d attempts; want one of each", rec.Deliveries, len(rec.Attempts))
	}
}

// TestRedeliveredFinishedRunWritesItsRecord: a delivery that stored its outcome but could not
// write the record (NATS trouble outlasting the in-place retries) is nak'ed; its redelivery
// answers from the stored outcome and writes the record from its own request — the gate does
// not hold the request, yet the record is whole, and the model was called once.
func TestRedeliveredFinishedRunWritesItsRecord(t *testing.T) {
	h := newHarness(t)
	r := h.start(func(o *replicaOpts) { o.cfg.StoreRetry = 100 * time.Millisecond })
	if rep := h.decide("svc-a", []byte(ticket)); rep.Status != contract.StatusSuccess {
		t.Fatalf("warm-up: %s", rep.Raw)
	}
	unblock := h.blockRuns()
	inbox := "_INBOX.svc-a." + nats.NewInbox()[7:]
	sub, _ := h.nc.SubscribeSync(inbox)
	if _, err := h.cl.Publish(context.Background(), client.Request{Caller: "svc-a", Body: []byte(ticket), RunID: "rebuilt-1", ReplyTo: inbox}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a redelivery answering from the stored outcome", 10*time.Second, func() bool { return r.w.Stats().Replayed >= 1 })
	kv, err := h.js.KeyValue(context.Background(), h.topo.RunsBucket)
	if err != nil {
		t.Fatal(err)
	}
	entry, err := kv.Get(context.Background(), worker.GateKey("rebuilt-1"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(entry.Value()), "request") || strings.Contains(string(entry.Value()), "ticket") {
		t.Errorf("the gate entry holds the request: %s", entry.Value())
	}
	unblock()
	m, err := sub.NextMsg(20 * time.Second)
	if err != nil {
		t.Fatalf("no reply: %v", err)
	}
	rep, _ := client.ParseReply(m)
	if rep.Status != contract.StatusSuccess {
		t.Fatalf("reply %s", rep.Raw)
	}
	rec := h.recordByRun("rebuilt-1")
	if rec.Request == nil || len(rec.Request.Questions) != 3 || rec.Result == nil || len(rec.Attempts) != 1 || rec.Deliveries != 1 || rec.Caller != "svc-a" || rec.Model != "nimble" {
		t.Errorf("rebuilt record: request %v, result %v, %d attempts, %d deliveries, caller %q, model %q", rec.Request != nil, rec.Result != nil, len(rec.Attempts), rec.Deliveries, rec.Caller, rec.Model)
	}
	if calls := h.fake.Calls(); calls != 2 {
		t.Errorf("provider calls = %d, want 2", calls)
	}
}

// TestRequestOutOfDeliveriesIsAnsweredFromItsDeadLetter: no message is redelivered without
// bound. A run whose every delivery fails to finish (here: the record cannot be written, for
// longer than the in-place retries last) is no longer delivered once SYS1_CONSUMER_MAX_DELIVER
// is spent; JetStream's advisory, kept in SYS1_DEAD_LETTERS, leads a worker to answer it once
// NATS lets it — from its stored outcome, the model called once — then remove it.
func TestRequestOutOfDeliveriesIsAnsweredFromItsDeadLetter(t *testing.T) {
	h := newHarness(t)
	h.topo.ConsumerMaxDeliver = 3
	h.start(func(o *replicaOpts) { o.cfg.MaxDeliver, o.cfg.StoreRetry = 2, 50*time.Millisecond })
	if rep := h.decide("svc-a", []byte(ticket)); rep.Status != contract.StatusSuccess {
		t.Fatalf("warm-up: %s", rep.Raw)
	}
	unblock := h.blockRuns()
	inbox := "_INBOX.svc-a." + nats.NewInbox()[7:]
	sub, _ := h.nc.SubscribeSync(inbox)
	if _, err := h.cl.Publish(context.Background(), client.Request{Caller: "svc-a", Body: []byte(ticket), RunID: "dead-1", ReplyTo: inbox}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the request dead-lettered", 15*time.Second, func() bool {
		return strings.Contains(h.logs.String(), "a request ran out of deliveries")
	})
	if _, err := sub.NextMsg(100 * time.Millisecond); err == nil {
		t.Fatal("answered while its record could not be written")
	}
	unblock()
	m, err := sub.NextMsg(20 * time.Second)
	if err != nil {
		t.Fatalf("no reply: %v", err)
	}
	if rep, _ := client.ParseReply(m); rep.Status != contract.StatusSuccess {
		t.Fatalf("reply %s", rep.Raw)
	}
	if rec := h.recordByRun("dead-1"); rec.Status != contract.StatusSuccess || rec.Request == nil || rec.Deliveries != 1 {
		t.Errorf("record: %s, request %v, finished in delivery %d", rec.Status, rec.Request != nil, rec.Deliveries)
	}
	waitFor(t, "the request removed from the stream", 10*time.Second, func() bool { return h.pending() == 0 })
	if calls := h.fake.Calls(); calls != 2 {
		t.Errorf("provider calls = %d, want 2 (the warm-up, and this run once)", calls)
	}
}

// TestDuplicateGivesUpWaitingWithinItsDeliveries: a message whose run id another message is
// still running waits for it, but not past its own deliveries: it is answered and terminated,
// and the owner's run is untouched.
func TestDuplicateGivesUpWaitingWithinItsDeliveries(t *testing.T) {
	t.Parallel() // waits out failovers and retries, not the CPU: runs beside the others
	h := newHarness(t)
	h.topo.ConsumerMaxDeliver = 4
	stuck := &blocking{Provider: h.ollama(time.Second), release: make(chan struct{})}
	t.Cleanup(func() { close(stuck.release) })
	h.start(func(o *replicaOpts) { o.provider = stuck })
	ctx := context.Background()
	if _, err := h.cl.Publish(ctx, client.Request{Caller: "svc-a", Body: []byte(ticket), RunID: "owned-1"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the owner in flight", 10*time.Second, func() bool { return stuck.started.Load() == 1 })
	inbox := "_INBOX.svc-a." + nats.NewInbox()[7:]
	sub, _ := h.nc.SubscribeSync(inbox)
	if _, err := h.cl.Publish(ctx, client.Request{Caller: "svc-a", Body: []byte(ticket), RunID: "owned-1", MsgID: "dup", ReplyTo: inbox}); err != nil {
		t.Fatal(err)
	}
	m, err := sub.NextMsg(20 * time.Second)
	if err != nil {
		t.Fatalf("the duplicate was never answered: %v", err)
	}
	rep, _ := client.ParseReply(m)
	if rep.Status != contract.StatusFailed || rep.Error.Code != contract.CodeRunIDConflict || !strings.Contains(rep.Error.Message, "gave up waiting after 4 deliveries") {
		t.Fatalf("reply %s", rep.Raw)
	}
	if stuck.started.Load() != 1 {
		t.Errorf("the duplicate ran the provider")
	}
}

// TestLargestRecordedRequestAtDefaults: at the default limits (8 MiB messages and payload), a
// request the stream accepts — here 8 MiB less 48 KiB, almost all of it state, with an image
// — is answered and recorded in full (README, Operating it: the largest fully recorded
// request); one whose record could not fit is refused before the model is called.
func TestLargestRecordedRequestAtDefaults(t *testing.T) {
	t.Parallel()       // waits out failovers and retries, not the CPU: runs beside the others
	h := newHarness(t) // the harness's server and topology use sys1's 8 MiB defaults
	h.start()
	fits := bigRequest(t, 8<<20-48<<10, 3, 8, "fits")
	if len(fits) > 8<<20 {
		t.Fatalf("test body %d bytes", len(fits))
	}
	rep := h.decide("svc-a", fits, func(r *client.Request) { r.RunID = "largest-1" })
	if rep.Status != contract.StatusSuccess {
		t.Fatalf("reply %.300s", rep.Raw)
	}
	if rec := h.recordByRun("largest-1"); rec.Request == nil || len(rec.Request.State) < 8<<20-64<<10 {
		t.Fatalf("the record does not hold the whole request")
	}
	calls := h.fake.Calls()
	// Long option keys repeat in the answer: the record would outgrow the payload.
	tooBig := bigRequest(t, 8<<20-200<<10, 26, 4<<10, "too big")
	rep = h.decide("svc-a", tooBig)
	if rep.Status != contract.StatusFailed || rep.Error.Code != contract.CodeRequestTooLarge || h.fake.Calls() != calls {
		t.Fatalf("reply %.300s (calls %d → %d)", rep.Raw, calls, h.fake.Calls())
	}
}
