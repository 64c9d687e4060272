package soak

import (
	"crypto/sha256"
	"fmt"
	"strings"
	"testing"
	"time"
)

// healthy is a small soak where everything held: two plain runs, a cache pair (one hit), a
// held run released after its label, a budget caller at its limit with one refusal, a batch
// of two, their records and labels in ClickHouse, consumers drained, processes up.
type healthy struct {
	Observations
	t0 time.Time
}

func at(t0 time.Time, s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }

func hashOf(s string) [32]byte { return sha256.Sum256([]byte(s)) }

func newHealthy() *healthy {
	t0 := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	h := &healthy{t0: t0}
	o := &h.Observations
	o.Start, o.End = t0, at(t0, 120)
	o.Timeline = NewTimeline(t0, nil)
	seq := uint64(0)
	reply := func(id string, s float64, r Reply) {
		seq++
		r.RunID, r.Seq, r.At = id, seq, at(t0, s)
		if r.Status == "" {
			r.Status = "success"
		}
		if r.Hash == ([32]byte{}) {
			r.Hash = hashOf(id + r.Status + r.ErrorCode + r.Review + fmt.Sprint(r.Reviewed))
		}
		o.Replies = append(o.Replies, r)
	}
	call := func(key string, slot int, s float64) {
		o.Calls = append(o.Calls, Call{Key: key, Slot: slot, Started: at(t0, s), Ended: at(t0, s+0.02), Answered: true})
	}
	req := func(id, caller, kind, key string, s float64) {
		o.Requests = append(o.Requests, Request{RunID: id, Caller: caller, Kind: kind, Key: key, PublishedAt: at(t0, s), AckedAt: at(t0, s+0.001)})
	}
	row := func(id, caller, status string) {
		o.Rows = append(o.Rows, Row{RunID: id, Caller: caller, Status: status})
	}

	req("p-1", "soak-plain", KindPlain, "p-1", 1)
	call("p-1", 1, 1.1)
	reply("p-1", 1.2, Reply{ProviderAnswers: 1})
	row("p-1", "soak-plain", "success")
	req("p-2", "soak-plain", KindPlain, "p-2", 2)
	o.Calls = append(o.Calls, Call{Key: "p-2", Slot: 2, Started: at(t0, 2.1), Ended: at(t0, 2.2), Fault: "status 503"}) // a programmed failure scores nothing
	call("p-2", 2, 3.1)
	reply("p-2", 3.2, Reply{ProviderAnswers: 1})
	reply("p-2", 3.3, Reply{ProviderAnswers: 1}) // the same reply again (at least once): one answer
	o.Replies[len(o.Replies)-1].Hash = o.Replies[len(o.Replies)-2].Hash
	row("p-2", "soak-plain", "success")

	req("c-1", "soak-cache", KindCache, "body-1", 4)
	call("body-1", 1, 4.1)
	reply("c-1", 4.2, Reply{ProviderAnswers: 1})
	row("c-1", "soak-cache", "success")
	req("c-2", "soak-cache", KindCache, "body-1", 5)
	reply("c-2", 5.1, Reply{CacheHit: true})
	row("c-2", "soak-cache", "success")

	req("h-1", "soak-hold", KindHold, "h-1", 6)
	call("h-1", 2, 6.1)
	o.Labels = append(o.Labels, Label{RunID: "h-1", Question: "approve", Value: "true", Source: "review", Reviewer: "alice", Item: "rv-1", At: at(t0, 9), Seq: 1})
	reply("h-1", 9.5, Reply{ProviderAnswers: 1, Review: "reviewed", Reviewed: map[string]string{"approve": "true"}})
	row("h-1", "soak-hold", "success")

	o.Budgets = []Budget{{Caller: "soak-budget", Limit: 1}}
	req("b-1", "soak-budget", KindBudget, "b-1", 10)
	call("b-1", 1, 10.1)
	reply("b-1", 10.2, Reply{ProviderAnswers: 1})
	row("b-1", "soak-budget", "success")
	req("b-2", "soak-budget", KindBudget, "b-2", 11)
	reply("b-2", 11.1, Reply{Status: "failed", ErrorCode: "SYS1_BUDGET_EXCEEDED"})
	row("b-2", "soak-budget", "failed")

	o.Batches = []BatchOutcome{{ID: "bt", Finished: true, ExitCode: 0,
		Items: []BatchItem{{CustomID: "i-1", Key: "bt:i-1"}, {CustomID: "i-2", Key: "bt:i-2"}},
		Lines: []BatchLine{{CustomID: "i-1", RunID: "bt:i-1", Status: "success", Line: 1}, {CustomID: "i-2", RunID: "bt:i-2", Status: "success", Line: 2}}}}
	call("bt:i-1", 1, 20)
	call("bt:i-2", 2, 21)
	row("bt:i-1", "soak-batch", "success")
	row("bt:i-2", "soak-batch", "success")

	o.SentLabels = []SentLabel{{RunID: "p-1", Question: "label", Value: `"bug"`, AckedAt: at(t0, 30)}}
	o.Labels = append(o.Labels, Label{RunID: "p-1", Question: "label", Value: `"bug"`, Source: "producer", Reviewer: "soak-plain", At: at(t0, 30.1), Seq: 2})
	o.RowsRead = true
	o.LabelRows = []LabelRow{{RunID: "h-1", Question: "approve", Value: "true", Source: "review"}, {RunID: "p-1", Question: "label", Value: `"bug"`, Source: "producer"}}

	o.Consumers = []ConsumerState{{Stream: "SYS1_REQUESTS", Name: "sys1-worker"}, {Stream: "SYS1_RUNS", Name: "sys1-sink"}}
	o.Workers = []Incarnation{
		{Name: "w1", Slot: 1, Gen: 1, Started: t0, Ended: at(t0, 50), Killed: true},
		{Name: "w1", Slot: 1, Gen: 2, Started: at(t0, 52)},
		{Name: "w2", Slot: 2, Gen: 1, Started: t0},
	}
	o.Processes = []Incarnation{{Name: "n1", Gen: 1, Started: t0}, {Name: "sink", Gen: 1, Started: t0}}
	return h
}

