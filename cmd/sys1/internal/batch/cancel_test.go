package batch_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sys1hq/sys1/cmd/sys1/internal/batch"
	"github.com/sys1hq/sys1/cmd/sys1/internal/batch/batchtest"
)

// TestBatchCancelMidway: cancelling a batch while it runs removes its queued requests; the run
// sees the marker, finishes with the finished items' results and every other item cancelled
// (no provider call for them); status counts the same; a later run of the batch writes the
// same output without calling the provider, and cancelling again keeps the first cancel time.
func TestBatchCancelMidway(t *testing.T) {
	const n = 300
	d := newDeployment(t)
	resp := d.responder(t, batchtest.Options{Concurrency: 4, Delay: func(string) time.Duration { return 3 * time.Millisecond }})
	lines := make([]string, n)
	for i := range n {
		lines[i] = fmt.Sprintf(`{"custom_id":"t-%d","body":%s}`, i, request(i))
	}
	path := writeLines(t, "c.jsonl", lines)
	out := filepath.Join(t.TempDir(), "c.out")
	cfg := batch.RunConfig{Caller: "svc", InFlight: 32, CancelPoll: 20 * time.Millisecond}
	var warned []string
	cfg.Warn = func(s string) { warned = append(warned, s) }
	done := make(chan runResult, 1)
	nc := d.client(t, "svc")
	go func() { done <- runBatch(context.Background(), t, nc, batch.Input{Path: path}, out, cfg) }()
	waitFor(t, 30*time.Second, "a third of the batch answered", func() bool { return len(resp.AllCalls()) >= n/3 })

	_, js := d.nc, d.js
	plan, _ := batch.Scan(context.Background(), batch.Input{Path: path}, nil)
	id := batch.DeriveBatchID(plan.InputHash, "svc", batch.Input{Path: path}.Fingerprint())
	rep, err := batch.Cancel(context.Background(), d.nc, js, batch.Names{}, id, "", time.Now(), 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if rep.AlreadyCancelled || rep.Purged == 0 {
		t.Errorf("cancel: %+v (a window of 32 was queued)", rep)
	}
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	s := r.summary
	if s.Succeeded+s.Cancelled != n || s.Cancelled == 0 || s.Failed != 0 || s.Succeeded < n/3 {
		t.Fatalf("after cancel: %d succeeded, %d cancelled, %d failed", s.Succeeded, s.Cancelled, s.Failed)
	}
	if len(warned) == 0 || !strings.Contains(warned[0], "was cancelled at") {
		t.Errorf("the run did not say it saw the cancel: %q", warned)
	}
	calls := resp.AllCalls()
	for _, l := range readOut(t, out) {
		switch l.Status {
		case batch.StatusSuccess:
			if calls[l.RunID] != 1 {
				t.Errorf("%s succeeded with %d provider calls", l.RunID, calls[l.RunID])
			}
		case batch.StatusCancelled:
			if l.Error == nil || l.Error.Code != "SYS1_EXPIRED" || !strings.Contains(l.Error.Message, rep.CancelledAt.Format(time.RFC3339Nano)) {
				t.Errorf("cancelled line: %+v", l)
			}
		default:
			t.Errorf("line %d: status %s", l.Line, l.Status)
		}
	}
	// A provider call already running when the batch was cancelled may finish unrecorded; none
	// starts after.
	if total := len(calls); total > s.Succeeded+4 {
		t.Errorf("%d items called the provider, %d succeeded: cancelled items were run", total, s.Succeeded)
	}

	var st *batch.StatusReport
	waitFor(t, 10*time.Second, "the stream to drain", func() bool {
		st, err = batch.Status(context.Background(), js, batch.Names{}, id, "svc")
		return err == nil && st.InStream == 0
	})
	if st.Succeeded != s.Succeeded || st.Cancelled != s.Cancelled || st.Running != 0 || st.Failed != 0 || st.CancelledAt == nil {
		t.Errorf("status %+v, summary %d succeeded %d cancelled", st, s.Succeeded, s.Cancelled)
	}

	before := len(resp.AllCalls())
	out2 := filepath.Join(t.TempDir(), "again.out")
	r2 := runBatch(context.Background(), t, nc, batch.Input{Path: path}, out2, cfg)
	if r2.err != nil {
		t.Fatal(r2.err)
	}
	if string(mustRead(t, out)) != string(mustRead(t, out2)) {
		t.Error("a later run of the cancelled batch writes other lines")
	}
	if after := len(resp.AllCalls()); after != before {
		t.Errorf("the later run called the provider for %d more items", after-before)
	}
	again, err := batch.Cancel(context.Background(), d.nc, js, batch.Names{}, id, "", time.Now(), 100*time.Millisecond)
	if err != nil || !again.AlreadyCancelled || !again.CancelledAt.Equal(rep.CancelledAt) {
		t.Errorf("second cancel: %+v %v", again, err)
	}
}

// TestBatchStatusOfUnknownBatch: nothing is known, and bad ids are refused.
func TestBatchStatusOfUnknownBatch(t *testing.T) {
	d := newDeployment(t)
	st, err := batch.Status(context.Background(), d.js, batch.Names{}, "nope", "")
	if err != nil || st.Known() {
		t.Errorf("before any worker: %+v %v", st, err)
	}
	d.responder(t, batchtest.Options{})
	st, err = batch.Status(context.Background(), d.js, batch.Names{}, "nope", "")
	if err != nil || st.Known() {
		t.Errorf("unknown batch: %+v %v", st, err)
	}
	if _, err := batch.Status(context.Background(), d.js, batch.Names{}, "a.b", ""); err == nil {
		t.Error("a batch id with a dot was accepted")
	}
	if _, err := batch.Cancel(context.Background(), d.nc, d.js, batch.Names{}, "x", "a b", time.Now(), 0); err == nil {
		t.Error("a caller with a space was accepted")
	}
}
