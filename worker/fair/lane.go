package fair

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/sys1hq/sys1/worker/topology"
)

// LaneConfig is what a Lane needs.
type LaneConfig struct {
	Lane     topology.Lane
	Topology topology.Config
	JS       jetstream.JetStream
	// Weight is a caller's weight (the limits file's weight; 1 when nil or below 1). It is
	// asked each time a caller's flow becomes active, so a reloaded limits file applies from
	// the next turn on.
	Weight func(caller string) int
	Log    zerolog.Logger
	// Creators bounds the flow consumers being created at once (0: 4). Creation runs beside
	// the pull loop, never in it: a thousand new callers at once must not hold up the others.
	Creators int
	// Life bounds the lane's own background work (consumer creation); nil: never ends.
	// Wait returns once it has ended and that work is done.
	Life context.Context
}

// Lane reads one lane (interactive requests, batch requests or label submissions) fairly.
// Notify, WakeAfter and Discover may be called from any goroutine; Take from one pull loop
// only.
type Lane struct {
	cfg     LaneConfig
	stream  string
	log     zerolog.Logger
	sem     chan struct{} // creators
	working sync.WaitGroup

	mu      sync.Mutex
	arrived map[string]topology.Flow // flows to activate, from any of the three ways
	ready   chan struct{}
	counts  map[string]uint64 // messages per caller at the last discovery (waiting or in hand)
	total   uint64
	// cons are the flows' consumers known to exist; creating marks those being created.
	cons     map[string]jetstream.Consumer
	creating map[string]bool
	lastErr  time.Time // when a creation failure was last logged
	// fresh holds, for flows an arrival announced, until when an empty fetch is looked at
	// again (see recheck).
	fresh map[string]time.Time

	// The pull loop's alone.
	sched *Scheduler
	flows map[string]topology.Flow
}

// NewLane returns a lane that knows of no flow yet.
func NewLane(cfg LaneConfig) *Lane {
	if cfg.Creators <= 0 {
		cfg.Creators = 4
	}
	if cfg.Life == nil {
		cfg.Life = context.Background()
	}
	return &Lane{
		cfg: cfg, stream: cfg.Topology.LaneStream(cfg.Lane),
		log:     cfg.Log.With().Str("lane", string(cfg.Lane)).Logger(),
		sem:     make(chan struct{}, cfg.Creators),
		arrived: map[string]topology.Flow{}, ready: make(chan struct{}, 1),
		counts: map[string]uint64{}, cons: map[string]jetstream.Consumer{}, creating: map[string]bool{}, fresh: map[string]time.Time{},
		sched: NewScheduler(), flows: map[string]topology.Flow{},
	}
}

// Ready is signalled when a flow may have become active (an arrival, a retry due, a
// discovery): the pull loop, idle, then calls Take.
func (l *Lane) Ready() <-chan struct{} { return l.ready }

func (l *Lane) signal() {
	select {
	case l.ready <- struct{}{}:
	default:
	}
}

// Notify says a message of f was stored (an arrival, sys1.arrivals.<subject>). Flows of
// other lanes are ignored.
func (l *Lane) Notify(f topology.Flow) {
	if f.Lane != l.cfg.Lane {
		return
	}
	now := time.Now()
	l.mu.Lock()
	l.arrived[f.Key()] = f
	if len(l.fresh) >= 4096 { // flows whose fetch never came (a consumer not created): forget them
		for k, until := range l.fresh {
			if now.After(until) {
				delete(l.fresh, k)
			}
		}
	}
	l.fresh[f.Key()] = now.Add(freshFor)
	l.mu.Unlock()
	l.signal()
}

// An arrival can overtake its message: the stream republishes it once stored, but a flow's
// consumer learns of it a moment later (a signal inside nats-server; in a cluster, a consumer
// whose leader is another replica of the stream waits for replication), and a fetch in that
// moment finds nothing. So a flow an arrival announced that comes back empty is fetched
// again after recheck, for up to freshFor; after that, discovery finds what is left.
const (
	freshFor = 100 * time.Millisecond
	recheck  = 10 * time.Millisecond
)

// WakeAfter activates f once d has passed: a delivery handed back with a delay comes back
// then, and nothing else would say so. Like an arrival, the wake is fresh for a moment: the
// server may make the message deliverable a little after the delay, and a fetch that comes
// back empty then is tried again (see recheck) rather than left to the next discovery.
func (l *Lane) WakeAfter(f topology.Flow, d time.Duration) {
	time.AfterFunc(d, func() {
		l.mu.Lock()
		l.arrived[f.Key()] = f
		l.fresh[f.Key()] = time.Now().Add(freshFor)
		l.mu.Unlock()
		l.signal()
	})
}