func violationsOf(t *testing.T, o Observations, check string) []Violation {
	t.Helper()
	r := Check(o)
	for _, res := range r.Results {
		if res.Check != check && len(res.Violations) > 0 {
			t.Errorf("check %q found %d violations in a fleet only %q was broken in: %v", res.Check, len(res.Violations), check, res.Violations)
		}
	}
	return r.Result(check).Violations
}

func expectViolation(t *testing.T, o Observations, check, runID, detail string) {
	t.Helper()
	vs := violationsOf(t, o, check)
	for _, v := range vs {
		if (runID == "" || contains(v.RunIDs, runID)) && strings.Contains(v.Detail, detail) {
			return
		}
	}
	t.Fatalf("check %q: no violation for %q saying %q; got %v", check, runID, detail, vs)
}

func contains(ids []string, id string) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}

func TestCheckPassesAHealthyFleet(t *testing.T) {
	h := newHealthy()
	r := Check(h.Observations)
	if vs := r.Violations(); len(vs) > 0 {
		t.Fatalf("violations in a healthy fleet: %+v", vs)
	}
	for _, name := range Checks {
		if r.Result(name).Checked == 0 {
			t.Errorf("check %q looked at nothing", name)
		}
	}
	if notes := r.Result(CheckBudgets).Notes; len(notes) != 1 || !strings.Contains(notes[0], "1 admitted, 1 refused") {
		t.Errorf("budget notes: %v", notes)
	}
}

// The planted faults of issue 24's acceptance: a double call, a lost run, a second release of
// a hold — and the other invariants, each detected on its own.

func TestCheckDetectsADoubleCall(t *testing.T) {
	h := newHealthy()
	h.Calls = append(h.Calls, Call{Key: "p-1", Slot: 2, Started: at(h.t0, 1.15), Ended: at(h.t0, 1.17), Answered: true})
	expectViolation(t, h.Observations, CheckScored, "p-1", "scored 2 times")
}

