package batch

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sys1hq/sys1/contract/wire"
	"github.com/sys1hq/sys1/worker/fleet"
)

// Estimate is how long a batch should take, from what the replicas report.
type Estimate struct {
	Replicas    int     `json:"replicas"`    // replicas found
	Reporting   int     `json:"reporting"`   // replicas that reported latency and concurrency
	Concurrency int     `json:"concurrency"` // provider calls in flight across the replicas
	LatencyMS   float64 `json:"latency_ms"`  // their recent provider latency (mean)
	PerSecond   float64 `json:"per_second"`  // the decisions per second that allows
	DurationMS  int64   `json:"duration_ms"` // items / PerSecond; 0 when not known
	Unavailable string  `json:"unavailable"` // why there is no estimate
}

// capability is what the estimate reads from a capabilities reply: the replica's id, its
// provider concurrency (SYS1_CONCURRENCY) and its recent provider latency, a number of
// milliseconds or {"p50": ms}.
type capability struct {
	Replica           string          `json:"replica"`
	ID                string          `json:"id"`
	Concurrency       int             `json:"concurrency"`
	ProviderLatencyMS json.RawMessage `json:"provider_latency_ms"`
}

func (c capability) id() string {
	if c.Replica != "" {
		return c.Replica
	}
	return c.ID
}

func (c capability) latency() (float64, bool) {
	var ms float64
	if json.Unmarshal(c.ProviderLatencyMS, &ms) == nil && ms > 0 {
		return ms, true
	}
	var q struct {
		P50 float64 `json:"p50"`
	}
	if json.Unmarshal(c.ProviderLatencyMS, &q) == nil && q.P50 > 0 {
		return q.P50, true
	}
	return 0, false
}

// EstimateDuration asks the replicas (sys1.svc.capabilities) for their concurrency and recent
// provider latency and estimates the time items requests take: items × latency / concurrency.
// It is a floor, not a promise: interactive requests go first, SYS1_BATCH_MAX_SHARE caps the
// slots batches may use, and retries take longer. When no replica answers, or none reports
// both figures, it says so instead of guessing.
func EstimateDuration(ctx context.Context, nc *nats.Conn, items int, wait time.Duration) Estimate {
	var est Estimate
	ids := map[string]bool{}
	pings, _ := fleet.Gather(ctx, nc, wire.PingSubject, 0, wait)
	for _, m := range pings {
		var p struct {
			ID string `json:"id"`
		}
		if json.Unmarshal(m, &p) == nil && p.ID != "" {
			ids[p.ID] = true
		}
	}
	caps, _ := fleet.Gather(ctx, nc, wire.CapabilitiesSubject, 0, wait)
	var perSecond, latencySum float64
	var conc, concOnly int
	seen := map[string]bool{}
	for _, m := range caps {
		var c capability
		if json.Unmarshal(m, &c) != nil {
			continue
		}
		if id := c.id(); id != "" {
			if seen[id] {
				continue
			}
			seen[id] = true
		}
		ms, ok := c.latency()
		if c.Concurrency > 0 && !ok {
			concOnly++
		}
		if !ok || c.Concurrency <= 0 {
			continue
		}
		est.Reporting++
		conc += c.Concurrency
		latencySum += ms
		perSecond += float64(c.Concurrency) * 1000 / ms
	}
	// The ping's ids are the micro service's instance ids, capabilities' are replica ids: the
	// two name the same replicas differently, so the larger count is the number of replicas.
	est.Replicas = max(len(ids), len(seen), len(caps))
	switch {
	case est.Replicas == 0:
		est.Unavailable = "no replica answered " + wire.CapabilitiesSubject + " (no worker, or one without the capabilities endpoint): no estimate is possible"
		return est
	case est.Reporting == 0 && concOnly > 0:
		est.Unavailable = fmt.Sprintf("%d replica(s) found; their capabilities give their concurrency but not their recent provider latency (provider_latency_ms): no estimate is possible", est.Replicas)
		return est
	case est.Reporting == 0:
		est.Unavailable = fmt.Sprintf("%d replica(s) found, but none reported its concurrency and recent provider latency: no estimate is possible", est.Replicas)
		return est
	}
	// Replicas that did not report (capabilities answered by one member of a queue group) are
	// taken to be like the ones that did.
	scale := float64(max(est.Replicas, est.Reporting)) / float64(est.Reporting)
	est.Concurrency = int(float64(conc) * scale)
	est.LatencyMS = latencySum / float64(est.Reporting)
	est.PerSecond = perSecond * scale
	est.DurationMS = int64(float64(items) / est.PerSecond * 1000)
	return est
}
