// Package loadtest generates System One load against a sys1 deployment and measures it: it
// publishes requests from concurrent producers at a target rate, collects every reply on one
// inbox subscription (matched by Sys1-Run-Id), and reports throughput, end-to-end latency,
// queue wait, provider time and failures by code. Self starts a whole deployment in-process
// (embedded NATS, worker replicas, fake Ollama) so the worker's own overhead can be measured
// on a laptop.
package loadtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"

	"github.com/sys1hq/sys1/contract/wire"
	"github.com/sys1hq/sys1/worker/client"
)

// CodeNoReply is the failure code of a run whose reply never arrived: no reply for
// Options.ReplyTimeout, or the run was interrupted. It is not a SYS1_ code: the worker never
// said the run failed, the generator just stopped waiting.
const CodeNoReply = "no_reply"

// Options describe one load run.
type Options struct {
	// Requests is how many requests to publish; with Duration set it is an upper bound (0:
	// none). One of the two is required.
	Requests int
	// Duration is how long to keep publishing.
	Duration time.Duration
	// Rate is the target publish rate over all producers, per second; 0 publishes as fast
	// as the producers can.
	Rate float64
	// Producers is how many goroutines publish concurrently (each awaits JetStream's ack).
	Producers int
	// Caller is the subject token: requests go to sys1.decide.<Caller>.
	Caller string
	// Callers, above 1, spreads the requests over that many callers, round robin: request i
	// goes to sys1.decide.<Caller>-<i mod Callers>.
	Callers int
	// Body is the request JSON sent with every message.
	Body []byte
	// ReplyTimeout is how long to wait with no reply arriving before giving up on the
	// outstanding runs (they count as CodeNoReply). Zero means 30 s.
	ReplyTimeout time.Duration
	// BeforeDrain, when set, runs after the requests are published and before replies are
	// awaited (the preload mode: build a backlog, then start the workers), with how many were
	// published (fewer than Requests when publishing failed part way: those still drain). The
	// throughput clock starts when it returns.
	BeforeDrain func(ctx context.Context, published int64) error
	// Progress, when set, is called about twice a second while the run lasts.
	Progress func(Progress)
	// Sampler, when set, samples memory while replies are collected.
	Sampler *MemorySampler
}

// Progress is a live snapshot of a run.
type Progress struct {
	Sent, Answered, Outstanding int64
	Elapsed                     time.Duration
}

// Report is a run's result. Sent = Succeeded + Failed always holds: a run that got no reply is
// failed with CodeNoReply.
type Report struct {
	Sent      int            `json:"sent"`
	Succeeded int            `json:"succeeded"`
	Failed    int            `json:"failed"`
	FailedBy  map[string]int `json:"failed_by_code"`
	// PublishErrors are requests JetStream did not store (not counted in Sent);
	// FirstPublishError says why the first one failed.
	PublishErrors     int    `json:"publish_errors"`
	FirstPublishError string `json:"first_publish_error"`
	// DuplicateReplies are replies for runs already answered (replies are at least once).
	DuplicateReplies int `json:"duplicate_replies"`
	// UnmatchedReplies are replies for no run this generator awaited: a request whose publish
	// reported an error though JetStream stored it, or another generator's reply. Neither
	// kind is counted in Succeeded or Failed.
	UnmatchedReplies int `json:"unmatched_replies"`
	// LateReplies are replies that came after the generator stopped waiting (ReplyTimeout
	// without a reply, or interrupted): their runs stay counted as CodeNoReply.
	LateReplies int `json:"late_replies"`
	// ElapsedMS is from the first publish (or, with a preload, the start of the drain) to the
	// last reply; Throughput is replies per second over it.
	ElapsedMS  float64 `json:"elapsed_ms"`
	Throughput float64 `json:"throughput_per_s"`
	// PublishMS is how long publishing took; PublishRate the achieved publish rate.
	PublishMS   float64 `json:"publish_ms"`
	PublishRate float64 `json:"publish_rate_per_s"`
	// TargetRate is Options.Rate (0: as fast as possible). ScheduleLag is, with a rate, how
	// late each publish started against its due time (request i is due i/rate after the
	// start): near zero when the producers keep up; growing when they cannot, and then the
	// achieved rate is below the target (more producers, -c, or a lower rate).
	TargetRate  float64 `json:"target_rate_per_s"`
	ScheduleLag Summary `json:"schedule_lag"`
	// Latency is end to end: publish start to reply received, per answered run.
	Latency Summary `json:"latency"`
	// Latencies are Latency's samples, ascending, for pooling runs' distributions.
	Latencies []time.Duration `json:"-"`
	// QueueWait is the reply's queued_ms: stream publish to the worker starting the run.
	QueueWait Summary `json:"queue_wait"`
	// ProviderTime is every attempt's latency_ms.
	ProviderTime Summary `json:"provider_time"`
	// CPUMS is the CPU time this process used from the start of the clock to the end (user +
	// system, every thread), and CPUPerDecisionMS that over the answered runs. With --self the
	// process is the whole deployment (NATS, workers, fake, generator), so this is the cost of
	// a decision, far steadier than throughput on a shared machine.
	CPUMS            float64 `json:"cpu_ms"`
	CPUPerDecisionMS float64 `json:"cpu_per_decision_ms"`
	// Peak is the most concurrent provider calls, when known (see Peak).
	Peak *Peak `json:"provider_peak"`
	// Memory is the process memory while replies were collected (--self only).
	Memory *MemoryReport `json:"memory"`
}

