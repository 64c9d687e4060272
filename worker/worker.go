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
	"math"
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
	"github.com/sys1hq/sys1/worker/budget"
	"github.com/sys1hq/sys1/worker/cache"
	"github.com/sys1hq/sys1/worker/calibration"
	"github.com/sys1hq/sys1/worker/internal/deadletter"
	"github.com/sys1hq/sys1/worker/internal/holds"
	"github.com/sys1hq/sys1/worker/internal/labelcheck"
	"github.com/sys1hq/sys1/worker/internal/orphans"
	"github.com/sys1hq/sys1/worker/limits"
	"github.com/sys1hq/sys1/worker/livefile"
	"github.com/sys1hq/sys1/worker/metrics"
	"github.com/sys1hq/sys1/worker/pause"
	"github.com/sys1hq/sys1/worker/policy"
	"github.com/sys1hq/sys1/worker/rungate"
	"github.com/sys1hq/sys1/worker/startup"
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
	// ModelPolicy is which models callers may name and the default (SYS1_MODEL,
	// SYS1_ALLOWED_MODELS, SYS1_KEEP_ALIVE): the request's resolution, not the abstention
	// policy below.
	ModelPolicy contract.Policy
	// Abstention is the abstention policy (SYS1_POLICY_FILE), reloaded as it changes; nil:
	// no policy — replies carry no verdicts, exactly as before policies existed.
	Abstention *policy.Handle
	// Limits are the per-caller budgets, rate limits and cache rules (SYS1_LIMITS_FILE);
	// Prices the USD prices of providers' models (SYS1_PRICES_FILE). Both re-read as they
	// change; nil: nobody is limited, every model is unpriced (cost_usd null).
	Limits *livefile.File[*limits.Limits]
	Prices *livefile.File[*limits.Prices]
	Auth   auth.Authenticator
	Logger zerolog.Logger
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
	// OnSetUpWait, when set, is told each time New could not set up the JetStream topology
	// for a passing reason (a leader election, a node down) and waits before trying again;
	// the command layer shows it on /readyz. New waits like that until ctx ends.
	OnSetUpWait func(err error, wait time.Duration)
}

// Worker is one replica's pool.
type Worker struct {
	cfg  Config
	opt  Options
	cons jetstream.Consumer // used by the pull loop alone, which also replaces it (ensure)
	// batchCons is the batch requests' consumer (sys1.batch.>), read only with slots no
	// interactive request is waiting for; batchInFlight counts the batch messages in hand.
	batchCons     jetstream.Consumer
	batchInFlight atomic.Int64
	// deadCons is the shared consumer of dead letters (deadletter.go); ensure replaces it.
	deadCons atomic.Pointer[jetstream.Consumer]
	// labelLoops are the consumers of SYS1_LABELS (labels.go, holds.go); ensure replaces them.
	labelLoops labelLoops
	// fair reads the lanes flow by flow, callers served in turn (SYS1_FAIR_SHARE, the
	// default; fairshare.go); nil when off, and cons, batchCons and the labels consumer
	// deliver in arrival order instead. batchFreed is signalled as batch slots free.
	fair       *fairShare
	batchFreed chan struct{}
	// pauses follows the fleet's pause switch (sys1 pause; KV sys1-fleet, fleetKV).
	pauses  *pause.Follower
	fleetKV atomic.Pointer[jetstream.KeyValue]
	// life bounds what the replica runs in the background from New on (the pause watch, flow
	// consumers being created); Run ends it on the way out, and so does a failed New.
	life    context.Context
	endLife context.CancelFunc
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
	gate                     rungate.Gate
	// pipe is what the runs' stages use (pipeline.go), built once the topology is in place;
	// holds releases held replies as reviewers' labels arrive (holds.go).
	pipe   *pipeline
	holds  *holds.Releaser
	labels *labelcheck.Checker
	dead   *deadletter.Answerer
	orphan *orphans.Sweeper
	log    zerolog.Logger
	stats  stats
	// chain is the providers. Each link's limiter bounds its calls in flight to Concurrency.
	// The pull loop admits twice as many messages, so the runs waiting for a slot have already
	// been claimed and validated, and the runs past their call store and publish their
	// outcome, while the provider stays busy: a slot is held for the call alone, never for a
	// JetStream round trip.
	chain *chain.Chain
	// fleet is the shared consumers' state, for health (service.go).
	fleet fleet
	// storage is the streams' room as this replica knows it (storage.go).
	storage storage
	// fits are the calibration fits (KV sys1-calibration), nil when the bucket is not usable.
	fits atomic.Pointer[calibration.Store]
	// budget enforces Limits (KV sys1-limits); nil without a limits file. cache is the exact
	// result cache (KV sys1-cache); nil when its bucket is not usable.
	budget *budget.Budget
	cache  *cache.Cache
	// background is work done off a run's path (cache writes); Run waits for it on the way out.
	background sync.WaitGroup
	// metrics and tracer observe the runs (observe.go).
	registry *prometheus.Registry
	metrics  *metrics.Worker
	tracer   trace.Tracer
}

