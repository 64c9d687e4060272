// Package worker consumes System One requests from JetStream and runs them: identity, the
// run-id gate, deadline, validation and resolution, the provider call, the reply and the run
// record. Replicas share one durable pull consumer; each bounds its own provider concurrency.
//
// Every delivery ends in exactly one of:
//   - Ack: the run finished; its outcome is stored in the gate and its record and reply were
//     published (the record's publish acknowledged by JetStream) before the ack.
//   - NakWithDelay: a transient failure with deliveries left, or a run that could not finish
//     (shutdown, NATS trouble); it comes back later, to this or another replica.
//   - Term: a permanent failure, after its reply and record were published.
package worker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/trace"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/provider"
	"github.com/sys1hq/sys1/provider/chain"
	"github.com/sys1hq/sys1/worker/auth"
	"github.com/sys1hq/sys1/worker/metrics"
	"github.com/sys1hq/sys1/worker/topology"
)

// Options are the worker's collaborators.
type Options struct {
	NC       *nats.Conn
	JS       jetstream.JetStream
	Topology topology.Config
	// Provider is a single provider; Links, when set, are the ordered provider chain instead
	// (SYS1_PROVIDERS, see provider/backend.Links), with ChainConfig its breaker settings.
	// Either way the worker sets each link's limiter (SYS1_CONCURRENCY calls in flight).
	Provider    provider.Provider
	Links       []chain.Link
	ChainConfig chain.Config
	Policy      contract.Policy
	Auth        auth.Authenticator
	Logger      zerolog.Logger
	// Version goes into every run record.
	Version string
	// FetchWait bounds one pull request; it is also how long shutdown may wait for a pull in
	// flight. Zero means one second.
	FetchWait time.Duration
	// Metrics is the process's registry (metrics.NewRegistry), which the replica's families
	// join, labelled with its id; nil gives the replica a registry of its own. Handler serves
	// it on /metrics.
	Metrics *prometheus.Registry
	// MetricsCallerLabel labels sys1_worker_runs_total with the verified caller too.
	MetricsCallerLabel bool
	// TracerProvider starts the runs' spans; nil means no tracing.
	TracerProvider trace.TracerProvider
}

// Worker is one replica's pool.
type Worker struct {
	cfg  Config
	opt  Options
	cons jetstream.Consumer // used by the pull loop alone, which also replaces it (ensure)
	// deadCons is the shared consumer of dead letters (deadletter.go); ensure replaces it.
	deadCons atomic.Pointer[jetstream.Consumer]
	// requests is the request stream, to tell whether a run's owning message still exists.
	// JetStream handles are names, so this one stays valid when the stream is recreated.
	requests jetstream.Stream
	// requestsEpoch tells this incarnation of the request stream from earlier ones (see
	// derivedRunID): sequences start again at 1 when the stream is recreated.
	requestsEpoch atomic.Pointer[string]
	// repair is signalled by a run that found a stream or the run-id bucket missing; the pull
	// loop then recreates the topology (see recreateTopology).
	repair chan struct{}
	// The pull loop's alone: a repair asked for and not yet done, when the topology was first
	// seen missing, and the last attempt to recreate it.
	repairPending            bool
	missingSince, lastRepair time.Time
	gate                     gate
	log                      zerolog.Logger
	stats                    stats
	// chain is the providers. Each link's limiter bounds its calls in flight to Concurrency.
	// The pull loop admits twice as many messages, so the runs waiting for a slot have already
	// been claimed and validated, and the runs past their call store and publish their
	// outcome, while the provider stays busy: a slot is held for the call alone, never for a
	// JetStream round trip.
	chain *chain.Chain
	// fleet is the shared consumers' state, for health (service.go).
	fleet fleet
	// metrics and tracer observe the runs (observe.go).
	registry *prometheus.Registry
	metrics  *metrics.Worker
	tracer   trace.Tracer
}

