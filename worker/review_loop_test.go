package worker_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/contract/wire"
	"github.com/sys1hq/sys1/sink/chtest"
	"github.com/sys1hq/sys1/worker/client"
)

// acceptancePolicy: caller unsure's routing answers are below their threshold and go to
// review at once (notify); caller held's wait for a person (hold); everything else is decided.
const acceptancePolicy = `
rules:
  - name: routing-hold
    caller: held
    question: label
    min_confidence: 0.99
    review: hold
  - name: routing
    caller: unsure
    question: label
    min_confidence: 0.99
    review: notify
  - name: lax
    min_confidence: 0
    noul_abstain_between: [0.0, 0.0]
`

// TestReviewAcceptanceEndToEnd is issue 12's acceptance against a real nats-server, the fake
// Ollama and ClickHouse (chshim): an answer below its threshold is abstained, its item is on
// SYS1_REVIEW and the reply says pending; a confident one is decided and queues nothing; a
// held run answers nothing until a reviewer's label, then once with the question reviewed.
// ClickHouse has each verdict per answer, the label, and labelled_answers joining the two.
func TestReviewAcceptanceEndToEnd(t *testing.T) {
	t.Parallel() // waits out failovers and retries, not the CPU: runs beside the others
	h := newHarness(t)
	db := h.labelSink()
	if db == nil {
		t.Skipf("needs ClickHouse (%s)", chtest.DSNVar)
	}
	h.start(subjectAuth(t), withPolicy(t, acceptancePolicy))

	unsure := h.decide("unsure", []byte(ticket), func(r *client.Request) { r.RunID = "acc-unsure" })
	if v, _ := unsure.Verdicts.Get("label"); v.Status != contract.VerdictAbstained || v.Rule != "routing" || unsure.Review == nil ||
		unsure.Review.Status != contract.ReviewPending || unsure.Header.Get(wire.HeaderReview) != "pending" {
		t.Fatalf("low confidence: %s", unsure.Raw)
	}
	sure := h.decide("sure", []byte(ticket), func(r *client.Request) { r.RunID = "acc-sure" })
	for _, v := range sure.Verdicts {
		if v.Status != contract.VerdictDecided {
			t.Errorf("confident %s: %+v", v.Question, v)
		}
	}
	if sure.Review != nil || sure.Header.Get(wire.HeaderReview) != "" || len(sure.Verdicts) != 3 {
		t.Errorf("confident: %s", sure.Raw)
	}

	in := h.labelInbox("held")
	if _, err := h.cl.Publish(context.Background(), client.Request{Caller: "held", Body: []byte(ticket), RunID: "acc-held", ReplyTo: in.subject}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the held run's record", 10*time.Second, func() bool { return len(h.records()) == 3 })
	var runs []string
	for _, it := range h.reviewItems() {
		runs = append(runs, it.RunID+"/"+it.Question+"/"+it.Mode)
	}
	if strings.Join(runs, " ") != "acc-unsure/label/notify acc-held/label/hold" {
		t.Fatalf("review items %v", runs)
	}
	in.none("the held run before its label")
	h.publishReviewLabel(reviewLabel("held", "acc-held", "label", `"bug"`, "alice"))
	m, err := in.sub.NextMsg(10 * time.Second)
	if err != nil {
		t.Fatalf("no reply after the label: %v", err)
	}
	held, err := client.ParseReply(m)
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := held.Verdicts.Get("label"); v.Status != contract.VerdictReviewed || string(v.Label) != `"bug"` || v.Reviewer != "alice" {
		t.Errorf("released: %s", held.Raw)
	}
	in.none("the held run, a second time")

	verdictOf := func(runID string) string {
		t.Helper()
		var v, rule string
		q := "SELECT answers.verdict, answers.rule FROM `" + db.Name + "`.runs FINAL ARRAY JOIN answers WHERE run_id = ? AND answers.name = 'label'"
		if err := db.Conn.QueryRow(context.Background(), q, runID).Scan(&v, &rule); err != nil {
			t.Fatalf("%s: %v", runID, err)
		}
		return v + " " + rule
	}
	waitFor(t, "the three runs in ClickHouse", time.Minute, func() bool {
		return db.Count(t, "SELECT count() FROM `"+db.Name+"`.runs FINAL") == 3
	})
	for runID, want := range map[string]string{"acc-unsure": "abstained routing", "acc-sure": "decided lax", "acc-held": "abstained routing-hold"} {
		if got := verdictOf(runID); got != want {
			t.Errorf("%s: ClickHouse verdict %q, want %q", runID, got, want)
		}
	}
	waitFor(t, "the labelled answer", time.Minute, func() bool {
		return db.Count(t, "SELECT count() FROM `"+db.Name+"`.labelled_answers WHERE run_id = 'acc-held' AND question = 'label' AND label = 'bug' AND reviewer = 'alice' AND source = 'review'") == 1
	})
}
