// Package calibration fits, measures, stores and applies temperature scaling of System One
// answers, learnt from labels (the ClickHouse view labelled_answers).
//
// # The model
//
// One temperature T per (model, caller, question name) rescales an answer's distribution:
//
//	p'ᵢ = max(pᵢ, ε)^(1/T) / Σⱼ max(pⱼ, ε)^(1/T)        ε = Epsilon = 1e-6
//
// over the answer's options (choice), levels (score) or {false, true} (noul). T > 1 flattens an
// overconfident model, T < 1 sharpens an underconfident one, T = 1 changes nothing (up to the
// clipping of zeros). Zeros are clipped to ε both when fitting and when applying, so the
// distribution a worker applies is exactly the one the fit scored; providers round to a few
// decimals, so a reported 0 means "below the rounding", not "impossible".
//
// For noul the two-class form is used: with a = max(P, ε) and b = max(1 − P, ε),
//
//	P' = a^(1/T) / (a^(1/T) + b^(1/T)) = 1 / (1 + exp((ln b − ln a) / T))
//
// which is the logistic of logit(P)/T. For choice and score the confidence is recomputed on
// the calibrated distribution as upstream defines it (README "How to read an answer"):
// 1 − H(p')/ln N, with H the entropy in nats and N the number of options or levels, clamped to
// [0, 1]; an exact tie for the top probability reports 0, the rule of the fake upstream
// (provider/internal/synth). Temperature keeps ties exact, so a tied raw answer stays tied.
//
// # Fitting
//
// T minimises the mean negative log-likelihood of the labels under p', bounded to
// [MinTemperature, MaxTemperature]. The NLL is convex in β = 1/T (a log-sum-exp of functions
// linear in β, minus a linear term), hence unimodal in ln T, so a bounded one-dimensional
// search finds the global minimum: Brent's method on ln T (see brent.go for why it is
// hand-written). A minimum on a bound, or a likelihood that does not depend on T (every
// distribution uniform), is reported as not converged.
//
// Temperature never changes which class is most probable, so accuracy is the same before and
// after; ECE, Brier, NLL and coverage at a threshold change.
//
// # Storage
//
// Fits live in the KV bucket sys1-calibration under Key(model, caller, question) as the JSON
// of Fit. A Store watches the bucket and keeps the fits in memory for the workers.
package calibration
