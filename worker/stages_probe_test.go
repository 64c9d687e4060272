package worker_test

import (
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/worker/client"
)

// TestMeasureBudgetAndCacheStages is a measurement, not a check (CI does not run it): issue
// 16's figure for deploy/performance.md — what the budget and cache stages add to a decision
// at the median. One replica, a zero-latency fake, one producer deciding one request at a time
// (so latency, not throughput, is measured), in alternating rounds: no limits file; a rule
// with a rate limit, a token and a USD day budget and the cache on, every request distinct (a
// miss, then the budget, then the call, then the cache write); the same with an in-flight cap.
//
//	SYS1_MEASURE_STAGES=1 go test -run MeasureBudgetAndCacheStages -v ./worker/
func TestMeasureBudgetAndCacheStages(t *testing.T) {
	if os.Getenv("SYS1_MEASURE_STAGES") == "" {
		t.Skip("a measurement: set SYS1_MEASURE_STAGES=1 to run it")
	}
	const rounds, perRound = 5, 300
	configs := []struct {
		name   string
		limits string
	}{
		{"no limits", ""},
		{"rate, tokens, USD, cache", "rules:\n  - caller: svc-a\n    decisions_per_minute: 1000000\n    input_tokens_per_day: 1000000000\n    usd_per_day: 1000000\n    cache: 1h\n"},
		{"and in_flight", "rules:\n  - caller: svc-a\n    decisions_per_minute: 1000000\n    input_tokens_per_day: 1000000000\n    usd_per_day: 1000000\n    in_flight: 64\n    cache: 1h\n"},
	}
	hs := make([]*harness, len(configs))
	for i, c := range configs {
		hs[i] = newHarness(t)
		opt := func(*replicaOpts) {}
		if c.limits != "" {
			opt = withLimits(t, c.limits, centPerRun)
		}
		hs[i].start(opt)
	}
	lat := make([][]time.Duration, len(configs))
	for r := range rounds {
		for i, h := range hs {
			for k := range perRound {
				body := []byte(fmt.Sprintf(`{"state":"distinct %d %d","questions":{"q":{"type":"noul","instructions":"x"}}}`, r, k))
				start := time.Now()
				rep := h.decide("svc-a", body, func(rq *client.Request) { rq.RunID = fmt.Sprintf("m-%d-%d", r, k) })
				lat[i] = append(lat[i], time.Since(start))
				if rep.Status != contract.StatusSuccess {
					t.Fatalf("%s: %s", configs[i].name, rep.Raw)
				}
			}
		}
	}
	med := func(d []time.Duration) time.Duration { s := slices.Clone(d); slices.Sort(s); return s[len(s)/2] }
	base := med(lat[0])
	for i, c := range configs {
		m := med(lat[i])
		t.Logf("%-26s median %8s  (+%s over no limits)", c.name, m.Round(time.Microsecond), (m - base).Round(time.Microsecond))
	}
}
