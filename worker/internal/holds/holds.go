// Package holds releases held replies. A rule with review: hold withholds a run's reply until
// a person has labelled every held question: the run finishes as usual (outcome stored, record published), but its
// gate entry lists the held questions (rungate.State.Held) and its stored Reply is the reply still
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
package holds

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/worker/internal/outbox"
	"github.com/sys1hq/sys1/worker/rungate"
)

// errRunFinishing is a label that arrived before its run's outcome was stored.
var errRunFinishing = errors.New("the labelled run is still finishing")

// Releaser applies accepted labels to held runs.
type Releaser struct {
	Gate rungate.Gate
	Out  *outbox.Config
	Log  zerolog.Logger
	// Retry is the delay before a label that could not be applied comes back, by delivery.
	Retry func(delivery int) time.Duration
}

// Release settles one accepted label on the holds consumer: acked once applied (or when it
// releases nothing), nak'ed with the retry delay when the run is still finishing or NATS
// could not be reached.
func (h *Releaser) Release(ctx context.Context, msg jetstream.Msg) {
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
	log := h.Log.With().Str("run_id", l.RunID).Str("question", l.Question).Uint64("labels_seq", meta.Sequence.Stream).Uint64("delivery", meta.NumDelivered).Logger()
	if err := h.apply(ctx, h.Out.For(msg, log), log, l); err != nil {
		delay := h.Retry(int(meta.NumDelivered))
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
// the question. o writes for the label's delivery (kept alive while storing).
func (h *Releaser) apply(ctx context.Context, o outbox.Writer, log zerolog.Logger, l *contract.Label) error {
	for range 8 {
		st, rev, err := h.Gate.Lookup(ctx, l.RunID)
		if errors.Is(err, rungate.ErrUnreadable) {
			log.Error().Err(err).Msg("a review label names a run whose gate entry cannot be read; nothing released")
			return nil
		}
		if err != nil {
			return err
		}
		switch {
		case st == nil:
			return nil // unknown, or forgotten: nothing held
		case st.Status != rungate.StatusDone:
			// Its review items are published before its outcome (and hold) is stored: a quick
			// reviewer can be there first. It finishes, or the gate forgets it.
			return errRunFinishing
		case !slices.Contains(st.Held, l.Question):
			return nil // not held (any more): an audit label, a relabel, a redelivery
		case l.Caller != "" && l.Caller != st.Caller:
			log.Warn().Str("label_caller", l.Caller).Msg("a review label for another caller's run; its hold stays")
			return nil
		}
		var reply contract.Reply
		if err := json.Unmarshal(st.Reply, &reply); err != nil {
			log.Error().Err(err).Msg("the held reply does not decode; nothing released")
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
				if err := o.Reply(ctx, outbox.RunReply(st.ReplyTo, reply.RunID, body, reply.Status), "reply:"+reply.RunID); err != nil {
					return err
				}
			}
		}
		st.Reply, st.Held = body, held
		_, err = h.Gate.Save(ctx, l.RunID, st, rev)
		if rungate.IsConflict(err) {
			log.Debug().Msg("another label of this run changed its entry first; reading it again")
			continue
		}
		if err != nil {
			return fmt.Errorf("store the reviewed outcome: %w", err)
		}
		if len(held) == 0 {
			log.Info().Str("reviewer", l.Reviewer).Bool("answered", st.ReplyTo != "").Msg("held reply released: every held question is labelled")
		} else {
			log.Info().Str("reviewer", l.Reviewer).Strs("held", held).Msg("held question labelled; the reply waits for the rest")
		}
		return nil
	}
	return errors.New("the run's gate entry kept changing")
}
