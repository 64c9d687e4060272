package worker_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/contract/wire"
	"github.com/sys1hq/sys1/worker"
	"github.com/sys1hq/sys1/worker/client"
	"github.com/sys1hq/sys1/worker/metricstest"
	"github.com/sys1hq/sys1/worker/topology"
)

// abstainAll sends every question to review (no confidence reaches 1, every P(yes) lies in
// [0, 1]).
const abstainAll = `
rules:
  - name: all
    min_confidence: 1
    noul_abstain_between: [0, 1]
`

// TestEveryStreamAndBucketIsBoundedAfterStartUp: once a worker has started, nothing sys1 keeps
// can grow without bound, and health and /metrics report every stream's bytes and limit.
func TestEveryStreamAndBucketIsBoundedAfterStartUp(t *testing.T) {
	h := newHarness(t)
	r := h.start(withLimits(t, "rules:\n  - caller: \"*\"\n    decisions_per_minute: 1000\n", ""))
	h.decide("svc-a", []byte(ticket))
	ctx := context.Background()
	n := 0
	for name := range h.js.StreamNames(ctx).Name() {
		s, err := h.js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if c := s.CachedInfo().Config; c.MaxBytes <= 0 {
			t.Errorf("stream %s has no byte limit", name)
		}
		n++
	}
	if n < 11 {
		t.Errorf("only %d streams after start-up", n)
	}
	usage := r.w.Health().Storage
	seen := map[string]bool{}
	for _, u := range usage {
		if u.Error == "" && u.MaxBytes > 0 && u.Variable != "" {
			seen[u.Name] = true
		}
	}
	for _, name := range []string{"SYS1_REQUESTS", "SYS1_RUNS", "SYS1_REPLIES", "SYS1_REVIEW", "SYS1_LABELS", "SYS1_LABEL_SUBMISSIONS", "SYS1_DEAD_LETTERS", "KV_sys1-runs", "KV_sys1-cache", "KV_sys1-calibration", "KV_sys1-limits"} {
		if !seen[name] {
			t.Errorf("health does not report %s with its limit and variable: %+v", name, usage)
		}
	}
	body := scrape(t, r)
	for _, want := range []string{`sys1_worker_stream_max_bytes{stream="SYS1_RUNS",worker="test-worker"} 8.589934592e+09`,
		`sys1_worker_stream_bytes{stream="KV_sys1-runs",worker="test-worker"}`, `sys1_worker_quota_refusals_total{kind="labels",worker="test-worker"} 0`} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// TestA64QuestionReviewAddsUnderThreeTimesTheRequest: a request whose 64 questions all go
// to review adds its state once to SYS1_REVIEW, not 64 times: under 3× the request's size
// (an earlier version added 59×).
func TestA64QuestionReviewAddsUnderThreeTimesTheRequest(t *testing.T) {
	h := newHarness(t)
	h.start(withPolicy(t, abstainAll))
	var req map[string]json.RawMessage
	if err := json.Unmarshal(example(t, "sixty-four.json"), &req); err != nil {
		t.Fatal(err)
	}
	req["state"], _ = json.Marshal(map[string]string{"review": strings.Repeat("The battery lasts two days. ", 1800)})
	body, _ := json.Marshal(req)
	if len(body) < 50<<10 || len(body) > contract.MaxTextBytes+16<<10 {
		t.Fatalf("request of %d bytes", len(body))
	}
	rep := h.decide("svc-a", body)
	if rep.Status != contract.StatusSuccess || rep.Review == nil || rep.Review.Status != contract.ReviewPending {
		t.Fatalf("reply %s", rep.Raw)
	}
	items := h.reviewItems()
	if len(items) != 64 {
		t.Fatalf("%d questions went to review, want all 64", len(items))
	}
	s, _ := h.js.Stream(context.Background(), h.topo.ReviewStream)
	info, _ := s.Info(context.Background())
	ratio := float64(info.State.Bytes) / float64(len(body))
	t.Logf("a %d-byte request with 64 questions in review added %d bytes to %s: %.2f×", len(body), info.State.Bytes, h.topo.ReviewStream, ratio)
	if ratio >= 3 {
		t.Errorf("SYS1_REVIEW grew by %.2f× the request", ratio)
	}
	for _, it := range items {
		if !bytes.Equal(it.State, items[0].State) || len(it.State) < 40<<10 {
			t.Fatalf("item %s does not show the run's state", it.Question)
		}
	}
}

// TestACallerOverItsQuotaIsRefusedAndAnotherIsNot: with svc-a holding its
// SYS1_REQUESTS_MAX_PER_CALLER requests (no worker running), its next publish is refused with
// a clear error, while svc-b's publish is stored and its run answered; svc-a's queued requests
// are answered too.
func TestACallerOverItsQuotaIsRefusedAndAnotherIsNot(t *testing.T) {
	h := newHarness(t)
	h.topo.RequestsPerCaller = 3
	if _, err := topology.Ensure(context.Background(), h.js, h.topo); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	in, err := h.nc.SubscribeSync("_INBOX.svc-a.queued.*")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := h.cl.Publish(ctx, client.Request{Caller: "svc-a", Body: []byte(ticket), ReplyTo: fmt.Sprintf("_INBOX.svc-a.queued.%d", i)}); err != nil {
			t.Fatalf("request %d within the quota: %v", i+1, err)
		}
	}
	_, err = h.cl.Publish(ctx, client.Request{Caller: "svc-a", Body: []byte(ticket)})
	if !errors.Is(err, client.ErrQuotaExceeded) || !strings.Contains(err.Error(), "SYS1_REQUESTS_MAX_PER_CALLER") {
		t.Fatalf("svc-a's fourth request: %v, want %v", err, client.ErrQuotaExceeded)
	}
	pub := make(chan *client.Reply, 1)
	go func() {
		rep, err := h.cl.Decide(ctx, client.Request{Caller: "svc-b", Body: []byte(ticket)})
		if err != nil {
			t.Errorf("svc-b: %v", err)
		}
		pub <- rep
	}()
	h.start()
	if rep := <-pub; rep == nil || rep.Status != contract.StatusSuccess {
		t.Fatalf("svc-b's run: %+v", rep)
	}
	for range 3 {
		m, err := in.NextMsg(20 * time.Second)
		if err != nil {
			t.Fatalf("svc-a's queued requests: %v", err)
		}
		if m.Header.Get(wire.HeaderStatus) != string(contract.StatusSuccess) {
			t.Errorf("svc-a's queued request: %s", m.Data)
		}
	}
}

