package worker

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/worker/topology"
)

// reviewItems builds the review items of the questions the policy sent to human review:
// everything a reviewer needs to decide without the run record — the question and its
// options, the answer's distribution, the verdict's reason, and the state unless
// SYS1_REVIEW_STATE=none (images only as their hashes and sizes).
func (r *run) reviewItems(now time.Time) []contract.ReviewItem {
	if len(r.reviews) == 0 || r.resolved == nil || r.resp == nil {
		return nil
	}
	images := contract.Redact(r.resolved).Images
	refs := make([]contract.ImageRef, len(images))
	for i, im := range images {
		refs[i] = im.Ref()
	}
	items := make([]contract.ReviewItem, 0, len(r.reviews))
	for _, rv := range r.reviews {
		q := r.resolved.Questions[rv.Index]
		it := contract.ReviewItem{
			ID: contract.ReviewItemID(r.runID, q.Name), RunID: r.runID, Caller: r.identity.Caller, Subject: r.msg.Subject(),
			Provider: r.provider(), Model: r.answeredModel, Question: q.Name, Type: q.Type,
			Instructions: q.Instructions, Options: q.Options, Levels: q.Levels,
			Mode: rv.Mode, Audit: rv.Audit, Images: refs, CreatedAt: now.UTC(),
		}
		if it.Model == "" {
			it.Model = r.resolved.Model
		}
		if rv.Index < len(r.verdicts) {
			it.Verdict = r.verdicts[rv.Index]
		}
		if a := answerNamed(r.resp.Answers, q.Name); a != nil {
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
		if r.w.cfg.ReviewState == ReviewStateFull {
			it.State = r.resolved.State
		}
		items = append(items, it)
	}
	return items
}

func answerNamed(answers []contract.Answer, name string) *contract.Answer {
	for i := range answers {
		if answers[i].Name == name {
			return &answers[i]
		}
	}
	return nil
}

// reviewSubject is where the run's review items go: topology.ReviewSubject, the one rule the
// review page checks them by.
func (r *run) reviewSubject() (string, error) {
	return topology.ReviewSubject(r.msg.Subject())
}

// publishReviewItems writes the run's review items to SYS1_REVIEW, each de-duplicated by its
// id, before the run's reply says "pending": a reply never points at an item that is not
// there. An item too large to store with its state is stored without it.
func (r *run) publishReviewItems(ctx context.Context, items []contract.ReviewItem) error {
	subject, err := r.reviewSubject()
	if err != nil {
		// Unreachable: admit refused every request without a caller token.
		return fmt.Errorf("publish review items: %w", err)
	}
	for i := 0; i < len(items); i++ {
		it := &items[i]
		err := r.store(ctx, "publish a review item", func(ctx context.Context) error {
			body, _ := it.MarshalJSON()
			m := &nats.Msg{Subject: subject, Data: body, Header: nats.Header{}}
			m.Header.Set(HeaderRunID, r.runID)
			_, err := r.w.opt.JS.PublishMsg(ctx, m, jetstream.WithMsgID("review:"+it.ID))
			return err
		})
		if isTooLarge(err) && len(it.State) > 0 {
			r.log.Warn().Str("item", it.ID).Msg("review item too large to store with the run's state; stored without it")
			it.State = nil
			i-- // again, without the state
			continue
		}
		if err != nil {
			return fmt.Errorf("publish review item %s: %w", it.ID, err)
		}
	}
	return nil
}
