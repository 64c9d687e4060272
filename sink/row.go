package sink

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/sys1hq/sys1/contract"
)

// runColumns is the INSERT column list of <db>.runs, in the order row.values returns them.
// inserted_at is left to its DEFAULT (the server's clock at insert).
var runColumns = []string{
	"run_id", "caller", "caller_kind", "roles", "scopes", "subject",
	"stream_seq", "deliveries", "published_at", "started_at", "finished_at", "queued_ms", "latency_ms",
	"status", "error_code", "error_status", "error_message",
	"provider", "model", "requested_model",
	"images.sha256", "images.bytes",
	"attempts.provider", "attempts.outcome", "attempts.latency_ms", "attempts.detail",
	"attempts.delivery", "attempts.error_code", "attempts.started_at",
	"answers.name", "answers.type", "answers.choice", "answers.noul", "answers.score",
	"answers.confidence", "answers.probabilities",
	"input_tokens", "output_tokens", "reply_to", "request", "result", "record_state",
	"worker", "version", "schema_version",
	"runs_stream", "runs_seq",
}

// row is one run record in the column layout of <db>.runs.
type row struct {
	runID, caller, callerKind string
	roles, scopes             []string
	subject                   string

	streamSeq                          uint64
	deliveries                         uint32
	publishedAt, startedAt, finishedAt time.Time
	queuedMS, latencyMS                int64

	status, errorCode string
	errorStatus       uint16
	errorMessage      string

	provider, model, requestedModel string

	imageSHA   []string
	imageBytes []uint64

	attProvider, attOutcome []string
	attLatency              []int64
	attDetail               []string
	attDelivery             []uint32
	attErrorCode            []string
	attStartedAt            []time.Time

	ansName, ansType, ansChoice []string
	ansNoul, ansScore, ansConf  []*float64
	ansProbs                    []map[string]float64

	inputTokens, outputTokens uint64
	replyTo, request, result  string
	recordState               string
	worker, version           string
	schemaVersion             uint16

	runsStream string
	runsSeq    uint64
}

func (r *row) values() []any {
	return []any{
		r.runID, r.caller, r.callerKind, r.roles, r.scopes, r.subject,
		r.streamSeq, r.deliveries, r.publishedAt, r.startedAt, r.finishedAt, r.queuedMS, r.latencyMS,
		r.status, r.errorCode, r.errorStatus, r.errorMessage,
		r.provider, r.model, r.requestedModel,
		r.imageSHA, r.imageBytes,
		r.attProvider, r.attOutcome, r.attLatency, r.attDetail, r.attDelivery, r.attErrorCode, r.attStartedAt,
		r.ansName, r.ansType, r.ansChoice, r.ansNoul, r.ansScore, r.ansConf, r.ansProbs,
		r.inputTokens, r.outputTokens, r.replyTo, r.request, r.result, r.recordState,
		r.worker, r.version, r.schemaVersion,
		r.runsStream, r.runsSeq,
	}
}

// errInvalidRecord marks a record that decoded but can never be stored as a row; it goes to
// the dead-letter table with the reason.
var errInvalidRecord = errors.New("invalid run record")

// DateTime64's range; a time outside it cannot be stored faithfully.
var (
	minTime = time.Date(1900, 1, 1, 0, 0, 0, 0, time.UTC)
	maxTime = time.Date(2299, 12, 31, 23, 59, 59, 0, time.UTC)
)

// origin is where a record came from in SYS1_RUNS.
type origin struct {
	stream    string
	seq       uint64
	published time.Time // the JetStream publish time, finished_at's fallback
}

// decodeRecord decodes one SYS1_RUNS message body into a row. A non-nil error means the
// record can never be inserted; the caller parks it in the dead-letter table.
func decodeRecord(data []byte, from origin, mode RecordState) (*row, error) {
	rec, err := contract.DecodeRecord(data)
	if err != nil {
		return nil, fmt.Errorf("decode run record: %w", err)
	}
	return toRow(rec, from, mode)
}