// New ensures the JetStream topology (streams, run-id bucket, the shared consumer) and returns
// a worker ready to Run.
func New(ctx context.Context, cfg Config, opt Options) (*Worker, error) {
	if errs := cfg.Validate(); len(errs) > 0 {
		return nil, fmt.Errorf("worker config: %w", errors.Join(errs...))
	}
	if opt.JS == nil || opt.NC == nil || (opt.Provider == nil && len(opt.Links) == 0) || opt.Auth == nil {
		return nil, errors.New("worker: NC, JS, a Provider (or Links) and Auth are required")
	}
	if opt.Topology.ConsumerMaxDeliver <= cfg.MaxDeliver {
		return nil, fmt.Errorf("worker config: SYS1_CONSUMER_MAX_DELIVER (%d) must exceed SYS1_MAX_DELIVER (%d): the worker answers a failing run itself after SYS1_MAX_DELIVER deliveries, and needs deliveries left to do so", opt.Topology.ConsumerMaxDeliver, cfg.MaxDeliver)
	}
	cfg = cfg.withDefaults()
	if opt.FetchWait <= 0 {
		opt.FetchWait = time.Second
	}
	w := &Worker{cfg: cfg, opt: opt, repair: make(chan struct{}, 1)}
	w.log = opt.Logger.With().Str("worker", cfg.ID).Logger()
	ch, err := w.buildChain()
	if err != nil {
		return nil, err
	}
	w.chain = ch
	if err := w.instrument(); err != nil {
		return nil, err
	}
	if err := w.ensure(ctx); err != nil {
		return nil, err
	}
	if opt.Topology.MaxAckPending < 2*cfg.Concurrency {
		w.log.Warn().Int("max_ack_pending", opt.Topology.MaxAckPending).Int("concurrency", cfg.Concurrency).
			Msg("SYS1_MAX_ACK_PENDING is below twice this replica's concurrency (a replica holds up to 2 × SYS1_CONCURRENCY messages); it caps the whole shared consumer, so raise it to at least 2 × replicas × SYS1_CONCURRENCY")
	}
	return w, nil
}

// ensure creates or updates the streams, the run-id bucket and the shared consumer, and
// notes which incarnation of the request stream this is. New calls it; so does the pull loop
// when they have vanished (NATS lost its store, or an operator deleted them).
func (w *Worker) ensure(ctx context.Context) error {
	kv, err := topology.Ensure(ctx, w.opt.JS, w.opt.Topology, topology.WithLogger(w.log))
	if err != nil {
		return err
	}
	cons, err := topology.EnsureWorkerConsumer(ctx, w.opt.JS, w.opt.Topology)
	if err != nil {
		return err
	}
	dead, err := topology.EnsureDeadLetterConsumer(ctx, w.opt.JS, w.opt.Topology)
	if err != nil {
		return err
	}
	w.deadCons.Store(&dead)
	requests, err := w.opt.JS.Stream(ctx, w.opt.Topology.RequestsStream)
	if err != nil {
		return fmt.Errorf("stream %s: %w", w.opt.Topology.RequestsStream, err)
	}
	epoch := streamEpoch(requests.CachedInfo().Created)
	w.requestsEpoch.Store(&epoch)
	if w.cons == nil {
		w.requests, w.gate = requests, gate{kv: kv}
	}
	w.cons = cons
	return nil
}

// recreateTopology runs ensure on behalf of the pull loop once the topology has been missing
// for topology.RecreateSettle (which says why it waits), then at most once a second until it
// succeeds. It reports whether the topology was recreated.
func (w *Worker) recreateTopology(ctx context.Context, cause error, why string) bool {
	now := time.Now()
	if w.missingSince.IsZero() {
		w.missingSince = now
		w.log.Warn().AnErr("cause", cause).Dur("recreate_in", topology.RecreateSettle).Msg(why + "; recreating the JetStream topology")
		return false
	}
	if now.Sub(w.missingSince) < topology.RecreateSettle || now.Sub(w.lastRepair) < time.Second {
		return false
	}
	w.lastRepair = now
	if err := w.ensure(ctx); err != nil {
		w.log.Warn().Err(err).Msg("could not recreate the JetStream topology; trying again")
		return false
	}
	w.missingSince = time.Time{}
	w.log.Warn().Str("requests_epoch", *w.requestsEpoch.Load()).Msg("recreated the JetStream topology")
	return true
}

// requestRepair asks the pull loop to recreate the topology if err says part of it is missing.
func (w *Worker) requestRepair(err error) {
	if errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, jetstream.ErrStreamNotFound) ||
		errors.Is(err, jetstream.ErrBucketNotFound) {
		select {
		case w.repair <- struct{}{}:
		default: // already asked
		}
	}
}