func TestCheckExcusesAScoringLostWithAKilledWorker(t *testing.T) {
	h := newHealthy()
	// w1's first incarnation got p-4's answer at +49 s and was killed at +50 s, before storing
	// it; the run's next delivery, on w2 after the ack wait, asked again. Documented, excused,
	// noted.
	h.Requests = append(h.Requests, Request{RunID: "p-4", Caller: "soak-plain", Kind: KindPlain, Key: "p-4", PublishedAt: at(h.t0, 48.9), AckedAt: at(h.t0, 48.91)})
	h.Calls = append(h.Calls,
		Call{Key: "p-4", Slot: 1, Started: at(h.t0, 49), Ended: at(h.t0, 49.1), Answered: true},
		Call{Key: "p-4", Slot: 2, Started: at(h.t0, 80), Ended: at(h.t0, 80.1), Answered: true})
	h.Replies = append(h.Replies, Reply{RunID: "p-4", Seq: 60, At: at(h.t0, 80.2), Hash: hashOf("p-4"), Status: "success", ProviderAnswers: 1})
	h.Rows = append(h.Rows, Row{RunID: "p-4", Caller: "soak-plain", Status: "success"})
	r := Check(h.Observations)
	if vs := r.Violations(); len(vs) > 0 {
		t.Fatalf("violations: %+v", vs)
	}
	if notes := r.Result(CheckScored).Notes; len(notes) != 1 || !strings.Contains(notes[0], "1 runs were scored again") {
		t.Errorf("notes: %v", notes)
	}
	// …and so is one whose run was asked again while the model failed, and failed with it: the
	// lost answer was the only one the model gave (the 60-minute soak's p-008586).
	h2 := newHealthy()
	h2.Requests = append(h2.Requests, Request{RunID: "p-4", Caller: "soak-plain", Kind: KindPlain, Key: "p-4", PublishedAt: at(h2.t0, 48.9), AckedAt: at(h2.t0, 48.91)})
	h2.Calls = append(h2.Calls,
		Call{Key: "p-4", Slot: 1, Started: at(h2.t0, 49), Ended: at(h2.t0, 49.1), Answered: true},
		Call{Key: "p-4", Slot: 2, Started: at(h2.t0, 80), Ended: at(h2.t0, 80.1), Fault: "500"})
	h2.Replies = append(h2.Replies, Reply{RunID: "p-4", Seq: 60, At: at(h2.t0, 80.2), Hash: hashOf("p-4 failed"), Status: "failed", ErrorCode: "SYS1_UPSTREAM_ERROR"})
	h2.Rows = append(h2.Rows, Row{RunID: "p-4", Caller: "soak-plain", Status: "failed"})
	if vs := Check(h2.Observations).Violations(); len(vs) > 0 {
		t.Fatalf("a lost answer whose run then failed with the model: violations %+v", vs)
	}
	// Without that second call, nothing shows the answer was lost rather than thrown away…
	h2.Calls = h2.Calls[:len(h2.Calls)-1]
	expectViolation(t, h2.Observations, CheckScored, "p-4", "scored 1 times")
	// …unless the run's next delivery was refused by the breakers, every circuit open after
	// the model's failures: it asked again as far as it was let (the 60-minute soak's
	// soak-batch-48:i-000207).
	h2.Replies[len(h2.Replies)-1].ErrorCode = "SYS1_PROVIDER_UNAVAILABLE"
	if vs := Check(h2.Observations).Violations(); len(vs) > 0 {
		t.Fatalf("a lost answer whose run was then refused by the breakers: violations %+v", vs)
	}
	// The same refusal excuses nothing on a worker that lived on.
	h2.Calls[len(h2.Calls)-1].Slot = 2
	expectViolation(t, h2.Observations, CheckScored, "p-4", "scored 1 times")
	// The same first call on a worker that lived on is not excused…
	h.Calls[len(h.Calls)-2].Slot = 2
	expectViolation(t, h.Observations, CheckScored, "p-4", "scored 2 times")
	// …nor one whose worker was killed only after the run's outcome was stored.
	h = newHealthy()
	h.Calls = append(h.Calls, Call{Key: "p-1", Slot: 1, Started: at(h.t0, 1.15), Ended: at(h.t0, 1.16), Answered: true})
	expectViolation(t, h.Observations, CheckScored, "p-1", "scored 2 times")
}

