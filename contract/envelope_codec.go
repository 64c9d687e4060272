package contract

import (
	"strconv"
	"time"
)

// Replies and records are encoded once per run on the worker's hot path, so they are built
// byte by byte like requests. The output is exactly what encoding/json would produce from the
// struct tags, except that lists are always arrays (never null): replies and records are read
// by other languages and loaded into ClickHouse, where null-for-empty is a needless special
// case. TestEnvelopeEncodersMatchReflection keeps the two in step.

// MarshalJSON encodes the SPEC §4 envelope.
func (r Reply) MarshalJSON() ([]byte, error) {
	n := 256 + 160*len(r.Attempts) + 96*len(r.Verdicts)
	if r.Result != nil {
		n += answersSize(r.Result.Answers)
	}
	return r.AppendJSON(make([]byte, 0, n)), nil
}

// AppendJSON appends the reply's JSON (see MarshalJSON) to b.
func (r *Reply) AppendJSON(b []byte) []byte {
	b = append(b, `{"run_id":`...)
	b = appendString(b, r.RunID)
	b = append(b, `,"status":`...)
	b = appendString(b, string(r.Status))
	b = append(b, `,"result":`...)
	if r.Result != nil {
		b = r.Result.AppendJSON(b)
	} else {
		b = append(b, "null"...)
	}
	if len(r.Verdicts) > 0 {
		b = append(b, `,"verdicts":`...)
		b = appendVerdicts(b, r.Verdicts)
	}
	if r.Review != nil {
		b = append(b, `,"review":`...)
		b = r.Review.appendJSON(b)
	}
	b = append(b, `,"error":`...)
	if r.Error != nil {
		b = r.Error.appendJSON(b)
	} else {
		b = append(b, "null"...)
	}
	b = append(b, `,"attempts":`...)
	b = appendAttempts(b, r.Attempts)
	b = append(b, `,"queued_ms":`...)
	b = strconv.AppendInt(b, r.QueuedMS, 10)
	b = append(b, `,"latency_ms":`...)
	b = strconv.AppendInt(b, r.LatencyMS, 10)
	return append(b, '}')
}

func (e *Error) appendJSON(b []byte) []byte {
	b = append(b, `{"code":`...)
	b = appendString(b, string(e.Code))
	b = append(b, `,"message":`...)
	b = appendString(b, e.Message)
	b = append(b, `,"status":`...)
	b = strconv.AppendInt(b, int64(e.Status), 10)
	return append(b, '}')
}

func appendAttempts(b []byte, as []Attempt) []byte {
	b = append(b, '[')
	for i := range as {
		if i > 0 {
			b = append(b, ',')
		}
		a := &as[i]
		b = append(b, `{"provider":`...)
		b = appendString(b, a.Provider)
		b = append(b, `,"model":`...)
		b = appendString(b, a.Model)
		b = append(b, `,"outcome":`...)
		b = appendString(b, a.Outcome)
		b = append(b, `,"latency_ms":`...)
		b = strconv.AppendInt(b, a.LatencyMS, 10)
		b = append(b, `,"detail":`...)
		b = appendString(b, a.Detail)
		b = append(b, `,"delivery":`...)
		b = strconv.AppendInt(b, int64(a.Delivery), 10)
		if a.ErrorCode != "" {
			b = append(b, `,"error_code":`...)
			b = appendString(b, string(a.ErrorCode))
		}
		b = append(b, `,"started_at":`...)
		b = appendTime(b, a.StartedAt)
		b = append(b, '}')
	}
	return append(b, ']')
}

// appendTime writes t as encoding/json does (RFC 3339 with nanoseconds, trailing zeros cut).
func appendTime(b []byte, t time.Time) []byte {
	b = append(b, '"')
	b = t.AppendFormat(b, time.RFC3339Nano)
	return append(b, '"')
}

func appendStrings(b []byte, ss []string) []byte {
	b = append(b, '[')
	for i, s := range ss {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, s)
	}
	return append(b, ']')
}

// MarshalJSON encodes the SPEC §6 record.
func (r RunRecord) MarshalJSON() ([]byte, error) {
	n := 1024 + 160*len(r.Attempts) + 96*len(r.Images) + 96*len(r.Verdicts)
	if r.Request != nil {
		n += r.Request.sizeHint()
	}
	if r.Result != nil {
		n += answersSize(r.Result.Answers)
	}
	return r.AppendJSON(make([]byte, 0, n)), nil
}

