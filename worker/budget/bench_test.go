package budget

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sys1hq/sys1/worker/limits"
)

// reportLatency reports the median and 99th percentile of the per-operation latencies: the
// issue's budget (0.2 ms per decision for the budget and cache stages) is a median.
func reportLatency(b *testing.B, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1e3, "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*90/100].Nanoseconds())/1e3, "p90-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds())/1e3, "p99-µs")
}

// Limits too high to be reached: every admission is admitted and written.
var benchRules = map[string]limits.Rule{
	"rate":            {Name: "b", Caller: "*", DecisionsPerMinute: 1e9},
	"rate+tokens+usd": {Name: "b", Caller: "*", DecisionsPerMinute: 1e9, InputTokensPerDay: 1e15, USDPerDay: 1e9},
	"all+in_flight":   {Name: "b", Caller: "*", DecisionsPerMinute: 1e9, InputTokensPerDay: 1e15, USDPerDay: 1e9, InFlight: 10_000},
}

// BenchmarkAdmitSettle is one decision's budget stage on one replica: Admit, then Settle with
// a usage other than the estimate (so it writes), then Release.
func BenchmarkAdmitSettle(b *testing.B) {
	for _, name := range []string{"rate", "rate+tokens+usd", "all+in_flight"} {
		rule := benchRules[name]
		b.Run(name, func(b *testing.B) {
			_, reps := fleet(b, 1, nil)
			bud, ctx := reps[0].b, context.Background()
			usd := 0.0002
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for range b.N {
				start := time.Now()
				d, err := bud.Admit(ctx, "bench", rule, Estimate{InputTokens: 500, USD: 0.0003})
				if err != nil || d.Outcome != Admitted {
					b.Fatal(d, err)
				}
				if err := d.Ticket.Settle(ctx, Actual{InputTokens: 420, USD: &usd}); err != nil {
					b.Fatal(err)
				}
				if err := d.Ticket.Release(ctx); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(start))
			}
			b.StopTimer()
			reportLatency(b, lat)
		})
	}
}

// BenchmarkAdmitSettleContended: 3 replicas and 16 producers admitting for one caller, as in
// the acceptance test: what contention costs each decision.
func BenchmarkAdmitSettleContended(b *testing.B) {
	rule := benchRules["rate+tokens+usd"]
	_, reps := fleet(b, 3, nil)
	ctx := context.Background()
	usd := 0.0002
	var mu sync.Mutex
	lat := make([]time.Duration, 0, b.N)
	var wg sync.WaitGroup
	work := make(chan struct{}, b.N)
	for range b.N {
		work <- struct{}{}
	}
	close(work)
	b.ResetTimer()
	for p := range producers {
		rep := reps[p%3]
		wg.Go(func() {
			var mine []time.Duration
			for range work {
				start := time.Now()
				for {
					d, err := rep.b.Admit(ctx, "bench", rule, Estimate{InputTokens: 500, USD: 0.0003})
					if err != nil {
						b.Error(err)
						return
					}
					if d.Outcome == Admitted {
						if err := d.Ticket.Settle(ctx, Actual{InputTokens: 420, USD: &usd}); err != nil {
							b.Error(err)
						}
						break
					}
				}
				mine = append(mine, time.Since(start))
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	b.StopTimer()
	reportLatency(b, lat)
	var st Stats
	for _, r := range reps {
		s := r.b.Stats()
		st.Attempts += s.Attempts
		st.Operations += s.Operations
		st.Conflicts += s.Conflicts
		st.Batches += s.Batches
		st.Exhausted += s.Exhausted
	}
	b.ReportMetric(float64(st.Conflicts)/float64(st.Operations), "lost-CAS/op")
	b.ReportMetric(float64(st.Operations)/float64(st.Batches), "ops/batch")
	b.ReportMetric(float64(st.Exhausted), "gave-up")
}

// BenchmarkKVRoundTrip is the floor every figure above stands on: one KV read of an existing
// key, on the same server.
func BenchmarkKVRoundTrip(b *testing.B) {
	_, reps := fleet(b, 1, nil)
	ctx := context.Background()
	if _, err := reps[0].kv.Put(ctx, "k", []byte("{}")); err != nil {
		b.Fatal(err)
	}
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		if _, err := reps[0].kv.Get(ctx, "k"); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	reportLatency(b, lat)
}
