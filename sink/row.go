package sink

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/column"

	"github.com/sys1hq/sys1/contract"
)

// runColumns is the INSERT column list of <db>.runs, in the order row.values returns them.
// inserted_at is left to its DEFAULT (the server's clock at insert).
var runColumns = []string{
	"run_id", "caller", "caller_kind", "roles", "scopes", "subject", "batch_id", "item_id",
	"stream_seq", "deliveries", "published_at", "started_at", "finished_at", "queued_ms", "latency_ms",
	"status", "error_code", "error_status", "error_message",
	"provider", "model", "requested_model",
	"images.sha256", "images.bytes",
	"attempts.provider", "attempts.model", "attempts.outcome", "attempts.latency_ms", "attempts.detail",
	"attempts.delivery", "attempts.error_code", "attempts.started_at",
	"answers.name", "answers.type", "answers.choice", "answers.noul", "answers.score",
	"answers.confidence", "answers.probabilities",
	"answers.verdict", "answers.rule", "answers.calibrated_probability", "answers.temperature",
	"answers.audit_share",
	"input_tokens", "output_tokens", "reply_to", "request", "result", "record_state",
	"verdicts", "review_status", "review_item", "review_items", "cache_hit", "cost_usd",
	"worker", "version", "schema_version", "trace_id",
	"runs_stream", "runs_seq",
}

// row is one run record in the column layout of <db>.runs.
type row struct {
	runID, caller, callerKind string
	roles, scopes             []string
	subject                   string
	batchID, itemID           string

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

	attProvider, attModel []string
	attOutcome            []string
	attLatency            []int64
	attDetail             []string
	attDelivery           []uint32
	attErrorCode          []string
	attStartedAt          []time.Time

	ansName, ansType, ansChoice []string
	ansNoul, ansScore, ansConf  []*float64
	ansProbs                    []*orderedProbs
	ansVerdict, ansRule         []string
	ansCalibrated, ansTemp      []*float64
	ansAuditShare               []float64

	inputTokens, outputTokens uint64
	replyTo, request, result  string
	recordState               string
	verdicts                  string
	reviewStatus, reviewItem  string
	reviewItems               []string
	cacheHit                  bool
	costUSD                   *float64
	worker, version           string
	schemaVersion             uint16
	traceID                   string

	runsStream string
	runsSeq    uint64
}

