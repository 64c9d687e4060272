package worker

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/provider"
	"github.com/sys1hq/sys1/provider/chain"
)

// buildChain assembles the provider chain the call stage uses: the configured links (or the
// one Provider), each with its own limiter (SYS1_CONCURRENCY_MODE: adaptive between
// SYS1_CONCURRENCY_MIN and SYS1_CONCURRENCY, or fixed at SYS1_CONCURRENCY) — concurrency is
// this replica's to decide, so it sets every link's limiter — and each observed for the
// replica's counters.
func (w *Worker) buildChain() (*chain.Chain, error) {
	links := w.opt.Links
	if len(links) == 0 {
		links = []chain.Link{{Provider: w.opt.Provider}}
	}
	out := make([]chain.Link, len(links))
	for i, l := range links {
		if l.Provider == nil {
			return nil, fmt.Errorf("worker: provider link %d has no provider", i)
		}
		if l.Name == "" {
			l.Name = l.Provider.Name()
		}
		l.Provider = &observed{Provider: l.Provider, stats: &w.stats}
		lim, err := w.cfg.newLimiter()
		if err != nil {
			return nil, fmt.Errorf("worker: provider %s: %w", l.Name, err)
		}
		l.Limiter = lim
		out[i] = l
	}
	cfg := w.opt.ChainConfig
	cfg.Logger = w.log
	return chain.New(cfg, out...)
}

// observed counts a provider's calls for Stats.
type observed struct {
	provider.Provider
	stats *stats
}

func (o *observed) Evaluate(ctx context.Context, req *contract.Request) (*contract.Response, error) {
	o.stats.providerStart()
	defer o.stats.providerNow.Add(-1)
	started := time.Now()
	resp, err := o.Provider.Evaluate(ctx, req)
	if err == nil {
		o.stats.latency.observe(time.Since(started))
	}
	return resp, err
}

// ewma is a moving average of successful calls' latency (a weight of 1/16 per call), for
// capabilities: what a batch's --dry-run estimates its time from.
type ewma struct {
	mu  sync.Mutex
	avg float64 // milliseconds; 0 before the first call
}

func (e *ewma) observe(d time.Duration) {
	ms := float64(d) / float64(time.Millisecond)
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.avg == 0 {
		e.avg = ms
		return
	}
	e.avg += (ms - e.avg) / 16
}

func (e *ewma) value() float64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.avg
}

// ModelDigest passes the provider's digest through (the cache keys on it).
func (o *observed) ModelDigest(ctx context.Context, model string) (string, error) {
	if d, ok := o.Provider.(provider.ModelDigester); ok {
		return d.ModelDigest(ctx, model)
	}
	return "", provider.ErrNoModelDigest
}
