// Package policy is sys1's abstention policy: it reads the policy file (SYS1_POLICY_FILE)
// and judges each answer of a run as decided or abstained, and says which questions go to
// human review. Answers are never changed; verdicts are added beside them.
//
// # The file
//
// YAML (JSON is valid YAML), one mapping with a list of rules:
//
//	rules:
//	  - name: refunds                       # required, unique; names the rule in verdicts
//	    caller: billing-*                   # glob, default *
//	    question: refund_*                  # glob, default *
//	    noul_abstain_between: [0.2, 0.8]    # noul: abstain when P(yes) is in the band, ends included
//	    review: hold                        # none | notify (the default) | hold
//	  - name: yes-no
//	    noul_abstain_between: [0.35, 0.65]
//	    use: calibrated                     # compare calibrated values when a fit applies
//	  - name: routing
//	    question: label
//	    model: "nimble*"                    # glob, default: any model
//	    min_confidence: 0.7                 # choice, score: the answer's confidence
//	    min_probability: 0.6                # choice: the chosen option's; score: the most probable level's
//	  - name: guaranteed
//	    caller: payments
//	    max_error: 0.02                     # at most 2% wrong among decided answers, by a risk fit
//	    audit_sample: 0.05
//	  - name: default
//	    min_confidence: 0.5
//	    audit_sample: 0.02                  # 2% of decided answers also go to review
//
// Rules are tried in order and the first that matches a question wins. A rule matches a
// question when its caller, question and model globs match and it has something to say about
// the question's type: a choice or score question is matched by rules that set
// min_confidence or min_probability, a noul question by rules that set
// noul_abstain_between, a rule with max_error and a rule that sets no threshold (only
// audit_sample) match every type. So a choice-only rule never shadows a later noul rule. A question no rule matches
// is decided, with rule "" and reason "no rule matched".
//
// Globs are shell-like, path.Match's syntax over whole names, case-sensitive: * is any run
// of characters (the empty one included, and '/' is not special, so `model: hf.co/*` works),
// ? is one character, [abc] and [a-z] are classes, [!abc] or [^abc] any other character, and
// \ quotes the next character (\* is a star). Quote a glob that starts with * or [ in YAML.
//
// review says what happens to an abstention: notify (the default) replies at once with
// "abstained" and queues a review item; hold queues the item and withholds the reply until
// a person labels it; none abstains without a review item. audit_sample sends that share of
// the rule's decided answers to review as well (never holding their reply), chosen by a hash
// of run id and question name, so a redelivery or a replay samples the same questions.
//
// Every decided answer of a rule with audit_sample carries the share in its verdict
// (audit_share), sampled or not: an audit label weighs 1/share when sys1 calibrate estimates
// the error of the traffic.
//
// max_error: ε compares each answer with the threshold that the risk fit of its model, caller
// and question (sys1 calibrate --target-error, stored beside the temperature) certified for
// an error rate of at most ε among decided answers (Input.Risk, RiskFit), on the values the
// fit was made on: confidence or top probability, calibrated when the fit has a temperature
// (noul: max(P, 1 − P)). The reason names the fit: "confidence 0.61 < 0.66 (max_error 0.02,
// fit of 2026-12-01, n 2,000)". Without a fit the answer abstains, "no risk fit (max_error
// 0.02)"; so it does when the fit certified no threshold for ε. use does not apply to it.
//
// use: calibrated compares the calibrated values of a temperature fit (issue 13) when the
// question has one, and the raw values otherwise (the reason then says "raw: no calibration
// fit"). The default, raw, always compares the provider's figures. Either way a verdict
// carries the calibrated values when a fit applies.
//
// Validation at load reports every problem in one error, each with its line and field:
// unknown or repeated fields, wrong types (a quoted number is a string, not a number),
// numbers outside [0, 1] (max_error: outside (0, 1)), lo > hi, bad globs, review modes and use values, missing or
// duplicate names, and rules with nothing to do (no threshold and no audit_sample; write
// min_confidence: 0 for a rule that exempts its questions from the rules after it). A policy
// with no rules says `rules: []` (every verdict is then "no rule matched"); an empty file, or
// `rules:` with nothing after it, is refused, because that is what a reader sees in the middle
// of an in-place write and it must not switch every rule off. Replace the file by rename
// (as Kubernetes does with a ConfigMap) so that no reader sees it half written. Not
// configuring a file at all (no verdicts) is the caller's decision.
//
// # Sys1-Min-Confidence
//
// A producer may tighten, never loosen, the confidence threshold of one request with the
// header Sys1-Min-Confidence: 0.7. For a choice or score question the threshold becomes the
// larger of the rule's min_confidence (0 when it sets none) and the header's; the reason says
// "(Sys1-Min-Confidence)" when the header's was the binding one, and the rule's review mode
// applies. A choice or score question that no rule matches is judged by the header alone,
// under the rule name "header" with review notify. Noul answers carry no confidence, so the
// header does not apply to them; nor does a value of 0, which tightens nothing. A malformed
// value is SYS1_INVALID_INPUT (ParseMinConfidence).
//
// # The safe side
//
// A figure a threshold needs that is missing (no confidence, no probability for the chosen
// option), NaN or outside [0, 1] abstains, and the reason says which figure and why; so do
// an answer missing for a question and one whose type differs from the question's.
package policy