// Run publishes the requests and collects their replies on nc. It returns an error only when
// the run could not take place (bad options, no stream, no connection); failed runs are in
// the report.
func Run(ctx context.Context, nc *nats.Conn, o Options) (*Report, error) {
	if err := o.check(); err != nil {
		return nil, err
	}
	if o.ReplyTimeout <= 0 {
		o.ReplyTimeout = 30 * time.Second
	}
	cl, err := client.New(nc)
	if err != nil {
		return nil, err
	}
	g := newGenerator(o, func(ctx context.Context, req client.Request) error {
		_, err := cl.Publish(ctx, req)
		return err
	})
	// One subscription for every reply: a per-request inbox would cost a subscription round
	// trip per request and skew what we measure.
	g.inbox = nc.NewInbox()
	sub, err := nc.Subscribe(g.inbox, g.onReply)
	if err != nil {
		return nil, fmt.Errorf("subscribe to the reply inbox: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	// A slow consumer would drop replies and report them as lost: never limit this one.
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		return nil, fmt.Errorf("reply subscription limits: %w", err)
	}
	if err := nc.Flush(); err != nil {
		return nil, fmt.Errorf("register the reply subscription: %w", err)
	}
	return g.run(ctx)
}

// run publishes, awaits the replies (delivered to onReply) and makes the report.
func (g *generator) run(ctx context.Context) (*Report, error) {
	o := g.o
	stopProgress := g.progress(ctx)
	defer stopProgress()

	cpuAtStart, _ := processCPU()
	g.start = time.Now()
	pubErr := g.publishAll(ctx)
	published := time.Now()
	if pubErr != nil && g.sent.Load() == 0 {
		return nil, pubErr
	}
	g.clock = g.start
	if o.BeforeDrain != nil {
		if err := o.BeforeDrain(ctx, g.sent.Load()); err != nil {
			return nil, fmt.Errorf("before drain: %w", err)
		}
		g.mu.Lock()
		g.clock = time.Now()
		g.mu.Unlock()
	}
	if o.Sampler != nil {
		o.Sampler.Start()
	}
	cpu0, cpuOK := processCPU()
	if o.BeforeDrain == nil {
		// Without a preload the clock started before publishing; so does the CPU count.
		cpu0 = cpuAtStart
	}
	g.await(ctx)
	// From here the outstanding runs are no_reply: a reply still to come is late, and must
	// neither turn one into an answer nor stretch the throughput window by the wait.
	g.mu.Lock()
	g.givenUp = true
	g.mu.Unlock()
	cpu1, _ := processCPU()
	if o.Sampler != nil {
		o.Sampler.Stop()
	}
	rep := g.report(published)
	if cpuOK && rep.Latency.Count > 0 {
		rep.CPUMS = ms(cpu1 - cpu0)
		rep.CPUPerDecisionMS = rep.CPUMS / float64(rep.Latency.Count)
	}
	if o.Sampler != nil {
		rep.Memory = o.Sampler.Report()
	}
	if pubErr != nil {
		return rep, pubErr
	}
	return rep, nil
}

func (o *Options) check() error {
	var errs []error
	if o.Requests < 0 {
		errs = append(errs, fmt.Errorf("requests must not be negative, got %d", o.Requests))
	}
	if o.Requests == 0 && o.Duration <= 0 {
		errs = append(errs, errors.New("set a number of requests or a duration"))
	}
	if o.Duration < 0 {
		errs = append(errs, fmt.Errorf("duration must not be negative, got %s", o.Duration))
	}
	if o.Rate < 0 {
		errs = append(errs, fmt.Errorf("rate must not be negative, got %g", o.Rate))
	}
	if o.Producers < 1 {
		errs = append(errs, fmt.Errorf("producers must be at least 1, got %d", o.Producers))
	}
	if o.Callers < 0 {
		errs = append(errs, fmt.Errorf("callers must not be negative, got %d", o.Callers))
	}
	if o.Caller == "" {
		errs = append(errs, errors.New("caller is required"))
	}
	if len(o.Body) == 0 {
		errs = append(errs, errors.New("request body is empty"))
	}
	if o.BeforeDrain != nil && o.Requests == 0 {
		errs = append(errs, errors.New("a preload needs a number of requests, not a duration"))
	}
	return errors.Join(errs...)
}

func newGenerator(o Options, publish func(context.Context, client.Request) error) *generator {
	g := &generator{
		o: o, publishFn: publish, prefix: "bench-" + nuid.Next() + "-",
		pending: map[string]time.Time{}, failedBy: map[string]int{}, answeredCh: make(chan struct{}, 1),
	}
	if o.Callers > 1 {
		for i := range o.Callers {
			g.callers = append(g.callers, o.Caller+"-"+strconv.Itoa(i))
		}
	}
	return g
}

type generator struct {
	o         Options
	publishFn func(context.Context, client.Request) error
	inbox     string
	prefix    string   // every run id is prefix + its request index
	callers   []string // Options.Callers' names, when above 1
	start     time.Time

	next      atomic.Int64 // the next request index to publish
	sent      atomic.Int64
	answeredN atomic.Int64
	pubErrs   atomic.Int64
	// answeredCh is signalled (non-blocking) on every reply so await notices the end.
	answeredCh chan struct{}

	mu        sync.Mutex
	pending   map[string]time.Time // run id → publish start
	answered  bitset               // request indexes answered: a further reply is a duplicate
	clock     time.Time            // throughput clock start
	last      time.Time            // last reply
	succeeded int
	failedBy  map[string]int
	dups      int
	unmatched int
	late      int  // replies to runs already given up as no_reply
	givenUp   bool // await has ended: outstanding runs are no_reply
	latency   []time.Duration
	// bodies are the answered replies, decoded only when the report is made: parsing JSON
	// while the run goes on would take CPU from the deployment being measured.
	bodies      [][]byte
	queueWait   []time.Duration
	providerMS  []time.Duration
	lag         []time.Duration // with a rate: how late each publish started against its due time
	firstPubErr string
}

// publishAll runs the producers until the count or the duration is reached, ctx ends, or
// publishing fails for good (no stream).
func (g *generator) publishAll(ctx context.Context) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	for range g.o.Producers {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := g.next.Add(1) - 1
				if g.o.Requests > 0 && i >= int64(g.o.Requests) {
					return
				}
				var dueAt time.Time
				if g.o.Rate > 0 {
					// The i-th request is due at i/rate: a schedule, not a sleep after each
					// publish, so a slow ack does not lower the rate. Producers that fall
					// behind publish late rather than skip (the report's schedule lag).
					due := time.Duration(float64(i) / g.o.Rate * float64(time.Second))
					if g.o.Duration > 0 && due >= g.o.Duration {
						return
					}
					dueAt = g.start.Add(due)
					if !waitUntil(ctx, dueAt) {
						return
					}
				} else if g.o.Duration > 0 && time.Since(g.start) >= g.o.Duration {
					return
				}
				if err := g.publish(ctx, i, dueAt); err != nil {
					if errors.Is(err, client.ErrNoStream) || errors.Is(err, nats.ErrConnectionClosed) {
						cancel(err)
						return
					}
					if g.pubErrs.Add(1) == 1 {
						g.mu.Lock()
						g.firstPubErr = err.Error()
						g.mu.Unlock()
					}
				}
			}
		})
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// publish publishes request i, due at dueAt (zero: no schedule).
func (g *generator) publish(ctx context.Context, i int64, dueAt time.Time) error {
	runID := g.prefix + strconv.FormatInt(i, 10)
	// Register before publishing: a fast worker can answer before the publish ack arrives.
	g.mu.Lock()
	now := time.Now()
	// Latency runs from when the request was due, not from when a producer that fell behind
	// got round to it: a real client keeping that schedule would have waited all along, and
	// measuring from the late start would hide exactly the slowness (coordinated omission).
	start := now
	if !dueAt.IsZero() && dueAt.Before(now) {
		start = dueAt
	}
	g.pending[runID] = start
	if !dueAt.IsZero() {
		g.lag = append(g.lag, now.Sub(start))
	}
	g.mu.Unlock()
	caller := g.o.Caller
	if len(g.callers) > 0 {
		caller = g.callers[i%int64(len(g.callers))]
	}
	err := g.publishFn(ctx, client.Request{Caller: caller, Body: g.o.Body, RunID: runID, ReplyTo: g.inbox})
	if err != nil {
		g.mu.Lock()
		answered := g.answered.has(i)
		delete(g.pending, runID)
		g.mu.Unlock()
		if !answered {
			return err
		}
		// Answered before the publish reported its error (an ack lost or timed out after
		// JetStream stored the request): the run was sent, and its reply is already counted.
	}
	g.sent.Add(1)
	return nil
}

