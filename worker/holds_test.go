package worker_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/contract/wire"
	"github.com/sys1hq/sys1/worker/client"
)

// holdLabelPolicy holds the ticket's label question for review whatever the fake answers (its
// confidence is always below 0.99) and decides the others.
var holdLabelPolicy = strings.Replace(strictLabelPolicy, "review: notify", "review: hold", 1)

// holdTwoPolicy holds the label and anger questions.
const holdTwoPolicy = `
rules:
  - name: routing
    question: label
    min_confidence: 0.99
    review: hold
  - name: temper
    question: anger
    min_confidence: 0.99
    review: hold
  - name: lax
    min_confidence: 0
    noul_abstain_between: [0.0, 0.0]
`

// reviewLabel is what the review page publishes once a reviewer won an item.
func reviewLabel(caller, runID, question, value, reviewer string) contract.Label {
	return contract.Label{RunID: runID, Question: question, Value: json.RawMessage(value), Reviewer: reviewer,
		LabelledAt: time.Now().UTC(), Source: contract.LabelSourceReview, Caller: caller, Item: contract.ReviewItemID(runID, question)}
}

// publishReviewLabel publishes l on sys1.labels.<caller>.accepted as the review page does.
func (h *harness) publishReviewLabel(l contract.Label) {
	h.t.Helper()
	b, _ := l.MarshalJSON()
	m := &nats.Msg{Subject: "sys1.labels." + l.Caller + ".accepted", Data: b, Header: nats.Header{}}
	m.Header.Set(jetstream.MsgIDHeader, "review:"+l.Item)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := h.js.PublishMsg(ctx, m); err != nil {
		h.t.Fatal(err)
	}
}

// durableReplies reads the durable replies under subject (SYS1_REPLIES).
func (h *harness) durableReplies(subject string) []*jetstream.RawStreamMsg {
	h.t.Helper()
	var out []*jetstream.RawStreamMsg
	for _, m := range h.streamMsgs(h.topo.RepliesStream) {
		if m.Subject == subject {
			out = append(out, m)
		}
	}
	return out
}