// TestCheckExcusesALostAnswerWhoseRunFoundTheCache (the CI soak, seed 24): a cache caller's
// worker could not read the cache (its NATS node was being killed), asked the model, and was
// killed holding the answer; the run's next delivery found the entry an earlier run stored.
func TestCheckExcusesALostAnswerWhoseRunFoundTheCache(t *testing.T) {
	h := newHealthy()
	h.Requests = append(h.Requests, Request{RunID: "c-3", Caller: "soak-cache", Kind: KindCache, Key: "body-1", PublishedAt: at(h.t0, 48.9), AckedAt: at(h.t0, 48.91)})
	h.Calls = append(h.Calls, Call{Key: "body-1", Slot: 1, Started: at(h.t0, 49), Ended: at(h.t0, 49.1), Answered: true})
	h.Replies = append(h.Replies, Reply{RunID: "c-3", Seq: 60, At: at(h.t0, 80.2), Hash: hashOf("c-3"), Status: "success", CacheHit: true})
	h.Rows = append(h.Rows, Row{RunID: "c-3", Caller: "soak-cache", Status: "success"})
	r := Check(h.Observations)
	if vs := r.Violations(); len(vs) > 0 {
		t.Fatalf("violations: %+v", vs)
	}
	if notes := r.Result(CheckScored).Notes; len(notes) != 1 || !strings.Contains(notes[0], "1 runs were scored again") {
		t.Errorf("notes: %v", notes)
	}
	// A hit that came before the worker died shows nothing about the answer it held.
	h.Replies[len(h.Replies)-1].At = at(h.t0, 49.5)
	expectViolation(t, h.Observations, CheckScored, "c-3", "scored 2 times")
	// Nor is the same call excused on a worker that lived on.
	h.Replies[len(h.Replies)-1].At = at(h.t0, 80.2)
	h.Calls[len(h.Calls)-1].Slot = 2
	expectViolation(t, h.Observations, CheckScored, "c-3", "scored 2 times")
}

func TestCheckDetectsACallForARunNobodySent(t *testing.T) {
	h := newHealthy()
	h.Calls = append(h.Calls, Call{Key: "ghost", Slot: 1, Started: at(h.t0, 7), Ended: at(h.t0, 7.1), Answered: true})
	expectViolation(t, h.Observations, CheckScored, "ghost", "which no request of the load carried")
}

func TestCheckDetectsACacheHitThatCalledTheModel(t *testing.T) {
	h := newHealthy()
	h.Calls = append(h.Calls, Call{Key: "body-1", Slot: 2, Started: at(h.t0, 5.05), Ended: at(h.t0, 5.07), Answered: true})
	expectViolation(t, h.Observations, CheckScored, "c-2", "scored 2 times")
}

func TestCheckDetectsALostRun(t *testing.T) {
	h := newHealthy()
	h.Requests = append(h.Requests, Request{RunID: "p-3", Caller: "soak-plain", Kind: KindPlain, Key: "p-3", PublishedAt: at(h.t0, 40), AckedAt: at(h.t0, 40.01)})
	expectViolation(t, h.Observations, CheckAnswered, "p-3", "never answered")
}

func TestCheckAllowsAnUnacknowledgedRequestToGoUnanswered(t *testing.T) {
	h := newHealthy()
	h.Requests = append(h.Requests, Request{RunID: "p-3", Caller: "soak-plain", Kind: KindPlain, Key: "p-3", PublishedAt: at(h.t0, 40), PublishErr: "nats: timeout"})
	if vs := Check(h.Observations).Violations(); len(vs) > 0 {
		t.Fatalf("violations: %+v", vs)
	}
}

func TestCheckDetectsARunAnsweredTwoWays(t *testing.T) {
	h := newHealthy()
	h.Replies = append(h.Replies, Reply{RunID: "p-1", Seq: 99, At: at(h.t0, 60), Hash: hashOf("other"), Status: "failed", ErrorCode: "SYS1_UPSTREAM_ERROR"})
	h.Rows[0].Status = "success"
	expectViolation(t, h.Observations, CheckAnswered, "p-1", "2 different answers")
}

