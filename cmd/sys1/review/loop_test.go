package review

import (
	"context"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/contract/examples"
	"github.com/sys1hq/sys1/provider/ollama"
	"github.com/sys1hq/sys1/provider/ollamatest"
	"github.com/sys1hq/sys1/worker"
	"github.com/sys1hq/sys1/worker/auth"
	sys1client "github.com/sys1hq/sys1/worker/client"
	"github.com/sys1hq/sys1/worker/natsconn/natstest"
	"github.com/sys1hq/sys1/worker/policy"
	"github.com/sys1hq/sys1/worker/topology"
)

// loopPolicy holds the ticket example's routing question for a person whatever the fake
// answers (its confidence is below 0.99), and decides the rest.
const loopPolicy = `
rules:
  - name: routing
    question: label
    min_confidence: 0.99
    review: hold
  - name: lax
    min_confidence: 0
    noul_abstain_between: [0.0, 0.0]
`

// startWorker runs a worker replica (subject auth, the fake Ollama, policy) on natsURL.
func startWorker(t *testing.T, natsURL, policyYAML string) {
	t.Helper()
	startWorkerAuth(t, natsURL, policyYAML, auth.Config{Mode: auth.ModeSubject})
}

// startWorkerAuth runs a worker replica (the fake Ollama, policy) in the auth mode of authCfg
// on natsURL.
func startWorkerAuth(t *testing.T, natsURL, policyYAML string, authCfg auth.Config) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(path, []byte(policyYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	pol, err := policy.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	fake := ollamatest.New(t)
	prov, err := ollama.New(ollama.Config{BaseURL: fake.URL(), TimeoutMS: "5000"}, ollama.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	authn, err := auth.New(context.Background(), authCfg, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(natsURL)
	if err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithCancel(context.Background())
	w, err := worker.New(ctx, worker.Config{
		Concurrency: 2, MaxDeliver: 3, ShutdownGrace: 5 * time.Second, FetchBatch: 2,
		RetryBase: 20 * time.Millisecond, RetryMax: 200 * time.Millisecond, StoreRetry: 2 * time.Second, ID: "loop-worker",
	}, worker.Options{
		NC: nc, JS: js, Topology: topology.Default(), Provider: prov, Auth: authn, Abstention: pol,
		ModelPolicy: contract.Policy{DefaultModel: "nimble", AllowedModels: []string{"nimble"}},
		Logger:      zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel), Version: "test", FetchWait: 200 * time.Millisecond,
	})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = w.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done; nc.Close() })
}

// TestReviewReleasesAHeldRunIntoClickHouse is issue 12's loop end to end, against a real
// nats-server, the fake Ollama and ClickHouse (chshim): a worker with a hold policy answers
// nothing and queues an item; a reviewer labels it on the review page; the held reply arrives
// with the question reviewed; the label row is in ClickHouse sys1.labels, and
// sys1.labelled_answers joins it with the answer it labels.
func TestReviewReleasesAHeldRunIntoClickHouse(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	db := runSink(t, h.srv.ClientURL())
	startWorker(t, h.srv.ClientURL(), loopPolicy)

	nc, err := nats.Connect(h.srv.ClientURL(), nats.CustomInboxPrefix("_INBOX.billing"))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	cl, err := sys1client.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	inbox := nc.NewInbox()
	replies, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	body, err := examples.Request("ticket")
	if err != nil {
		t.Fatal(err)
	}
	const runID = "loop-1"
	if _, err := cl.Publish(context.Background(), sys1client.Request{Caller: "billing", Body: body, RunID: runID, ReplyTo: inbox}); err != nil {
		t.Fatal(err)
	}
	itemID := contract.ReviewItemID(runID, "label")
	h.waitIndexed(itemID)
	if m, err := replies.NextMsg(200 * time.Millisecond); err == nil {
		t.Fatalf("the held run was answered before anyone labelled it: %s", m.Data)
	}

	// A reviewer opens the item and picks "account" (the fake's choice or not: a person decides).
	c := h.client()
	csrf := c.mustLogin("alice")
	page := c.get("/items/" + itemID)
	if page.status != http.StatusOK || !strings.Contains(page.body, "Which team should handle this ticket?") {
		t.Fatalf("item page %d:\n%s", page.status, page.body)
	}
	if res := c.post("/items/"+itemID+"/label", url.Values{"csrf": {csrf}, "value": {"account"}}); res.status != http.StatusSeeOther {
		t.Fatalf("label: %d\n%s", res.status, res.body)
	}

	m, err := replies.NextMsg(20 * time.Second)
	if err != nil {
		t.Fatalf("no reply after the label: %v", err)
	}
	rep, err := sys1client.ParseReply(m)
	if err != nil {
		t.Fatal(err)
	}
	v, _ := rep.Verdicts.Get("label")
	if rep.Status != contract.StatusSuccess || v.Status != contract.VerdictReviewed || string(v.Label) != `"account"` || v.Reviewer != "alice" ||
		rep.Review == nil || rep.Review.Status != contract.ReviewReviewed || rep.Review.Item != itemID {
		t.Fatalf("released reply %s", rep.Raw)
	}
	if extra, err := replies.NextMsg(300 * time.Millisecond); err == nil {
		t.Errorf("a second reply: %s", extra.Data)
	}
	var chosen string
	var confidence float64
	for _, a := range rep.Result.Answers {
		if a.Name == "label" {
			chosen, confidence = a.Choice, *a.Confidence
		}
	}

	row := waitLabelRow(t, db, runID, "label")
	if row.label != "account" || row.value != `"account"` || row.reviewer != "alice" || row.source != "review" || row.item != itemID || row.caller != "billing" {
		t.Errorf("label row %+v", row)
	}
	natstest.WaitFor(t, time.Minute, "the labelled answer", func() bool {
		return db.Count(t, "SELECT count() FROM `"+db.Name+"`.labelled_answers WHERE run_id = ?", runID) == 1
	})
	var predicted, label, reviewer, source, verdict, rule, caller string
	var correct uint8
	var conf *float64
	var labelP float64
	q := "SELECT predicted, label, correct, confidence, label_probability, reviewer, source, verdict, rule, caller FROM `" + db.Name + "`.labelled_answers WHERE run_id = ? AND question = 'label'"
	if err := db.Conn.QueryRow(context.Background(), q, runID).Scan(&predicted, &label, &correct, &conf, &labelP, &reviewer, &source, &verdict, &rule, &caller); err != nil {
		t.Fatal(err)
	}
	var pAccount float64
	for _, a := range rep.Result.Answers {
		for _, p := range a.Probabilities {
			if a.Name == "label" && p.Key == "account" {
				pAccount = p.P
			}
		}
	}
	wantCorrect := uint8(0)
	if chosen == "account" {
		wantCorrect = 1
	}
	if predicted != chosen || label != "account" || correct != wantCorrect || conf == nil || *conf != confidence || labelP != pAccount ||
		reviewer != "alice" || source != "review" || verdict != "abstained" || rule != "routing" || caller != "billing" {
		t.Errorf("labelled_answers: predicted %q label %q correct %d confidence %v label_probability %v reviewer %q source %q verdict %q rule %q caller %q; the answer chose %q (confidence %v, P(account) %v)",
			predicted, label, correct, conf, labelP, reviewer, source, verdict, rule, caller, chosen, confidence, pAccount)
	}
}
