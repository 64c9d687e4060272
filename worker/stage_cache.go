package worker

import (
	"context"
	"fmt"
	"time"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/contract/wire"
	"github.com/sys1hq/sys1/worker/cache"
	"github.com/sys1hq/sys1/worker/internal/outbox"
	"github.com/sys1hq/sys1/worker/topology"
)

// cacheLookup answers the run from the exact result cache when its caller opted in (the
// limits file's cache: or Sys1-Cache, never longer than the rule) and the same request went
// to the same model weights within that age. A hit is an answer without a provider call: its
// attempt says "cache", its cost is 0. The key is the request as sent upstream, the provider
// the chain would ask first and that provider's model digest — new weights, new keys.
func (r *run) cacheLookup(ctx context.Context) error {
	p := r.p
	if p.cache == nil || r.resp != nil {
		return nil
	}
	rule, _ := p.limitsNow().Match(r.identity.Caller)
	age, cerr := cache.MaxAge(rule, r.msg.Headers().Get(wire.HeaderCache), p.cfg.CacheMaxTTL)
	if cerr != nil {
		return cerr
	}
	if age <= 0 {
		return nil
	}
	routes := p.chain.Routes(r.resolved.Model)
	if len(routes) == 0 {
		return nil
	}
	route := routes[0]
	dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	digest, err := p.chain.ModelDigest(dctx, route.Provider, route.Model)
	cancel()
	if err != nil || digest == "" {
		r.log.Debug().Err(err).Str("provider", route.Provider).Msg("no model digest: the cache is not used for this run")
		return nil
	}
	key, err := cache.NewKey(r.identity.Caller, route.Provider, digest, r.resolved)
	if err != nil {
		return nil
	}
	r.cacheKey, r.cacheAge = &key, age
	started := time.Now()
	hit, err := p.cache.Get(ctx, key, r.resolved, age)
	if err != nil {
		// The cache is an optimisation, never a reason to fail a run: the model decides.
		r.log.Warn().Err(err).Msg("cache lookup failed; calling the provider")
		return nil
	}
	if hit == nil {
		return nil
	}
	p.stats.cacheHits.Add(1)
	r.resp = &contract.Response{Model: hit.Result.Model, Answers: hit.Result.Answers, Usage: hit.Result.Usage}
	r.answeredBy, r.answeredModel, r.cacheHit = hit.Result.Provider, route.Model, true
	r.attempts = append(r.attempts, contract.Attempt{
		Provider: hit.Result.Provider, Model: route.Model, Outcome: contract.OutcomeCache,
		LatencyMS: time.Since(started).Milliseconds(), Delivery: int(r.meta.NumDelivered), StartedAt: started.UTC(),
		Detail: fmt.Sprintf("answered from the cache, stored %s ago", hit.Age.Round(time.Second)),
	})
	r.newAttempts = true
	return nil
}

// cacheStore keeps a fresh answer for the next identical request, for the age this one
// allowed. Only answers the provider that was asked first gave are stored under its key.
func (r *run) cacheStore(ctx context.Context) error {
	if r.cacheKey == nil || r.cacheHit || r.resumed || r.resp == nil {
		return nil
	}
	routes := r.p.chain.Routes(r.resolved.Model)
	if len(routes) == 0 || routes[0].Provider != r.answeredBy {
		return nil // another provider answered: not what the key names
	}
	res := &contract.Result{Provider: r.answeredBy, Model: r.resp.Model, Answers: r.resp.Answers, Usage: r.resp.Usage}
	if res.Model == "" {
		res.Model = r.answeredModel
	}
	// Off the run's path: the reply does not wait for the cache (an entry lost to a crash
	// only costs the next identical request a call).
	key, age, log := *r.cacheKey, r.cacheAge, r.log
	r.p.background.Go(func() {
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		err := r.p.cache.Put(pctx, key, res, age)
		if _, full := outbox.RefusedBy(r.p.room.Note(topology.KVStream(r.p.topo.CacheBucket), err)); full {
			return // a full cache is said once (storage.go); entries expire and make room
		}
		if err != nil {
			log.Warn().Err(err).Msg("could not store the answer in the cache")
		}
	})
	return nil
}