// New ensures the JetStream topology (streams, run-id bucket, the shared consumer) and returns
// a worker ready to Run. While JetStream cannot answer for a passing reason — a stream or the
// meta group electing a leader, a node down — New waits with back-off, logging each try
// (startup.Retry), until ctx ends; a permanent error (a permission refused, a stream
// configured in a way sys1 cannot change) is returned at once.
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
	w := &Worker{cfg: cfg, opt: opt, repair: make(chan struct{}, 1), batchFreed: make(chan struct{}, 1), pauses: pause.NewFollower()}
	w.life, w.endLife = context.WithCancel(context.WithoutCancel(ctx))
	ok := false
	defer func() {
		if !ok {
			w.stopBackground()
		}
	}()
	w.log = opt.Logger.With().Str("worker", cfg.ID).Logger()
	w.storage.log, w.storage.variables = w.log, opt.Topology.StreamVariables()
	ch, err := w.buildChain()
	if err != nil {
		return nil, err
	}
	w.chain = ch
	if opt.Topology.FairShare {
		w.fair = w.newFairShare()
	}
	if err := w.instrument(); err != nil {
		return nil, err
	}
	setUp := startup.Retry{What: "the JetStream topology", Log: w.log, LastError: opt.NC.LastError, OnWait: opt.OnSetUpWait}
	if err := setUp.Do(ctx, func(ctx context.Context) error {
		if err := w.ensure(ctx); err != nil {
			return err
		}
		return w.openLimits(ctx)
	}); err != nil {
		return nil, err
	}
	if opt.Topology.MaxAckPending < 2*cfg.Concurrency {
		w.log.Warn().Int("max_ack_pending", opt.Topology.MaxAckPending).Int("concurrency", cfg.Concurrency).
			Msg("SYS1_MAX_ACK_PENDING is below twice this replica's concurrency (a replica holds up to 2 × SYS1_CONCURRENCY messages); it caps each request consumer across replicas, so raise it to at least 2 × replicas × SYS1_CONCURRENCY")
	}
	w.pipe = w.newPipeline()
	retry := func(n int) time.Duration { return w.cfg.retry().Delay(n, 0) }
	w.holds = &holds.Releaser{Gate: w.gate, Out: w.pipe.out, Log: w.log, Retry: retry}
	w.labels = &labelcheck.Checker{Auth: w.opt.Auth, Gate: w.gate, Out: w.pipe.out, Log: w.log,
		AllowAnyInbox: w.cfg.AllowAnyInbox, MaxDeliver: w.opt.Topology.ConsumerMaxDeliver, Retry: retry,
		RunIDTTL: w.opt.Topology.RunIDTTL, LabelsStream: w.opt.Topology.LabelsStream, RejectedMaxAge: w.opt.Topology.RejectedLabelsMaxAge}
	w.dead = &deadletter.Answerer{RequestsStream: w.opt.Topology.RequestsStream,
		Requests: func() deadletter.Stream { return w.requests }, Handle: w.handle,
		RetryBase: w.cfg.RetryBase, Log: w.log, Answered: func() { w.stats.deadLetters.Add(1) }}
	w.orphan = &orphans.Sweeper{Requests: func() orphans.Stream { return orphans.JetStream(w.requests) },
		StreamName: w.opt.Topology.RequestsStream, Handle: w.handle, LastDelivery: w.lastDelivery,
		RetryBase: w.cfg.RetryBase, Log: w.log, Answered: func() { w.stats.orphans.Add(1) }}
	ok = true
	return w, nil
}