// AppendJSON appends the record's JSON (see MarshalJSON) to b.
func (r *RunRecord) AppendJSON(b []byte) []byte {
	b = append(b, `{"schema_version":`...)
	b = strconv.AppendInt(b, int64(r.SchemaVersion), 10)
	b = append(b, `,"run_id":`...)
	b = appendString(b, r.RunID)
	b = append(b, `,"caller":`...)
	b = appendString(b, r.Caller)
	b = append(b, `,"caller_kind":`...)
	b = appendString(b, r.CallerKind)
	b = append(b, `,"roles":`...)
	b = appendStrings(b, r.Roles)
	b = append(b, `,"scopes":`...)
	b = appendStrings(b, r.Scopes)
	b = append(b, `,"subject":`...)
	b = appendString(b, r.Subject)
	b = append(b, `,"batch_id":`...)
	b = appendString(b, r.BatchID)
	b = append(b, `,"item_id":`...)
	b = appendString(b, r.ItemID)
	b = append(b, `,"stream_seq":`...)
	b = strconv.AppendUint(b, r.StreamSeq, 10)
	b = append(b, `,"deliveries":`...)
	b = strconv.AppendInt(b, int64(r.Deliveries), 10)
	b = append(b, `,"published_at":`...)
	b = appendTime(b, r.PublishedAt)
	b = append(b, `,"started_at":`...)
	b = appendTime(b, r.StartedAt)
	b = append(b, `,"finished_at":`...)
	b = appendTime(b, r.FinishedAt)
	b = append(b, `,"queued_ms":`...)
	b = strconv.AppendInt(b, r.QueuedMS, 10)
	b = append(b, `,"latency_ms":`...)
	b = strconv.AppendInt(b, r.LatencyMS, 10)
	b = append(b, `,"status":`...)
	b = appendString(b, string(r.Status))
	b = append(b, `,"error_code":`...)
	b = appendString(b, string(r.ErrorCode))
	b = append(b, `,"error_status":`...)
	b = strconv.AppendInt(b, int64(r.ErrorStatus), 10)
	b = append(b, `,"error_message":`...)
	b = appendString(b, r.ErrorMessage)
	b = append(b, `,"provider":`...)
	b = appendString(b, r.Provider)
	b = append(b, `,"model":`...)
	b = appendString(b, r.Model)
	b = append(b, `,"requested_model":`...)
	b = appendString(b, r.RequestedModel)
	b = append(b, `,"request":`...)
	if r.Request != nil {
		b = r.Request.AppendJSON(b)
	} else {
		b = append(b, "null"...)
	}
	b = append(b, `,"record_state":`...)
	b = appendString(b, string(r.RecordState))
	b = append(b, `,"images":[`...)
	for i, im := range r.Images {
		if i > 0 {
			b = append(b, ',')
		}
		b = im.appendJSON(b)
	}
	b = append(b, `],"result":`...)
	if r.Result != nil {
		b = r.Result.AppendJSON(b)
	} else {
		b = append(b, "null"...)
	}
	if len(r.Verdicts) > 0 {
		b = append(b, `,"verdicts":`...)
		b = appendVerdicts(b, r.Verdicts)
	}
	if r.Review != nil {
		b = append(b, `,"review":`...)
		b = r.Review.appendJSON(b)
	}
	b = append(b, `,"attempts":`...)
	b = appendAttempts(b, r.Attempts)
	if r.CacheHit {
		b = append(b, `,"cache_hit":true`...)
	} else {
		b = append(b, `,"cache_hit":false`...)
	}
	b = append(b, `,"cost_usd":`...)
	if r.CostUSD != nil {
		b = appendFloat(b, *r.CostUSD)
	} else {
		b = append(b, "null"...)
	}
	b = append(b, `,"reply_to":`...)
	b = appendString(b, r.ReplyTo)
	b = append(b, `,"worker":`...)
	b = appendString(b, r.Worker)
	b = append(b, `,"version":`...)
	b = appendString(b, r.Version)
	b = append(b, `,"trace_id":`...)
	b = appendString(b, r.TraceID)
	return append(b, '}')
}