// index is the request index of one of this run's ids.
func (g *generator) index(runID string) (int64, bool) {
	rest, ok := strings.CutPrefix(runID, g.prefix)
	if !ok {
		return 0, false
	}
	i, err := strconv.ParseInt(rest, 10, 64)
	return i, err == nil && i >= 0
}

// replyView is the part of the reply envelope (SPEC §4) the report needs.
type replyView struct {
	Status string `json:"status"`
	Error  *struct {
		Code string `json:"code"`
	} `json:"error"`
	Attempts []struct {
		LatencyMS int64 `json:"latency_ms"`
	} `json:"attempts"`
	QueuedMS int64 `json:"queued_ms"`
}

func (g *generator) onReply(msg *nats.Msg) {
	now := time.Now()
	runID := msg.Header.Get(wire.HeaderRunID)

	g.mu.Lock()
	defer g.mu.Unlock()
	sentAt, ok := g.pending[runID]
	if ok && g.givenUp {
		g.late++
		return
	}
	if !ok {
		// Not awaited: a second reply to an answered run (replies are at least once), or a
		// reply matching no run of ours (another generator's, or a request whose publish
		// reported an error though JetStream stored it).
		if i, mine := g.index(runID); mine && g.answered.has(i) {
			g.dups++
		} else {
			g.unmatched++
		}
		return
	}
	delete(g.pending, runID)
	if i, mine := g.index(runID); mine {
		g.answered.set(i)
	}
	g.last = now
	g.latency = append(g.latency, now.Sub(sentAt))
	g.bodies = append(g.bodies, msg.Data) // a fresh slice per message: safe to keep
	g.answeredN.Add(1)
	select {
	case g.answeredCh <- struct{}{}:
	default:
	}
}

