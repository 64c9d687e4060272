package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/worker/rungate"
	"github.com/sys1hq/sys1/worker/topology"
)

// Held replies. A rule with review: hold withholds a run's reply until a person has labelled
// every held question: the run finishes as usual (outcome stored, record published), but its
// gate entry lists the held questions (runState.Held) and its stored Reply is the reply still
// to send; replays answer nothing meanwhile. Every replica reads the accepted labels from one
// shared consumer (topology.HoldsConsumer). A label from the review page (source "review")
// for a held question of a held run:
//
//  1. sets that question's verdict to {"status": "reviewed", "label": …, "reviewer": …} in the
//     stored reply, keeping its rule and reason, and drops the question from Held;
//  2. once Held is empty, says {"status": "reviewed", "item": …} in the reply's review and
//     sends the reply to the run's Sys1-Reply-To, with the headers every reply has;
//  3. then saves the entry, compare-and-set on the revision it read (a conflict — another
//     label of the same run, on another replica — re-reads and starts again).
//
// Sending before saving means a crash in between loses nothing: the label comes back, finds
// the question still held and sends the same reply again (replies are at least once, and a
// durable reply's Nats-Msg-Id absorbs the copy within the dedupe window). The same can happen
// when one question's label is delivered twice at once (its ack wait ran out); the review page
// gives each item one label, so a release normally sends one reply, and any copy is identical.
// Once saved, replays of the run answer with the reviewed reply.
//
// Producer labels never release a hold: holding is a person's approval, and a producer could
// otherwise approve its own runs. A label for a question that is not held, for a run that is
// not held (or unknown), or that is not a label at all is acked and left to the sink. A label
// for a run still finishing (its entry not yet done) comes back later, as does anything that
// meets NATS or KV trouble: the consumer redelivers without bound, with a growing delay.

// errRunFinishing is a label that arrived before its run's outcome was stored.
var errRunFinishing = errors.New("the labelled run is still finishing")

// heldReplies releases held replies as reviewers' labels arrive, until ctx ends.
func (w *Worker) heldReplies(ctx, runCtx context.Context) {
	w.consumeLabels(ctx, runCtx, w.opt.Topology.LabelsStream, w.opt.Topology.HoldsConsumer, &w.labelLoops.holds, topology.EnsureHoldsConsumer, w.releaseHold)
}

// releaseHold settles one accepted label on the holds consumer.
func (w *Worker) releaseHold(ctx context.Context, msg jetstream.Msg) {
	meta, err := msg.Metadata()
	if err != nil {
		_ = msg.Term()
		return
	}
	l, derr := contract.DecodeLabel(msg.Data())
	if derr != nil || l.Source != contract.LabelSourceReview {
		// Not a label (the sink parks it), or a producer's: neither releases anything.
		_ = msg.Ack()
		return
	}
	log := w.log.With().Str("run_id", l.RunID).Str("question", l.Question).Uint64("labels_seq", meta.Sequence.Stream).Uint64("delivery", meta.NumDelivered).Logger()
	if err := w.pipe.applyReview(ctx, w.pipe.outbox(msg, log), l); err != nil {
		delay := w.cfg.retry().Delay(int(meta.NumDelivered), 0)
		ev := log.Warn()
		if errors.Is(err, errRunFinishing) {
			ev = log.Debug()
		}
		ev.Err(err).Dur("retry_in", delay).Msg("could not apply a review label to its held run; redelivering")
		_ = msg.NakWithDelay(delay)
		return
	}
	_ = msg.Ack()
}

// applyReview applies a reviewer's label to the run it labels, if that run holds its reply for
// the question. o writes for the label's delivery (kept alive while storing), and logs.
func (p *pipeline) applyReview(ctx context.Context, o outbox, l *contract.Label) error {
	for range 8 {
		st, rev, err := p.gate.Lookup(ctx, l.RunID)
		if errors.Is(err, rungate.ErrUnreadable) {
			o.log.Error().Err(err).Msg("a review label names a run whose gate entry cannot be read; nothing released")
			return nil
		}
		if err != nil {
			return err
		}
		switch {
		case st == nil:
			return nil // unknown, or forgotten: nothing held
		case st.Status != runDone:
			// Its review items are published before its outcome (and hold) is stored: a quick
			// reviewer can be there first. It finishes, or the gate forgets it.
			return errRunFinishing
		case !slices.Contains(st.Held, l.Question):
			return nil // not held (any more): an audit label, a relabel, a redelivery
		case l.Caller != "" && l.Caller != st.Caller:
			o.log.Warn().Str("label_caller", l.Caller).Msg("a review label for another caller's run; its hold stays")
			return nil
		}
		var reply contract.Reply
		if err := json.Unmarshal(st.Reply, &reply); err != nil {
			o.log.Error().Err(err).Msg("the held reply does not decode; nothing released")
			return nil
		}
		for i := range reply.Verdicts {
			v := &reply.Verdicts[i]
			if v.Question == l.Question {
				v.Status, v.Label, v.Reviewer = contract.VerdictReviewed, l.Value, l.Reviewer
			}
			if v.Status == contract.VerdictReviewed && len(v.Label) == 0 {
				// A stored "label": null (none of these) reads back as no label: keep it said.
				v.Label = json.RawMessage("null")
			}
		}
		held := slices.DeleteFunc(slices.Clone(st.Held), func(q string) bool { return q == l.Question })
		if len(held) == 0 && reply.Review != nil {
			reply.Review.Status = contract.ReviewReviewed
		}
		body, _ := reply.MarshalJSON()
		if len(held) == 0 {
			if st.ReplyTo != "" {
				if err := o.reply(ctx, runReply(st.ReplyTo, reply.RunID, body, reply.Status), "reply:"+reply.RunID); err != nil {
					return err
				}
			}
		}
		st.Reply, st.Held = body, held
		_, err = p.gate.Save(ctx, l.RunID, st, rev)
		if rungate.IsConflict(err) {
			o.log.Debug().Msg("another label of this run changed its entry first; reading it again")
			continue
		}
		if err != nil {
			return fmt.Errorf("store the reviewed outcome: %w", err)
		}
		if len(held) == 0 {
			o.log.Info().Str("reviewer", l.Reviewer).Bool("answered", st.ReplyTo != "").Msg("held reply released: every held question is labelled")
		} else {
			o.log.Info().Str("reviewer", l.Reviewer).Strs("held", held).Msg("held question labelled; the reply waits for the rest")
		}
		return nil
	}
	return errors.New("the run's gate entry kept changing")
}
