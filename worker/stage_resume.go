package worker

import (
	"context"
	"fmt"
	"time"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/worker/rungate"
	"github.com/sys1hq/sys1/worker/topology"
)

// A run's answer is kept in the gate before its first effect outside it — its review message
// (keepAnswer, called by publish) — and a later delivery of the same message finishes the run
// with that answer (resume) instead of asking the model again. Without it, a delivery that died
// between queueing the review and storing the outcome left a review item, and a held reply,
// for an answer the run never gave: the next delivery asked the model anew, and its different
// answer or its failure became the run's outcome (the soak found three such runs in ten
// minutes).

// keptAnswer is this message's answer kept in the gate by an earlier delivery, or nil.
func (r *run) keptAnswer() *rungate.Answer {
	if r.state == nil || r.state.Answer == nil || r.meta == nil || r.state.StreamSeq != r.meta.Sequence.Stream {
		return nil
	}
	return r.state.Answer
}

// resume takes up the answer an earlier delivery of this message kept (see keepAnswer): the
// run goes on from it — policy, review, outcome — without a provider call.
func (r *run) resume(context.Context) error {
	kept := r.keptAnswer()
	if kept == nil || r.resp != nil {
		return nil
	}
	resp, cerr := contract.DecodeResponse(r.resolved, kept.Response)
	if cerr != nil {
		// Written by a worker from a validated answer to this very request: unreachable unless
		// the entry was tampered with. The model decides again.
		r.log.Warn().Str("error", cerr.Error()).Msg("the answer an earlier delivery kept does not decode; asking the model again")
		return nil
	}
	r.resp, r.answeredBy, r.answeredModel, r.resumed = resp, kept.Provider, kept.Model, true
	r.log.Info().Str("provider", kept.Provider).Time("answered_at", kept.At).
		Msg("finishing the run with the answer an earlier delivery kept; the model is not asked again")
	return nil
}

// keepAnswer stores the answer in hand in the gate (with the attempts that got it), before
// the run's review message is queued: retried in place like every store of an answer the
// model was paid for. A run answered from its kept answer has it there already.
func (r *run) keepAnswer(ctx context.Context) error {
	if r.state == nil || r.resp == nil || r.keptAnswer() != nil {
		return nil
	}
	body, err := r.resp.MarshalJSON()
	if err != nil {
		return fmt.Errorf("encode the answer to keep: %w", err)
	}
	answer := &rungate.Answer{Response: body, Provider: r.answeredBy, Model: r.answeredModel, At: time.Now().UTC()}
	r.leaseMu.Lock()
	defer r.leaseMu.Unlock()
	st := *r.state
	st.Attempts, st.Answer = r.attempts, answer
	err = r.saveState(ctx, "keep the answer before its review", &st)
	if err != nil {
		return fmt.Errorf("keep the answer: %w", err)
	}
	*r.state = st
	return nil
}

// saveState writes st as the run's gate entry, compare-and-set on the revision this delivery
// holds, retried in place like every store of what the model was paid for.
func (r *run) saveState(ctx context.Context, what string, st *runState) error {
	return r.store(ctx, what, topology.KVStream(r.p.topo.RunsBucket), func(ctx context.Context) error {
		rev, err := r.p.gate.Save(ctx, r.runID, st, r.rev)
		if rungate.IsConflict(err) {
			return r.revisionMoved(ctx)
		}
		if err != nil {
			return err
		}
		r.rev = rev
		return nil
	})
}