func toRow(rec *contract.RunRecord, from origin, mode RecordState) (*row, error) {
	if rec.RunID == "" {
		return nil, fmt.Errorf("%w: run_id is empty", errInvalidRecord)
	}
	// finished_at drives the partition, the TTL and the ReplacingMergeTree version; a record
	// without one is dated by its publication so it is neither lost to TTL nor filed in 1970.
	finished := rec.FinishedAt
	if finished.IsZero() {
		finished = from.published
	}
	times := []struct {
		name string
		t    *time.Time
	}{{"published_at", &rec.PublishedAt}, {"started_at", &rec.StartedAt}, {"finished_at", &finished}}
	for _, f := range times {
		if t, err := storableTime(*f.t); err != nil {
			return nil, fmt.Errorf("%w: %s: %v", errInvalidRecord, f.name, err)
		} else {
			*f.t = t
		}
	}
	r := &row{
		runID: rec.RunID, caller: rec.Caller, callerKind: rec.CallerKind,
		roles: nonNil(rec.Roles), scopes: nonNil(rec.Scopes), subject: rec.Subject,
		streamSeq: rec.StreamSeq, deliveries: clampU32(rec.Deliveries),
		publishedAt: rec.PublishedAt, startedAt: rec.StartedAt, finishedAt: finished,
		queuedMS: rec.QueuedMS, latencyMS: rec.LatencyMS,
		status: string(rec.Status), errorCode: string(rec.ErrorCode),
		errorStatus: uint16(min(max(rec.ErrorStatus, 0), 65535)), errorMessage: rec.ErrorMessage,
		provider: rec.Provider, model: rec.Model, requestedModel: rec.RequestedModel,
		replyTo: rec.ReplyTo, worker: rec.Worker, version: rec.Version,
		schemaVersion: uint16(min(max(rec.SchemaVersion, 0), 65535)),
		recordState:   string(mode), runsStream: from.stream, runsSeq: from.seq,
	}
	r.imageSHA = make([]string, len(rec.Images))
	r.imageBytes = make([]uint64, len(rec.Images))
	for i, im := range rec.Images {
		r.imageSHA[i], r.imageBytes[i] = im.SHA256, uint64(max(im.Bytes, 0))
	}
	n := len(rec.Attempts)
	r.attProvider, r.attOutcome, r.attDetail, r.attErrorCode = make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	r.attLatency, r.attDelivery, r.attStartedAt = make([]int64, n), make([]uint32, n), make([]time.Time, n)
	for i, a := range rec.Attempts {
		started, err := storableTime(a.StartedAt)
		if err != nil {
			return nil, fmt.Errorf("%w: attempts[%d].started_at: %v", errInvalidRecord, i, err)
		}
		r.attProvider[i], r.attOutcome[i], r.attLatency[i], r.attDetail[i] = a.Provider, a.Outcome, a.LatencyMS, a.Detail
		r.attDelivery[i], r.attErrorCode[i], r.attStartedAt[i] = clampU32(a.Delivery), string(a.ErrorCode), started
	}
	var answers []contract.Answer
	if rec.Result != nil {
		answers = rec.Result.Answers
		r.inputTokens = uint64(max(rec.Result.Usage.InputTokens, 0))
		r.outputTokens = uint64(max(rec.Result.Usage.OutputTokens, 0))
		// The contract's encoder directly: the bytes json.Marshal would give, without its
		// second validating pass (a third of the sink's CPU otherwise).
		b, _ := rec.Result.MarshalJSON() // never fails
		r.result = string(b)
	}
	n = len(answers)
	r.ansName, r.ansType, r.ansChoice = make([]string, n), make([]string, n), make([]string, n)
	r.ansNoul, r.ansScore, r.ansConf = make([]*float64, n), make([]*float64, n), make([]*float64, n)
	r.ansProbs = make([]map[string]float64, n)
	for i, a := range answers {
		r.ansName[i], r.ansType[i] = a.Name, string(a.Type)
		switch a.Type {
		case contract.TypeChoice:
			r.ansChoice[i] = a.Choice
		case contract.TypeNoul:
			r.ansNoul[i] = ptr(a.Noul)
		case contract.TypeScore:
			r.ansScore[i] = ptr(a.Score)
		}
		if a.Confidence != nil {
			r.ansConf[i] = ptr(*a.Confidence)
		}
		probs := make(map[string]float64, len(a.Probabilities))
		for _, p := range a.Probabilities {
			probs[p.Key] = p.P
		}
		r.ansProbs[i] = probs
	}
	if rec.Request != nil {
		b, _ := redactRequest(rec.Request, mode).MarshalJSON() // never fails
		r.request = string(b)
	}
	return r, nil
}

// redactRequest applies SYS1_RECORD_STATE to a copy of req: state and every question's
// instructions kept (full), replaced by the JSON string of their sha256 hex (hash), or by JSON
// null (none). The hash is over the JSON bytes as carried in the record.
func redactRequest(req *contract.Request, mode RecordState) *contract.Request {
	if mode == RecordFull {
		return req
	}
	cp := *req
	cp.State = redactRaw(req.State, mode)
	cp.Questions = make([]contract.Question, len(req.Questions))
	for i, q := range req.Questions {
		q.Instructions = redactRaw(q.Instructions, mode)
		cp.Questions[i] = q
	}
	return &cp
}

func redactRaw(raw json.RawMessage, mode RecordState) json.RawMessage {
	switch {
	case mode == RecordFull:
		return raw
	case mode == RecordHash && len(raw) > 0:
		sum := sha256.Sum256(raw)
		return json.RawMessage(`"` + hex.EncodeToString(sum[:]) + `"`)
	default:
		return json.RawMessage("null")
	}
}

// storableTime maps the zero time to the Unix epoch (ClickHouse's empty DateTime64) and
// refuses times DateTime64 cannot hold.
func storableTime(t time.Time) (time.Time, error) {
	if t.IsZero() {
		return time.Unix(0, 0).UTC(), nil
	}
	if t.Before(minTime) || t.After(maxTime) {
		return t, fmt.Errorf("%s is outside the storable range 1900–2299", t.UTC().Format(time.RFC3339))
	}
	return t.UTC(), nil
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func clampU32(n int) uint32 { return uint32(min(max(n, 0), 1<<32-1)) }

func ptr(f float64) *float64 { return &f }
