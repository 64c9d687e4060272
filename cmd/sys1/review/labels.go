package review

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/contract/wire"
	"github.com/sys1hq/sys1/worker/topology"
)

// Submitting a label is two writes, in this order:
//
//  1. Create the item's entry in the review bucket, marked "publishing". Create succeeds for
//     exactly one writer, so this is where the first label wins; a second reviewer's Create
//     fails and they are told who labelled the item first.
//  2. Publish the label to sys1.labels.<token>.accepted (the token of the item's subject,
//     sys1.review.<token>: topology.ReviewLabelSubject) with Nats-Msg-Id "review:<item>",
//     awaiting JetStream's ack, then update the entry to "published".
//
// If the process dies between 1 and 2 (or the publish fails), the entry says "publishing"
// and holds the whole label: every replica republishes such entries once they are older than
// the recovery grace, and a restarted replica does so at start. The message id makes a
// republish within the labels stream's duplicate window (SYS1_DEDUPE_WINDOW, 2 min) a no-op
// for JetStream, so a label whose ack was lost is not stored twice. Only if every replica stays
// down longer than that window right after a publish was acked but before the entry was updated
// can the same label reach the stream twice; the copies are identical, and the label sink keeps
// the latest label per run and question, so it still counts once.
//
// The other order (publish, then claim) would let two reviewers' labels for one item both
// reach the stream.

// msgIDPrefix prefixes the Nats-Msg-Id of a review label.
const msgIDPrefix = "review:"

// errAlreadyLabelled is returned with the entry of the label that won.
type errAlreadyLabelled struct{ by labelMeta }

func (e *errAlreadyLabelled) Error() string {
	return fmt.Sprintf("already labelled by %s at %s", e.by.Reviewer, e.by.LabelledAt.Format(time.RFC3339))
}

// errPublishDelayed means the label is saved (the item is won) but not on SYS1_LABELS yet; the
// recovery will publish it.
var errPublishDelayed = errors.New("the label is saved, but publishing it failed; it will be published automatically")

type labeller struct {
	js           jetstream.JetStream
	kv           jetstream.KeyValue
	idx          *index
	now          func() time.Time
	recoverAfter time.Duration
	log          zerolog.Logger
}

// labelValue checks a submitted form value against the item and returns the label value as
// JSON: choice → the option key (a string), noul → true/false, score → the level index;
// none → null ("none of these").
func labelValue(it *contract.ReviewItem, value string, none bool) (json.RawMessage, error) {
	if none {
		return json.RawMessage("null"), nil
	}
	switch it.Type {
	case contract.TypeChoice:
		for _, o := range it.Options {
			if o.Key == value {
				return json.RawMessage(contract.AppendJSONString(nil, value)), nil
			}
		}
		return nil, fmt.Errorf("%q is not one of the item's options", clip(value, 64))
	case contract.TypeNoul:
		if value == "true" || value == "false" {
			return json.RawMessage(value), nil
		}
		return nil, errors.New("a yes/no item takes true or false")
	case contract.TypeScore:
		n, err := strconv.Atoi(value)
		if err != nil || n < 0 || n >= len(it.Levels) || strconv.Itoa(n) != value {
			return nil, fmt.Errorf("a score label is a level index 0–%d", len(it.Levels)-1)
		}
		return json.RawMessage(value), nil
	}
	return nil, fmt.Errorf("unknown question type %q", it.Type)
}

// submit records reviewer's label for the item, read on sys1.review.<token>: the first label
// wins (errAlreadyLabelled otherwise), and a label that won is published or, failing that,
// left for the recovery (errPublishDelayed).
func (l *labeller) submit(ctx context.Context, it *contract.ReviewItem, token, reviewer string, value json.RawMessage) (contract.Label, error) {
	lbl := contract.Label{RunID: it.RunID, Question: it.Question, Value: value, Reviewer: reviewer,
		LabelledAt: l.now().UTC(), Source: contract.LabelSourceReview, Caller: it.Caller, Item: it.ID}
	subject, err := topology.ReviewLabelSubject(wire.Review(token))
	if err != nil {
		return lbl, err
	}
	body, err := json.Marshal(claim{Status: claimPublishing, Label: lbl, Subject: subject})
	if err != nil {
		return lbl, err
	}
	rev, err := l.kv.Create(ctx, it.ID, body)
	if errors.Is(err, jetstream.ErrKeyExists) {
		won, gerr := l.winner(ctx, it.ID)
		if gerr != nil {
			return lbl, fmt.Errorf("the item is already labelled, and reading by whom failed: %w", gerr)
		}
		return lbl, &errAlreadyLabelled{by: won}
	}
	if err != nil {
		return lbl, fmt.Errorf("save the label: %w", err)
	}
	// The entry is ours: from here on the label is never lost, only possibly late.
	l.idx.setLabel(it.ID, labelMeta{Reviewer: reviewer, LabelledAt: lbl.LabelledAt, Value: string(value), Revision: rev, Created: l.now()})
	if err := l.publish(ctx, it.ID, lbl, subject, rev); err != nil {
		l.log.Warn().Err(err).Str("item", it.ID).Str("run_id", it.RunID).Msg("label saved but not published yet; recovery will publish it")
		return lbl, errPublishDelayed
	}
	return lbl, nil
}

