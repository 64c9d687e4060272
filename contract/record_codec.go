package contract

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"
	"unicode/utf8"
)

// DecodeRecord reads one run record (SPEC §6) as the sink receives it from SYS1_RUNS. On any
// JSON that json.Unmarshal accepts into a RunRecord with exact-case field names it gives the
// same value, without encoding/json's reflection and its second pass over the bytes (the
// sink's largest cost per record). Unknown fields are ignored and null leaves a field at its
// zero value, as with json.Unmarshal. Input that is not valid UTF-8 goes through json.Unmarshal
// itself, which repairs it the way it always has.
func DecodeRecord(data []byte) (*RunRecord, error) {
	var r RunRecord
	if !utf8.Valid(data) {
		if err := json.Unmarshal(data, &r); err != nil {
			return nil, fmt.Errorf("contract: decode record: %w", err)
		}
		return &r, nil
	}
	// One copy of the input backs every string field (none allocates on its own), and the
	// caller may reuse data afterwards.
	text := string(data)
	d := recordDecoder{p: parser{data: []byte(text), text: text}}
	if d.p.kind() != kindObject {
		return nil, fmt.Errorf("contract: decode record: %w", d.p.fail("expected an object"))
	}
	err := d.p.object(func(key []byte) error { return d.field(&r, key) })
	if err == nil {
		err = d.p.end()
	}
	if err != nil {
		return nil, fmt.Errorf("contract: decode record: %w", err)
	}
	return &r, nil
}

type recordDecoder struct{ p parser }

// null consumes a null and reports whether there was one.
func (d *recordDecoder) null() (bool, error) {
	if d.p.kind() != kindNull {
		return false, nil
	}
	return true, d.p.literal("null")
}

func (d *recordDecoder) str(dst *string) error {
	if null, err := d.null(); null || err != nil {
		return err
	}
	if d.p.kind() != kindString {
		return d.p.fail("expected a string")
	}
	s, err := d.p.str()
	*dst = s
	return err
}

func (d *recordDecoder) integer(bits int) (int64, error) {
	s, e, err := d.p.number()
	if err != nil {
		return 0, err
	}
	n, perr := strconv.ParseInt(d.p.text[s:e], 10, bits)
	if perr != nil {
		return 0, d.p.fail(fmt.Sprintf("%s is not a whole number of %d bits", d.p.text[s:e], bits))
	}
	return n, nil
}

func (d *recordDecoder) int(dst *int) error {
	if null, err := d.null(); null || err != nil {
		return err
	}
	n, err := d.integer(strconv.IntSize)
	*dst = int(n)
	return err
}

func (d *recordDecoder) int64(dst *int64) error {
	if null, err := d.null(); null || err != nil {
		return err
	}
	n, err := d.integer(64)
	*dst = n
	return err
}

func (d *recordDecoder) uint64(dst *uint64) error {
	if null, err := d.null(); null || err != nil {
		return err
	}
	s, e, err := d.p.number()
	if err != nil {
		return err
	}
	n, perr := strconv.ParseUint(d.p.text[s:e], 10, 64)
	if perr != nil {
		return d.p.fail(fmt.Sprintf("%s is not an unsigned whole number", d.p.text[s:e]))
	}
	*dst = n
	return nil
}

func (d *recordDecoder) time(dst *time.Time) error {
	if null, err := d.null(); null || err != nil {
		return err
	}
	var s string
	if err := d.str(&s); err != nil {
		return err
	}
	// The same strict RFC 3339 parse as time.Time's UnmarshalJSON.
	if err := dst.UnmarshalText([]byte(s)); err != nil {
		return d.p.fail(err.Error())
	}
	return nil
}

func (d *recordDecoder) strings(dst *[]string) error {
	if null, err := d.null(); null || err != nil {
		*dst = nil
		return err
	}
	out := []string{}
	err := d.p.array(func() error {
		var s string
		err := d.str(&s)
		out = append(out, s)
		return err
	})
	*dst = out
	return err
}

// raw skips a value and returns its bytes (aliasing the decoder's copy). The value is a
// document of its own (a request, a result), so it gets its own nesting allowance: a request
// nested the 64 levels DecodeRequest allows must not fail here for sitting inside a record.
func (d *recordDecoder) raw() ([]byte, error) {
	depth := d.p.depth
	d.p.depth = 0
	s, e, err := d.p.skip()
	d.p.depth = depth
	return d.p.data[s:e], err
}