// tally decodes the answered replies into outcomes, queue waits and provider times.
func (g *generator) tally() {
	for _, body := range g.bodies {
		var v replyView
		if err := json.Unmarshal(body, &v); err != nil {
			g.failedBy["unparseable_reply"]++
			continue
		}
		if v.Status == "success" {
			g.succeeded++
		} else {
			code := "unknown"
			if v.Error != nil && v.Error.Code != "" {
				code = v.Error.Code
			}
			g.failedBy[code]++
		}
		g.queueWait = append(g.queueWait, time.Duration(v.QueuedMS)*time.Millisecond)
		for _, a := range v.Attempts {
			g.providerMS = append(g.providerMS, time.Duration(a.LatencyMS)*time.Millisecond)
		}
	}
	g.bodies = nil
}

// await waits until every published run is answered, no reply arrives for ReplyTimeout, or
// ctx ends.
func (g *generator) await(ctx context.Context) {
	idle := time.NewTimer(g.o.ReplyTimeout)
	defer idle.Stop()
	for g.answeredN.Load() < g.sent.Load() {
		select {
		case <-ctx.Done():
			return
		case <-idle.C:
			return
		case <-g.answeredCh:
			if !idle.Stop() {
				select {
				case <-idle.C:
				default:
				}
			}
			idle.Reset(g.o.ReplyTimeout)
		}
	}
}

