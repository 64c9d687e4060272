package worker

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sys1hq/sys1/worker/topology"
)

// Producer labels are checked by worker/internal/labelcheck; this replica's part is the
// consumers that deliver the submissions to it.

// labelLoops are the worker's two consumers of SYS1_LABELS; ensure replaces them.
type labelLoops struct {
	labels atomic.Pointer[jetstream.Consumer] // submissions (labels.go)
	holds  atomic.Pointer[jetstream.Consumer] // accepted labels (holds.go)
}

// ensureLabelConsumers creates or updates the consumer of submissions and that of accepted
// labels (the streams themselves are topology.Ensure's).
func (w *Worker) ensureLabelConsumers(ctx context.Context) error {
	if w.fair == nil { // with fair share each sender's submissions have a consumer of their own
		labels, err := topology.EnsureLabelsConsumer(ctx, w.opt.JS, w.opt.Topology)
		if err != nil {
			return err
		}
		w.labelLoops.labels.Store(&labels)
	}
	holds, err := topology.EnsureHoldsConsumer(ctx, w.opt.JS, w.opt.Topology)
	if err != nil {
		return err
	}
	w.labelLoops.holds.Store(&holds)
	return nil
}

// labelSubmissions checks submitted labels until ctx ends; runCtx bounds the work on one.
func (w *Worker) labelSubmissions(ctx, runCtx context.Context) {
	w.drainLegacyLabels(ctx, runCtx)
	if w.fair != nil {
		w.consumeLabelFlows(ctx, runCtx)
		return
	}
	w.consumeLabels(ctx, runCtx, w.opt.Topology.LabelSubmissionsStream, w.opt.Topology.LabelsConsumer, &w.labelLoops.labels, topology.EnsureLabelsConsumer, w.labels.Check)
}

// consumeLabelFlows checks submitted labels with fair share: one at a time, senders served in
// turn (worker/fair), so one sender's flood of labels does not hold up another's, until ctx
// ends.
func (w *Worker) consumeLabelFlows(ctx, runCtx context.Context) {
	lane := w.fair.labels
	var fails int
	for ctx.Err() == nil {
		if w.storage.isFull(w.opt.Topology.LabelsStream) {
			// Back-pressure, as in consumeLabels: nothing is pulled while a checked label
			// could not be stored.
			select {
			case <-time.After(w.cfg.StatusInterval):
			case <-ctx.Done():
			}
			continue
		}
		n, err := lane.Take(ctx, 1, func(m jetstream.Msg, f topology.Flow) bool {
			if ctx.Err() != nil {
				_ = m.Nak() // pulled after SIGTERM: another replica takes it
				return false
			}
			w.labels.Check(runCtx, flowMsg{Msg: m, lane: lane, flow: f})
			return true
		})
		if n > 0 {
			fails = 0
			continue
		}
		wait := w.opt.FetchWait
		if err != nil {
			fails++
			wait = min(time.Duration(fails)*200*time.Millisecond, 5*time.Second)
			w.log.Debug().Err(err).Dur("retry_in", wait).Msg("label pull failed")
		}
		ready := lane.Ready()
		if err != nil {
			ready = nil // back off first
		}
		idle := time.NewTimer(wait)
		select {
		case <-ready:
		case <-idle.C:
		case <-ctx.Done():
		}
		idle.Stop()
	}
}

// drainLegacyLabels checks the submissions a version before SYS1_LABEL_SUBMISSIONS left on
// SYS1_LABELS, through its consumer there, until none is left: an upgrade loses no label.
// A fleet upgraded long ago has no such consumer, or an empty one, and this returns at once.
func (w *Worker) drainLegacyLabels(ctx, runCtx context.Context) {
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	cons := topology.LegacyLabelsConsumer(lctx, w.opt.JS, w.opt.Topology)
	cancel()
	if cons == nil {
		return
	}
	log := w.log.With().Str("consumer", w.opt.Topology.LabelsConsumer).Str("stream", w.opt.Topology.LabelsStream).Logger()
	log.Info().Msg("checking the label submissions an earlier version left on the labels stream")
	for ctx.Err() == nil {
		batch, err := pullWaiting(cons, 4, w.opt.FetchWait)
		n := 0
		if err == nil {
			for m := range batch.Messages() {
				n++
				w.labels.Check(runCtx, m)
			}
		}
		if n > 0 {
			continue
		}
		ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
		info, err := cons.Info(ictx)
		cancel()
		if err != nil || info.NumPending == 0 && info.NumAckPending == 0 {
			log.Info().Msg("the earlier version's label submissions are all checked")
			return
		}
	}
}

