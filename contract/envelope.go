package contract

import (
	"time"
)

// Status is a run's final status.
type Status string

// Run statuses (SPEC §4, §6).
const (
	StatusSuccess Status = "success"
	StatusFailed  Status = "failed"
)

// Attempt outcomes (SPEC §4, §8).
const (
	OutcomeOK          = "ok"
	OutcomeTimeout     = "timeout"
	OutcomeError       = "error"
	OutcomeMalformed   = "malformed"
	OutcomeBusy        = "busy"
	OutcomeUnavailable = "unavailable"
	// OutcomeSkipped is a provider passed over without a call: no model mapped for the
	// requested one, or its circuit is open. Detail says which.
	OutcomeSkipped = "skipped"
	// OutcomeCache is an answer served from the exact result cache: no provider was called.
	OutcomeCache = "cache"
)

// Outcomes returns every attempt outcome in documentation order; schemas are checked against it.
func Outcomes() []string {
	return []string{OutcomeOK, OutcomeTimeout, OutcomeError, OutcomeMalformed, OutcomeBusy, OutcomeUnavailable, OutcomeSkipped, OutcomeCache}
}

// Result is what a successful run produced: the provider's answers verbatim, in request order.
type Result struct {
	Provider string   `json:"provider"`
	Model    string   `json:"model"`
	Answers  []Answer `json:"-"`
	Usage    Usage    `json:"usage"`
}

// Attempt is one provider call of one delivery.
type Attempt struct {
	Provider string `json:"provider"`
	// Model is the model sent to this provider (after its model map); empty when nothing was
	// sent (a skipped provider with no mapping).
	Model     string `json:"model"`
	Outcome   string `json:"outcome"`
	LatencyMS int64  `json:"latency_ms"`
	Detail    string `json:"detail"`
	// Delivery is the JetStream delivery count the attempt ran in (1-based).
	Delivery int `json:"delivery"`
	// ErrorCode is the SYS1_ code the attempt failed with; empty on success.
	ErrorCode Code      `json:"error_code,omitempty"`
	StartedAt time.Time `json:"started_at"`
}

// Reply is the envelope published to Sys1-Reply-To (SPEC §4).
type Reply struct {
	RunID  string  `json:"run_id"`
	Status Status  `json:"status"`
	Result *Result `json:"result"`
	// Verdicts are the abstention policy's verdicts, one per question in request order; nil
	// (and absent from the JSON) when no policy is configured or the run failed.
	Verdicts Verdicts `json:"verdicts,omitempty"`
	// Review is set when at least one question went to human review.
	Review    *ReviewRef `json:"review,omitempty"`
	Error     *Error     `json:"error"`
	Attempts  []Attempt  `json:"attempts"`
	QueuedMS  int64      `json:"queued_ms"`
	LatencyMS int64      `json:"latency_ms"`
}

// Caller kinds (SPEC §6). Anonymous means unverified: a request refused before its caller was
// verified (its caller empty), or any request in auth mode none (its caller the subject's
// token, as claimed).
const (
	CallerKindAnonymous = "anonymous"
	CallerKindSubject   = "subject"
	CallerKindJWT       = "jwt"
)

// LegacyAnonymousCaller is the caller versions before issue 23 gave every request in auth mode
// none. Runs in the run-id gate and review items on SYS1_REVIEW written then still carry it.
const LegacyAnonymousCaller = "anonymous"

// RecordSchemaVersion is the version of the RunRecord shape; bump it on any change. Version 2
// added batch_id, item_id, record_state, verdicts, review, cache_hit, cost_usd, trace_id and
// attempts[].model; a version 1 record reads as a version 2 one with those empty (cost_usd
// null: unknown, not free). Version 3 added verdicts[].audit_share and review.items (every
// review item of the run); an older record reads with them absent (its audit samples' share
// unknown; review.item its only known item).
const RecordSchemaVersion = 3

// MinRecordSchemaVersion is the oldest record shape readers still accept.
const MinRecordSchemaVersion = 1

// RunRecord is the one durable record of a run (SPEC §6), published to sys1.runs.<status>.
type RunRecord struct {
	SchemaVersion int `json:"schema_version"`

	// identity
	RunID      string   `json:"run_id"`
	Caller     string   `json:"caller"`
	CallerKind string   `json:"caller_kind"`
	Roles      []string `json:"roles"`
	Scopes     []string `json:"scopes"`
	Subject    string   `json:"subject"`
	// BatchID and ItemID name a batch run (sys1.batch.<caller>.<batch id>, run id
	// "<batch id>:<item id>"); both are empty for interactive runs.
	BatchID string `json:"batch_id"`
	ItemID  string `json:"item_id"`

	// delivery
	StreamSeq   uint64    `json:"stream_seq"`
	Deliveries  int       `json:"deliveries"`
	PublishedAt time.Time `json:"published_at"`
	StartedAt   time.Time `json:"started_at"`
	FinishedAt  time.Time `json:"finished_at"`
	QueuedMS    int64     `json:"queued_ms"`
	LatencyMS   int64     `json:"latency_ms"`

	// outcome
	Status       Status `json:"status"`
	ErrorCode    Code   `json:"error_code"`
	ErrorStatus  int    `json:"error_status"`
	ErrorMessage string `json:"error_message"`

	// what ran
	Provider       string `json:"provider"`
	Model          string `json:"model"`
	RequestedModel string `json:"requested_model"`
	// Request is the resolved request with images redacted; nil when the request could not be
	// decoded or must not be stored (unauthenticated, forbidden).
	Request *Request `json:"request"`
	// RecordState is the form Request's state and instructions are in (see RedactContent);
	// empty means as the caller sent them, with SYS1_RECORD_STATE not yet applied.
	RecordState RecordState `json:"record_state"`
	Images      []ImageRef  `json:"images"`
	Result      *Result     `json:"result"`
	// Verdicts and Review are the reply's (absent without a policy).
	Verdicts Verdicts   `json:"verdicts,omitempty"`
	Review   *ReviewRef `json:"review,omitempty"`
	Attempts []Attempt  `json:"attempts"`
	// CacheHit is true when the result came from the exact result cache (no provider call).
	CacheHit bool `json:"cache_hit"`
	// CostUSD is what the run cost, priced from the attempt that answered; nil (JSON null)
	// when the model is unpriced or nothing answered; 0 only when it really cost nothing (a
	// cache hit).
	CostUSD *float64 `json:"cost_usd"`
	ReplyTo string   `json:"reply_to"`

	// provenance
	Worker  string `json:"worker"`
	Version string `json:"version"`
	// TraceID is the W3C trace id (32 hex digits) of the run's trace; empty without tracing.
	TraceID string `json:"trace_id"`
}