func (g *generator) report(published time.Time) *Report {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.tally()
	r := &Report{
		Sent:              int(g.sent.Load()),
		Succeeded:         g.succeeded,
		FailedBy:          map[string]int{},
		PublishErrors:     int(g.pubErrs.Load()),
		FirstPublishError: g.firstPubErr,
		DuplicateReplies:  g.dups,
		UnmatchedReplies:  g.unmatched,
		LateReplies:       g.late,
		PublishMS:         ms(published.Sub(g.start)),
		Latency:           Summarize(g.latency),
		Latencies:         g.latency, // sorted by Summarize
		QueueWait:         Summarize(g.queueWait),
		ProviderTime:      Summarize(g.providerMS),
		TargetRate:        g.o.Rate,
		ScheduleLag:       Summarize(g.lag),
	}
	for code, n := range g.failedBy {
		r.FailedBy[code] = n
		r.Failed += n
	}
	if len(g.pending) > 0 {
		r.FailedBy[CodeNoReply] = len(g.pending)
		r.Failed += len(g.pending)
	}
	if pub := published.Sub(g.start); pub > 0 {
		r.PublishRate = float64(r.Sent) / pub.Seconds()
	}
	if answered := len(g.latency); answered > 0 && g.last.After(g.clock) {
		el := g.last.Sub(g.clock)
		r.ElapsedMS = ms(el)
		r.Throughput = float64(answered) / el.Seconds()
	}
	return r
}

// progress reports a live snapshot every 500 ms until the returned stop is called.
func (g *generator) progress(ctx context.Context) (stop func()) {
	if g.o.Progress == nil {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(500 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
				sent, answered := g.sent.Load(), g.answeredN.Load()
				g.o.Progress(Progress{Sent: sent, Answered: answered, Outstanding: max(sent-answered, 0), Elapsed: time.Since(g.start)})
			}
		}
	})
	return func() { close(done); wg.Wait() }
}

// waitUntil sleeps until t; false if ctx ended first.
func waitUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// bitset is a growable set of request indexes.
type bitset []uint64

func (b bitset) has(i int64) bool {
	w := i / 64
	return w < int64(len(b)) && b[w]&(1<<(uint64(i)%64)) != 0
}

func (b *bitset) set(i int64) {
	w := int(i / 64)
	if w >= len(*b) {
		*b = append(*b, make([]uint64, w+1-len(*b))...)
	}
	(*b)[w] |= 1 << (uint64(i) % 64)
}