// winner reads the entry of an item that is already labelled.
func (l *labeller) winner(ctx context.Context, id string) (labelMeta, error) {
	e, err := l.kv.Get(ctx, id)
	if err != nil {
		return labelMeta{}, err
	}
	c, err := decodeClaim(e.Value())
	if err != nil {
		return labelMeta{Reviewer: "(unknown)", Created: e.Created()}, nil
	}
	return labelMeta{Reviewer: c.Label.Reviewer, LabelledAt: c.Label.LabelledAt, Value: string(c.Label.Value),
		Published: c.Status == claimPublished, Revision: e.Revision(), Created: e.Created()}, nil
}

// publish puts the label on SYS1_LABELS at subject (awaiting the ack) and marks the entry at
// revision rev published. A failed update is only logged: the entry stays "publishing" and
// the recovery's republish is absorbed by the message id.
func (l *labeller) publish(ctx context.Context, id string, lbl contract.Label, subject string, rev uint64) error {
	body, err := lbl.MarshalJSON()
	if err != nil {
		return err
	}
	msg := &nats.Msg{Subject: subject, Data: body, Header: nats.Header{}}
	msg.Header.Set(jetstream.MsgIDHeader, msgIDPrefix+id)
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := l.js.PublishMsg(pctx, msg); err != nil {
		return fmt.Errorf("publish to %s: %w", msg.Subject, err)
	}
	at := l.now().UTC()
	done, _ := json.Marshal(claim{Status: claimPublished, Label: lbl, Subject: subject, PublishedAt: &at})
	uctx, cancel2 := context.WithTimeout(ctx, 10*time.Second)
	defer cancel2()
	if newRev, err := l.kv.Update(uctx, id, done, rev); err != nil {
		l.log.Warn().Err(err).Str("item", id).Msg("label published, but marking its entry published failed; a republish will be de-duplicated")
	} else {
		l.idx.setLabel(id, labelMeta{Reviewer: lbl.Reviewer, LabelledAt: lbl.LabelledAt, Value: string(lbl.Value), Published: true, Revision: newRev, Created: l.now()})
	}
	return nil
}

// recoverOnce republishes every label whose entry has said "publishing" for longer than the
// grace (its writer died, or its publish failed). It returns how many it published.
func (l *labeller) recoverOnce(ctx context.Context) int {
	n := 0
	for id, m := range l.idx.publishing() {
		if l.now().Sub(m.Created) < l.recoverAfter {
			continue // its writer may still be publishing it
		}
		e, err := l.kv.Get(ctx, id)
		if err != nil {
			continue
		}
		c, err := decodeClaim(e.Value())
		if err != nil || c.Status != claimPublishing {
			continue
		}
		if err := l.publish(ctx, id, c.Label, c.labelSubject(), e.Revision()); err != nil {
			l.log.Warn().Err(err).Str("item", id).Msg("republishing a saved label failed; will retry")
			continue
		}
		n++
		l.log.Info().Str("item", id).Str("run_id", c.Label.RunID).Str("reviewer", c.Label.Reviewer).Msg("republished a saved label that had not been published")
	}
	return n
}

// recoverLoop runs recoverOnce as soon as the bucket's entries are known (a restarted replica
// publishes what its predecessor left at once), then every interval until ctx ends.
func (l *labeller) recoverLoop(ctx context.Context, every time.Duration) {
	select {
	case <-ctx.Done():
		return
	case <-l.idx.labelsLoaded:
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		l.recoverOnce(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
