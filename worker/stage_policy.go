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
	h := r.p.abstention
	if h == nil || r.resp == nil {
		return nil
	}
	calibrated, risks := r.fitsFor()
	out := h.Current().Evaluate(&policy.Input{
		RunID: r.runID, Caller: r.identity.Caller, Model: r.resolved.Model,
		Questions: r.resolved.Questions, Answers: r.resp.Answers,
		Calibrated: calibrated, Risk: risks, MinConfidence: r.minConfidence,
	})
	r.verdicts, r.reviews, r.hold = out.Verdicts, out.Review, out.Hold()
	if len(out.Review) > 0 {
		// The reply names every review item of the run (items), and the first one as item.
		ids := make([]string, len(out.Review))
		for i, rv := range out.Review {
			ids[i] = contract.ReviewItemID(r.runID, rv.Question)
		}
		r.review = &contract.ReviewRef{Status: contract.ReviewPending, Item: ids[0], Items: ids}
	}
	return nil
}

// fitsFor is what the fits that apply to the run's questions give the policy, one entry per
// question (nil where none does): the answers after their temperature, and the risk fits of
// max_error rules. Fits are per model — the model that answered, as the record names it —
// caller and question, so a fit never applies to another model's probabilities. A fit's
// temperature applies only when it converged (a fit stored for its risk threshold alone
// carries none).
func (r *run) fitsFor() (calibrated []*contract.Calibrated, risks []policy.RiskFit) {
	fits := r.p.fits.Load()
	if fits == nil || fits.Len() == 0 {
		return nil, nil
	}
	model := r.resp.Model
	if model == "" {
		model = r.answeredModel
	}
	n := len(r.resolved.Questions)
	for i, q := range r.resolved.Questions {
		fit, ok := fits.Lookup(model, r.identity.Caller, q.Name)
		if !ok {
			continue
		}
		if fit.Risk != nil {
			if risks == nil {
				risks = make([]policy.RiskFit, n)
			}
			risks[i] = fit.Risk
		}
		if !fit.AppliesTemperature() {
			continue
		}
		a := contract.AnswerNamed(r.resp.Answers, q.Name)
		if a == nil {
			continue
		}
		c, err := calibration.Apply(fit, a)
		if err != nil {
			r.log.Warn().Err(err).Str("question", q.Name).Msg("calibration fit does not apply to this answer; left uncalibrated")
			continue
		}
		if calibrated == nil {
			calibrated = make([]*contract.Calibrated, n)
		}
		calibrated[i] = &c
	}
	return calibrated, risks
}