// TestTheQuotaBackstopCountsACallersFurtherSubjects: spreading requests over
// sys1.decide.<caller>.<more> subjects (each its own JetStream subject) does not buy a caller
// more than its quota: the worker refuses the excess at admission, SYS1_QUOTA_EXCEEDED,
// without calling the model; another caller's run goes on.
func TestTheQuotaBackstopCountsACallersFurtherSubjects(t *testing.T) {
	h := newHarness(t)
	h.topo.RequestsPerCaller = 2
	if _, err := topology.Ensure(context.Background(), h.js, h.topo); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	in, err := h.nc.SubscribeSync("_INBOX.svc-a.spread.*")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		_, err := h.cl.Publish(ctx, client.Request{Caller: fmt.Sprintf("svc-a.part%d", i), Body: []byte(ticket), ReplyTo: fmt.Sprintf("_INBOX.svc-a.spread.%d", i)})
		if err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	r := h.start()
	if rep := h.decide("svc-b", []byte(ticket)); rep.Status != contract.StatusSuccess {
		t.Fatalf("svc-b: %s", rep.Raw)
	}
	var ok, refused int
	for range 5 {
		m, err := in.NextMsg(20 * time.Second)
		if err != nil {
			t.Fatalf("after %d ok and %d refused: %v", ok, refused, err)
		}
		switch m.Header.Get(wire.HeaderErrorCode) {
		case "":
			ok++
		case string(contract.CodeQuotaExceeded):
			refused++
			if !strings.Contains(string(m.Data), "SYS1_REQUESTS_MAX_PER_CALLER") {
				t.Errorf("refusal without its reason: %s", m.Data)
			}
		default:
			t.Errorf("unexpected reply %s", m.Data)
		}
	}
	if refused != 3 || ok != 2 {
		t.Errorf("%d answered and %d refused, want 2 and 3", ok, refused)
	}
	if got := quotaRefusals(t, r, "requests"); got != 3 {
		t.Errorf("sys1_worker_quota_refusals_total{kind=requests} = %v", got)
	}
	if calls := h.fake.Calls(); calls != 3 {
		t.Errorf("%d model calls, want 3 (svc-b and svc-a's two within the quota)", calls)
	}
}