// consumeLabels pulls from one consumer of stream until ctx ends and hands each message to
// handle. A consumer that vanished (deleted by an operator, or with its stream) is recreated
// once it has been gone for topology.RecreateSettle.
func (w *Worker) consumeLabels(ctx, runCtx context.Context, stream, name string, cons *atomic.Pointer[jetstream.Consumer],
	ensure func(context.Context, jetstream.JetStream, topology.Config) (jetstream.Consumer, error), handle func(context.Context, jetstream.Msg)) {
	log := w.log.With().Str("consumer", name).Logger()
	var fails int
	var goneSince time.Time
	for ctx.Err() == nil {
		if stream == w.opt.Topology.LabelSubmissionsStream && w.storage.isFull(w.opt.Topology.LabelsStream) {
			// Back-pressure: a checked label could not be stored now, and pulling would only
			// spend the submissions' deliveries. They wait, unread, until there is room.
			select {
			case <-time.After(w.cfg.StatusInterval):
			case <-ctx.Done():
			}
			continue
		}
		// Bounded by the server's expiry, not by ctx (see pullWaiting): a pull the client stops
		// reading before the server's expiry status can strand messages until AckWait.
		// One message a pull, as with fair share: a pull of several stays open after its first
		// and takes back a refused label's own redeliveries (nak'd for a retry delay, which can
		// be shorter than the pull) before the check above could see the stream full, spending
		// every delivery until the label is dropped unchecked.
		batch, err := pullWaiting(*cons.Load(), 1, w.opt.FetchWait)
		if err == nil {
			for m := range batch.Messages() {
				if ctx.Err() != nil {
					_ = m.Nak() // pulled after SIGTERM: another replica takes it
					continue
				}
				handle(runCtx, m)
			}
			err = batch.Error()
		}
		if err == nil || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) {
			fails, goneSince = 0, time.Time{}
			continue
		}
		fails++
		if topology.ConsumerGone(ctx, w.opt.JS, stream, name) {
			switch {
			case goneSince.IsZero():
				goneSince = time.Now()
				log.Warn().Err(err).Dur("recreate_in", topology.RecreateSettle).Msg("the labels stream or this consumer is gone; recreating it")
			case time.Since(goneSince) >= topology.RecreateSettle:
				if err := w.recreateLabelConsumer(ctx, cons, ensure); err != nil {
					log.Warn().Err(err).Msg("could not recreate the consumer; trying again")
				} else {
					log.Warn().Msg("recreated the consumer")
					fails, goneSince = 0, time.Time{}
					continue
				}
			}
		}
		delay := min(time.Duration(fails)*200*time.Millisecond, 5*time.Second)
		log.Debug().Err(err).Dur("retry_in", delay).Msg("label pull failed")
		select {
		case <-time.After(delay):
		case <-ctx.Done():
		}
	}
}

func (w *Worker) recreateLabelConsumer(ctx context.Context, cons *atomic.Pointer[jetstream.Consumer],
	ensure func(context.Context, jetstream.JetStream, topology.Config) (jetstream.Consumer, error)) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := topology.EnsureLabelSubmissionsStream(ctx, w.opt.JS, w.opt.Topology, topology.WithLogger(w.log)); err != nil {
		return err
	}
	c, err := ensure(ctx, w.opt.JS, w.opt.Topology)
	if err != nil {
		return err
	}
	cons.Store(&c)
	return nil
}
