package worker_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/contract/wire"
	"github.com/sys1hq/sys1/worker"
	"github.com/sys1hq/sys1/worker/client"
	"github.com/sys1hq/sys1/worker/policy"
)

// withPolicy is a replica option loading the policy YAML.
func withPolicy(t *testing.T, yaml string) func(*replicaOpts) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	h, err := policy.Load(path)
	if err != nil {
		t.Fatalf("policy: %v", err)
	}
	return func(o *replicaOpts) { o.abstention = h }
}

// reviewItems reads every item on SYS1_REVIEW (each message holds a run's items).
func (h *harness) reviewItems() []*contract.ReviewItem {
	h.t.Helper()
	var out []*contract.ReviewItem
	for _, m := range h.streamMsgs(h.topo.ReviewStream) {
		rr, legacy, err := contract.DecodeReviewMessage(m.Data)
		if err != nil || legacy {
			h.t.Fatalf("review message on %s (legacy %v): %v\n%s", m.Subject, legacy, err, m.Data)
		}
		for _, it := range rr.Expand() {
			out = append(out, &it)
		}
	}
	return out
}

// The ticket example's label question is always below a confidence of 0.99, and always at or
// above 0: the two rules below make its verdict certain whatever the fake answers.
const strictLabelPolicy = `
rules:
  - name: routing
    question: label
    min_confidence: 0.99
    review: notify
  - name: lax
    min_confidence: 0
    noul_abstain_between: [0.0, 0.0]
`

// TestPolicyAbstainsAndQueuesReview: an answer below its rule's threshold is abstained (the
// answer itself untouched), the run is still a success, the reply says review pending and
// its item is on SYS1_REVIEW with what a reviewer needs; confident answers are decided and
// queue nothing.
func TestPolicyAbstainsAndQueuesReview(t *testing.T) {
	h := newHarness(t)
	h.start(withPolicy(t, strictLabelPolicy))
	rep := h.decide("svc-a", []byte(ticket), func(r *client.Request) { r.RunID = "unsure-1" })
	if rep.Status != contract.StatusSuccess || len(rep.Verdicts) != 3 {
		t.Fatalf("reply %s", rep.Raw)
	}
	label, _ := rep.Verdicts.Get("label")
	urgent, _ := rep.Verdicts.Get("urgent")
	if label.Status != contract.VerdictAbstained || label.Rule != "routing" || !strings.Contains(label.Reason, "< 0.99") {
		t.Errorf("label verdict %+v", label)
	}
	if urgent.Status != contract.VerdictDecided || urgent.Rule != "lax" {
		t.Errorf("urgent verdict %+v", urgent)
	}
	itemID := contract.ReviewItemID("unsure-1", "label")
	if rep.Review == nil || rep.Review.Status != contract.ReviewPending || rep.Review.Item != itemID || rep.Header.Get(wire.HeaderReview) != "pending" {
		t.Errorf("review %+v, header %q", rep.Review, rep.Header.Get(wire.HeaderReview))
	}
	if !strings.Contains(string(rep.Raw), `"answers":{"label":{"type":"choice"`) {
		t.Errorf("answers are not verbatim: %s", rep.Raw)
	}
	items := h.reviewItems()
	if len(items) != 1 {
		t.Fatalf("%d review items, want 1", len(items))
	}
	it := items[0]
	if it.ID != itemID || it.RunID != "unsure-1" || it.Question != "label" || it.Type != contract.TypeChoice || it.Mode != contract.ReviewNotify ||
		len(it.Options) != 3 || len(it.Probabilities) != 3 || it.Verdict.Status != contract.VerdictAbstained || !strings.Contains(string(it.State), "Checkout broken") {
		t.Errorf("review item %+v", it)
	}
	rec := h.recordByRun("unsure-1")
	if v, _ := rec.Verdicts.Get("label"); rec.Review == nil || v.Status != contract.VerdictAbstained {
		t.Errorf("record verdicts %+v review %+v", rec.Verdicts, rec.Review)
	}
}

// TestPolicyDecidedQueuesNothingAndNoPolicyChangesNothing: confident answers are decided and
// queue nothing; without a policy replies carry no verdicts and Sys1-Min-Confidence is ignored.
func TestPolicyDecidedQueuesNothingAndNoPolicyChangesNothing(t *testing.T) {
	h := newHarness(t)
	h.start(withPolicy(t, "rules:\n  - name: lax\n    min_confidence: 0\n    noul_abstain_between: [0.0, 0.0]\n"))
	rep := h.decide("svc-a", []byte(ticket))
	if rep.Review != nil || len(rep.Verdicts) != 3 || rep.Header.Get(wire.HeaderReview) != "" {
		t.Fatalf("reply %s", rep.Raw)
	}
	for _, v := range rep.Verdicts {
		if v.Status != contract.VerdictDecided {
			t.Errorf("%s: %+v", v.Question, v)
		}
	}
	if n := len(h.reviewItems()); n != 0 {
		t.Errorf("%d review items for decided answers", n)
	}

	bare := newHarness(t)
	bare.start()
	rep = bare.decide("svc-a", []byte(ticket), func(r *client.Request) { r.MinConfidence = 0.999 })
	if rep.Status != contract.StatusSuccess || rep.Verdicts != nil || strings.Contains(string(rep.Raw), "verdicts") {
		t.Errorf("without a policy: %s", rep.Raw)
	}
}

