package contract

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"time"
)

// Verdict statuses (SPEC §8): what the abstention policy concluded about one answer. The
// answer itself always stays verbatim in result.answers; a verdict is added beside it.
type VerdictStatus string

const (
	VerdictDecided   VerdictStatus = "decided"   // confident enough under the matching rule
	VerdictAbstained VerdictStatus = "abstained" // below a threshold: sent to review
	VerdictReviewed  VerdictStatus = "reviewed"  // a person labelled it (review: hold)
)

// Verdict is the policy's conclusion about one question's answer. Replies and records carry
// verdicts as an object keyed by question name, in request order (like answers); it is absent
// when no policy is configured.
type Verdict struct {
	// Question is the question's name: the verdict's key in "verdicts" (not a field).
	Question string        `json:"-"`
	Status   VerdictStatus `json:"status"`
	// Rule names the policy rule that matched ("" when none did: decided by default).
	Rule string `json:"rule"`
	// Reason says why, with the figures: "confidence 0.31 < 0.50".
	Reason string `json:"reason"`
	// Audit marks a decided answer sampled for review anyway (audit_sample).
	Audit bool `json:"audit,omitempty"`
	// AuditShare is, on a decided answer, the audit_sample of the rule that decided it: the
	// chance it had of being sampled for review, whether it was or not. An audit label weighs
	// 1/AuditShare when sys1 calibrate estimates the traffic's error (0, and absent, when the
	// rule samples nothing or the answer abstained).
	AuditShare float64 `json:"audit_share,omitempty"`
	// Calibrated holds the calibrated distribution when a temperature fit applies.
	Calibrated *Calibrated `json:"calibrated,omitempty"`
	// Label and Reviewer are set once a person labelled the question (status reviewed):
	// a choice option key (JSON string), true/false (noul) or a level index (score).
	Label    json.RawMessage `json:"label,omitempty"`
	Reviewer string          `json:"reviewer,omitempty"`
}

// Calibrated is an answer after temperature scaling p'ᵢ ∝ pᵢ^(1/T). Exactly the fields that
// apply to the answer's type are set: probabilities and confidence (choice, score), noul
// (noul).
type Calibrated struct {
	Probabilities []Probability `json:"-"`
	Confidence    *float64      `json:"confidence,omitempty"`
	Noul          *float64      `json:"noul,omitempty"`
	Temperature   float64       `json:"temperature"`
}

// Review statuses of a run (the reply's and record's "review" field): pending while a
// question waits for review; reviewed on the reply a hold (review: hold) released once every
// held question was labelled.
const (
	ReviewPending  = "pending"
	ReviewReviewed = "reviewed"
	// ReviewNotQueued: the questions went to review, but the review item could not be
	// stored (the caller's quota, or the review stream full); the reply goes out at once.
	ReviewNotQueued = "not_queued"
)

// ReviewRef says that a run sent at least one question to human review.
type ReviewRef struct {
	Status string `json:"status"` // "pending", "reviewed", or "not_queued"
	Item   string `json:"item"`   // the first review item's id
	// Items are the ids of every review item of the run, in question order (Items[0] is
	// Item). Absent in replies and records written before issue 23 added it.
	Items []string `json:"items,omitempty"`
	// Reason says why the review was not queued (status not_queued): the caller's review
	// quota, or SYS1_REVIEW full. The questions stay abstained; nobody will review them.
	Reason string `json:"reason,omitempty"`
}

// Review modes of a policy rule.
const (
	ReviewNone   = "none"   // abstain, no review item
	ReviewNotify = "notify" // abstain, reply at once, and queue a review item
	ReviewHold   = "hold"   // no reply until a person labels the question
)

// ReviewRun is what a run sends to human review, one message on sys1.review.<caller>
// (stream SYS1_REVIEW): the run's fields and its state once, and one item per question sent
// to review. A 64-question request so adds its state once, not 64 times. Items carries each
// question's part of a ReviewItem (ID through Audit); Items expands them into whole items.
// Review items from before this message (one ReviewItem per message, the state in each) are
// still read: DecodeReviewMessage takes both.
type ReviewRun struct {
	RunID  string `json:"run_id"`
	Caller string `json:"caller"`
	// Subject is the subject the run's request was published on (see ReviewItem.Subject).
	Subject  string `json:"subject,omitempty"`
	Provider string `json:"provider"`
	Model    string `json:"model"`
	// State is the run's state verbatim, absent when SYS1_REVIEW_STATE=none.
	State     json.RawMessage `json:"state,omitempty"`
	Images    []ImageRef      `json:"images"`
	CreatedAt time.Time       `json:"created_at"`
	Items     []ReviewItem    `json:"items"`
}