func TestCheckDetectsASecondReleaseOfAHold(t *testing.T) {
	h := newHealthy()
	// bob labelled the item too, and a second, different reply went out.
	h.Labels = append(h.Labels, Label{RunID: "h-1", Question: "approve", Value: "false", Source: "review", Reviewer: "bob", Item: "rv-1", At: at(h.t0, 9.2), Seq: 3})
	h.Replies = append(h.Replies, Reply{RunID: "h-1", Seq: 100, At: at(h.t0, 9.6), Hash: hashOf("bob's"), Status: "success", ProviderAnswers: 1, Review: "reviewed", Reviewed: map[string]string{"approve": "false"}})
	r := Check(h.Observations)
	found := false
	for _, v := range r.Result(CheckHolds).Violations {
		found = found || (contains(v.RunIDs, "h-1") && strings.Contains(v.Detail, "released 2 times"))
	}
	if !found {
		t.Fatalf("no second release found: %+v", r.Result(CheckHolds))
	}
	found = false
	for _, v := range r.Result(CheckLabels).Violations {
		found = found || strings.Contains(v.Detail, "labelled twice")
	}
	if !found {
		t.Errorf("the second accepted label went unnoticed: %+v", r.Result(CheckLabels))
	}
}

func TestCheckDetectsAReleaseBeforeItsLabel(t *testing.T) {
	h := newHealthy()
	for i := range h.Labels {
		if h.Labels[i].RunID == "h-1" {
			h.Labels[i].At = at(h.t0, 9.8) // accepted after the reply went out
		}
	}
	expectViolation(t, h.Observations, CheckHolds, "h-1", "before its label")
}

func TestCheckDetectsAReplyWhileHeld(t *testing.T) {
	h := newHealthy()
	h.Replies = append(h.Replies, Reply{RunID: "h-1", Seq: 0, At: at(h.t0, 6.2), Hash: hashOf("pending"), Status: "success", ProviderAnswers: 1, Review: "pending"})
	expectViolation(t, h.Observations, CheckHolds, "h-1", "went out while the run was held")
}

func TestCheckDetectsAHoldNeverReleased(t *testing.T) {
	h := newHealthy()
	var kept []Reply
	for _, r := range h.Replies {
		if r.RunID != "h-1" {
			kept = append(kept, r)
		}
	}
	h.Replies = kept
	expectViolation(t, h.Observations, CheckHolds, "h-1", "labelled (approve) but never released")
}

func TestCheckDetectsABudgetOverspent(t *testing.T) {
	h := newHealthy()
	h.Replies[len(h.Replies)-1] = Reply{RunID: "b-2", Seq: 50, At: at(h.t0, 11.1), Hash: hashOf("b-2 ok"), Status: "success", ProviderAnswers: 1}
	h.Calls = append(h.Calls, Call{Key: "b-2", Slot: 2, Started: at(h.t0, 11.05), Ended: at(h.t0, 11.07), Answered: true})
	for i := range h.Rows {
		if h.Rows[i].RunID == "b-2" {
			h.Rows[i].Status = "success"
		}
	}
	expectViolation(t, h.Observations, CheckBudgets, "", "2 decisions admitted under a budget of 1")
}

func TestCheckDetectsABudgetRefusedTooEarly(t *testing.T) {
	h := newHealthy()
	h.Budgets[0].Limit = 2
	expectViolation(t, h.Observations, CheckBudgets, "", "with only 1 of its 2 decisions admitted")
}