// Discover reads the lane's subject state and activates every flow that holds a message. It
// finds what arrivals and retries missed: messages a replica that died was holding, an
// arrival lost in a NATS failover, flows of a replica that just started.
func (l *Lane) Discover(ctx context.Context, stream jetstream.Stream) error {
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(topology.LaneSubjects(l.cfg.Lane)))
	if err != nil {
		return fmt.Errorf("%s lane: read the subjects of %s: %w", l.cfg.Lane, l.stream, err)
	}
	l.apply(info.State.Subjects)
	return nil
}

// Empty records a discovery that found the stream empty.
func (l *Lane) Empty() { l.apply(nil) }

func (l *Lane) apply(subjects map[string]uint64) {
	counts := map[string]uint64{}
	var total uint64
	found := 0
	l.mu.Lock()
	for subject, n := range subjects {
		f, ok := topology.FlowOf(subject)
		if !ok || n == 0 || f.Lane != l.cfg.Lane {
			continue
		}
		counts[f.Caller] += n
		total += n
		l.arrived[f.Key()] = f
		found++
	}
	l.counts, l.total = counts, total
	l.mu.Unlock()
	if found > 0 {
		l.signal()
	}
}

// Waiting is what the last discovery found: messages (waiting or in hand) per caller, and
// in all.
func (l *Lane) Waiting() (perCaller map[string]uint64, total uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string]uint64, len(l.counts))
	for k, v := range l.counts {
		out[k] = v
	}
	return out, l.total
}

// Active is the number of flows the pull loop will fetch from, and of their callers.
func (l *Lane) Active() (flows, callers int) { return l.sched.Active() }

// Deliver hands one fetched message to the runners; false means it was not taken (the
// replica is stopping, and handed it back).
type Deliver func(jetstream.Msg, topology.Flow) bool

// Take fetches up to n messages, from flows in the Scheduler's order, and hands each to
// deliver with its flow. It returns how many were taken, and an error only when none was
// because no flow could be read.
//
// The pulls of one pass are all sent before any is read: with many callers each turn is one
// message, and a round trip per flow, one after the other, would make the pull loop slower
// the more callers compete (a round trip per message where arrival order takes every free
// slot in one). A pass costs one round trip whatever the number of flows it reads.
func (l *Lane) Take(ctx context.Context, n int, deliver Deliver) (int, error) {
	l.absorb(ctx)
	used := 0
	var firstErr error
	for used < n && ctx.Err() == nil {
		pulls := l.plan(n - used)
		if len(pulls) == 0 {
			break
		}
		for i := range pulls {
			pulls[i].send(l)
		}
		for _, p := range pulls {
			got, exhausted, err := p.receive(l, deliver)
			if err != nil {
				exhausted = true
				if firstErr == nil && !gone(err) {
					firstErr = err
				}
				if gone(err) {
					// Removed for idleness (or by an operator) between our pulls: created again
					// with the flow's next activation.
					l.mu.Lock()
					delete(l.cons, p.key)
					l.arrived[p.key] = p.flow
					l.mu.Unlock()
				}
			}
			if exhausted {
				l.sched.Deactivate(p.key)
				delete(l.flows, p.key)
			}
			l.settleFresh(p.flow, got, err)
			used += got
		}
	}
	if used > 0 {
		return used, nil
	}
	return 0, firstErr
}

// pull is one flow's part of a pass: up to k messages.
type pull struct {
	key  string
	flow topology.Flow
	cons jetstream.Consumer
	k    int
	mb   jetstream.MessageBatch
	err  error
}

// plan is the Scheduler's order for up to left messages, as one pull per flow. Each turn is
// recorded as taken in full when planned; a flow that gives fewer is exhausted and leaves
// the round when its pull is read (a caller with several flows, the batch lane's, may so be
// charged for up to a turn it did not get: never more than its weight).
func (l *Lane) plan(left int) []pull {
	var pulls []pull
	index := map[string]int{}
	for left > 0 {
		key, k, ok := l.sched.Next(left)
		if !ok {
			break
		}
		l.mu.Lock()
		cons := l.cons[key]
		l.mu.Unlock()
		if cons == nil { // found gone by an earlier pull of this Take: created again first
			l.sched.Took(key, 0, true)
			delete(l.flows, key)
			continue
		}
		l.sched.Took(key, k, false)
		if i, ok := index[key]; ok {
			pulls[i].k += k
		} else {
			index[key] = len(pulls)
			pulls = append(pulls, pull{key: key, flow: l.flows[key], cons: cons, k: k})
		}
		left -= k
	}
	return pulls
}

