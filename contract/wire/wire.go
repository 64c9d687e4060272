// Package wire is every name sys1 puts on the bus, in one place: the headers of SPEC §3–§4,
// the subjects producers, workers, the sink and the review page publish and read (and how to
// build each one), the NATS micro service's name and endpoints, the default names of the
// JetStream streams, consumers and buckets, and the rule for run ids.
//
// It depends on the standard library alone, so a producer — the Go client, sys1 batch, a
// service of your own — can name things exactly as the workers do without importing them.
// A name here changes only with SPEC (or an issue that amends it); a test pins the
// command layer's environment defaults and topology.Default() to these.
package wire

import "strings"

// Headers (SPEC §3–§4, and the additions issues made).
const (
	// Requests.
	HeaderRunID         = "Sys1-Run-Id"         // the run's id; a request without one gets <stream>~<seq>~<epoch>
	HeaderReplyTo       = "Sys1-Reply-To"       // where the reply goes (else the message's reply subject)
	HeaderDeadline      = "Sys1-Deadline"       // RFC 3339: not called after it
	HeaderAuthorization = "Authorization"       // "Bearer <jwt>" in auth mode jwt
	HeaderMinConfidence = "Sys1-Min-Confidence" // tightens the abstention policy's confidence threshold
	HeaderCache         = "Sys1-Cache"          // how old a cached answer the caller accepts (1h; 0: none)
	HeaderMsgID         = "Nats-Msg-Id"         // JetStream's de-duplication id
	// HeaderBatchManifest marks a batch's manifest on sys1.decide.<caller> (sys1 batch run).
	HeaderBatchManifest = "Sys1-Batch-Manifest"

	// Replies and records.
	HeaderStatus    = "Sys1-Status"     // success or failed
	HeaderErrorCode = "Sys1-Error-Code" // the error's code on a failed reply
	HeaderReview    = "Sys1-Review"     // pending, reviewed or not_queued when a question went to review
)

// Subjects. Tokens are caller tokens (one NATS subject token: no '.', '*', '>' or white
// space), batch ids and run ids.
const (
	DecidePrefix   = "sys1.decide."   // + <caller>[.<more tokens>]: interactive requests
	BatchPrefix    = "sys1.batch."    // + <caller>.<batch id>: batch requests
	RunsPrefix     = "sys1.runs."     // + <status>: run records
	RepliesPrefix  = "sys1.replies."  // + <caller>.<run id>: durable replies
	ReviewPrefix   = "sys1.review."   // + <caller token>: review items
	LabelsPrefix   = "sys1.labels."   // + <caller>: labels submitted; + <caller>.accepted|rejected: checked
	ArrivalsPrefix = "sys1.arrivals." // + <subject>: the request streams' arrivals (headers only)
	InboxPrefix    = "_INBOX."        // + <caller>.…: a caller's own inboxes

	DecideSubjects   = DecidePrefix + ">"
	BatchSubjects    = BatchPrefix + ">"
	RunsSubjects     = RunsPrefix + ">"
	RepliesSubjects  = RepliesPrefix + ">"
	ReviewSubjects   = ReviewPrefix + ">"
	LabelSubjects    = LabelsPrefix + ">"
	ArrivalsSubjects = ArrivalsPrefix + ">"
	// LabelsSubmitted are labels as producers and reviewers send them (one token: the
	// caller); LabelsAccepted and LabelsRejected the checked ones.
	LabelsSubmitted = LabelsPrefix + "*"
	LabelsAccepted  = LabelsPrefix + "*." + AcceptedToken
	LabelsRejected  = LabelsPrefix + "*." + RejectedToken

	AcceptedToken = "accepted"
	RejectedToken = "rejected"
)

// Decide is the subject a caller's interactive requests go to.
func Decide(caller string) string { return DecidePrefix + caller }

// Batch is the subject of one batch's requests.
func Batch(caller, batchID string) string { return BatchPrefix + caller + "." + batchID }

// BatchOf is the subject filter of every batch of a caller.
func BatchOf(caller string) string { return BatchPrefix + caller + ".*" }

// Runs is the subject a record of a run ending in status goes to.
func Runs(status string) string { return RunsPrefix + status }

// Replies is the durable reply subject of a caller's run.
func Replies(caller, runID string) string { return RepliesPrefix + caller + "." + runID }

// RepliesOf is the subject filter of every durable reply of a caller.
func RepliesOf(caller string) string { return RepliesPrefix + caller + ".>" }

