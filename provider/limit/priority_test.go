package limit

import (
	"context"
	"sync"
	"testing"
	"time"
)

// TestUrgentWaitersGoFirst: with every slot taken, a waiter marked Urgent is handed the next
// free slot before those that waited longer without the mark — for both limiters — and a
// waiter that gives up leaves the queue without taking a slot.
func TestUrgentWaitersGoFirst(t *testing.T) {
	for name, lim := range map[string]Limiter{"fixed": NewFixed(1), "adaptive": mustAdaptive(t)} {
		t.Run(name, func(t *testing.T) {
			held, err := lim.Acquire(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			order := make(chan string, 3)
			// done: every waiter has returned, its slot given back (each says its label
			// before releasing, so that the labels come in the order the slots were handed)
			var done sync.WaitGroup
			done.Add(4)
			wait := func(label string, ctx context.Context) {
				defer done.Done()
				tok, err := lim.Acquire(ctx)
				if err != nil {
					return
				}
				order <- label
				tok.Release(Result{Ignore: true})
			}
			gone, cancel := context.WithCancel(context.Background())
			go wait("batch-1", context.Background())
			waitQueued(t, lim, 1)
			go wait("abandoned", gone)
			waitQueued(t, lim, 2)
			go wait("batch-2", context.Background())
			waitQueued(t, lim, 3)
			go wait("interactive", Urgent(context.Background()))
			waitQueued(t, lim, 4)
			cancel()
			waitQueued(t, lim, 3)
			held.Release(Result{Ignore: true})
			var got []string
			for range 3 {
				select {
				case l := <-order:
					got = append(got, l)
				case <-time.After(10 * time.Second):
					t.Fatalf("order so far %v", got)
				}
			}
			if got[0] != "interactive" || got[1] != "batch-1" || got[2] != "batch-2" {
				t.Fatalf("order %v, want interactive, batch-1, batch-2", got)
			}
			done.Wait()
			if n := lim.InFlight(); n != 0 {
				t.Fatalf("%d slots still held", n)
			}
		})
	}
}

func mustAdaptive(t *testing.T) *Adaptive {
	t.Helper()
	cfg := DefaultAdaptiveConfig(1)
	a, err := NewAdaptive(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// waitQueued waits until n calls wait for lim.
func waitQueued(t *testing.T, lim Limiter, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for queued(lim) != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d waiters, want %d", queued(lim), n)
		}
		time.Sleep(time.Millisecond)
	}
}

func queued(lim Limiter) int {
	switch l := lim.(type) {
	case *Fixed:
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.waiters.len()
	case *Adaptive:
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.waiters.len()
	}
	return -1
}
