package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/contract/wire"
	"github.com/sys1hq/sys1/worker/client"
	"github.com/sys1hq/sys1/worker/rungate"
)

// publishBatch publishes n batch items of batch id on sys1.batch.svc-a.<id>, each with its
// own state so the fake's recorded calls tell them apart.
func (h *harness) publishBatch(id string, n int, replyTo string) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for i := range n {
		m := nats.NewMsg("sys1.batch.svc-a." + id)
		m.Data = []byte(fmt.Sprintf(`{"state":"batch item %d","questions":{"q":{"type":"noul","instructions":"x"}}}`, i))
		runID := fmt.Sprintf("%s:%d", id, i)
		m.Header.Set("Sys1-Run-Id", runID)
		m.Header.Set("Nats-Msg-Id", runID)
		if replyTo != "" {
			m.Header.Set("Sys1-Reply-To", replyTo)
		}
		if _, err := h.js.PublishMsgAsync(m); err != nil {
			h.t.Fatal(err)
		}
	}
	select {
	case <-h.js.PublishAsyncComplete():
	case <-ctx.Done():
		h.t.Fatal("batch publish did not complete")
	}
}

// TestBatchItemsAreRecordedAsSuch: a batch item runs like any request, and its record names
// its batch and item; a batch message whose run id is not <batch id>:<item id> is refused.
func TestBatchItemsAreRecordedAsSuch(t *testing.T) {
	h := newHarness(t)
	h.start()
	inbox := "_INBOX.svc-a." + nats.NewInbox()[7:]
	sub, _ := h.nc.SubscribeSync(inbox)
	h.publishBatch("b1", 3, inbox)
	m := nats.NewMsg("sys1.batch.svc-a.b1")
	m.Data = []byte(ticket)
	m.Header.Set("Sys1-Run-Id", "not-of-the-batch")
	m.Header.Set("Sys1-Reply-To", inbox)
	if _, err := h.js.PublishMsg(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	got := map[string]*client.Reply{}
	for len(got) < 4 {
		msg, err := sub.NextMsg(10 * time.Second)
		if err != nil {
			t.Fatalf("%d replies: %v", len(got), err)
		}
		rep, _ := client.ParseReply(msg)
		got[rep.RunID] = rep
	}
	for i := range 3 {
		id := fmt.Sprint("b1:", i)
		if rep := got[id]; rep == nil || rep.Status != contract.StatusSuccess {
			t.Errorf("%s: %+v", id, rep)
		}
		if rec := h.recordByRun(id); rec.BatchID != "b1" || rec.ItemID != fmt.Sprint(i) {
			t.Errorf("%s recorded as batch %q item %q", id, rec.BatchID, rec.ItemID)
		}
	}
	if rep := got["not-of-the-batch"]; rep == nil || rep.Error == nil || rep.Error.Code != contract.CodeInvalidInput || !strings.Contains(rep.Error.Message, "b1:") {
		t.Errorf("a batch message with a foreign run id: %+v", rep)
	}
}

// TestInteractiveRequestJumpsTheBatchBacklog: with 2,000 batch items queued, an interactive
// request is started before any batch item pulled after it arrived: the slot that frees next
// is its. Only the batch items already in hand (at most two per unit of concurrency) run
// before it.
func TestInteractiveRequestJumpsTheBatchBacklog(t *testing.T) {
	h := newHarness(t)
	// Each call takes long enough that publishing the interactive request (a round trip that
	// can take tens of milliseconds on a loaded machine under -race) lets no extra batch call
	// start: the position measured is the worker's doing, not the publisher's.
	h.fake.SetLatency(40 * time.Millisecond)
	const concurrency = 2
	h.start(func(o *replicaOpts) { o.cfg.Concurrency, o.cfg.FetchBatch = concurrency, concurrency })
	h.publishBatch("backlog", 2000, "")
	waitFor(t, "the batch draining", 20*time.Second, func() bool { return h.fake.Calls() >= 20 })
	before := len(h.fake.SystemOneRequests())
	rep := h.decide("svc-a", []byte(`{"state":"the interactive one","questions":{"q":{"type":"noul","instructions":"x"}}}`))
	if rep.Status != contract.StatusSuccess {
		t.Fatalf("interactive: %s", rep.Raw)
	}
	calls := h.fake.SystemOneRequests()
	pos := -1
	for i, c := range calls {
		if strings.Contains(string(c.Body), "the interactive one") {
			pos = i
		}
	}
	// Calls recorded by the time we published, plus what was in hand: at most 2 per slot.
	if pos < 0 || pos > before+2*concurrency {
		t.Fatalf("the interactive request was call %d; %d calls had been made when it was published (at most %d more may run first)", pos, before, 2*concurrency)
	}
	if h.pending() == 0 {
		t.Fatal("the backlog drained before the check: it proves nothing")
	}
}

// TestBatchShareCapsBatchSlots: SYS1_BATCH_MAX_SHARE keeps slots free for interactive
// requests even when only batch work is waiting.
func TestBatchShareCapsBatchSlots(t *testing.T) {
	h := newHarness(t)
	h.fake.SetLatency(20 * time.Millisecond)
	h.start(func(o *replicaOpts) { o.cfg.Concurrency, o.cfg.FetchBatch, o.cfg.BatchMaxShare = 4, 4, 0.25 })
	h.publishBatch("shared", 60, "")
	waitFor(t, "the batch drained", 30*time.Second, func() bool { return h.fake.Calls() >= 60 })
	// 8 message slots × 0.25: at most 2 batch messages in hand, so at most 2 calls at once.
	if peak := h.fake.MaxConcurrent(); peak > 2 {
		t.Errorf("%d batch calls ran at once under SYS1_BATCH_MAX_SHARE=0.25 of 8 slots (want at most 2)", peak)
	}
}

// TestBatchManifestIsKeptForItsCaller: a batch's manifest (sys1 batch run's count of its
// input's items and invalid lines) is stored in the gate's bucket for batch status; it is not
// a run (no record, no reply); another caller cannot overwrite it, and a malformed one is
// dropped.
func TestBatchManifestIsKeptForItsCaller(t *testing.T) {
	h := newHarness(t)
	h.start(subjectAuth(t))
	ctx := context.Background()
	publish := func(subject, body string) {
		t.Helper()
		m := nats.NewMsg(subject)
		m.Data = []byte(body)
		m.Header.Set(wire.HeaderBatchManifest, "1")
		if _, err := h.js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	kv, err := h.js.KeyValue(ctx, h.topo.RunsBucket)
	if err != nil {
		t.Fatal(err)
	}
	stored := func() (rungate.Manifest, bool) {
		e, err := kv.Get(ctx, rungate.ManifestKey("b-1"))
		if err != nil {
			return rungate.Manifest{}, false
		}
		var m rungate.Manifest
		return m, json.Unmarshal(e.Value(), &m) == nil
	}
	publish("sys1.decide.svc-a", `{"batch_id":"b-1","items":50,"invalid":3}`)
	waitFor(t, "the manifest stored", 10*time.Second, func() bool { _, ok := stored(); return ok })
	if m, _ := stored(); m.Caller != "svc-a" || m.Items != 50 || m.Invalid != 3 {
		t.Fatalf("stored manifest %+v", m)
	}
	publish("sys1.decide.svc-b", `{"batch_id":"b-1","items":9,"invalid":9}`)              // another caller's
	publish("sys1.decide.svc-a", `{"batch_id":"b-1","items":5,"invalid":7}`)              // inconsistent
	publish("sys1.decide.svc-a", `{"batch_id":"b.1","items":5,"invalid":1}`)              // not a batch id
	publish("sys1.decide.svc-a", `{"batch_id":"b-1","items":5,"invalid":1,"extra":true}`) // not a manifest
	waitFor(t, "every manifest settled", 10*time.Second, func() bool {
		return h.pending() == 0 && strings.Count(h.logs.String(), "; dropped") >= 4
	})
	if m, _ := stored(); m.Caller != "svc-a" || m.Items != 50 || m.Invalid != 3 {
		t.Fatalf("the manifest was overwritten: %+v\n%s", m, h.logs.String())
	}
	if n := len(h.rawRecords()); n != 0 {
		t.Errorf("manifests made %d run records", n)
	}
}
