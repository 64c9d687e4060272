package contract

import (
	"encoding/json"
	"time"
)

// Status is a run's final status.
type Status string

// Run statuses (SPEC §4, §6).
const (
	StatusSuccess Status = "success"
	StatusFailed  Status = "failed"
)

// Attempt outcomes (SPEC §4).
const (
	OutcomeOK          = "ok"
	OutcomeTimeout     = "timeout"
	OutcomeError       = "error"
	OutcomeMalformed   = "malformed"
	OutcomeBusy        = "busy"
	OutcomeUnavailable = "unavailable"
	// OutcomeSkipped is a provider of the chain passed over without a call: it has no mapping
	// for the requested model, or its circuit breaker is open (SPEC §8).
	OutcomeSkipped = "skipped"
)

// Result is what a successful run produced: the provider's answers verbatim, in request order.
type Result struct {
	Provider string   `json:"provider"`
	Model    string   `json:"model"`
	Answers  []Answer `json:"-"`
	Usage    Usage    `json:"usage"`
}

// Attempt is one provider call of one delivery (or one provider of the chain skipped).
type Attempt struct {
	Provider string `json:"provider"`
	// Model is the model sent to that provider (after its model map); empty when nothing was
	// sent because the provider has no mapping for the requested model.
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
	RunID     string    `json:"run_id"`
	Status    Status    `json:"status"`
	Result    *Result   `json:"result"`
	Error     *Error    `json:"error"`
	Attempts  []Attempt `json:"attempts"`
	QueuedMS  int64     `json:"queued_ms"`
	LatencyMS int64     `json:"latency_ms"`
}

// Caller kinds (SPEC §6).
const (
	CallerKindAnonymous = "anonymous"
	CallerKindSubject   = "subject"
	CallerKindJWT       = "jwt"
)

// RecordSchemaVersion is the version of the RunRecord shape; bump it on any change.
const RecordSchemaVersion = 1

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
	Request  *Request   `json:"request"`
	Images   []ImageRef `json:"images"`
	Result   *Result    `json:"result"`
	Attempts []Attempt  `json:"attempts"`
	ReplyTo  string     `json:"reply_to"`

	// provenance
	Worker  string `json:"worker"`
	Version string `json:"version"`
}

// keep the json import used even before custom codecs land.
var _ = json.Marshal