// TestTheQuotaBackstopCountsACallersBatches: every sys1.batch.<caller>.<batch id> is a
// JetStream subject of its own, so a caller spreading requests over many batch ids is bounded
// by the worker's backstop only: the excess over its quota is refused at admission,
// SYS1_QUOTA_EXCEEDED, without calling the model, while another caller's batch (at its quota,
// not over) and its interactive run are answered.
func TestTheQuotaBackstopCountsACallersBatches(t *testing.T) {
	h := newHarness(t)
	h.topo.RequestsPerCaller = 2
	if _, err := topology.Ensure(context.Background(), h.js, h.topo); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	replies := map[string]*nats.Subscription{}
	for _, caller := range []string{"svc-a", "svc-b"} {
		sub, err := h.nc.SubscribeSync("_INBOX." + caller + ".batches.*")
		if err != nil {
			t.Fatal(err)
		}
		replies[caller] = sub
	}
	publish := func(caller, batch string, item int) {
		m := nats.NewMsg("sys1.batch." + caller + "." + batch)
		m.Data = []byte(ticket)
		runID := fmt.Sprintf("%s:%d", batch, item)
		m.Header.Set("Sys1-Run-Id", runID)
		m.Header.Set("Sys1-Reply-To", "_INBOX."+caller+".batches."+batch)
		if _, err := h.js.PublishMsg(ctx, m, jetstream.WithMsgID(runID)); err != nil {
			t.Fatalf("publish %s %s: %v", caller, runID, err)
		}
	}
	// svc-a: six batches of one item each, each subject far under JetStream's per-subject
	// limit; svc-b: one batch of two, exactly its quota.
	for i := range 6 {
		publish("svc-a", fmt.Sprint("a", i), 0)
	}
	publish("svc-b", "b0", 0)
	publish("svc-b", "b0", 1)
	r := h.start()
	if rep := h.decide("svc-b", []byte(ticket)); rep.Status != contract.StatusSuccess {
		t.Fatalf("svc-b's interactive run: %s", rep.Raw)
	}
	count := func(caller string, n int) (ok, refused int) {
		for range n {
			m, err := replies[caller].NextMsg(20 * time.Second)
			if err != nil {
				t.Fatalf("%s: after %d ok and %d refused: %v", caller, ok, refused, err)
			}
			switch m.Header.Get(wire.HeaderErrorCode) {
			case "":
				ok++
			case string(contract.CodeQuotaExceeded):
				refused++
				if !strings.Contains(string(m.Data), "SYS1_REQUESTS_MAX_PER_CALLER") || !strings.Contains(string(m.Data), "batches") {
					t.Errorf("refusal without its reason: %s", m.Data)
				}
			default:
				t.Errorf("%s: unexpected reply %s", caller, m.Data)
			}
		}
		return ok, refused
	}
	if ok, refused := count("svc-a", 6); ok != 2 || refused != 4 {
		t.Errorf("svc-a's six batches: %d answered and %d refused, want 2 and 4", ok, refused)
	}
	if ok, refused := count("svc-b", 2); ok != 2 || refused != 0 {
		t.Errorf("svc-b's batch at its quota: %d answered and %d refused, want 2 and 0", ok, refused)
	}
	if got := quotaRefusals(t, r, "requests"); got != 4 {
		t.Errorf("sys1_worker_quota_refusals_total{kind=requests} = %v, want 4", got)
	}
	if calls := h.fake.Calls(); calls != 5 {
		t.Errorf("%d model calls, want 5 (svc-a's two within its quota, svc-b's three)", calls)
	}
}

