package worker_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/provider/ollamatest"
	"github.com/sys1hq/sys1/worker/client"
)

// flood publishes n requests of caller with replies on inbox, without waiting for answers.
func (h *harness) flood(caller, inbox string, n int) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for i := range n {
		req := client.Request{Caller: caller, Body: []byte(ticket), RunID: fmt.Sprintf("%s-%04d", caller, i), ReplyTo: inbox}
		if _, err := h.cl.Publish(ctx, req); err != nil {
			h.t.Fatalf("flood %s: %v", caller, err)
		}
	}
}

// TestAFloodingCallerDoesNotDelayAnother (issue 21, the interactive lane): with 4 slots and a
// 50 ms model, caller a publishes 400 requests; caller b's 10, sent one after another while
// a's flood is being served, are each answered within a second, and a's flood is still
// answered in full. In arrival order b would wait behind the whole flood (about 5 s).
func TestAFloodingCallerDoesNotDelayAnother(t *testing.T) {
	h := newHarness(t, ollamatest.WithLatency(50*time.Millisecond))
	h.start(subjectAuth(t))
	inbox := "_INBOX.a." + nats.NewInbox()[len("_INBOX."):]
	answered := make(chan struct{}, 1000)
	sub, err := h.nc.Subscribe(inbox, func(*nats.Msg) { answered <- struct{}{} })
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	const flood = 400
	h.flood("a", inbox, flood)
	for range 8 { // the flood is being served
		<-answered
	}
	for i := range 10 {
		start := time.Now()
		rep := h.decide("b", []byte(ticket), func(r *client.Request) { r.RunID = fmt.Sprint("b-", i) })
		if took := time.Since(start); rep.Status != contract.StatusSuccess || took > time.Second {
			t.Fatalf("b's request %d: %s after %s during a's flood, want success within 1s", i, rep.Status, took)
		}
	}
	deadline := time.After(60 * time.Second)
	for n := 8; n < flood; n++ {
		select {
		case <-answered:
		case <-deadline:
			t.Fatalf("a's flood: %d of %d answered", n, flood)
		}
	}
}

// TestALabelFloodDoesNotDelayAnotherSendersLabel (issue 21, the label lane): one sender's
// 2,000 labels for runs that do not exist are checked and rejected; another sender's valid
// label, sent behind them, is answered within a second and before most of the flood (in
// arrival order, after all of it).
func TestALabelFloodDoesNotDelayAnotherSendersLabel(t *testing.T) {
	h := newHarness(t)
	h.start(subjectAuth(t))
	h.runTicket("svc-b", "b-run")
	spamInbox := "_INBOX.svc-a." + nats.NewInbox()[len("_INBOX."):]
	var spamAnswered atomic.Int64
	first := make(chan struct{})
	sub, err := h.nc.Subscribe(spamInbox, func(*nats.Msg) {
		if spamAnswered.Add(1) == 1 {
			close(first)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	const flood = 2000
	for i := range flood {
		m := &nats.Msg{Subject: "sys1.labels.svc-a", Header: replyTo(spamInbox),
			Data: fmt.Appendf(nil, `{"run_id":"no-such-run-%d","question":"label","label":"billing"}`, i)}
		if _, err := h.js.PublishMsgAsync(m); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-h.js.PublishAsyncComplete():
	case <-time.After(30 * time.Second):
		t.Fatal("the flood was not acknowledged")
	}
	<-first // the flood is being checked
	in := h.labelInbox("svc-b")
	start := time.Now()
	h.submitLabel("sys1.labels.svc-b", []byte(`{"run_id":"b-run","question":"label","label":"billing"}`), replyTo(in.subject))
	rep, _ := in.next()
	took, before := time.Since(start), spamAnswered.Load()
	if rep.Status != contract.LabelAccepted || took > time.Second || before > flood/2 {
		t.Fatalf("svc-b's label: %s after %s, with %d of svc-a's %d answered before it; want accepted within 1s, ahead of most of the flood", rep.Status, took, before, flood)
	}
}

// TestBatchesOfTwoCallersShareTheBatchLane (issue 21, the batch lane): caller b's batch of 20,
// sent after caller a's batch of 300, finishes long before a's does.
func TestBatchesOfTwoCallersShareTheBatchLane(t *testing.T) {
	t.Parallel() // waits out failovers and retries, not the CPU: runs beside the others
	h := newHarness(t, ollamatest.WithLatency(20*time.Millisecond))
	h.start(subjectAuth(t))
	var mu sync.Mutex
	done := map[string]int{}
	aAtB := -1 // a's answers when b's batch was done
	inbox := func(caller string) string {
		s := "_INBOX." + caller + "." + nats.NewInbox()[len("_INBOX."):]
		if _, err := h.nc.Subscribe(s, func(*nats.Msg) {
			mu.Lock()
			defer mu.Unlock()
			done[caller]++
			if caller == "b" && done[caller] == 20 {
				aAtB = done["a"]
			}
		}); err != nil {
			t.Fatal(err)
		}
		return s
	}
	ia, ib := inbox("a"), inbox("b")
	publish := func(caller, batch, reply string, n int) {
		for i := range n {
			m := &nats.Msg{Subject: fmt.Sprintf("sys1.batch.%s.%s", caller, batch), Data: []byte(ticket), Header: nats.Header{}}
			m.Header.Set("Sys1-Run-Id", fmt.Sprintf("%s:%d", batch, i))
			m.Header.Set("Sys1-Reply-To", reply)
			if _, err := h.js.PublishMsgAsync(m, jetstream.WithMsgID(m.Header.Get("Sys1-Run-Id"))); err != nil {
				t.Fatal(err)
			}
		}
		<-h.js.PublishAsyncComplete()
	}
	publish("a", "big", ia, 300)
	publish("b", "small", ib, 20)
	waitFor(t, "both batches answered", 60*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return done["a"] == 300 && done["b"] == 20
	})
	mu.Lock()
	defer mu.Unlock()
	// Taking turns, b's 20 are done after about as many of a's (plus what a ran before b's
	// arrived); in arrival order all 300 of a's would come first.
	if aAtB > 150 {
		t.Fatalf("when b's batch of 20 was done, %d of a's 300 were: b waited behind a", aAtB)
	}
}