// TestHoldIsReleasedByTheReviewersLabel: a held run answers nothing — not to its request, not
// to a replay, not after a producer's own label — until a reviewer's label arrives; then
// exactly one reply goes to its durable reply subject, whose verdict for the question says
// reviewed with the label and the reviewer, and whose review says reviewed. Replays answer
// with that reply from then on.
func TestHoldIsReleasedByTheReviewersLabel(t *testing.T) {
	h := newHarness(t)
	h.start(subjectAuth(t), withPolicy(t, holdLabelPolicy))
	durable := "sys1.replies.svc-a.held-1"
	if _, err := h.cl.Publish(context.Background(), client.Request{Caller: "svc-a", Body: []byte(ticket), RunID: "held-1", ReplyTo: durable}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the record", 10*time.Second, func() bool { return len(h.records()) == 1 })
	items := h.reviewItems()
	if len(items) != 1 || items[0].Mode != contract.ReviewHold || items[0].Question != "label" {
		t.Fatalf("review items %+v", items)
	}

	// The producer's own label is stored, and releases nothing: a person must approve.
	in := h.labelInbox("svc-a")
	h.submitLabel("sys1.labels.svc-a", []byte(`{"run_id":"held-1","question":"label","label":"zeta"}`), replyTo(in.subject))
	if rep, _ := in.next(); rep.Status != contract.LabelAccepted {
		t.Fatalf("producer label: %+v", rep)
	}
	// A review label for a question that is not held, and one for another run: nothing either.
	h.publishReviewLabel(reviewLabel("svc-a", "held-1", "urgent", "true", "alice"))
	h.publishReviewLabel(reviewLabel("svc-a", "no-such-run", "label", `"bug"`, "alice"))
	waitFor(t, "the holds consumer to settle the labels", 10*time.Second, func() bool { return h.consumerIdle(h.topo.HoldsConsumer) })
	if got := h.durableReplies(durable); len(got) != 0 {
		t.Fatalf("a held run was answered before a reviewer labelled it: %s", got[0].Data)
	}

	h.publishReviewLabel(reviewLabel("svc-a", "held-1", "label", `"bug"`, "alice"))
	waitFor(t, "the released reply", 10*time.Second, func() bool { return len(h.durableReplies(durable)) == 1 })
	m := h.durableReplies(durable)[0]
	rep, err := client.ParseReply(&nats.Msg{Data: m.Data, Header: m.Header})
	if err != nil {
		t.Fatal(err)
	}
	v, _ := rep.Verdicts.Get("label")
	if v.Status != contract.VerdictReviewed || string(v.Label) != `"bug"` || v.Reviewer != "alice" || v.Rule != "routing" || !strings.Contains(v.Reason, "< 0.99") {
		t.Errorf("label verdict %+v", v)
	}
	if u, _ := rep.Verdicts.Get("urgent"); u.Status != contract.VerdictDecided {
		t.Errorf("urgent verdict %+v", u)
	}
	if rep.Status != contract.StatusSuccess || rep.Review == nil || rep.Review.Status != contract.ReviewReviewed || rep.Review.Item != items[0].ID {
		t.Errorf("reply %s", rep.Raw)
	}
	if rep.Header.Get(wire.HeaderRunID) != "held-1" || rep.Header.Get(wire.HeaderStatus) != "success" || rep.Header.Get(wire.HeaderReview) != "reviewed" {
		t.Errorf("reply headers %v", rep.Header)
	}
	if !strings.Contains(string(rep.Raw), `"answers":{"label":{"type":"choice"`) {
		t.Errorf("answers changed: %s", rep.Raw)
	}

	// The same label again (a relabel, a redelivery): the run is released already, nothing more.
	again := reviewLabel("svc-a", "held-1", "label", `"zeta"`, "bob")
	again.Item = "rv-again"
	h.publishReviewLabel(again)
	waitFor(t, "the holds consumer to settle the relabel", 10*time.Second, func() bool { return h.consumerIdle(h.topo.HoldsConsumer) })
	if n := len(h.durableReplies(durable)); n != 1 {
		t.Errorf("%d replies, want exactly 1", n)
	}
	// A replay of the run now answers with the reviewed reply.
	replay := h.decide("svc-a", []byte(ticket), func(r *client.Request) { r.RunID = "held-1"; r.MsgID = "replay" })
	if string(replay.Raw) != string(m.Data) {
		t.Errorf("replay answered\n%s\nwant\n%s", replay.Raw, m.Data)
	}
}

// consumerIdle reports whether a consumer of SYS1_LABELS has nothing pending or unacked.
func (h *harness) consumerIdle(name string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := h.js.Consumer(ctx, h.topo.LabelsStream, name)
	if err != nil {
		return false
	}
	info, err := c.Info(ctx)
	return err == nil && info.NumPending == 0 && info.NumAckPending == 0
}

// TestHoldOfTwoQuestionsWaitsForBoth: with two held questions the reply waits for both
// labels; the two labels of a run arriving at once on two replicas (compare-and-set conflicts
// on the run's entry) still release exactly one reply with both verdicts reviewed.
func TestHoldOfTwoQuestionsWaitsForBoth(t *testing.T) {
	h := newHarness(t)
	pol := withPolicy(t, holdTwoPolicy)
	h.start(subjectAuth(t), pol)
	h.start(subjectAuth(t), pol)
	in := h.labelInbox("svc-a")
	racing := []string{"race-1", "race-2", "race-3", "race-4"}
	for _, id := range append([]string{"two-1"}, racing...) {
		if _, err := h.cl.Publish(context.Background(), client.Request{Caller: "svc-a", Body: []byte(ticket), RunID: id, ReplyTo: in.subject}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "every record", 10*time.Second, func() bool { return len(h.records()) == 1+len(racing) })

	// two-1: one label ("none of these", which must survive the second), then the other.
	h.publishReviewLabel(reviewLabel("svc-a", "two-1", "label", "null", "bob"))
	waitFor(t, "the first label settled", 10*time.Second, func() bool { return h.consumerIdle(h.topo.HoldsConsumer) })
	in.none("a run with one of two held questions labelled")
	h.publishReviewLabel(reviewLabel("svc-a", "two-1", "anger", "2", "alice"))

	// The others: both labels at once, racing on two replicas.
	var wg sync.WaitGroup
	for _, id := range racing {
		wg.Go(func() { h.publishReviewLabel(reviewLabel("svc-a", id, "label", `"billing"`, "carla")) })
		wg.Go(func() { h.publishReviewLabel(reviewLabel("svc-a", id, "anger", "0", "dan")) })
	}
	wg.Wait()

	got := map[string]*client.Reply{}
	for range 1 + len(racing) {
		m, err := in.sub.NextMsg(10 * time.Second)
		if err != nil {
			t.Fatalf("released replies so far %v: %v", len(got), err)
		}
		rep, err := client.ParseReply(m)
		if err != nil {
			t.Fatal(err)
		}
		if got[rep.RunID] != nil {
			t.Fatalf("run %s answered twice", rep.RunID)
		}
		got[rep.RunID] = rep
	}
	waitFor(t, "every label settled", 10*time.Second, func() bool { return h.consumerIdle(h.topo.HoldsConsumer) })
	in.none("a released run, again")
	t.Logf("%d compare-and-set conflicts retried", strings.Count(h.logs.String(), "changed its entry first"))
	want := map[string][2]string{"two-1": {"null", "2"}}
	for _, id := range racing {
		want[id] = [2]string{`"billing"`, "0"}
	}
	for id, want := range want {
		rep := got[id]
		if rep == nil {
			t.Fatalf("no reply for %s", id)
		}
		l, _ := rep.Verdicts.Get("label")
		a, _ := rep.Verdicts.Get("anger")
		if want[0] == "null" && l.Label == nil && strings.Contains(string(rep.Raw), `"label":null,"reviewer":"bob"`) {
			l.Label = json.RawMessage("null") // none of these: Go reads a null label as none
		}
		if l.Status != contract.VerdictReviewed || a.Status != contract.VerdictReviewed || string(l.Label) != want[0] || string(a.Label) != want[1] ||
			rep.Review == nil || rep.Review.Status != contract.ReviewReviewed {
			t.Errorf("%s: %s", id, rep.Raw)
		}
		// The reply names both review items, the first as item too.
		items := []string{contract.ReviewItemID(id, "label"), contract.ReviewItemID(id, "anger")}
		if rep.Review == nil || rep.Review.Item != items[0] || strings.Join(rep.Review.Items, ",") != strings.Join(items, ",") {
			t.Errorf("%s: review %+v, want item %s and items %v", id, rep.Review, items[0], items)
		}
	}
}

// TestHoldLabelledWhileItsRunIsStillRunning: a label that arrives before its run's outcome
// (and hold) is stored — the review item goes out first, and a quick reviewer or a script can
// beat the store — waits for the run instead of being lost, and releases the reply once the
// run has finished.
func TestHoldLabelledWhileItsRunIsStillRunning(t *testing.T) {
	h := newHarness(t)
	h.start(subjectAuth(t), withPolicy(t, holdLabelPolicy))
	h.fake.SetLatency(300 * time.Millisecond)
	in := h.labelInbox("svc-a")
	if _, err := h.cl.Publish(context.Background(), client.Request{Caller: "svc-a", Body: []byte(ticket), RunID: "early-1", ReplyTo: in.subject}); err != nil {
		t.Fatal(err)
	}
	h.awaitInFlight(1) // the run has claimed its id and is calling the model
	h.publishReviewLabel(reviewLabel("svc-a", "early-1", "label", `"zeta"`, "alice"))
	m, err := in.sub.NextMsg(10 * time.Second)
	if err != nil {
		t.Fatalf("the early label did not release the run: %v", err)
	}
	rep, err := client.ParseReply(m)
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := rep.Verdicts.Get("label"); v.Status != contract.VerdictReviewed || string(v.Label) != `"zeta"` {
		t.Errorf("reply %s", rep.Raw)
	}
	if !strings.Contains(h.logs.String(), "the labelled run is still finishing") {
		t.Error("the label did not arrive while the run was running; the test proves nothing")
	}
}