// stopBackground ends the replica's background work (see life) and waits for it.
func (w *Worker) stopBackground() {
	w.endLife()
	if done := w.pauses.Done(); done != nil {
		<-done
	}
	if w.fair != nil {
		w.fair.wait()
	}
}

// ensure creates or updates the streams, the run-id bucket and the shared consumer, and
// notes which incarnation of the request stream this is. New calls it; so does the pull loop
// when they have vanished (NATS lost its store, or an operator deleted them).
func (w *Worker) ensure(ctx context.Context) error {
	kv, err := topology.Ensure(ctx, w.opt.JS, w.opt.Topology, topology.WithLogger(w.log))
	if err != nil {
		return err
	}
	if err := w.followPauses(ctx); err != nil {
		return err
	}
	removed, err := topology.RemoveOtherModeConsumers(ctx, w.opt.JS, w.opt.Topology)
	if len(removed) > 0 {
		w.log.Warn().Strs("consumers", removed).Bool("fair_share", w.opt.Topology.FairShare).
			Msg("removed the consumers of a fleet that read its lanes the other way (SYS1_FAIR_SHARE); their messages are delivered through this way's")
	}
	if err != nil {
		return err
	}
	var cons, batchCons jetstream.Consumer
	if w.fair == nil {
		if cons, err = topology.EnsureWorkerConsumer(ctx, w.opt.JS, w.opt.Topology); err != nil {
			return err
		}
		if batchCons, err = topology.EnsureBatchConsumer(ctx, w.opt.JS, w.opt.Topology); err != nil {
			return err
		}
	}
	if w.fits.Load() == nil {
		if err := w.loadFits(ctx); err != nil {
			return err
		}
	}
	dead, err := topology.EnsureDeadLetterConsumer(ctx, w.opt.JS, w.opt.Topology)
	if err != nil {
		return err
	}
	w.deadCons.Store(&dead)
	if err := w.ensureLabelConsumers(ctx); err != nil {
		return err
	}
	requests, err := w.opt.JS.Stream(ctx, w.opt.Topology.RequestsStream)
	if err != nil {
		return fmt.Errorf("stream %s: %w", w.opt.Topology.RequestsStream, err)
	}
	epoch := streamEpoch(requests.CachedInfo().Created)
	w.requestsEpoch.Store(&epoch)
	if w.requests == nil {
		w.requests, w.gate = requests, newGate(w.opt.JS, kv, w.opt.Topology.RunsBucket)
	}
	w.cons, w.batchCons = cons, batchCons
	return nil
}

