package worker_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/worker/client"
)

// TestExactCacheHitsMissesAndNewWeights: an opted-in caller's identical request is answered
// from the cache without a provider call (attempt outcome cache, cache_hit, cost 0); a
// different request misses; Sys1-Cache: 0 opts one request out; new model weights (a new
// digest) mean new keys, so the cache never answers for them; an entry older than the
// request allows is a miss.
func TestExactCacheHitsMissesAndNewWeights(t *testing.T) {
	h := newHarness(t)
	h.start(withLimits(t, "rules:\n  - caller: svc-a\n    cache: 1h\n", centPerRun),
		func(o *replicaOpts) { o.cfg.ProbeInterval = 50 * time.Millisecond })
	first := h.decide("svc-a", []byte(ticket), func(r *client.Request) { r.RunID = "cold" })
	if first.Status != contract.StatusSuccess || h.fake.Calls() != 1 {
		t.Fatalf("first: %s", first.Raw)
	}
	// The answer is stored off the run's path: wait for it.
	h.waitCacheEntries(1)
	hit := h.decide("svc-a", []byte(ticket), func(r *client.Request) { r.RunID = "warm" })
	if hit.Status != contract.StatusSuccess || h.fake.Calls() != 1 || len(hit.Attempts) != 1 || hit.Attempts[0].Outcome != contract.OutcomeCache {
		t.Fatalf("hit: %s (provider calls %d)", hit.Raw, h.fake.Calls())
	}
	if string(mustAnswers(t, hit)) != string(mustAnswers(t, first)) {
		t.Errorf("the cached answers differ from the original's")
	}
	if rec := h.recordByRun("warm"); !rec.CacheHit || rec.CostUSD == nil || *rec.CostUSD != 0 {
		t.Errorf("hit record: cache_hit %v cost %v", rec.CacheHit, rec.CostUSD)
	}
	if rec := h.recordByRun("cold"); rec.CacheHit || rec.CostUSD == nil || *rec.CostUSD != 0.01 {
		t.Errorf("miss record: cache_hit %v cost %v", rec.CacheHit, rec.CostUSD)
	}
	// A request that opts out is called.
	h.decide("svc-a", []byte(ticket), func(r *client.Request) { r.Header = map[string][]string{"Sys1-Cache": {"0"}} })
	if h.fake.Calls() != 2 {
		t.Errorf("Sys1-Cache: 0 was answered from the cache")
	}
	// A malformed Sys1-Cache is refused, not ignored.
	if rep := h.decide("svc-a", []byte(ticket), func(r *client.Request) { r.Header = map[string][]string{"Sys1-Cache": {"forever"}} }); rep.Error == nil || rep.Error.Code != contract.CodeInvalidInput {
		t.Errorf("bad Sys1-Cache: %s", rep.Raw)
	}
	// New weights: the same model name with another digest.
	h.fake.SetModels("tev1", "nimble")
	waitFor(t, "the new digest probed", 10*time.Second, func() bool {
		rep := h.decide("svc-a", []byte(ticket))
		return rep.Attempts[len(rep.Attempts)-1].Outcome == contract.OutcomeOK
	})
	h.waitCacheEntries(2)
	calls := h.fake.Calls()
	if rep := h.decide("svc-a", []byte(ticket)); rep.Attempts[0].Outcome != contract.OutcomeCache || h.fake.Calls() != calls {
		t.Errorf("after the new weights' first answer, the cache serves them: %s", rep.Raw)
	}
	// Older than the request allows: a miss (the entry is seconds old; allow one second).
	time.Sleep(1100 * time.Millisecond) // the entry's age is the behaviour under test
	if rep := h.decide("svc-a", []byte(ticket), func(r *client.Request) { r.Cache = time.Second }); rep.Attempts[0].Outcome != contract.OutcomeOK {
		t.Errorf("an entry older than Sys1-Cache allowed was served: %s", rep.Raw)
	}
}

func mustAnswers(t *testing.T, rep *client.Reply) []byte {
	t.Helper()
	b, err := rep.Result.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// waitCacheEntries waits until the cache bucket holds at least n entries.
func (h *harness) waitCacheEntries(n int) {
	h.t.Helper()
	kv, err := h.js.KeyValue(context.Background(), h.topo.CacheBucket)
	if err != nil {
		h.t.Fatal(err)
	}
	waitFor(h.t, fmt.Sprint(n, " cache entries"), 10*time.Second, func() bool {
		keys, err := kv.Keys(context.Background())
		return err == nil && len(keys) >= n
	})
}