// topologyGone reports whether the shared consumer or its stream no longer exists.
func (w *Worker) topologyGone(ctx context.Context) bool {
	return topology.ConsumerGone(ctx, w.opt.JS, w.opt.Topology.RequestsStream, w.opt.Topology.WorkerConsumer)
}

// storeHeadroom is what a stored message needs beyond its body: headers (run id, status,
// Nats-Msg-Id) and the protocol's framing.
const storeHeadroom = 2 << 10

// storeLimit is the largest body this replica can store: a record in SYS1_RUNS, a reply, a
// gate entry. The smaller of the server's max_payload and the streams' max message size.
func (w *Worker) storeLimit() int {
	limit := int64(w.opt.Topology.MaxMsgSize)
	if mp := w.opt.NC.MaxPayload(); mp > 0 && mp < limit {
		limit = mp
	}
	return int(max(limit-storeHeadroom, 1024))
}

// ID is the replica id written into run records.
func (w *Worker) ID() string { return w.cfg.ID }

// Run pulls and processes messages until ctx is cancelled, then stops pulling, lets in-flight
// runs finish within the shutdown grace, naks what could not finish, and returns. It returns
// nil on a clean shutdown.
func (w *Worker) Run(ctx context.Context) error {
	// Runs must outlive the pull loop's context: a SIGTERM stops pulling, not the work in hand.
	runCtx, cancelRuns := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelRuns()

	// Messages in flight: Concurrency in provider calls and as many again before or after
	// theirs (see chain).
	slots := make(chan struct{}, 2*w.cfg.Concurrency)
	// One long-lived goroutine per slot runs the messages. A goroutine per message would be
	// simpler, but each new one grows its stack again through the decoders (copystack was 5% of
	// the CPU at zero provider latency); these keep theirs.
	work := make(chan jetstream.Msg, cap(slots))
	var wg sync.WaitGroup
	for range cap(slots) {
		wg.Go(func() {
			for msg := range work {
				w.handle(runCtx, msg)
				w.stats.inFlight.Add(-1)
				<-slots
			}
		})
	}
	var dead sync.WaitGroup
	dead.Go(func() { w.deadLetters(ctx, runCtx) })
	probed := w.chain.Start(ctx, w.cfg.ProbeInterval)
	dead.Go(func() { w.watchFleet(ctx, w.cfg.StatusInterval) })
	if stop, err := w.startService(); err != nil {
		// Health and capabilities over NATS are for operators; decisions do not need them.
		w.log.Error().Err(err).Msg("cannot register the micro service; sys1 status will not see this replica")
	} else {
		defer stop()
	}
	w.log.Info().Int("concurrency", w.cfg.Concurrency).Int("max_deliver", w.cfg.MaxDeliver).
		Strs("providers", w.chain.Names()).Msg("worker started")

	var fetchErrs int
	for ctx.Err() == nil {
		// Reserve at least one slot, then as many more as are free (up to one batch), so we
		// never pull a message we cannot start at once.
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			continue
		}
		select {
		case <-w.repair:
			w.repairPending = true
		default:
		}
		if w.repairPending && w.recreateTopology(ctx, nil, "a run found a stream or the run-id bucket missing") {
			w.repairPending = false
		}
		n := 1
	reserve:
		for n < w.cfg.FetchBatch {
			select {
			case slots <- struct{}{}:
				n++
			default:
				break reserve
			}
		}
		used, err := w.fetch(ctx, n, work)
		for i := used; i < n; i++ {
			<-slots
		}
		if err != nil && w.topologyGone(ctx) {
			// Pulling from a consumer that no longer exists would fail until a restart.
			if w.recreateTopology(ctx, err, "the request stream or the worker consumer is gone") {
				fetchErrs = 0
				continue
			}
		}
		if err != nil {
			fetchErrs++
			// A broken connection or a deleted consumer must not spin the CPU; back off.
			delay := min(time.Duration(fetchErrs)*100*time.Millisecond, 5*time.Second)
			w.log.Warn().Err(err).Dur("retry_in", delay).Msg("pull failed")
			select {
			case <-time.After(delay):
			case <-ctx.Done():
			}
			continue
		}
		fetchErrs = 0
		if !w.repairPending {
			w.missingSince = time.Time{} // whatever was missing is back
		}
	}

	w.log.Info().Int64("in_flight", w.stats.inFlight.Load()).Dur("grace", w.cfg.ShutdownGrace).Msg("stopping: no more pulls, finishing in-flight runs")
	close(work)
	done := make(chan struct{})
	go func() { wg.Wait(); dead.Wait(); <-probed; close(done) }()
	grace := time.NewTimer(w.cfg.ShutdownGrace)
	defer grace.Stop()
	select {
	case <-done:
	case <-grace.C:
		w.log.Warn().Int64("in_flight", w.stats.inFlight.Load()).Msg("shutdown grace over: cancelling in-flight runs; they are nak'ed for redelivery")
		cancelRuns()
		<-done
	}
	// Acks are fire-and-forget publishes: push them to the server before saying we stopped,
	// so a process that exits right after Run does not leave finished runs to be replayed.
	fctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := w.opt.NC.FlushWithContext(fctx); err != nil {
		w.log.Warn().Err(err).Msg("could not flush acks on shutdown; those runs will be answered again from their stored outcome")
	}
	w.log.Info().Msg("worker stopped")
	return nil
}