// openLimits opens the budget's and the cache's buckets. Budgets are enforced or the worker
// does not start (a limit that silently does nothing would be worse than none); the cache is
// an optimisation, so a cache bucket this replica cannot use only turns it off — but one that
// cannot be reached for a passing reason (a leader election) is waited for like the rest,
// or a replica started during a failover would run without its cache until restarted.
func (w *Worker) openLimits(ctx context.Context) error {
	if w.opt.Limits != nil && w.budget == nil {
		kv, err := topology.EnsureKeyValue(ctx, w.opt.JS, w.opt.Topology.LimitsBucketConfig())
		if err != nil {
			return fmt.Errorf("limits bucket %s (SYS1_LIMITS_FILE needs it to enforce budgets): %w", w.opt.Topology.LimitsBucket, err)
		}
		b, err := budget.New(budget.Config{KV: kv, Log: w.log})
		if err != nil {
			return err
		}
		w.budget = b
	}
	if w.cache != nil {
		return nil
	}
	kv, err := topology.EnsureKeyValue(ctx, w.opt.JS, w.opt.Topology.CacheBucketConfig(w.cfg.CacheMaxTTL))
	if startup.Transient(err) {
		return fmt.Errorf("cache bucket %s: %w", w.opt.Topology.CacheBucket, err)
	}
	if err != nil {
		w.log.Warn().Err(err).Str("bucket", w.opt.Topology.CacheBucket).Msg("cannot use the cache bucket; the exact result cache is off")
		return nil
	}
	c, err := cache.New(cache.Config{KV: kv, JS: w.opt.JS, Log: w.log})
	if err != nil {
		return err
	}
	w.cache = c
	return nil
}