// TestMinConfidenceHeaderTightensOnly: Sys1-Min-Confidence raises a rule's threshold for one
// request, never lowers it, and a malformed value is refused before the model is called.
func TestMinConfidenceHeaderTightensOnly(t *testing.T) {
	h := newHarness(t)
	h.start(withPolicy(t, "rules:\n  - name: lax\n    min_confidence: 0\n    noul_abstain_between: [0.0, 0.0]\n  - name: strict\n    question: never\n    min_confidence: 0.99\n"))
	rep := h.decide("svc-a", []byte(ticket), func(r *client.Request) { r.MinConfidence = 0.999 })
	if v, _ := rep.Verdicts.Get("label"); v.Status != contract.VerdictAbstained {
		t.Errorf("tightened: %s", rep.Raw)
	}
	calls := h.fake.Calls()
	rep = h.decide("svc-a", []byte(ticket), func(r *client.Request) { r.Header = nats.Header{"Sys1-Min-Confidence": {"lots"}} })
	if rep.Status != contract.StatusFailed || rep.Error.Code != contract.CodeInvalidInput || !strings.Contains(rep.Error.Message, "Sys1-Min-Confidence") || h.fake.Calls() != calls {
		t.Errorf("malformed header: %s (calls %d → %d)", rep.Raw, calls, h.fake.Calls())
	}
}

// TestHoldWithholdsTheReply: review: hold is a blocking approval — the run is recorded, its
// item queued, and no reply goes out (not even to a replay) until a person labels it.
func TestHoldWithholdsTheReply(t *testing.T) {
	h := newHarness(t)
	h.start(withPolicy(t, strings.Replace(strictLabelPolicy, "review: notify", "review: hold", 1)))
	inbox := "_INBOX.svc-a." + nats.NewInbox()[7:]
	sub, _ := h.nc.SubscribeSync(inbox)
	if _, err := h.cl.Publish(context.Background(), client.Request{Caller: "svc-a", Body: []byte(ticket), RunID: "held-1", ReplyTo: inbox}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the record", 10*time.Second, func() bool { return len(h.records()) == 1 })
	if items := h.reviewItems(); len(items) != 1 || items[0].Mode != contract.ReviewHold {
		t.Fatalf("review items %+v", items)
	}
	// Asked again, it is still held.
	if _, err := h.cl.Publish(context.Background(), client.Request{Caller: "svc-a", Body: []byte(ticket), RunID: "held-1", MsgID: "again", ReplyTo: inbox}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "both requests settled", 10*time.Second, func() bool { return h.pending() == 0 })
	if m, err := sub.NextMsg(300 * time.Millisecond); err == nil {
		t.Fatalf("a held run was answered: %s", m.Data)
	}
}

// TestRecordStateIsAppliedWhereTheRecordIsMade: SYS1_RECORD_STATE=hash keeps state and
// instructions out of SYS1_RUNS (and the gate never holds them), not only out of ClickHouse.
func TestRecordStateIsAppliedWhereTheRecordIsMade(t *testing.T) {
	for _, mode := range []contract.RecordState{contract.RecordHash, contract.RecordNone} {
		t.Run(string(mode), func(t *testing.T) {
			h := newHarness(t)
			h.start(func(o *replicaOpts) { o.cfg.RecordState = mode })
			if rep := h.decide("svc-a", []byte(ticket), func(r *client.Request) { r.RunID = "private-1" }); rep.Status != contract.StatusSuccess {
				t.Fatalf("reply %s", rep.Raw)
			}
			raw := h.rawRecords()
			if len(raw) != 1 || strings.Contains(string(raw[0]), "Checkout broken") || strings.Contains(string(raw[0]), "Which team") ||
				!strings.Contains(string(raw[0]), `"record_state":"`+string(mode)+`"`) {
				t.Errorf("record %s", raw[0])
			}
			kv, err := h.js.KeyValue(context.Background(), h.topo.RunsBucket)
			if err != nil {
				t.Fatal(err)
			}
			entry, err := kv.Get(context.Background(), worker.GateKey("private-1"))
			if err != nil || strings.Contains(string(entry.Value()), "Checkout broken") {
				t.Errorf("gate entry: %v %s", err, entry.Value())
			}
		})
	}
}