// send asks for the flow's messages that are there now; receive reads them.
func (p *pull) send(l *Lane) {
	p.mb, p.err = p.cons.FetchNoWait(p.k)
	if p.err != nil {
		p.err = fmt.Errorf("%s lane: fetch from %s: %w", l.cfg.Lane, l.cfg.Topology.FlowConsumer(p.flow), p.err)
	}
}

// receive hands the pull's messages to deliver; exhausted says the flow has no more now.
func (p *pull) receive(l *Lane, deliver Deliver) (got int, exhausted bool, err error) {
	if p.err != nil {
		return 0, true, p.err
	}
	var last jetstream.Msg
	n := 0
	for m := range p.mb.Messages() {
		n++
		last = m
		if deliver(m, p.flow) {
			got++
		}
	}
	if err := p.mb.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) && !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, context.DeadlineExceeded) {
		return got, true, fmt.Errorf("%s lane: fetch from %s: %w", l.cfg.Lane, l.cfg.Topology.FlowConsumer(p.flow), err)
	}
	if n < p.k {
		return got, true, nil
	}
	// Every message carries how many more the consumer has waiting: none, and the flow is
	// idle now without another round trip to find out.
	if meta, err := last.Metadata(); err == nil && meta.NumPending == 0 {
		return got, true, nil
	}
	return got, false, nil
}

// settleFresh ends a flow's fresh window once it gave a message (or failed), and looks at an
// empty one again while its window lasts.
func (l *Lane) settleFresh(f topology.Flow, got int, err error) {
	key := f.Key()
	l.mu.Lock()
	until, ok := l.fresh[key]
	again := ok && got == 0 && err == nil && time.Now().Before(until)
	if !again {
		delete(l.fresh, key)
	}
	l.mu.Unlock()
	if again {
		time.AfterFunc(recheck, func() {
			l.mu.Lock()
			l.arrived[key] = f
			l.mu.Unlock()
			l.signal()
		})
	}
}

// absorb moves the flows found active since the last Take into the scheduler; those whose
// consumer is not known to exist yet are created in the background first.
func (l *Lane) absorb(ctx context.Context) {
	l.mu.Lock()
	if len(l.arrived) == 0 {
		l.mu.Unlock()
		return
	}
	arrived := l.arrived
	l.arrived = map[string]topology.Flow{}
	var create []topology.Flow
	var ready []topology.Flow
	for key, f := range arrived {
		switch {
		case l.cons[key] != nil:
			ready = append(ready, f)
		case !l.creating[key]:
			l.creating[key] = true
			create = append(create, f)
		}
	}
	l.mu.Unlock()
	for _, f := range ready {
		l.flows[f.Key()] = f
		l.sched.Activate(f.Caller, f.Key(), l.weight(f.Caller))
	}
	for _, f := range create {
		l.working.Go(func() { l.create(l.cfg.Life, f) })
	}
}

// Wait returns once the lane's background work has ended (LaneConfig.Life ended).
func (l *Lane) Wait() { l.working.Wait() }

func (l *Lane) weight(caller string) int {
	if l.cfg.Weight == nil {
		return 1
	}
	return max(l.cfg.Weight(caller), 1)
}

// create makes a flow's consumer (or finds it made by another replica) and then activates
// the flow.
func (l *Lane) create(ctx context.Context, f topology.Flow) {
	select {
	case l.sem <- struct{}{}:
	case <-ctx.Done():
		l.mu.Lock()
		delete(l.creating, f.Key())
		l.mu.Unlock()
		return
	}
	defer func() { <-l.sem }()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cfg := l.cfg.Topology.FlowConsumerConfig(f)
	cons, err := l.cfg.JS.CreateOrUpdateConsumer(ctx, l.stream, cfg)
	l.mu.Lock()
	delete(l.creating, f.Key())
	if err != nil {
		logIt := time.Since(l.lastErr) > 10*time.Second && ctx.Err() == nil
		if logIt {
			l.lastErr = time.Now()
		}
		l.mu.Unlock()
		if logIt {
			l.log.Warn().Err(err).Str("consumer", cfg.Durable).Str("caller", f.Caller).
				Msg("cannot create a flow's consumer; its messages wait in the stream and are tried again at the next discovery")
		}
		return
	}
	l.cons[f.Key()] = cons
	l.arrived[f.Key()] = f
	l.mu.Unlock()
	l.signal()
}

// gone reports whether err says the consumer (or its stream) no longer exists.
func gone(err error) bool {
	return errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrConsumerDeleted) ||
		errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse)
}
