package worker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sys1hq/sys1/worker/fair"
	"github.com/sys1hq/sys1/worker/pause"
	"github.com/sys1hq/sys1/worker/topology"
)

// fairShare is how a replica reads its lanes when SYS1_FAIR_SHARE is on (worker/fair): a
// Lane per kind of work, fed by the streams' arrivals, by its own retries and by a discovery
// of the streams' subject state every status interval.
type fairShare struct {
	interactive, batch, labels *fair.Lane
}

func (w *Worker) newFairShare() *fairShare {
	weight := func(caller string) int {
		if w.opt.Limits == nil {
			return 1
		}
		return w.opt.Limits.Current().Weight(caller)
	}
	lane := func(l topology.Lane) *fair.Lane {
		return fair.NewLane(fair.LaneConfig{Lane: l, Topology: w.opt.Topology, JS: w.opt.JS, Weight: weight, Log: w.log, Life: w.life})
	}
	return &fairShare{interactive: lane(topology.LaneInteractive), batch: lane(topology.LaneBatch), labels: lane(topology.LaneLabels)}
}

// wait returns once the lanes' background work has ended (the worker's life ended).
func (f *fairShare) wait() {
	for _, l := range []*fair.Lane{f.interactive, f.batch, f.labels} {
		l.Wait()
	}
}

func (f *fairShare) lane(l topology.Lane) *fair.Lane {
	switch l {
	case topology.LaneBatch:
		return f.batch
	case topology.LaneLabels:
		return f.labels
	}
	return f.interactive
}

// followArrivals subscribes to the streams' arrivals (topology.ArrivalsSubjects): each names
// the subject a message was stored on, and so its flow, the moment it is stored. They are
// hints: one lost (a slow subscription, a failover) is found by the next discovery.
func (w *Worker) followArrivals() (*nats.Subscription, error) {
	sub, err := w.opt.NC.Subscribe(topology.ArrivalsSubjects, func(m *nats.Msg) {
		if f, ok := topology.FlowOf(strings.TrimPrefix(m.Subject, topology.ArrivalsPrefix)); ok {
			w.fair.lane(f.Lane).Notify(f)
		}
	})
	if err != nil {
		return nil, err
	}
	// Arrivals are small (headers only) and cheap to handle; a backlog of them is dropped by
	// the client beyond these bounds rather than slowing the connection the runs share.
	_ = sub.SetPendingLimits(1<<20, 256<<20)
	return sub, nil
}

// discoverFlows reads the streams' subject state every status interval, so every flow with
// a message is found even when its arrival was missed, until ctx ends.
func (w *Worker) discoverFlows(ctx context.Context) {
	t := time.NewTicker(w.cfg.StatusInterval)
	defer t.Stop()
	for {
		w.discoverOnce(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (w *Worker) discoverOnce(ctx context.Context) {
	t := w.opt.Topology
	for _, s := range []struct {
		stream string
		lanes  []*fair.Lane
	}{{t.RequestsStream, []*fair.Lane{w.fair.interactive, w.fair.batch}}, {t.LabelSubmissionsStream, []*fair.Lane{w.fair.labels}}} {
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		stream, err := w.opt.JS.Stream(sctx, s.stream)
		if err == nil && stream.CachedInfo().State.Msgs == 0 {
			for _, l := range s.lanes {
				l.Empty()
			}
		} else if err == nil {
			for _, l := range s.lanes {
				if err = l.Discover(sctx, stream); err != nil {
					break
				}
			}
		}
		cancel()
		w.requestRepair(err) // a stream gone (NATS lost its store, an operator deleted it)
		if err != nil && ctx.Err() == nil && !errors.Is(err, context.DeadlineExceeded) {
			w.log.Debug().Err(err).Str("stream", s.stream).Msg("could not read the stream's subjects; flows are found by their arrivals until the next try")
		}
	}
}

// flowMsg is a delivery of a flow: handing it back with a delay (a transient failure, a rate
// limit) wakes the flow when the delay has passed, since nothing else would tell this
// replica the message is back.
type flowMsg struct {
	jetstream.Msg
	lane *fair.Lane
	flow topology.Flow
}

func (m flowMsg) Nak() error {
	err := m.Msg.Nak()
	m.lane.WakeAfter(m.flow, 0)
	return err
}

func (m flowMsg) NakWithDelay(d time.Duration) error {
	err := m.Msg.NakWithDelay(d)
	m.lane.WakeAfter(m.flow, d)
	return err
}

// pullFair is pull with fair share: whatever the interactive lane has for the free slots,
// then the batch lane for the slots left (within maxBatch), callers served by weighted round
// robin in each. With nothing to start it waits — for an arrival, a freed batch slot, a
// change of pause, or FetchWait, after which discovery may have found more — and returns 0.
func (w *Worker) pullFair(ctx context.Context, n int, maxBatch int64, work chan<- delivery) (int, error) {
	deliver := func(lane *fair.Lane, batch bool) fair.Deliver {
		return func(m jetstream.Msg, f topology.Flow) bool {
			return w.hand(ctx, flowMsg{Msg: m, lane: lane, flow: f}, batch, work)
		}
	}
	used := 0
	var err error
	if _, paused := w.pauses.Paused(topology.LaneInteractive); !paused {
		used, err = w.fair.interactive.Take(ctx, n, deliver(w.fair.interactive, false))
	}
	batchRoom := min(int64(n-used), maxBatch-w.batchInFlight.Load())
	_, batchPaused := w.pauses.Paused(topology.LaneBatch)
	if batchRoom > 0 && !batchPaused {
		b, berr := w.fair.batch.Take(ctx, int(batchRoom), deliver(w.fair.batch, true))
		used += b
		err = errors.Join(err, berr)
	}
	if used > 0 {
		return used, nil
	}
	if err != nil {
		return 0, err
	}
	var batchReady <-chan struct{}
	if !batchPaused && maxBatch-w.batchInFlight.Load() > 0 {
		batchReady = w.fair.batch.Ready()
	}
	idle := time.NewTimer(w.opt.FetchWait)
	defer idle.Stop()
	select {
	case <-w.fair.interactive.Ready():
	case <-batchReady:
	case <-w.batchFreed:
	case <-w.pauses.Changed():
	case <-w.repair:
		w.repairPending = true
	case <-idle.C:
	case <-ctx.Done():
	}
	return 0, nil
}

// followPauses opens the fleet bucket and starts following the lanes' pauses (once; the
// follower restarts its own watch). A replica started during a pause keeps it from its
// first pull on: the follow returns once the watch has delivered the current entries.
func (w *Worker) followPauses(ctx context.Context) error {
	kv, err := topology.EnsureKeyValue(ctx, w.opt.JS, w.opt.Topology.FleetBucketConfig())
	if err != nil {
		return fmt.Errorf("fleet bucket %s: %w", w.opt.Topology.FleetBucket, err)
	}
	if w.fleetKV.Load() != nil {
		return nil
	}
	w.fleetKV.Store(&kv)
	// The watch outlives New's context: it is the replica's for as long as it runs.
	w.pauses.Follow(w.life, kv, func(err error) {
		w.log.Warn().Err(err).Msg("the fleet's pause switch is not being followed; reading it every status interval meanwhile")
	})
	return nil
}

// readPauses re-reads the lanes' pauses (every status interval): a backstop for a watch that
// is slow to come back after a NATS failover.
func (w *Worker) readPauses(ctx context.Context) {
	kv := w.fleetKV.Load()
	if kv == nil || w.pauses.Watching() {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if states, err := pause.Read(ctx, *kv); err == nil {
		w.pauses.Replace(states)
	}
}