// Expand returns the run's items as whole review items, each with the run's fields; their
// State shares the message's bytes.
func (rr *ReviewRun) Expand() []ReviewItem {
	out := make([]ReviewItem, len(rr.Items))
	for i, it := range rr.Items {
		it.RunID, it.Caller, it.Subject, it.Provider, it.Model = rr.RunID, rr.Caller, rr.Subject, rr.Provider, rr.Model
		it.State, it.Images, it.CreatedAt = rr.State, rr.Images, rr.CreatedAt
		out[i] = it
	}
	return out
}

// ReviewItem is one question sent to human review, published to sys1.review.<caller> on the
// SYS1_REVIEW stream. It carries everything a reviewer needs to decide without the run record.
type ReviewItem struct {
	ID    string `json:"id"` // ReviewItemID(run id, question)
	RunID string `json:"run_id"`
	// Caller is the run's verified caller (in mode none: the unverified subject token).
	Caller string `json:"caller"`
	// Subject is the subject the run's request was published on. Its caller token names the
	// item's own subject, sys1.review.<token> (topology.ReviewSubject), which the review page
	// checks; empty in items written before issue 23, whose caller was that token.
	Subject  string       `json:"subject,omitempty"`
	Provider string       `json:"provider"`
	Model    string       `json:"model"`
	Question string       `json:"question"`
	Type     QuestionType `json:"type"`
	// Instructions is the question's instructions verbatim (a JSON string, object or array).
	Instructions json.RawMessage `json:"instructions"`
	// Options are the choice options (key and description) in order, or the noul sides
	// ("true"/"false") when the question described them; Levels are the score levels in order.
	Options []Option `json:"-"`
	Levels  []string `json:"levels,omitempty"`
	// The answer: probabilities in order (option keys, level indexes, or true/false),
	// confidence when sent, noul's P(yes), score's expected index.
	Probabilities []Probability `json:"-"`
	Confidence    *float64      `json:"confidence,omitempty"`
	Noul          *float64      `json:"noul,omitempty"`
	Score         *float64      `json:"score,omitempty"`
	Choice        string        `json:"choice,omitempty"`
	Verdict       Verdict       `json:"verdict"`
	// Mode is the rule's review mode (notify or hold); Audit marks an audit sample.
	Mode  string `json:"mode"`
	Audit bool   `json:"audit,omitempty"`
	// State is the run's state verbatim, absent when SYS1_REVIEW_STATE=none; images only as
	// their hashes and sizes.
	State     json.RawMessage `json:"state,omitempty"`
	Images    []ImageRef      `json:"images"`
	CreatedAt time.Time       `json:"created_at"`
}

// Label sources.
const (
	LabelSourceReview   = "review"   // a reviewer on the review page
	LabelSourceProducer = "producer" // ground truth the producer learned later
)

// Label is the truth about one question of one run, on stream SYS1_LABELS.
type Label struct {
	RunID    string `json:"run_id"`
	Question string `json:"question"`
	// Value: a choice option key (JSON string), true/false (noul), a level index (score).
	Value      json.RawMessage `json:"label"`
	Reviewer   string          `json:"reviewer"`
	LabelledAt time.Time       `json:"labelled_at"`
	Source     string          `json:"source"`
	// Caller is the run's verified caller, set when the label is accepted.
	Caller string `json:"caller,omitempty"`
	// Item is the review item the label answers (source review).
	Item string `json:"item,omitempty"`
}

// ReviewItemID is the id of the review item for one question of one run: stable, so a
// republished item de-duplicates, and safe in subjects, KV keys and URLs.
func ReviewItemID(runID, question string) string {
	sum := sha256.Sum256([]byte(runID + "\x00" + question))
	return "rv-" + hex.EncodeToString(sum[:16])
}
