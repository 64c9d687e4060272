package worker_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/worker/client"
)

// TestMeasureInteractiveFirst is a measurement, not a check (CI does not run it): issue 14's
// priority figure for deploy/performance.md. One replica (SYS1_CONCURRENCY 8) against a 20 ms
// model: the interactive p99 of a steady closed-loop load alone, the same load while a
// 20,000-item batch drains, and the batch's own throughput with nothing interactive, against
// the provider bound (concurrency ÷ latency).
//
//	SYS1_MEASURE_PRIORITY=1 go test -run MeasureInteractiveFirst -v -timeout 30m ./worker/
func TestMeasureInteractiveFirst(t *testing.T) {
	if os.Getenv("SYS1_MEASURE_PRIORITY") == "" {
		t.Skip("a measurement: set SYS1_MEASURE_PRIORITY=1 to run it")
	}
	const (
		latency     = 20 * time.Millisecond
		concurrency = 8
		items       = 20000
		producers   = 2   // interactive callers, each one request at a time
		perProducer = 150 // interactive requests each
	)
	interactive := func(h *harness, tag string) []time.Duration {
		var mu sync.Mutex
		var lat []time.Duration
		var wg sync.WaitGroup
		for p := range producers {
			wg.Go(func() {
				for i := range perProducer {
					start := time.Now()
					rep := h.decide("svc-a", []byte(ticket), func(r *client.Request) { r.RunID = fmt.Sprintf("%s-%d-%d", tag, p, i) })
					if rep.Status != contract.StatusSuccess {
						t.Errorf("interactive: %s", rep.Raw)
					}
					mu.Lock()
					lat = append(lat, time.Since(start))
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		slices.Sort(lat)
		return lat
	}
	p := func(lat []time.Duration, q float64) time.Duration {
		return lat[min(int(q*float64(len(lat))), len(lat)-1)]
	}
	setup := func() *harness {
		h := newHarness(t)
		h.fake.SetLatency(latency)
		h.start(func(o *replicaOpts) { o.cfg.Concurrency, o.cfg.FetchBatch = concurrency, concurrency })
		return h
	}

	alone := interactive(setup(), "alone")

	h := setup()
	h.publishBatch("drain", items, "")
	waitFor(t, "the batch draining", time.Minute, func() bool { return h.fake.Calls() >= 200 })
	during := interactive(h, "during")
	remaining := h.pending()

	b := setup()
	start := time.Now()
	b.publishBatch("throughput", items, "")
	waitFor(t, "the batch drained", 30*time.Minute, func() bool { return b.fake.Calls() >= items })
	took := time.Since(start)
	bound := float64(concurrency) / latency.Seconds()
	rate := float64(items) / took.Seconds()
	t.Logf("interactive alone: p50 %s p99 %s; while a %d-item batch drained (%d still queued at the end): p50 %s p99 %s; p99 difference %s (one provider call: %s)",
		p(alone, 0.5), p(alone, 0.99), items, remaining, p(during, 0.5), p(during, 0.99), p(during, 0.99)-p(alone, 0.99), latency)
	t.Logf("batch alone: %d items in %s = %.0f/s; provider bound %.0f/s; ratio %.3f", items, took.Round(time.Millisecond), rate, bound, rate/bound)
	_ = context.Background
}