// TestCheckExcusesRefusalsWhileAFailingRunHeldTheBudget: a run charged while it ran and
// refunded when it failed in the end may have refused another meanwhile.
func TestCheckExcusesRefusalsWhileAFailingRunHeldTheBudget(t *testing.T) {
	h := newHealthy()
	h.Budgets[0].Limit = 2
	h.Requests = append(h.Requests, Request{RunID: "b-3", Caller: "soak-budget", Kind: KindBudget, Key: "b-3", PublishedAt: at(h.t0, 10.5), AckedAt: at(h.t0, 10.5)})
	h.Replies = append(h.Replies, Reply{RunID: "b-3", Seq: 60, At: at(h.t0, 12), Hash: hashOf("b-3 failed"), Status: "failed", ErrorCode: "SYS1_UPSTREAM_ERROR"})
	h.Rows = append(h.Rows, Row{RunID: "b-3", Caller: "soak-budget", Status: "failed"})
	r := Check(h.Observations)
	if res := r.Result(CheckBudgets); len(res.Violations) != 0 || len(res.Notes) != 1 || !strings.Contains(res.Notes[0], "1 runs that failed in the end still held their charge") {
		t.Fatalf("budget check: %+v", res)
	}
}

func TestCheckDetectsMissingAndDoubledBatchLines(t *testing.T) {
	h := newHealthy()
	h.Batches[0].Lines = h.Batches[0].Lines[:1]
	h.Rows = h.Rows[:len(h.Rows)-1] // no line, no record expected either
	h.Calls = h.Calls[:len(h.Calls)-1]
	h.Batches[0].Items[1].Key = "bt:i-2"
	expectViolation(t, h.Observations, CheckBatch, "i-2", "have no result line")

	h = newHealthy()
	h.Batches[0].Lines = append(h.Batches[0].Lines, BatchLine{CustomID: "i-1", RunID: "bt:i-1", Status: "success", Line: 3})
	expectViolation(t, h.Observations, CheckBatch, "i-1", "more than one result line")
}

// A batch whose command never wrote its result file is one violation, of the batch check: its
// items' scorings and records are not judged again as strays.
func TestCheckReportsAnUnfinishedBatchOnce(t *testing.T) {
	h := newHealthy()
	h.Batches[0].Finished, h.Batches[0].ExitCode, h.Batches[0].Lines = false, 2, nil
	expectViolation(t, h.Observations, CheckBatch, "", "never wrote its result file (exit status 2)")
}

func TestCheckDetectsAMissingOrWrongRecord(t *testing.T) {
	h := newHealthy()
	h.Rows = h.Rows[1:] // p-1's record is gone
	expectViolation(t, h.Observations, CheckRecords, "p-1", "no record in ClickHouse")

	h = newHealthy()
	h.Rows[0].Status = "failed"
	expectViolation(t, h.Observations, CheckRecords, "", "another status than the run's reply")

	h = newHealthy()
	h.Rows = append(h.Rows, Row{RunID: "p-1", Caller: "soak-plain", Status: "success"})
	expectViolation(t, h.Observations, CheckRecords, "p-1", "more than one record under FINAL")
}

func TestCheckDetectsLostLabels(t *testing.T) {
	h := newHealthy()
	h.SentLabels = append(h.SentLabels, SentLabel{RunID: "p-2", Question: "label", Value: `"bug"`, AckedAt: at(h.t0, 31)})
	expectViolation(t, h.Observations, CheckLabels, "p-2/label", "never accepted")

	h = newHealthy()
	h.LabelRows = h.LabelRows[:1]
	expectViolation(t, h.Observations, CheckLabels, "p-1/label", "no row in ClickHouse")
}

func TestCheckDetectsAPendingConsumer(t *testing.T) {
	h := newHealthy()
	h.Consumers[1].AckPending = 3
	expectViolation(t, h.Observations, CheckConsumers, "", "consumer sys1-sink on SYS1_RUNS: 0 pending, 3 unacknowledged")
}

func TestCheckDetectsARequestLeftInTheWorkQueue(t *testing.T) {
	h := newHealthy()
	h.Leftovers = []Leftover{{Stream: "SYS1_REQUESTS", Msgs: 15, FirstSeq: 65742}}
	expectViolation(t, h.Observations, CheckConsumers, "", "work queue SYS1_REQUESTS still holds 15 messages at the end (the first at sequence 65742)")
}

func TestCheckDetectsAProcessThatExitedOnItsOwn(t *testing.T) {
	h := newHealthy()
	h.Workers[1].Ended, h.Workers[1].ExitCode = at(h.t0, 53), 2
	h.Workers[1].LogTail = `{"level":"error","message":"cannot start the worker"}`
	expectViolation(t, h.Observations, CheckProcesses, "", "w1 (incarnation 2, pid 0) exited on its own with status 2")
}