// Review is where the review items of a caller token's runs go.
func Review(token string) string { return ReviewPrefix + token }

// Label is where a caller submits labels for its runs.
func Label(caller string) string { return LabelsPrefix + caller }

// LabelAccepted and LabelRejected are where a checked label of a caller token goes.
func LabelAccepted(token string) string { return LabelsPrefix + token + "." + AcceptedToken }

// LabelRejected: see LabelAccepted.
func LabelRejected(token string) string { return LabelsPrefix + token + "." + RejectedToken }

// Inbox is the prefix of a caller's own inboxes (_INBOX.<caller>).
func Inbox(caller string) string { return InboxPrefix + caller }

// Arrival is the subject a stream republishes the arrival of a message on subject to.
func Arrival(subject string) string { return ArrivalsPrefix + subject }

// The NATS micro service every worker replica registers (nats micro ls): every replica
// answers every request, so one request gathers the fleet.
const (
	ServiceName         = "sys1"
	HealthSubject       = "sys1.svc.health"
	CapabilitiesSubject = "sys1.svc.capabilities"
	// PingSubject is micro's ping of the service: each replica answers once.
	PingSubject = "$SRV.PING." + ServiceName
)

// Default names of the JetStream objects (SPEC §2 and the issues since); each has a
// SYS1_* variable in the command layer.
const (
	RequestsStream         = "SYS1_REQUESTS"
	RunsStream             = "SYS1_RUNS"
	RepliesStream          = "SYS1_REPLIES"
	ReviewStream           = "SYS1_REVIEW"
	LabelsStream           = "SYS1_LABELS"
	LabelSubmissionsStream = "SYS1_LABEL_SUBMISSIONS"
	DeadLetterStream       = "SYS1_DEAD_LETTERS"

	WorkerConsumer     = "sys1-worker"
	BatchConsumer      = "sys1-worker-batch"
	LabelsConsumer     = "sys1-labels"
	HoldsConsumer      = "sys1-worker-holds"
	DeadLetterConsumer = "sys1-dead-letter"
	SinkConsumer       = "sys1-sink"
	SinkLabelsConsumer = "sys1-sink-labels"

	RunsBucket           = "sys1-runs"
	ReviewBucket         = "sys1-review"
	ReviewSessionsBucket = "sys1-review-sessions"
	CalibrationBucket    = "sys1-calibration"
	CacheBucket          = "sys1-cache"
	LimitsBucket         = "sys1-limits"
	FleetBucket          = "sys1-fleet"
)

// MaxRunIDLen is the longest run id (SPEC §3).
const MaxRunIDLen = 128

// ValidRunID reports whether id is 1–128 of A-Za-z0-9._:- (SPEC §3). Ids the worker derives
// for requests without one contain '~', so they never collide with a caller's.
func ValidRunID(id string) bool {
	if len(id) == 0 || len(id) > MaxRunIDLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '.', c == '_', c == ':', c == '-':
		default:
			return false
		}
	}
	return true
}

// MaxBatchIDLen is the longest batch id: a batch's items are run ids "<batch id>:<item id>",
// which leaves the item 128 − 64 − 1 bytes.
const MaxBatchIDLen = 64

// ValidBatchID reports whether id can be a batch id: 1–64 of A-Za-z0-9_- — one subject token
// (sys1.batch.<caller>.<batch id>, so no '.') and the group of its items' run ids (so no ':').
func ValidBatchID(id string) bool {
	if id == "" || len(id) > MaxBatchIDLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// ValidToken reports whether s can be one literal subject token: a caller token, a batch
// id. A lone "*" or ">" is a wildcard, not a token; '*' or '>' inside a longer token is
// literal to NATS.
func ValidToken(s string) bool {
	return s != "" && s != "*" && s != ">" && !strings.ContainsAny(s, ". \t\r\n")
}

// CallerOf is the caller token of a subject producers publish on — sys1.decide.<caller>[.…],
// sys1.batch.<caller>.<batch id>, sys1.labels.<caller> — and whether there is one.
func CallerOf(subject string) (string, bool) {
	for _, prefix := range []string{DecidePrefix, BatchPrefix, LabelsPrefix} {
		if rest, ok := strings.CutPrefix(subject, prefix); ok {
			caller, _, _ := strings.Cut(rest, ".")
			return caller, ValidToken(caller)
		}
	}
	return "", false
}
