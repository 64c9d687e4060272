package batch_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sys1hq/sys1/cmd/sys1/internal/batch"
	"github.com/sys1hq/sys1/cmd/sys1/internal/batch/batchtest"
)

// TestBatchTenThousandLines: thousands of lines (3,000; SYS1_TEST_BATCH_LINES=10000 for the
// 10,000 of issue 14), 1% of them invalid in every way a line can be,
// through a real nats-server and a responder that answers out of order, twice for some items,
// and loses some first replies. Every valid line is answered exactly once (one provider call),
// the output has one line per input line in input order, and the invalid lines are in the
// errors file with their line numbers.
func TestBatchTenThousandLines(t *testing.T) {
	n := 3000
	if v, err := strconv.Atoi(os.Getenv("SYS1_TEST_BATCH_LINES")); err == nil && v >= 300 {
		n = v
	}
	d := newDeployment(t)
	resp := d.responder(t, batchtest.Options{Concurrency: 16, DuplicateEvery: 50, LoseEvery: 200})
	lines := make([]string, n)
	invalidAt := map[int]int{} // line number → invalidLines index
	for i := range n {
		if i%100 == 37 {
			k := (i / 100) % len(invalidLines)
			lines[i] = strings.ReplaceAll(invalidLines[k].line, "CID", fmt.Sprintf("bad-%d", i))
			invalidAt[i+1] = k
			continue
		}
		if i%2 == 0 {
			lines[i] = fmt.Sprintf(`{"custom_id":"t-%d","body":%s}`, i, request(i))
		} else {
			lines[i] = request(i) // no custom id: the line number names it
		}
	}
	path := writeLines(t, "tickets.jsonl", lines)
	out := path + ".results.jsonl"
	res := runBatch(context.Background(), t, d.client(t, "analytics"), batch.Input{Path: path}, out,
		batch.RunConfig{Caller: "analytics", InFlight: 64, ResendAfter: 100 * time.Millisecond})
	if res.err != nil {
		t.Fatal(res.err)
	}
	if res.plan.Entries != n || res.plan.Invalid != len(invalidAt) {
		t.Fatalf("plan: %d entries, %d invalid; want %d, %d", res.plan.Entries, res.plan.Invalid, n, len(invalidAt))
	}
	got := readOut(t, out)
	if len(got) != n {
		t.Fatalf("%d output lines, want %d", len(got), n)
	}
	calls := resp.AllCalls()
	for i, l := range got {
		wantID := strconv.Itoa(i + 1)
		if i%2 == 0 && invalidAt[i+1] == 0 && i%100 != 37 {
			wantID = fmt.Sprintf("t-%d", i)
		}
		if l.Line != i+1 {
			t.Fatalf("output line %d is input line %d: not in input order", i+1, l.Line)
		}
		if k, bad := invalidAt[i+1]; bad {
			if l.Status != batch.StatusInvalid || l.Error == nil || l.Error.Code != invalidLines[k].code || !strings.Contains(l.Error.Message, invalidLines[k].want) {
				t.Fatalf("line %d: %+v, want invalid %s %q", i+1, l, invalidLines[k].code, invalidLines[k].want)
			}
			if calls[l.RunID] != 0 {
				t.Fatalf("invalid line %d was sent", i+1)
			}
			continue
		}
		if l.CustomID != wantID || l.Status != batch.StatusSuccess || len(l.Result) == 0 {
			t.Fatalf("line %d: %+v, want success for custom id %s", i+1, l, wantID)
		}
		if !strings.HasPrefix(l.RunID, res.summary.BatchID+":") {
			t.Fatalf("line %d: run id %s is not under the batch id %s", i+1, l.RunID, res.summary.BatchID)
		}
		if c := calls[l.RunID]; c != 1 {
			t.Fatalf("line %d (%s): %d provider calls, want exactly 1", i+1, l.RunID, c)
		}
	}
	if len(calls) != n-len(invalidAt) {
		t.Errorf("%d runs called the provider, want %d", len(calls), n-len(invalidAt))
	}
	errs := readOut(t, batch.ErrorsPath(out))
	if len(errs) != len(invalidAt) {
		t.Fatalf("errors file: %d lines, want %d", len(errs), len(invalidAt))
	}
	for _, e := range errs {
		if _, ok := invalidAt[e.Line]; !ok || e.Status != batch.StatusInvalid {
			t.Errorf("errors file holds line %d (%s)", e.Line, e.Status)
		}
	}
	s := res.summary
	if s.Succeeded != n-len(invalidAt) || s.Invalid != len(invalidAt) || s.Failed != 0 || s.Lines != n {
		t.Errorf("summary counts: %+v", s)
	}
	if s.Resent == 0 || s.DuplicateReplies == 0 {
		t.Errorf("the responder lost and duplicated replies, yet the summary shows %d re-sent, %d duplicates", s.Resent, s.DuplicateReplies)
	}
	if len(s.Questions) != 3 || s.Questions[0].Name != "label" || s.Questions[0].Answered != s.Succeeded {
		t.Errorf("questions: %+v", s.Questions)
	}
	if _, err := os.Stat(out + batch.PartialSuffix); !os.IsNotExist(err) {
		t.Errorf("the .partial file is still there after a complete run: %v", err)
	}
}