// loadFits opens the calibration bucket and follows its fits. Calibration is an addition:
// a bucket this replica cannot use (permissions) leaves runs uncalibrated, with a warning.
// A bucket that cannot be reached for a passing reason is an error, so start-up waits for it
// (a replica started during a leader election must not run uncalibrated until restarted).
func (w *Worker) loadFits(ctx context.Context) error {
	kv, err := topology.EnsureKeyValue(ctx, w.opt.JS, w.opt.Topology.CalibrationBucketConfig())
	if startup.Transient(err) {
		return fmt.Errorf("calibration bucket %s: %w", w.opt.Topology.CalibrationBucket, err)
	}
	if err != nil {
		w.log.Warn().Err(err).Str("bucket", w.opt.Topology.CalibrationBucket).Msg("cannot use the calibration bucket; runs are not calibrated")
		return nil
	}
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	store, err := calibration.NewStore(lctx, kv, w.log)
	if startup.Transient(err) {
		return fmt.Errorf("calibration fits: %w", err)
	}
	if err != nil {
		w.log.Warn().Err(err).Msg("cannot load the calibration fits; runs are not calibrated")
		return nil
	}
	w.fits.Store(store)
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

// topologyGone reports whether the request stream (or, without fair share, the shared
// consumer) no longer exists.
func (w *Worker) topologyGone(ctx context.Context) bool {
	if w.fair != nil {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err := w.opt.JS.Stream(ctx, w.opt.Topology.RequestsStream)
		return errors.Is(err, jetstream.ErrStreamNotFound)
	}
	return topology.ConsumerGone(ctx, w.opt.JS, w.opt.Topology.RequestsStream, w.opt.Topology.WorkerConsumer)
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
	work := make(chan delivery, cap(slots))
	var wg sync.WaitGroup
	for range cap(slots) {
		wg.Go(func() {
			for d := range work {
				w.handle(runCtx, d.msg)
				w.stats.inFlight.Add(-1)
				if d.batch {
					w.batchInFlight.Add(-1)
					select {
					case w.batchFreed <- struct{}{}:
					default:
					}
				}
				<-slots
			}
		})
	}
	// Batch requests may hold at most this many slots, even with no interactive traffic
	// (SYS1_BATCH_MAX_SHARE), so a burst of interactive requests never waits for more.
	// One slot always stays free of batch work, so an interactive request is pulled the moment
	// it arrives, not when a batch item finishes.
	maxBatch := max(min(int64(math.Floor(w.cfg.BatchMaxShare*float64(cap(slots)))), int64(cap(slots)-1)), 1)
	var dead sync.WaitGroup
	dead.Go(func() { w.deadLetters(ctx, runCtx) })
	dead.Go(func() { w.sweepOrphans(ctx, runCtx) })
	dead.Go(func() { w.labelSubmissions(ctx, runCtx) })
	dead.Go(func() { w.heldReplies(ctx, runCtx) })
	probed := w.chain.Start(ctx, w.cfg.ProbeInterval)
	// The streams' room and the callers' quotas are known before the first pull.
	w.refreshStorage(ctx)
	dead.Go(func() { w.watchFleet(ctx, w.cfg.StatusInterval) })
	if w.fair != nil {
		sub, err := w.followArrivals()
		if err != nil {
			// Discovery still finds every flow, a status interval later.
			w.log.Error().Err(err).Msg("cannot follow the streams' arrivals; new callers are found by discovery alone")
		} else {
			defer func() { _ = sub.Unsubscribe() }()
		}
		dead.Go(func() { w.discoverFlows(ctx) })
	}
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
		used, err := w.pull(ctx, n, maxBatch, work)
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
	w.background.Wait()
	if fits := w.fits.Load(); fits != nil {
		_ = fits.Stop()
	}
	if w.budget != nil {
		w.budget.Close()
	}
	w.stopBackground()
	w.log.Info().Msg("worker stopped")
	return nil
}

// delivery is one message handed to a runner, and which consumer it came from.
type delivery struct {
	msg   jetstream.Msg
	batch bool
}

// pull fills up to n reserved slots, interactive first: whatever interactive requests are
// waiting, then batch requests for the slots left (within maxBatch batch messages in hand).
// Both are asked without waiting; only when neither had anything does it wait (up to
// FetchWait) for interactive requests, so an idle replica picks up a burst at once and looks
// at batch work again right after. It returns how many slots it used.
func (w *Worker) pull(ctx context.Context, n int, maxBatch int64, work chan<- delivery) (int, error) {
	if w.fair != nil {
		return w.pullFair(ctx, n, maxBatch, work)
	}
	if _, paused := w.pauses.Paused(topology.LaneInteractive); paused {
		return w.pullPausedShared(ctx, n, maxBatch, work)
	}
	used, err := w.fetchNoWait(ctx, w.cons, n, false, work)
	if err != nil {
		return used, err
	}
	if _, paused := w.pauses.Paused(topology.LaneBatch); paused {
		if used > 0 {
			return used, nil
		}
		return w.fetchWait(ctx, w.cons, n, w.opt.FetchWait, work)
	}
	if allowance := min(int64(n-used), maxBatch-w.batchInFlight.Load()); allowance > 0 {
		b, err := w.fetchNoWait(ctx, w.batchCons, int(allowance), true, work)
		used += b
		if err != nil {
			return used, err
		}
	}
	if used > 0 {
		return used, nil
	}
	// Nothing to start: wait for an interactive request — briefly while batch work is in hand,
	// so a batch slot that frees is filled again soon.
	wait := w.opt.FetchWait
	if w.batchInFlight.Load() > 0 {
		wait = min(wait, batchRecheck)
	}
	return w.fetchWait(ctx, w.cons, n, wait, work)
}

// pullPausedShared is pull while the interactive lane is paused, without fair share: batch
// requests only (unless paused too), and otherwise a wait for the pause to change.
func (w *Worker) pullPausedShared(ctx context.Context, n int, maxBatch int64, work chan<- delivery) (int, error) {
	if _, paused := w.pauses.Paused(topology.LaneBatch); !paused {
		if allowance := min(int64(n), maxBatch-w.batchInFlight.Load()); allowance > 0 {
			if used, err := w.fetchNoWait(ctx, w.batchCons, int(allowance), true, work); used > 0 || err != nil {
				return used, err
			}
		}
	}
	idle := time.NewTimer(min(w.opt.FetchWait, w.cfg.StatusInterval))
	defer idle.Stop()
	select {
	case <-w.pauses.Changed():
	case <-w.batchFreed:
	case <-idle.C:
	case <-ctx.Done():
	}
	return 0, nil
}

// batchRecheck is how long an idle pull waits for interactive work while batch items are in
// hand: a bound on how late a freed batch slot is filled again.
const batchRecheck = 20 * time.Millisecond

// fetchNoWait pulls up to n messages from cons that are there now, and hands each to the
// runners (a slot is already reserved for each). It returns how many it handed over.
func (w *Worker) fetchNoWait(ctx context.Context, cons jetstream.Consumer, n int, batch bool, work chan<- delivery) (int, error) {
	mb, err := cons.FetchNoWait(n)
	return w.take(ctx, mb, err, n, batch, work)
}

// fetchWait is a pull of interactive requests that waits up to wait for the first.
func (w *Worker) fetchWait(ctx context.Context, cons jetstream.Consumer, n int, wait time.Duration, work chan<- delivery) (int, error) {
	mb, err := pullWaiting(cons, n, wait)
	return w.take(ctx, mb, err, n, false, work)
}

// pullWaiting is every waiting pull the worker makes: up to n messages, waiting at most wait.
// It is bounded by the server's expiry, not by a client-side context: the client then reads
// until the server's own "request expired" status, which comes after every message the server
// sent for the pull. A context deadline (FetchContext) stops the client 10% of the wait after
// the server's expiry (2 ms at batchRecheck), so a message the server sent just before its
// expiry could arrive after the client stopped reading and sit unacknowledged until AckWait:
// an interactive request answered 30 s late (sys1 bench --self --batch saw it in about one
// run in twelve). Shutdown waits at most wait (plus nats.go's 1 s grace should the status be
// lost).
func pullWaiting(cons jetstream.Consumer, n int, wait time.Duration) (jetstream.MessageBatch, error) {
	return cons.Fetch(n, jetstream.FetchMaxWait(wait))
}

// take hands a pull's messages to the runners.
func (w *Worker) take(ctx context.Context, mb jetstream.MessageBatch, err error, n int, batch bool, work chan<- delivery) (int, error) {
	if err != nil {
		return 0, fmt.Errorf("fetch %d: %w", n, err)
	}
	used := 0
	for msg := range mb.Messages() {
		if w.hand(ctx, msg, batch, work) {
			used++
		}
	}
	if err := mb.Error(); err != nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, jetstream.ErrNoMessages) {
		return used, fmt.Errorf("fetch: %w", err)
	}
	return used, nil
}

