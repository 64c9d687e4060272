package worker

import (
	"context"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/worker/policy"
)

// policy judges the provider's answers with the abstention policy (SYS1_POLICY_FILE): a
// verdict per question, beside the answers (which stay verbatim), and the questions that go
// to human review. Without a policy, or without an answer, it does nothing.
func (r *run) policy(context.Context) error {
	h := r.w.opt.Abstention
	if h == nil || r.resp == nil {
		return nil
	}
	out := h.Current().Evaluate(&policy.Input{
		RunID: r.runID, Caller: r.identity.Caller, Model: r.resolved.Model,
		Questions: r.resolved.Questions, Answers: r.resp.Answers,
		MinConfidence: r.minConfidence,
	})
	r.verdicts, r.reviews, r.hold = out.Verdicts, out.Review, out.Hold()
	if len(out.Review) > 0 {
		r.review = &contract.ReviewRef{Status: contract.ReviewPending, Item: contract.ReviewItemID(r.runID, out.Review[0].Question)}
	}
	return nil
}