// fetch issues one pull for up to n messages and hands each to the runners as it arrives (a
// slot is already reserved for each). It returns how many it handed over.
func (w *Worker) fetch(ctx context.Context, n int, work chan<- jetstream.Msg) (int, error) {
	// The pull is bounded by time, not by ctx: cancelling a pull mid-flight can strand
	// messages the server already sent until AckWait. Shutdown waits at most FetchWait.
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.opt.FetchWait)
	defer cancel()
	batch, err := w.cons.Fetch(n, jetstream.FetchContext(fctx))
	if err != nil {
		return 0, fmt.Errorf("fetch %d: %w", n, err)
	}
	used := 0
	for msg := range batch.Messages() {
		if ctx.Err() != nil {
			// Pulled after SIGTERM: hand it straight back for another replica.
			_ = msg.Nak()
			continue
		}
		used++
		w.stats.inFlight.Add(1)
		work <- msg // never blocks: there is a runner per slot and a slot per message
	}
	if err := batch.Error(); err != nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, nats.ErrTimeout) {
		return used, fmt.Errorf("fetch: %w", err)
	}
	return used, nil
}

// stats are the replica's live counters (see Stats).
type stats struct {
	inFlight      atomic.Int64
	providerNow   atomic.Int64
	providerPeak  atomic.Int64
	providerCalls atomic.Int64
	succeeded     atomic.Int64
	failed        atomic.Int64
	retried       atomic.Int64
	replayed      atomic.Int64
	deadLetters   atomic.Int64
}

// Stats is a snapshot of a replica's counters.
type Stats struct {
	InFlight          int64 // messages being processed
	ProviderInFlight  int64 // provider calls running now
	ProviderPeak      int64 // most provider calls ever running at once
	ProviderCalls     int64 // provider calls made
	Succeeded, Failed int64 // runs finished
	Retried           int64 // deliveries nak'ed for a transient error
	Replayed          int64 // finished runs answered again from their stored outcome
	DeadLetters       int64 // dead-lettered requests answered from their advisory
}

// Stats returns the replica's counters.
func (w *Worker) Stats() Stats {
	return Stats{
		InFlight: w.stats.inFlight.Load(), ProviderInFlight: w.stats.providerNow.Load(),
		ProviderPeak: w.stats.providerPeak.Load(), ProviderCalls: w.stats.providerCalls.Load(),
		Succeeded: w.stats.succeeded.Load(), Failed: w.stats.failed.Load(),
		Retried: w.stats.retried.Load(), Replayed: w.stats.replayed.Load(),
		DeadLetters: w.stats.deadLetters.Load(),
	}
}

func (s *stats) providerStart() {
	s.providerCalls.Add(1)
	now := s.providerNow.Add(1)
	for {
		peak := s.providerPeak.Load()
		if now <= peak || s.providerPeak.CompareAndSwap(peak, now) {
			return
		}
	}
}