// TestReviewFullStillAnswersAndHealthNamesIt: with SYS1_REVIEW full, a run whose questions go
// to review is answered at once — its reply says the review was not queued, and why — no loop
// retries in place, and health, /readyz and /metrics name the stream.
func TestReviewFullStillAnswersAndHealthNamesIt(t *testing.T) {
	h := newHarness(t)
	h.topo.MaxMsgSize = 64 << 10
	h.topo.ReviewMaxBytes = 256 << 10
	if _, err := topology.Ensure(context.Background(), h.js, h.topo); err != nil {
		t.Fatal(err)
	}
	fillStream(t, h.js, "sys1.review.filler", 60<<10)
	r := h.start(withPolicy(t, strings.Replace(strictLabelPolicy, "review: notify", "review: hold", 1)))
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
	defer cancel()
	rep, err := h.cl.Decide(ctx, client.Request{Caller: "svc-a", Body: []byte(ticket), RunID: "full-1"})
	if err != nil {
		t.Fatalf("decide: %v\n%s", err, h.logs.String())
	}
	if rep.Status != contract.StatusSuccess || rep.Review == nil || rep.Review.Status != contract.ReviewNotQueued ||
		!strings.Contains(rep.Review.Reason, "SYS1_REVIEW is full") || rep.Header.Get(wire.HeaderReview) != contract.ReviewNotQueued {
		t.Fatalf("reply %s (headers %v)\n%s", rep.Raw, rep.Header, h.logs.String())
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("the reply took %s", took)
	}
	// The rule holds the reply (review: hold), but with no review queued nobody could release
	// it: it went out, and the verdict stays abstained.
	if len(rep.Verdicts) == 0 || rep.Verdicts[0].Question != "label" || rep.Verdicts[0].Status != contract.VerdictAbstained {
		t.Errorf("verdicts %+v", rep.Verdicts)
	}
	health := r.w.Health()
	if health.Status != worker.HealthDegraded || len(health.Full) != 1 || health.Full[0] != "SYS1_REVIEW" {
		t.Errorf("health status %s, full %v", health.Status, health.Full)
	}
	if !strings.Contains(scrape(t, r), `sys1_worker_stream_full{stream="SYS1_REVIEW",worker="test-worker"} 1`) {
		t.Errorf("/metrics does not say SYS1_REVIEW is full")
	}
	logs := h.logs.String()
	if !strings.Contains(logs, "stream SYS1_REVIEW is full") || strings.Contains(logs, "retrying in place") {
		t.Errorf("logs: %s", logs)
	}
	// A second run is answered as promptly, and the log says the stream is full only once.
	if rep := h.decide("svc-a", []byte(ticket)); rep.Review == nil || rep.Review.Status != contract.ReviewNotQueued {
		t.Errorf("second reply %s", rep.Raw)
	}
	if n := strings.Count(h.logs.String(), "stream SYS1_REVIEW is full"); n != 1 {
		t.Errorf("the full stream is logged %d times", n)
	}
}