func TestReplyParsesThePublicSchema(t *testing.T) {
	body := `{"run_id":"h-1","status":"success","result":{"provider":"ollama"},"verdicts":{"label":{"status":"decided","rule":"","reason":"no rule matched"},"approve":{"status":"reviewed","rule":"hold","reason":"P(yes) 0.41 in [0, 1]","label":true,"reviewer":"alice"}},"review":{"status":"reviewed","item":"rv-x"},"error":null,"attempts":[{"provider":"ollama","outcome":"timeout","delivery":1},{"provider":"ollama","outcome":"ok","delivery":2}],"queued_ms":0,"latency_ms":3}`
	r, err := ParseReply("", 7, at(time.Unix(0, 0), 0), hashOf(body), []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	if r.RunID != "h-1" || r.Status != "success" || r.Review != "reviewed" || r.ProviderAnswers != 1 || r.CacheHit || r.Reviewed["approve"] != "true" || len(r.Reviewed) != 1 {
		t.Fatalf("%+v", r)
	}
	body = `{"run_id":"c-2","status":"failed","result":null,"error":{"code":"SYS1_BUDGET_EXCEEDED","message":"…","status":429},"attempts":[{"outcome":"cache"}]}`
	if r, err = ParseReply("c-2", 8, time.Time{}, hashOf(body), []byte(body)); err != nil || r.ErrorCode != "SYS1_BUDGET_EXCEEDED" || !r.CacheHit || r.ProviderAnswers != 0 {
		t.Fatalf("%+v %v", r, err)
	}
}

func TestCheckAcceptsAHeldCallersRunThatFailedBeforeItHadAnAnswer(t *testing.T) {
	h := newHealthy()
	h.Requests = append(h.Requests, Request{RunID: "h-2", Caller: "soak-hold", Kind: KindHold, Key: "h-2", PublishedAt: at(h.t0, 40), AckedAt: at(h.t0, 40.001)})
	h.Calls = append(h.Calls, Call{Key: "h-2", Slot: 1, Started: at(h.t0, 40.1), Ended: at(h.t0, 40.2), Fault: "status 503"})
	h.Replies = append(h.Replies, Reply{RunID: "h-2", Seq: 100, At: at(h.t0, 45), Hash: hashOf("h-2 failed"), Status: "failed", ErrorCode: "SYS1_PROVIDER_BUSY"})
	h.Rows = append(h.Rows, Row{RunID: "h-2", Caller: "soak-hold", Status: "failed"})
	r := Check(h.Observations)
	for _, res := range r.Results {
		if len(res.Violations) > 0 {
			t.Fatalf("check %q: %v", res.Check, res.Violations)
		}
	}
	if notes := strings.Join(r.Result(CheckHolds).Notes, " "); !strings.Contains(notes, "1 held caller's runs failed before they had an answer") {
		t.Errorf("holds notes: %q", notes)
	}
}

func TestCheckDetectsAReviewOfAnAnswerTheRunNeverGave(t *testing.T) {
	h := newHealthy()
	for i := range h.Replies {
		if h.Replies[i].RunID == "h-1" { // the run failed, yet a reviewer labelled its item
			h.Replies[i] = Reply{RunID: "h-1", Seq: h.Replies[i].Seq, At: h.Replies[i].At, Hash: hashOf("h-1 failed"), Status: "failed", ErrorCode: "SYS1_PROVIDER_UNAVAILABLE"}
		}
	}
	for i := range h.Rows {
		if h.Rows[i].RunID == "h-1" {
			h.Rows[i].Status = "failed"
		}
	}
	// Its record is one the soak never saw answered, too: two views of one fault.
	for _, v := range Check(h.Observations).Result(CheckHolds).Violations {
		if contains(v.RunIDs, "h-1") && strings.Contains(v.Detail, "went out while the run was held") {
			return
		}
	}
	t.Fatal("a failed run whose review a person labelled passed the holds check")
}
