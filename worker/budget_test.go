package worker_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/worker/client"
	"github.com/sys1hq/sys1/worker/limits"
)

func writeFile(t *testing.T, name, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// withLimits is a replica option loading a limits file and a prices file (either may be "").
func withLimits(t *testing.T, limitsYAML, pricesYAML string) func(*replicaOpts) {
	t.Helper()
	var o replicaOpts
	if limitsYAML != "" {
		l, err := limits.LoadLimits(writeFile(t, "limits.yaml", limitsYAML))
		if err != nil {
			t.Fatal(err)
		}
		o.limits = l
	}
	if pricesYAML != "" {
		p, err := limits.LoadPrices(writeFile(t, "prices.yaml", pricesYAML))
		if err != nil {
			t.Fatal(err)
		}
		o.prices = p
	}
	return func(r *replicaOpts) { r.limits, r.prices = o.limits, o.prices }
}

const centPerRun = `
providers:
  ollama:
    nimble:
      input_per_million: 0
      output_per_million: 0
      per_request: 0.01
`

// TestBudgetIsExactAcrossReplicas: three replicas, sixteen concurrent producers, a day budget
// of five runs' worth of USD: exactly five are answered, never six; the others are refused
// SYS1_BUDGET_EXCEEDED (429, not retried) naming the budget and its reset, in reply and
// record, and cost the model nothing.
func TestBudgetIsExactAcrossReplicas(t *testing.T) {
	h := newHarness(t)
	opt := withLimits(t, "rules:\n  - caller: svc-a\n    usd_per_day: 0.05\n", centPerRun)
	for i := range 3 {
		h.start(opt, func(o *replicaOpts) { o.cfg.ID = fmt.Sprint("replica-", i) })
	}
	const producers, each = 16, 2
	var mu sync.Mutex
	codes := map[contract.Code]int{}
	var ok int
	var wg sync.WaitGroup
	for p := range producers {
		wg.Go(func() {
			for i := range each {
				rep := h.decide("svc-a", []byte(ticket), func(r *client.Request) { r.RunID = fmt.Sprintf("spend-%d-%d", p, i) })
				mu.Lock()
				if rep.Status == contract.StatusSuccess {
					ok++
				} else {
					codes[rep.Error.Code]++
					if rep.Error.Code == contract.CodeBudgetExceeded && (rep.Error.Status != 429 || !strings.Contains(rep.Error.Message, "USD per day") || !strings.Contains(rep.Error.Message, "resets")) {
						t.Errorf("refusal %s", rep.Raw)
					}
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if ok != 5 || codes[contract.CodeBudgetExceeded] != producers*each-5 {
		t.Fatalf("%d answered, refusals %v; want exactly 5 answered, the rest SYS1_BUDGET_EXCEEDED", ok, codes)
	}
	if calls := h.fake.Calls(); calls != 5 {
		t.Errorf("provider calls = %d, want 5", calls)
	}
	var priced, refused int
	for _, rec := range h.records() {
		switch {
		case rec.Status == contract.StatusSuccess && rec.CostUSD != nil && *rec.CostUSD == 0.01:
			priced++
		case rec.ErrorCode == contract.CodeBudgetExceeded && rec.CostUSD == nil:
			refused++
		default:
			t.Errorf("record %s: %s %s cost %v", rec.RunID, rec.Status, rec.ErrorCode, rec.CostUSD)
		}
	}
	if priced != 5 || refused != producers*each-5 {
		t.Errorf("records: %d priced, %d refused", priced, refused)
	}
}

// TestUnpricedRunsCostNull: a model without a price has cost_usd null, never 0.
func TestUnpricedRunsCostNull(t *testing.T) {
	h := newHarness(t)
	h.start(withLimits(t, "", "providers:\n  ollama:\n    other-model:\n      input_per_million: 1\n      output_per_million: 1\n"))
	h.decide("svc-a", []byte(ticket), func(r *client.Request) { r.RunID = "unpriced-1" })
	if rec := h.recordByRun("unpriced-1"); rec.CostUSD != nil {
		t.Errorf("unpriced run cost %v", *rec.CostUSD)
	}
	raw := h.rawRecords()
	if len(raw) != 1 || !strings.Contains(string(raw[0]), `"cost_usd":null`) {
		t.Errorf("record %s", raw[0])
	}
}

// TestRateLimitWaitsWithinTheDeadline: over a rate limit a run waits for the next window —
// and when that is past its deadline it is answered SYS1_EXPIRED at once, without a call.
func TestRateLimitWaitsWithinTheDeadline(t *testing.T) {
	h := newHarness(t)
	h.start(withLimits(t, "rules:\n  - caller: svc-a\n    decisions_per_minute: 2\n", ""))
	// Stay inside one minute: a window boundary between the runs would admit a third.
	if s := time.Now().Second(); s > 50 {
		time.Sleep(time.Duration(61-s) * time.Second)
	}
	for i := range 2 {
		if rep := h.decide("svc-a", []byte(ticket)); rep.Status != contract.StatusSuccess {
			t.Fatalf("run %d: %s", i, rep.Raw)
		}
	}
	rep := h.decide("svc-a", []byte(ticket), func(r *client.Request) { r.Deadline = time.Now().Add(time.Second) })
	if rep.Status != contract.StatusFailed || rep.Error.Code != contract.CodeExpired || !strings.Contains(rep.Error.Message, "decisions per minute") {
		t.Fatalf("the third run: %s", rep.Raw)
	}
	// Without a deadline it waits in the stream: not answered, not called, not lost.
	inbox := "_INBOX.svc-a." + nats.NewInbox()[7:]
	sub, _ := h.nc.SubscribeSync(inbox)
	if _, err := h.cl.Publish(context.Background(), client.Request{Caller: "svc-a", Body: []byte(ticket), ReplyTo: inbox}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the wait logged", 10*time.Second, func() bool { return strings.Contains(h.logs.String(), "over the caller's decisions per minute") })
	if m, err := sub.NextMsg(200 * time.Millisecond); err == nil {
		t.Fatalf("answered within the window: %s", m.Data)
	}
	if calls := h.fake.Calls(); calls != 2 {
		t.Errorf("provider calls = %d, want 2", calls)
	}
}

// TestInFlightCapHoldsAcrossReplicas: in_flight: 1 lets one call run at a time across the
// fleet; the others wait for the slot and are answered in turn.
func TestInFlightCapHoldsAcrossReplicas(t *testing.T) {
	t.Parallel() // waits out failovers and retries, not the CPU: runs beside the others
	h := newHarness(t)
	h.fake.SetLatency(150 * time.Millisecond)
	opt := withLimits(t, "rules:\n  - caller: svc-a\n    in_flight: 1\n", "")
	for i := range 2 {
		h.start(opt, func(o *replicaOpts) { o.cfg.ID = fmt.Sprint("replica-", i) })
	}
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			if rep := h.decide("svc-a", []byte(ticket), func(r *client.Request) { r.RunID = fmt.Sprint("capped-", i) }); rep.Status != contract.StatusSuccess {
				t.Errorf("run %d: %s", i, rep.Raw)
			}
		})
	}
	wg.Wait()
	if peak := h.fake.MaxConcurrent(); peak != 1 {
		t.Errorf("peak calls in flight %d, want 1", peak)
	}
}