// TestAReviewQuotaRefusesOnlyItsCaller: a caller at SYS1_REVIEW_MAX_PER_CALLER gets its next
// run answered with "not queued", counted; another caller's review is queued.
func TestAReviewQuotaRefusesOnlyItsCaller(t *testing.T) {
	h := newHarness(t)
	h.topo.ReviewPerCaller = 1
	r := h.start(withPolicy(t, strictLabelPolicy), subjectAuth(t))
	if rep := h.decide("svc-a", []byte(ticket)); rep.Review == nil || rep.Review.Status != contract.ReviewPending {
		t.Fatalf("svc-a's first review: %s", rep.Raw)
	}
	rep := h.decide("svc-a", []byte(ticket))
	if rep.Status != contract.StatusSuccess || rep.Review == nil || rep.Review.Status != contract.ReviewNotQueued || !strings.Contains(rep.Review.Reason, "SYS1_REVIEW_MAX_PER_CALLER") {
		t.Fatalf("svc-a over its review quota: %s", rep.Raw)
	}
	if rep := h.decide("svc-b", []byte(ticket)); rep.Review == nil || rep.Review.Status != contract.ReviewPending {
		t.Errorf("svc-b's review: %s", rep.Raw)
	}
	if got := quotaRefusals(t, r, "review"); got != 1 {
		t.Errorf("sys1_worker_quota_refusals_total{kind=review} = %v", got)
	}
	if n := len(h.reviewItems()); n != 2 {
		t.Errorf("%d review items stored, want 2", n)
	}
}

// TestRunsFullAnswersAndWaitsForRoomToRecord: with SYS1_RUNS full the run is still answered;
// its delivery is not acknowledged until its record is stored, which happens, from its stored
// outcome and without another model call, once there is room.
func TestRunsFullAnswersAndWaitsForRoomToRecord(t *testing.T) {
	h := newHarness(t)
	h.topo.MaxMsgSize = 64 << 10
	h.topo.RunsMaxBytes = 256 << 10
	if _, err := topology.Ensure(context.Background(), h.js, h.topo); err != nil {
		t.Fatal(err)
	}
	fillStream(t, h.js, "sys1.runs.filler", 60<<10)
	cfg := defaultWorkerConfig()
	cfg.RetryMax = 100 * time.Millisecond
	r := h.start(func(o *replicaOpts) { o.cfg = cfg })
	rep := h.decide("svc-a", []byte(ticket), func(r *client.Request) { r.RunID = "runs-full-1" })
	if rep.Status != contract.StatusSuccess {
		t.Fatalf("reply %s", rep.Raw)
	}
	waitFor(t, "health to name SYS1_RUNS", 5*time.Second, func() bool {
		full := r.w.Health().Full
		return len(full) == 1 && full[0] == "SYS1_RUNS"
	})
	if n := h.pending(); n != 1 {
		t.Errorf("%d requests on the stream while its record waits for room, want 1 (not acknowledged)", n)
	}
	if strings.Contains(h.logs.String(), "retrying in place") {
		t.Errorf("a store retried in place against a full stream")
	}
	s, _ := h.js.Stream(context.Background(), h.topo.RunsStream)
	if err := s.Purge(context.Background(), jetstream.WithPurgeSubject("sys1.runs.filler")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the record once there is room", 10*time.Second, func() bool {
		for _, rec := range h.records() {
			if rec.RunID == "runs-full-1" {
				return true
			}
		}
		return false
	})
	waitFor(t, "the request acknowledged", 10*time.Second, func() bool { return h.pending() == 0 })
	if calls := h.fake.Calls(); calls != 1 {
		t.Errorf("%d model calls, want 1", calls)
	}
	waitFor(t, "health to clear SYS1_RUNS", 10*time.Second, func() bool { return len(r.w.Health().Full) == 0 })
}

// fillStream publishes to subject until the stream refuses even a small message for want of
// room: messages of size bytes first, then smaller ones into what is left.
func fillStream(t *testing.T, js jetstream.JetStream, subject string, size int) {
	t.Helper()
	for _, n := range []int{size, 1 << 10, 16} {
		body := bytes.Repeat([]byte("f"), n)
		for i := 0; ; i++ {
			_, err := js.Publish(context.Background(), subject, body)
			if topology.Refused(err) == topology.RefusedFull {
				break
			}
			if err != nil || i > 10000 {
				t.Fatalf("filling %s: %v after %d", subject, err, i)
			}
		}
	}
}

func quotaRefusals(t *testing.T, r *replica, kind string) float64 {
	t.Helper()
	fams, err := metricstest.Parse(scrape(t, r))
	if err != nil {
		t.Fatal(err)
	}
	return value(t, fams, "sys1_worker_quota_refusals_total", map[string]string{"kind": kind})
}