func (d *recordDecoder) field(r *RunRecord, key []byte) error {
	switch string(key) {
	case "schema_version":
		return d.int(&r.SchemaVersion)
	case "run_id":
		return d.str(&r.RunID)
	case "caller":
		return d.str(&r.Caller)
	case "caller_kind":
		return d.str(&r.CallerKind)
	case "roles":
		return d.strings(&r.Roles)
	case "scopes":
		return d.strings(&r.Scopes)
	case "subject":
		return d.str(&r.Subject)
	case "batch_id":
		return d.str(&r.BatchID)
	case "item_id":
		return d.str(&r.ItemID)
	case "stream_seq":
		return d.uint64(&r.StreamSeq)
	case "deliveries":
		return d.int(&r.Deliveries)
	case "published_at":
		return d.time(&r.PublishedAt)
	case "started_at":
		return d.time(&r.StartedAt)
	case "finished_at":
		return d.time(&r.FinishedAt)
	case "queued_ms":
		return d.int64(&r.QueuedMS)
	case "latency_ms":
		return d.int64(&r.LatencyMS)
	case "status":
		return d.str((*string)(&r.Status))
	case "error_code":
		return d.str((*string)(&r.ErrorCode))
	case "error_status":
		return d.int(&r.ErrorStatus)
	case "error_message":
		return d.str(&r.ErrorMessage)
	case "provider":
		return d.str(&r.Provider)
	case "model":
		return d.str(&r.Model)
	case "requested_model":
		return d.str(&r.RequestedModel)
	case "request":
		if null, err := d.null(); null || err != nil {
			r.Request = nil
			return err
		}
		b, err := d.raw()
		if err != nil {
			return err
		}
		r.Request = new(Request)
		return r.Request.UnmarshalJSON(b)
	case "result":
		if null, err := d.null(); null || err != nil {
			r.Result = nil
			return err
		}
		b, err := d.raw()
		if err != nil {
			return err
		}
		r.Result = new(Result)
		return r.Result.UnmarshalJSON(b)
	case "record_state":
		return d.str((*string)(&r.RecordState))
	case "images":
		return d.images(r)
	case "verdicts":
		return d.verdicts(&r.Verdicts)
	case "review":
		return d.reviewRef(&r.Review)
	case "attempts":
		return d.attempts(r)
	case "cache_hit":
		return d.boolean(&r.CacheHit)
	case "cost_usd":
		return d.floatPtr(&r.CostUSD)
	case "reply_to":
		return d.str(&r.ReplyTo)
	case "worker":
		return d.str(&r.Worker)
	case "version":
		return d.str(&r.Version)
	case "trace_id":
		return d.str(&r.TraceID)
	}
	_, _, err := d.p.skip()
	return err
}

func (d *recordDecoder) images(r *RunRecord) error {
	if null, err := d.null(); null || err != nil {
		r.Images = nil
		return err
	}
	out := []ImageRef{}
	err := d.p.array(func() error {
		var im ImageRef
		if null, err := d.null(); null || err != nil {
			out = append(out, im)
			return err
		}
		err := d.p.object(func(key []byte) error {
			switch string(key) {
			case "sha256":
				return d.str(&im.SHA256)
			case "bytes":
				return d.int(&im.Bytes)
			}
			_, _, err := d.p.skip()
			return err
		})
		out = append(out, im)
		return err
	})
	r.Images = out
	return err
}

func (d *recordDecoder) attempts(r *RunRecord) error {
	if null, err := d.null(); null || err != nil {
		r.Attempts = nil
		return err
	}
	out := []Attempt{}
	err := d.p.array(func() error {
		var a Attempt
		if null, err := d.null(); null || err != nil {
			out = append(out, a)
			return err
		}
		err := d.p.object(func(key []byte) error {
			switch string(key) {
			case "provider":
				return d.str(&a.Provider)
			case "model":
				return d.str(&a.Model)
			case "outcome":
				return d.str(&a.Outcome)
			case "latency_ms":
				return d.int64(&a.LatencyMS)
			case "detail":
				return d.str(&a.Detail)
			case "delivery":
				return d.int(&a.Delivery)
			case "error_code":
				return d.str((*string)(&a.ErrorCode))
			case "started_at":
				return d.time(&a.StartedAt)
			}
			_, _, err := d.p.skip()
			return err
		})
		out = append(out, a)
		return err
	})
	r.Attempts = out
	return err
}
