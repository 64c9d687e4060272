package worker

import (
	"context"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/worker/calibration"
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
		Calibrated: r.calibrated(), MinConfidence: r.minConfidence,
	})
	r.verdicts, r.reviews, r.hold = out.Verdicts, out.Review, out.Hold()
	if len(out.Review) > 0 {
		r.review = &contract.ReviewRef{Status: contract.ReviewPending, Item: contract.ReviewItemID(r.runID, out.Review[0].Question)}
	}
	return nil
}

// calibrated is the answers after the temperature fits that apply to them (one per question,
// nil where none does): fits are per model — the model that answered, as the record names it
// — caller and question, so a fit never applies to another model's probabilities.
func (r *run) calibrated() []*contract.Calibrated {
	fits := r.w.fits.Load()
	if fits == nil || fits.Len() == 0 {
		return nil
	}
	model := r.resp.Model
	if model == "" {
		model = r.answeredModel
	}
	var out []*contract.Calibrated
	for i, q := range r.resolved.Questions {
		fit, ok := fits.Lookup(model, r.identity.Caller, q.Name)
		if !ok {
			continue
		}
		a := answerNamed(r.resp.Answers, q.Name)
		if a == nil {
			continue
		}
		c, err := calibration.Apply(fit, a)
		if err != nil {
			r.log.Warn().Err(err).Str("question", q.Name).Msg("calibration fit does not apply to this answer; left uncalibrated")
			continue
		}
		if out == nil {
			out = make([]*contract.Calibrated, len(r.resolved.Questions))
		}
		out[i] = &c
	}
	return out
}