// hand gives a pulled message to the runners (a slot is reserved for it), or, pulled after
// SIGTERM, straight back for another replica; it reports whether the runners took it.
func (w *Worker) hand(ctx context.Context, msg jetstream.Msg, batch bool, work chan<- delivery) bool {
	if ctx.Err() != nil {
		_ = msg.Nak()
		return false
	}
	w.stats.inFlight.Add(1)
	if batch {
		w.batchInFlight.Add(1)
	}
	work <- delivery{msg: msg, batch: batch} // never blocks: a runner per slot, a slot per message
	return true
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
	cacheHits     atomic.Int64
	latency       ewma
	deadLetters   atomic.Int64
	orphans       atomic.Int64
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
	Orphans           int64 // requests below their consumer's floor answered by the sweep
}

// Stats returns the replica's counters.
func (w *Worker) Stats() Stats {
	return Stats{
		InFlight: w.stats.inFlight.Load(), ProviderInFlight: w.stats.providerNow.Load(),
		ProviderPeak: w.stats.providerPeak.Load(), ProviderCalls: w.stats.providerCalls.Load(),
		Succeeded: w.stats.succeeded.Load(), Failed: w.stats.failed.Load(),
		Retried: w.stats.retried.Load(), Replayed: w.stats.replayed.Load(),
		DeadLetters: w.stats.deadLetters.Load(), Orphans: w.stats.orphans.Load(),
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