func (r *row) values() []any {
	return []any{
		r.runID, r.caller, r.callerKind, r.roles, r.scopes, r.subject, r.batchID, r.itemID,
		r.streamSeq, r.deliveries, r.publishedAt, r.startedAt, r.finishedAt, r.queuedMS, r.latencyMS,
		r.status, r.errorCode, r.errorStatus, r.errorMessage,
		r.provider, r.model, r.requestedModel,
		r.imageSHA, r.imageBytes,
		r.attProvider, r.attModel, r.attOutcome, r.attLatency, r.attDetail, r.attDelivery, r.attErrorCode, r.attStartedAt,
		r.ansName, r.ansType, r.ansChoice, r.ansNoul, r.ansScore, r.ansConf, r.ansProbs,
		r.ansVerdict, r.ansRule, r.ansCalibrated, r.ansTemp,
		r.ansAuditShare,
		r.inputTokens, r.outputTokens, r.replyTo, r.request, r.result, r.recordState,
		r.verdicts, r.reviewStatus, r.reviewItem, r.reviewItems, r.cacheHit, r.costUSD,
		r.worker, r.version, r.schemaVersion, r.traceID,
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
	// 0 is a record without the field (a test's, or a hand-written one): read as version 1.
	if rec.SchemaVersion > contract.RecordSchemaVersion || rec.SchemaVersion < 0 {
		return nil, fmt.Errorf("%w: schema_version %d is not one this sink reads (%d–%d): upgrade the sink, then replay the record from the dead-letter table",
			errInvalidRecord, rec.SchemaVersion, contract.MinRecordSchemaVersion, contract.RecordSchemaVersion)
	}
	if rec.CostUSD != nil && (*rec.CostUSD < 0 || math.IsNaN(*rec.CostUSD) || math.IsInf(*rec.CostUSD, 0)) {
		return nil, fmt.Errorf("%w: cost_usd %v is not a cost", errInvalidRecord, *rec.CostUSD)
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
		batchID: rec.BatchID, itemID: rec.ItemID,
		streamSeq: rec.StreamSeq, deliveries: clampU32(rec.Deliveries),
		publishedAt: rec.PublishedAt, startedAt: rec.StartedAt, finishedAt: finished,
		queuedMS: rec.QueuedMS, latencyMS: rec.LatencyMS,
		status: string(rec.Status), errorCode: string(rec.ErrorCode),
		errorStatus: uint16(min(max(rec.ErrorStatus, 0), 65535)), errorMessage: rec.ErrorMessage,
		provider: rec.Provider, model: rec.Model, requestedModel: rec.RequestedModel,
		replyTo: rec.ReplyTo, worker: rec.Worker, version: rec.Version,
		schemaVersion: uint16(max(rec.SchemaVersion, contract.MinRecordSchemaVersion)),
		cacheHit:      rec.CacheHit, costUSD: rec.CostUSD, traceID: rec.TraceID,
		runsStream: from.stream, runsSeq: from.seq,
	}
	r.reviewItems = []string{}
	if rec.Review != nil {
		r.reviewStatus, r.reviewItem = rec.Review.Status, rec.Review.Item
		switch {
		case len(rec.Review.Items) > 0:
			r.reviewItems = rec.Review.Items
		case rec.Review.Item != "":
			r.reviewItems = []string{rec.Review.Item} // written before records named every item
		}
	}
	if len(rec.Verdicts) > 0 {
		b, _ := rec.Verdicts.MarshalJSON() // never fails
		r.verdicts = string(b)
	}
	r.imageSHA = make([]string, len(rec.Images))
	r.imageBytes = make([]uint64, len(rec.Images))
	for i, im := range rec.Images {
		r.imageSHA[i], r.imageBytes[i] = im.SHA256, uint64(max(im.Bytes, 0))
	}
	n := len(rec.Attempts)
	r.attProvider, r.attModel, r.attOutcome = make([]string, n), make([]string, n), make([]string, n)
	r.attDetail, r.attErrorCode = make([]string, n), make([]string, n)
	r.attLatency, r.attDelivery, r.attStartedAt = make([]int64, n), make([]uint32, n), make([]time.Time, n)
	for i, a := range rec.Attempts {
		started, err := storableTime(a.StartedAt)
		if err != nil {
			return nil, fmt.Errorf("%w: attempts[%d].started_at: %v", errInvalidRecord, i, err)
		}
		r.attProvider[i], r.attModel[i], r.attOutcome[i], r.attLatency[i], r.attDetail[i] = a.Provider, a.Model, a.Outcome, a.LatencyMS, a.Detail
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
	r.ansProbs = make([]*orderedProbs, n)
	r.ansVerdict, r.ansRule = make([]string, n), make([]string, n)
	r.ansCalibrated, r.ansTemp = make([]*float64, n), make([]*float64, n)
	r.ansAuditShare = make([]float64, n)
	for i, a := range answers {
		if v, ok := verdictOf(rec.Verdicts, i, a.Name); ok {
			r.ansVerdict[i], r.ansRule[i] = string(v.Status), v.Rule
			// A share outside (0, 1] is no probability: stored as unknown (0), never as a
			// weight that would skew an estimate.
			if v.AuditShare > 0 && v.AuditShare <= 1 {
				r.ansAuditShare[i] = v.AuditShare
			}
			if c := v.Calibrated; c != nil {
				r.ansTemp[i] = ptr(c.Temperature)
				r.ansCalibrated[i] = calibratedTop(&a, c)
			}
		}
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
		r.ansProbs[i] = &orderedProbs{ps: a.Probabilities}
	}
	// SYS1_RECORD_STATE once more: a record the worker already redacted says so in
	// record_state and passes unchanged; an older one, or one under a laxer setting, is made
	// as strict as this sink's setting.
	red := rec.RedactContent(mode)
	r.recordState = string(red.RecordState)
	if red.Request != nil {
		b, _ := red.Request.MarshalJSON() // never fails
		r.request = string(b)
	}
	return r, nil
}

// verdictOf finds the verdict of answer i: verdicts are in request order like answers, so
// the same index almost always holds it; otherwise it is looked up by name.
func verdictOf(vs contract.Verdicts, i int, name string) (contract.Verdict, bool) {
	if i < len(vs) && vs[i].Question == name {
		return vs[i], true
	}
	return vs.Get(name)
}

// calibratedTop is the calibrated top probability of an answer: a choice's calibrated
// probability of the chosen option, a score's of its most probable level, a noul's calibrated
// P(yes); nil when the fit carries none for the answer's type.
func calibratedTop(a *contract.Answer, c *contract.Calibrated) *float64 {
	switch a.Type {
	case contract.TypeNoul:
		if c.Noul != nil {
			return ptr(*c.Noul)
		}
	case contract.TypeChoice:
		for _, p := range c.Probabilities {
			if p.Key == a.Choice {
				return ptr(p.P)
			}
		}
	case contract.TypeScore:
		if len(c.Probabilities) > 0 {
			top := c.Probabilities[0].P
			for _, p := range c.Probabilities[1:] {
				top = max(top, p.P)
			}
			return ptr(top)
		}
	}
	return nil
}

// orderedProbs inserts an answer's distribution into a Map(String, Float64) in the answer's
// order (a Go map would shuffle it): ClickHouse keeps a map's entries in insertion order, so
// mapKeys and mapValues (and sys1.labelled_answers' prob_keys) list options as asked.
type orderedProbs struct{ ps []contract.Probability }

var _ column.IterableOrderedMap = (*orderedProbs)(nil)

// Put appends an entry (the driver calls it only when scanning into the type, which the sink
// never does).
func (o *orderedProbs) Put(key, value any) {
	k, _ := key.(string)
	v, _ := value.(float64)
	o.ps = append(o.ps, contract.Probability{Key: k, P: v})
}

// Iterator walks the entries in order.
func (o *orderedProbs) Iterator() column.MapIterator { return &probsIterator{ps: o.ps, i: -1} }

type probsIterator struct {
	ps []contract.Probability
	i  int
}

func (it *probsIterator) Next() bool { it.i++; return it.i < len(it.ps) }
func (it *probsIterator) Key() any   { return it.ps[it.i].Key }
func (it *probsIterator) Value() any { return it.ps[it.i].P }

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
