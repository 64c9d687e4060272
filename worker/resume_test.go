package worker_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/provider/ollamatest"
	"github.com/sys1hq/sys1/worker"
	"github.com/sys1hq/sys1/worker/client"
	"github.com/sys1hq/sys1/worker/rungate"
)

// blockReview makes SYS1_REVIEW refuse every publish (nothing answers its subjects) until
// unblock, as a review stream without a leader would.
func (h *harness) blockReview() (unblock func()) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := h.js.Stream(ctx, h.topo.ReviewStream)
	if err != nil {
		h.t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	blocked := cfg
	blocked.Subjects = []string{"sys1.review-blocked.>"}
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

// TestAnAnswerKeptBeforeItsReviewFinishesTheRun (found by the soak): a delivery that dies
// between queueing a run's review and storing its outcome must not leave a review item, and a
// held reply, for an answer the run never gives. The answer is kept in the gate before the
// review is queued, and the next delivery finishes the run with it: the model is not asked
// again — here it would fail — the run is held on its one review item, and the reviewer's
// label releases the first answer.
func TestAnAnswerKeptBeforeItsReviewFinishesTheRun(t *testing.T) {
	h := newHarness(t)
	a := h.start(subjectAuth(t), withPolicy(t, holdLabelPolicy), func(o *replicaOpts) {
		o.cfg.ID, o.cfg.StoreRetry, o.cfg.ShutdownGrace = "a", time.Minute, 100*time.Millisecond
	})
	unblock := h.blockReview()
	durable := "sys1.replies.svc-a.kept-1"
	if _, err := h.cl.Publish(context.Background(), client.Request{Caller: "svc-a", Body: []byte(ticket), RunID: "kept-1", ReplyTo: durable}); err != nil {
		t.Fatal(err)
	}
	kv, err := h.js.KeyValue(context.Background(), h.topo.RunsBucket)
	if err != nil {
		t.Fatal(err)
	}
	var kept *rungate.Answer
	waitFor(t, "the answer kept in the gate while its review cannot be queued", 15*time.Second, func() bool {
		e, err := kv.Get(context.Background(), worker.GateKey("kept-1"))
		if err != nil {
			return false
		}
		var st rungate.State
		if json.Unmarshal(e.Value(), &st) != nil || st.Answer == nil {
			return false
		}
		kept = st.Answer
		return true
	})
	if err := a.stop(t); err != nil { // the delivery dies with the answer in hand, its review not queued
		t.Fatal(err)
	}
	unblock()
	h.fake.FailAlways(ollamatest.Fault{Status: 500}) // asked again, the model would fail the run
	calls := h.fake.Calls()
	h.start(subjectAuth(t), withPolicy(t, holdLabelPolicy), func(o *replicaOpts) { o.cfg.ID = "b" })

	// The review item is queued before the run's outcome is stored, so wait for both.
	var entry []byte
	waitFor(t, "the run held on its review item", 20*time.Second, func() bool {
		if len(h.reviewItems()) != 1 {
			return false
		}
		e, err := kv.Get(context.Background(), worker.GateKey("kept-1"))
		if err != nil {
			return false
		}
		entry = e.Value()
		var st rungate.State
		return json.Unmarshal(entry, &st) == nil && st.Status == rungate.StatusDone
	})
	if n := h.fake.Calls(); n != calls {
		t.Fatalf("the model was asked %d more times for a run whose answer was kept", n-calls)
	}
	var st rungate.State
	if err := json.Unmarshal(entry, &st); err != nil || len(st.Held) != 1 || st.Answer != nil {
		t.Fatalf("gate entry %s", entry)
	}
	if got := h.durableReplies(durable); len(got) != 0 {
		t.Fatalf("a held run was answered before its label: %s", got[0].Data)
	}
	h.publishReviewLabel(reviewLabel("svc-a", "kept-1", "label", `"bug"`, "alice"))
	waitFor(t, "the released reply", 10*time.Second, func() bool { return len(h.durableReplies(durable)) == 1 })
	m := h.durableReplies(durable)[0]
	var rep struct {
		Status contract.Status `json:"status"`
		Result struct {
			Answers map[string]json.RawMessage `json:"answers"`
		} `json:"result"`
	}
	if err := json.Unmarshal(m.Data, &rep); err != nil || rep.Status != contract.StatusSuccess || len(rep.Result.Answers) == 0 {
		t.Fatalf("released reply %s", m.Data)
	}
	var first struct {
		Answers map[string]json.RawMessage `json:"answers"`
	}
	if err := json.Unmarshal(kept.Response, &first); err != nil {
		t.Fatal(err)
	}
	for q, a := range first.Answers {
		if string(rep.Result.Answers[q]) != string(a) {
			t.Errorf("question %s answered %s, want the kept answer %s", q, rep.Result.Answers[q], a)
		}
	}
}
