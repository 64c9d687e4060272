package worker_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/provider/ollamatest"
	"github.com/sys1hq/sys1/worker/client"
)

// TestAdaptiveConcurrencyDoesNotParkCallsInTheModel: against a model that serves two calls at
// once and queues the rest (Ollama with a loaded model), a replica allowed 16 calls parks far
// fewer in the model's queue in adaptive mode than the 14 that fixed mode parks — the queue
// that makes calls outlive their timeout when the fleet grows. Every run is answered either way.
func TestAdaptiveConcurrencyDoesNotParkCallsInTheModel(t *testing.T) {
	for _, mode := range []string{"fixed", "adaptive"} {
		t.Run(mode, func(t *testing.T) {
			h := newHarness(t, ollamatest.WithCapacity(ollamatest.Capacity{Slots: 2, Base: 10 * time.Millisecond}))
			h.start(func(o *replicaOpts) {
				o.cfg.Concurrency, o.cfg.FetchBatch, o.cfg.ConcurrencyMode = 16, 16, mode
			})
			// Rounds of 16 producers × 8 runs, until the round has shown what the mode is
			// checked for. On a CPU-starved machine (the race detector beside other tests) one
			// round may not: the producers may not keep 16 calls going for fixed mode to park
			// its 12, and adaptive mode, which starts at 1 and grows only on windows as fast as
			// its baseline, may not yet have learnt that 2 is safe.
			shown := func() bool {
				if mode == "fixed" {
					return h.fake.Queue().MaxWaiting >= 12
				}
				return h.fake.MaxConcurrent() >= 2
			}
			deadline := time.Now().Add(30 * time.Second)
			rounds := 0
			for ; rounds == 0 || (!shown() && time.Now().Before(deadline)); rounds++ {
				round := rounds
				var wg sync.WaitGroup
				for p := range 16 {
					wg.Go(func() {
						for i := range 8 {
							if rep := h.decide("svc-a", []byte(ticket), func(r *client.Request) { r.RunID = fmt.Sprintf("%s-%d-%d-%d", mode, round, p, i) }); rep.Status != contract.StatusSuccess {
								t.Errorf("reply %s", rep.Raw)
							}
						}
					})
				}
				wg.Wait()
			}
			q := h.fake.Queue()
			t.Logf("%s: most calls waiting in the model's queue %d, peak %d calls, %d rounds", mode, q.MaxWaiting, h.fake.MaxConcurrent(), rounds)
			switch {
			case mode == "fixed" && q.MaxWaiting < 12:
				t.Errorf("fixed 16 against 2 slots parked only %d calls: the test shows nothing", q.MaxWaiting)
			case mode == "adaptive" && q.MaxWaiting > 8:
				t.Errorf("adaptive mode parked %d calls in the model's queue", q.MaxWaiting)
			case mode == "adaptive" && h.fake.MaxConcurrent() < 2:
				t.Errorf("adaptive mode never used both of the model's slots (peak %d calls)", h.fake.MaxConcurrent())
			}
		})
	}
}
