package worker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/trace"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/provider/chain"
	"github.com/sys1hq/sys1/worker/auth"
	"github.com/sys1hq/sys1/worker/budget"
	"github.com/sys1hq/sys1/worker/cache"
	"github.com/sys1hq/sys1/worker/calibration"
	"github.com/sys1hq/sys1/worker/internal/outbox"
	"github.com/sys1hq/sys1/worker/limits"
	"github.com/sys1hq/sys1/worker/livefile"
	"github.com/sys1hq/sys1/worker/metrics"
	"github.com/sys1hq/sys1/worker/policy"
	"github.com/sys1hq/sys1/worker/rungate"
	"github.com/sys1hq/sys1/worker/topology"
)

// pipeline is what a run's stages use: the replica's collaborators, each named, so that a
// stage depends on them and not on the Worker (its pull loops, consumers, repair state and
// fleet watcher). New builds the replica's one pipeline once the topology is in place; the
// stage tests build theirs from fakes (pipeline_test.go): an in-memory gate bucket, a
// recording publisher, a scripted provider — no NATS server.
//
// The bus-facing parts are narrow interfaces that nats.go's types satisfy; the rest are the
// worker's own packages, which take their collaborators the same way.
type pipeline struct {
	cfg     Config
	topo    topology.Config
	version string
	log     zerolog.Logger

	// Who sent a request and what it may ask for.
	auth       auth.Authenticator
	models     contract.Policy // which models callers may name (the request's resolution)
	abstention *policy.Handle  // the abstention policy; nil: replies carry no verdicts
	limits     *livefile.File[*limits.Limits]
	prices     *livefile.File[*limits.Prices]
	fits       *atomic.Pointer[calibration.Store] // nil inside: runs are not calibrated

	// The run-id gate, and the request stream it checks a run's owning message against.
	gate     rungate.Gate
	requests messageLookup
	// epoch is the request stream's incarnation (derivedRunID).
	epoch func() string

	chain  *chain.Chain
	budget *budget.Budget // nil without a limits file
	cache  *cache.Cache   // nil when the cache bucket is not usable

	// Where records, replies and review items go (publish.go), and what is known of the
	// streams' room (storage.go); maxPayload is the server's max_payload (0 before the first
	// connect).
	out        *outbox.Config
	room       *storage
	maxPayload func() int64

	stats   *stats
	metrics *metrics.Worker
	tracer  trace.Tracer
	// background is work done off a run's path (cache writes), waited for by Run.
	background *sync.WaitGroup
	// repair asks the pull loop to recreate the topology when a run finds part of it gone.
	repair func(error)
}

// messageLookup reads a stream's message by sequence (jetstream.Stream).
type messageLookup interface {
	GetMsg(ctx context.Context, seq uint64, opts ...jetstream.GetMsgOpt) (*jetstream.RawStreamMsg, error)
}

// newPipeline gathers the replica's collaborators for its runs. It runs once New has
// ensured the topology (the gate, the request stream) and opened the limits.
func (w *Worker) newPipeline() *pipeline {
	return &pipeline{
		cfg: w.cfg, topo: w.opt.Topology, version: w.opt.Version, log: w.log,
		auth: w.opt.Auth, models: w.opt.ModelPolicy, abstention: w.opt.Abstention,
		limits: w.opt.Limits, prices: w.opt.Prices, fits: &w.fits,
		gate: w.gate, requests: w.requests, epoch: func() string { return *w.requestsEpoch.Load() },
		chain: w.chain, budget: w.budget, cache: w.cache,
		out: &outbox.Config{Streams: w.opt.JS, Core: w.opt.NC, Room: &w.storage, StoreRetry: w.cfg.StoreRetry,
			AckWait: w.opt.Topology.AckWait, RunsStream: w.opt.Topology.RunsStream, RepliesStream: w.opt.Topology.RepliesStream},
		room: &w.storage, maxPayload: w.opt.NC.MaxPayload,
		stats: &w.stats, metrics: w.metrics, tracer: w.tracer,
		background: &w.background, repair: w.requestRepair,
	}
}

// lease is how long a claim keeps a run its delivery's: the ack wait and a quarter. A live
// delivery renews it with every heartbeat of a long call (renewLease), so JetStream handing the
// message to another replica (a consumer leader's change can do it at once) finds it held; a
// dead replica's lapses a few seconds after JetStream redelivers its message for silence.
func (p *pipeline) lease() time.Duration { return p.topo.AckWait + p.topo.AckWait/4 }

// storeHeadroom is what a stored message needs beyond its body: headers (run id, status,
// Nats-Msg-Id) and the protocol's framing.
const storeHeadroom = 2 << 10

// storeLimit is the largest body this replica can store: a record in SYS1_RUNS, a reply, a
// gate entry. The smaller of the server's max_payload and the streams' max message size.
func (p *pipeline) storeLimit() int {
	limit := int64(p.topo.MaxMsgSize)
	if mp := p.maxPayload(); mp > 0 && mp < limit {
		limit = mp
	}
	return int(max(limit-storeHeadroom, 1024))
}

// messageGone reports whether the request message at seq has left the request stream (acked,
// terminated, or aged out), which a gate entry still marked running can outlive.
func (p *pipeline) messageGone(ctx context.Context, seq uint64) (bool, error) {
	_, err := p.requests.GetMsg(ctx, seq)
	switch {
	case err == nil:
		return false, nil
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return true, nil
	default:
		return false, fmt.Errorf("look up request %d: %w", seq, err)
	}
}

// limitsNow is the limits file in force (nil: nobody is limited).
func (p *pipeline) limitsNow() *limits.Limits {
	if p.limits == nil {
		return nil
	}
	return p.limits.Current()
}

// pricesNow is the prices file in force (nil: every model unpriced).
func (p *pipeline) pricesNow() *limits.Prices {
	if p.prices == nil {
		return nil
	}
	return p.prices.Current()
}
