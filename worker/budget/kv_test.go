package budget

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sys1hq/sys1/worker/natsconn/natstest"
)

// TestQueuedOperationsShareABatchAndCancelCleanly: while one operation on a key is being
// written, the ones queued behind it go in the next batch together (one write), and one
// whose context ends while it is still queued is dropped without ever running.
func TestQueuedOperationsShareABatchAndCancelCleanly(t *testing.T) {
	_, reps := fleet(t, 1, nil)
	b := reps[0].b
	ctx := context.Background()
	appendByte := func(c byte, ran *atomic.Int32) func([]byte) ([]byte, error) {
		return func(cur []byte) ([]byte, error) {
			ran.Add(1)
			return append(append([]byte(nil), cur...), c), nil
		}
	}
	hold, entered := make(chan struct{}), make(chan struct{})
	var ranA, ranB, ranC, ranD atomic.Int32
	first := make(chan error, 1)
	go func() {
		first <- b.update(ctx, "q", 1, func(cur []byte) ([]byte, error) {
			if ranA.Add(1) == 1 {
				close(entered)
				<-hold
			}
			return []byte("a"), nil
		})
	}()
	<-entered
	// b and d queue behind a, in that order; c queues between them and gives up before its
	// turn.
	queued := func(n int) {
		natstest.WaitFor(t, 5*time.Second, "operations queued", func() bool {
			st := b.state("q")
			st.mu.Lock()
			defer st.mu.Unlock()
			return len(st.pending) == n
		})
	}
	results := make(chan error, 3)
	go func() { results <- b.update(ctx, "q", 1, appendByte('b', &ranB)) }()
	queued(1)
	cctx, cancel := context.WithCancel(ctx)
	cDone := make(chan error, 1)
	go func() { cDone <- b.update(cctx, "q", 1, appendByte('c', &ranC)) }()
	queued(2)
	go func() { results <- b.update(ctx, "q", 1, appendByte('d', &ranD)) }()
	queued(3)
	cancel()
	if err := <-cDone; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled while queued: %v", err)
	}
	close(hold)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := <-results; err != nil {
			t.Fatal(err)
		}
	}
	if ranC.Load() != 0 {
		t.Fatal("a cancelled operation ran")
	}
	entry, err := reps[0].kv.Get(ctx, "q")
	if err != nil {
		t.Fatal(err)
	}
	if got := string(entry.Value()); got != "abd" {
		t.Fatalf("value %q, want abd", got)
	}
	st := b.Stats()
	if st.Operations != 4 || st.Batches != 2 {
		t.Fatalf("stats %+v: want 4 operations in 2 batches (b and d together)", st)
	}
}