// TestBatchResumeAfterInterruption: a run interrupted half way leaves only .partial files; the
// same command again answers the finished items from the gate (no second provider call) and
// writes output byte-identical to an uninterrupted run of the same batch elsewhere.
func TestBatchResumeAfterInterruption(t *testing.T) {
	const n = 600
	lines := make([]string, n)
	for i := range n {
		lines[i] = fmt.Sprintf(`{"custom_id":"t-%d","body":%s}`, i, request(i))
	}
	lines[10] = `{"custom_id":"broken","body":{`
	path := writeLines(t, "in.jsonl", lines)
	cfg := batch.RunConfig{Caller: "analytics", InFlight: 32, ResendAfter: 500 * time.Millisecond}

	// The reference: an uninterrupted run on its own deployment.
	ref := newDeployment(t)
	ref.responder(t, batchtest.Options{Concurrency: 8})
	refOut := filepath.Join(t.TempDir(), "ref.jsonl")
	if r := runBatch(context.Background(), t, ref.client(t, "analytics"), batch.Input{Path: path}, refOut, cfg); r.err != nil {
		t.Fatal(r.err)
	}

	d := newDeployment(t)
	resp := d.responder(t, batchtest.Options{Concurrency: 8, Delay: func(string) time.Duration { return 2 * time.Millisecond }})
	out := filepath.Join(t.TempDir(), "out.jsonl")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan runResult, 1)
	go func() { done <- runBatch(ctx, t, d.client(t, "analytics"), batch.Input{Path: path}, out, cfg) }()
	waitFor(t, 30*time.Second, "half the batch to be answered", func() bool { return len(resp.AllCalls()) >= n/2 })
	cancel()
	first := <-done
	if first.err == nil {
		t.Fatal("the interrupted run reported success")
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Fatalf("an interrupted run left %s under its final name", out)
	}
	if _, err := os.Stat(out + batch.PartialSuffix); err != nil {
		t.Fatalf("no .partial file after the interruption: %v", err)
	}
	second := runBatch(context.Background(), t, d.client(t, "analytics"), batch.Input{Path: path}, out, cfg)
	if second.err != nil {
		t.Fatal(second.err)
	}
	if first.summary.BatchID != second.summary.BatchID {
		t.Fatalf("the rerun named another batch: %s, then %s", first.summary.BatchID, second.summary.BatchID)
	}
	if a, b := mustRead(t, refOut), mustRead(t, out); string(a) != string(b) {
		t.Fatalf("the resumed output differs from an uninterrupted run's (%d and %d bytes)", len(a), len(b))
	}
	if a, b := mustRead(t, batch.ErrorsPath(refOut)), mustRead(t, batch.ErrorsPath(out)); string(a) != string(b) {
		t.Fatal("the resumed errors file differs from an uninterrupted run's")
	}
	for id, c := range resp.AllCalls() {
		if c != 1 {
			t.Errorf("%s: %d provider calls across the interruption, want 1", id, c)
		}
	}
	if got := len(resp.AllCalls()); got != n-1 {
		t.Errorf("%d items called the provider, want %d", got, n-1)
	}
}

// TestBatchWindowBoundsWhatIsOutstanding: with a responder that could take 64 requests at once,
// never more than --in-flight are published and unanswered.
func TestBatchWindowBoundsWhatIsOutstanding(t *testing.T) {
	const n, inFlight = 400, 8
	d := newDeployment(t)
	resp := d.responder(t, batchtest.Options{Concurrency: 64, Delay: func(string) time.Duration { return time.Millisecond }})
	lines := make([]string, n)
	for i := range n {
		lines[i] = request(i)
	}
	path := writeLines(t, "w.jsonl", lines)
	res := runBatch(context.Background(), t, d.client(t, "svc"), batch.Input{Path: path}, path+".out", batch.RunConfig{Caller: "svc", InFlight: inFlight})
	if res.err != nil {
		t.Fatal(res.err)
	}
	if got := resp.MaxOpen(); got > inFlight || got < inFlight/2 {
		t.Errorf("at most %d requests were open at once, want ≤ %d (and the window used)", got, inFlight)
	}
}

// TestBatchReorderBufferIsBounded: while the first item is held, later items are answered and
// wait to be written in order; no more than 2 × --in-flight items are taken from the input.
func TestBatchReorderBufferIsBounded(t *testing.T) {
	const n, inFlight = 200, 4
	d := newDeployment(t)
	release := make(chan struct{})
	lines := make([]string, n)
	for i := range n {
		lines[i] = fmt.Sprintf(`{"custom_id":"t-%d","body":%s}`, i, request(i))
	}
	resp := d.responder(t, batchtest.Options{Concurrency: 16, Delay: func(id string) time.Duration {
		if strings.HasSuffix(id, ":t-0") {
			<-release
		}
		return 0
	}})
	path := writeLines(t, "r.jsonl", lines)
	var mu sync.Mutex
	var last batch.Progress
	done := make(chan runResult, 1)
	go func() {
		done <- runBatch(context.Background(), t, d.client(t, "svc"), batch.Input{Path: path}, path+".out", batch.RunConfig{
			Caller: "svc", InFlight: inFlight, ProgressEvery: 10 * time.Millisecond,
			Progress: func(p batch.Progress) { mu.Lock(); last = p; mu.Unlock() },
		})
	}()
	waitFor(t, 20*time.Second, "every item but the held one in the window answered", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return last.Succeeded == 2*inFlight-1
	})
	if got := resp.Received(); got != 2*inFlight {
		t.Errorf("%d items were sent while the first was held; the window and the reorder buffer allow %d", got, 2*inFlight)
	}
	close(release)
	if r := <-done; r.err != nil || r.summary.Succeeded != n {
		t.Fatalf("after the release: %v %+v", r.err, r.summary)
	}
}
