package worker

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/contract/wire"
	"github.com/sys1hq/sys1/worker/internal/outbox"
	"github.com/sys1hq/sys1/worker/metrics"
	"github.com/sys1hq/sys1/worker/topology"
)

// reviewRun builds the run's review message: everything a reviewer needs to decide without
// the run record — each question sent to review with its options, the answer's distribution
// and the verdict's reason — and, once for all of them, the state unless
// SYS1_REVIEW_STATE=none (images only as their hashes and sizes). nil when nothing goes to
// review.
func (r *run) reviewRun(now time.Time) *contract.ReviewRun {
	if len(r.reviews) == 0 || r.resolved == nil || r.resp == nil {
		return nil
	}
	images := contract.Redact(r.resolved).Images
	refs := make([]contract.ImageRef, len(images))
	for i, im := range images {
		refs[i] = im.Ref()
	}
	rr := &contract.ReviewRun{RunID: r.runID, Caller: r.identity.Caller, Subject: r.msg.Subject(), Provider: r.provider(), Model: r.answeredModel,
		Images: refs, CreatedAt: now.UTC(), Items: make([]contract.ReviewItem, 0, len(r.reviews))}
	if rr.Model == "" {
		rr.Model = r.resolved.Model
	}
	if r.p.cfg.ReviewState == ReviewStateFull {
		rr.State = r.resolved.State
	}
	for _, rv := range r.reviews {
		q := r.resolved.Questions[rv.Index]
		it := contract.ReviewItem{
			ID: contract.ReviewItemID(r.runID, q.Name), Question: q.Name, Type: q.Type,
			Instructions: q.Instructions, Options: q.Options, Levels: q.Levels,
			Mode: rv.Mode, Audit: rv.Audit,
		}
		if rv.Index < len(r.verdicts) {
			it.Verdict = r.verdicts[rv.Index]
		}
		if a := contract.AnswerNamed(r.resp.Answers, q.Name); a != nil {
			it.Probabilities, it.Confidence = a.Probabilities, a.Confidence
			switch q.Type {
			case contract.TypeChoice:
				it.Choice = a.Choice
			case contract.TypeNoul:
				it.Noul = &a.Noul
			case contract.TypeScore:
				it.Score = &a.Score
			}
		}
		rr.Items = append(rr.Items, it)
	}
	return rr
}

// reviewSubject is where the run's review items go: topology.ReviewSubject, the one rule the
// review page checks them by.
func (r *run) reviewSubject() (string, error) {
	return topology.ReviewSubject(r.msg.Subject())
}

// queueReview writes the run's review message to SYS1_REVIEW, de-duplicated by the run's
// first item id, before the run's reply says "pending": a reply never points at an item that
// is not there. A message too large to store with its state is stored without it.
//
// A message JetStream refuses for want of room — the caller's SYS1_REVIEW_MAX_PER_CALLER
// reached, or SYS1_REVIEW full — is not retried: the run is answered all the same, its reply
// saying the review was not queued and why, and a held run is not held (nobody could release
// it). It reports whether the run's review changed that way. Any other failure (NATS trouble
// past SYS1_STORE_RETRY) is returned: the run is redelivered.
func (r *run) queueReview(ctx context.Context, now time.Time) (bool, error) {
	rr := r.reviewRun(now)
	if rr == nil || r.reviewQueued {
		return false, nil
	}
	subject, err := r.reviewSubject()
	if err != nil {
		// Unreachable: admit refused every request without a caller token.
		return false, fmt.Errorf("publish review items: %w", err)
	}
	stream := r.p.topo.ReviewStream
	for {
		body, _ := rr.MarshalJSON()
		m := &nats.Msg{Subject: subject, Data: body, Header: nats.Header{}}
		m.Header.Set(wire.HeaderRunID, r.runID)
		err := r.out().Publish(ctx, "publish the review item", stream, m, jetstream.WithMsgID("review:"+rr.Items[0].ID))
		if outbox.IsTooLarge(err) && len(rr.State) > 0 {
			r.log.Warn().Str("item", rr.Items[0].ID).Msg("review item too large to store with the run's state; stored without it")
			rr.State = nil
			continue // again, without the state
		}
		if refused, ok := outbox.RefusedBy(err); ok || outbox.IsTooLarge(err) {
			r.reviewNotQueued(refused, err)
			return true, nil
		}
		if err != nil {
			return false, fmt.Errorf("publish review item %s: %w", rr.Items[0].ID, err)
		}
		r.reviewQueued = true
		return false, nil
	}
}

// reviewNotQueued answers a run whose review item could not be stored: the reply says so and
// why, and the run is not held.
func (r *run) reviewNotQueued(refused *outbox.Refused, err error) {
	var reason string
	switch {
	case refused != nil && refused.Refusal == topology.RefusedQuota:
		reason = fmt.Sprintf("caller %q already has %d review items on %s (SYS1_REVIEW_MAX_PER_CALLER); this run's were not queued",
			r.identity.Caller, r.p.topo.ReviewPerCaller, refused.Stream)
		r.p.metrics.QuotaRefused(metrics.QuotaReview)
	case refused != nil && refused.Refusal == topology.RefusedStorage:
		reason = "the NATS server has no storage left; this run's review items were not queued"
	case refused != nil:
		reason = fmt.Sprintf("%s is full (SYS1_REVIEW_MAX_BYTES); this run's review items were not queued", refused.Stream)
	default:
		reason = "the review item is too large to store; it was not queued"
	}
	r.log.Warn().Err(err).Str("reason", reason).Bool("held", r.hold).Msg("review not queued; the run is answered without it")
	if r.review != nil {
		r.review.Status, r.review.Reason = contract.ReviewNotQueued, reason
	}
	r.hold, r.reviewRefused = false, true
}
