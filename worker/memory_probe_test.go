package worker_test

import (
	"context"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/worker/client"
)

// TestMeasureInvalidBurstMemory is a measurement, not a check (CI does not run it): what a
// burst of maximal invalid bodies costs a replica at default settings (SYS1_CONCURRENCY 8,
// SYS1_FETCH_BATCH 16, 8 MiB messages) — the peak Go heap of the process (worker and the
// in-process nats-server together) while it refuses them, and how long a valid request
// published behind them waits. README (Operating it) quotes its figures.
//
//	SYS1_MEASURE_MEMORY=1 go test -run MeasureInvalidBurstMemory -v ./worker/
func TestMeasureInvalidBurstMemory(t *testing.T) {
	if os.Getenv("SYS1_MEASURE_MEMORY") == "" {
		t.Skip("a measurement: set SYS1_MEASURE_MEMORY=1 to run it")
	}
	const bodies, size = 200, 8<<20 - 8<<10
	h := newHarnessWith(t, func(o *server.Options) { o.MaxPayload = 8 << 20 })
	h.topo.MaxMsgSize = 8 << 20
	h.start(func(o *replicaOpts) { o.cfg.Concurrency, o.cfg.FetchBatch = measureConcurrency(), 16 })
	body := invalidBody(size)
	var peak atomic.Uint64
	stop := make(chan struct{})
	go func() {
		var ms runtime.MemStats
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			runtime.ReadMemStats(&ms)
			if ms.HeapInuse > peak.Load() {
				peak.Store(ms.HeapInuse)
			}
		}
	}()
	runtime.GC()
	var base runtime.MemStats
	runtime.ReadMemStats(&base)
	ctx := context.Background()
	start := time.Now()
	for range bodies {
		if _, err := h.cl.Publish(ctx, client.Request{Caller: "svc-a", Body: body}); err != nil {
			t.Fatal(err)
		}
	}
	published := time.Now()
	rep := h.decide("svc-a", []byte(ticket))
	waited := time.Since(published)
	close(stop)
	if rep.Status != contract.StatusSuccess {
		t.Fatalf("the valid request: %s", rep.Raw)
	}
	var failed int
	for _, rec := range h.records() {
		if rec.ErrorCode == contract.CodeInvalidInput {
			failed++
		}
	}
	t.Logf("%d invalid bodies of %d MiB: published in %s; heap in use before %d MiB, peak %d MiB; the valid request behind them answered after %s; %d refusals recorded",
		bodies, size>>20, published.Sub(start).Round(time.Millisecond), base.HeapInuse>>20, peak.Load()>>20, waited.Round(time.Millisecond), failed)
}

// invalidBody is a body of n bytes that breaks the contract only at its end: a huge state,
// then an unknown field, so the decoder reads all of it before refusing it.
func invalidBody(n int) []byte {
	tail := `","questions":{"q":{"type":"noul","instructions":"x"}},"bogus":1}`
	head := `{"state":"`
	return []byte(head + strings.Repeat("s", max(n-len(head)-len(tail), 0)) + tail)
}

func measureConcurrency() int {
	if v := os.Getenv("SYS1_MEASURE_CONCURRENCY"); v != "" {
		n, _ := strconv.Atoi(v)
		return max(n, 1)
	}
	return 8
}
