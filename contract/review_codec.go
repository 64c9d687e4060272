package contract

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"
	"unicode/utf8"
)

// The JSON codecs of ReviewItem and Label (SYS1_REVIEW and SYS1_LABELS messages).
//
// Encoding keeps order: a review item's options and probabilities are JSON objects in the
// question's order, like a request's criteria and an answer's probabilities, so a reviewer
// sees the options as the model did. Decoding is strict, because these messages cross a
// trust boundary (anyone allowed to publish on the subjects can write one): the input must be
// valid UTF-8, nest at most MaxDepth levels, hold no duplicate key at any depth and no
// unknown field, and every field must have its type. A failure names the field.
//
// Review item shape:
//
//	{"id", "run_id", "caller", "provider", "model", "question", "type",
//	 "instructions"?: <raw JSON>,
//	 "options": {"<key>": "<description>" | null, …},      // omitted when none
//	 "levels": ["…", …],                                    // score, omitted when none
//	 "probabilities": {"<key>": 0.42, …},                   // omitted when none
//	 "confidence"?, "noul"?, "score"?, "choice"?,
//	 "verdict": {"status", "rule", "reason", "audit"?, "calibrated"?, "label"?, "reviewer"?},
//	 "mode", "audit"?, "state"?: <raw JSON>, "images": [{"sha256", "bytes"}], "created_at"}
//
// Label shape:
//
//	{"run_id", "question", "label": "<key>" | true | false | <level index> | null,
//	 "reviewer", "labelled_at", "source", "caller"?, "item"?}
//
// A label value of null means "none of these": a reviewer saw the item and found that no
// option (or level, or side) is right. It is a recorded judgement, distinct from every option
// key, and never confused with a missing label (a label without the "label" field is an error).

// MarshalJSON encodes the review item in the shape above.
func (it ReviewItem) MarshalJSON() ([]byte, error) {
	b := make([]byte, 0, 512+len(it.State)+len(it.Instructions))
	b = append(b, `{"id":`...)
	b = appendString(b, it.ID)
	b = append(b, `,"run_id":`...)
	b = appendString(b, it.RunID)
	b = append(b, `,"caller":`...)
	b = appendString(b, it.Caller)
	b = append(b, `,"provider":`...)
	b = appendString(b, it.Provider)
	b = append(b, `,"model":`...)
	b = appendString(b, it.Model)
	b = append(b, `,"question":`...)
	b = appendString(b, it.Question)
	b = append(b, `,"type":`...)
	b = appendString(b, string(it.Type))
	if len(it.Instructions) > 0 {
		b = append(b, `,"instructions":`...)
		b = append(b, it.Instructions...)
	}
	if len(it.Options) > 0 {
		b = append(b, `,"options":{`...)
		for i, o := range it.Options {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, o.Key)
			b = append(b, ':')
			if o.Description == nil {
				b = append(b, "null"...)
			} else {
				b = appendString(b, *o.Description)
			}
		}
		b = append(b, '}')
	}
	if len(it.Levels) > 0 {
		b = append(b, `,"levels":`...)
		b = appendStrings(b, it.Levels)
	}
	if len(it.Probabilities) > 0 {
		b = append(b, `,"probabilities":`...)
		b = appendProbabilities(b, it.Probabilities)
	}
	b = appendOptFloat(b, `,"confidence":`, it.Confidence)
	b = appendOptFloat(b, `,"noul":`, it.Noul)
	b = appendOptFloat(b, `,"score":`, it.Score)
	if it.Choice != "" {
		b = append(b, `,"choice":`...)
		b = appendString(b, it.Choice)
	}
	b = append(b, `,"verdict":`...)
	b = appendReviewVerdict(b, &it.Verdict)
	b = append(b, `,"mode":`...)
	b = appendString(b, it.Mode)
	if it.Audit {
		b = append(b, `,"audit":true`...)
	}
	if len(it.State) > 0 {
		b = append(b, `,"state":`...)
		b = append(b, it.State...)
	}
	b = append(b, `,"images":[`...)
	for i, im := range it.Images {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"sha256":`...)
		b = appendString(b, im.SHA256)
		b = append(b, `,"bytes":`...)
		b = strconv.AppendInt(b, int64(im.Bytes), 10)
		b = append(b, '}')
	}
	b = append(b, `],"created_at":`...)
	b = appendTime(b, it.CreatedAt)
	return append(b, '}'), nil
}

func appendOptFloat(b []byte, field string, f *float64) []byte {
	if f == nil {
		return b
	}
	b = append(b, field...)
	return appendFloat(b, *f)
}

func appendProbabilities(b []byte, ps []Probability) []byte {
	b = append(b, '{')
	for i, p := range ps {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, p.Key)
		b = append(b, ':')
		b = appendFloat(b, p.P)
	}
	return append(b, '}')
}

// appendReviewVerdict encodes a verdict as review items carry it (SPEC §8's verdict object).
func appendReviewVerdict(b []byte, v *Verdict) []byte {
	b = append(b, `{"status":`...)
	b = appendString(b, string(v.Status))
	b = append(b, `,"rule":`...)
	b = appendString(b, v.Rule)
	b = append(b, `,"reason":`...)
	b = appendString(b, v.Reason)
	if v.Audit {
		b = append(b, `,"audit":true`...)
	}
	if c := v.Calibrated; c != nil {
		b = append(b, `,"calibrated":{`...)
		sep := false
		if len(c.Probabilities) > 0 {
			b = append(b, `"probabilities":`...)
			b = appendProbabilities(b, c.Probabilities)
			sep = true
		}
		if c.Confidence != nil {
			if sep {
				b = append(b, ',')
			}
			b = append(b, `"confidence":`...)
			b = appendFloat(b, *c.Confidence)
			sep = true
		}
		if c.Noul != nil {
			if sep {
				b = append(b, ',')
			}
			b = append(b, `"noul":`...)
			b = appendFloat(b, *c.Noul)
			sep = true
		}
		if sep {
			b = append(b, ',')
		}
		b = append(b, `"temperature":`...)
		b = appendFloat(b, c.Temperature)
		b = append(b, '}')
	}
	if len(v.Label) > 0 {
		b = append(b, `,"label":`...)
		b = append(b, v.Label...)
	}
	if v.Reviewer != "" {
		b = append(b, `,"reviewer":`...)
		b = appendString(b, v.Reviewer)
	}
	return append(b, '}')
}

// MarshalJSON encodes the label in the shape above. A label without a value cannot be
// encoded: an absent value would read back as an error, never as "none of these" (null).
func (l Label) MarshalJSON() ([]byte, error) {
	if len(l.Value) == 0 {
		return nil, errors.New("contract: label: no value (use null for \"none of these\")")
	}
	if err := checkLabelValue(l.Value); err != nil {
		return nil, fmt.Errorf("contract: label: %w", err)
	}
	b := make([]byte, 0, 192+len(l.Value))
	b = append(b, `{"run_id":`...)
	b = appendString(b, l.RunID)
	b = append(b, `,"question":`...)
	b = appendString(b, l.Question)
	b = append(b, `,"label":`...)
	b = append(b, l.Value...)
	b = append(b, `,"reviewer":`...)
	b = appendString(b, l.Reviewer)
	b = append(b, `,"labelled_at":`...)
	b = appendTime(b, l.LabelledAt)
	b = append(b, `,"source":`...)
	b = appendString(b, l.Source)
	if l.Caller != "" {
		b = append(b, `,"caller":`...)
		b = appendString(b, l.Caller)
	}
	if l.Item != "" {
		b = append(b, `,"item":`...)
		b = appendString(b, l.Item)
	}
	return append(b, '}'), nil
}

// checkLabelValue accepts exactly the label value kinds: a JSON string, true, false, a
// non-negative whole number written without fraction or exponent, or null.
func checkLabelValue(raw []byte) error {
	p := parser{data: raw}
	if err := labelValue(&p); err != nil {
		return err
	}
	return p.end()
}

func labelValue(p *parser) error {
	switch p.kind() {
	case kindString:
		_, _, _, err := p.stringSpan()
		return err
	case kindTrue:
		return p.literal("true")
	case kindFalse:
		return p.literal("false")
	case kindNull:
		return p.literal("null")
	case kindNumber:
		s, e, err := p.number()
		if err != nil {
			return err
		}
		n := p.data[s:e]
		for _, c := range n {
			if c < '0' || c > '9' {
				return fmt.Errorf("label %s: a level index is a whole number ≥ 0 without fraction or exponent", n)
			}
		}
		if len(n) > 1 && n[0] == '0' || len(n) > 9 {
			return fmt.Errorf("label %s: not a level index", n)
		}
		return nil
	}
	return fmt.Errorf("label: must be an option key (string), true/false, a level index or null, got %s", kindName(p.kind()))
}

// DecodeLabel reads one label strictly (see the file comment). Only run_id, question and
// label are required: a producer's submission may leave the rest to the worker.
func DecodeLabel(data []byte) (*Label, error) {
	var l Label
	err := decodeStrict(data, "label", func(d *strictDecoder, key string) error {
		switch key {
		case "run_id":
			return d.str(&l.RunID)
		case "question":
			return d.str(&l.Question)
		case "label":
			d.p.skipWS()
			s := d.p.pos
			if err := labelValue(&d.p); err != nil {
				return err
			}
			l.Value = rawCopy(d.p.data[s:d.p.pos])
			return nil
		case "reviewer":
			return d.str(&l.Reviewer)
		case "labelled_at":
			return d.time(&l.LabelledAt)
		case "source":
			if err := d.str(&l.Source); err != nil {
				return err
			}
			if l.Source != "" && l.Source != LabelSourceReview && l.Source != LabelSourceProducer {
				return fmt.Errorf("must be %q or %q, got %q", LabelSourceReview, LabelSourceProducer, l.Source)
			}
			return nil
		case "caller":
			return d.str(&l.Caller)
		case "item":
			return d.str(&l.Item)
		}
		return errUnknownField
	}, "run_id", "question", "label")
	if err != nil {
		return nil, err
	}
	return &l, nil
}

// UnmarshalJSON is DecodeLabel.
func (l *Label) UnmarshalJSON(b []byte) error {
	out, err := DecodeLabel(b)
	if err != nil {
		return err
	}
	*l = *out
	return nil
}

// DecodeReviewItem reads one review item strictly (see the file comment). id, run_id,
// caller, question, type, verdict and created_at are required; whether the item is
// consistent (its id derived from its run and question, its caller the subject's) is for the
// reader to check, which knows the subject.
func DecodeReviewItem(data []byte) (*ReviewItem, error) {
	var it ReviewItem
	err := decodeStrict(data, "review item", func(d *strictDecoder, key string) error {
		switch key {
		case "id":
			return d.str(&it.ID)
		case "run_id":
			return d.str(&it.RunID)
		case "caller":
			return d.str(&it.Caller)
		case "provider":
			return d.str(&it.Provider)
		case "model":
			return d.str(&it.Model)
		case "question":
			return d.str(&it.Question)
		case "type":
			if err := d.str((*string)(&it.Type)); err != nil {
				return err
			}
			switch it.Type {
			case TypeChoice, TypeNoul, TypeScore:
				return nil
			}
			return fmt.Errorf("must be choice, noul or score, got %q", it.Type)
		case "instructions":
			if d.p.kind() == kindNull {
				return d.p.literal("null") // as if absent: a question without instructions
			}
			return d.raw(&it.Instructions)
		case "options":
			return d.options(&it.Options)
		case "levels":
			return d.strings(&it.Levels)
		case "probabilities":
			return d.probabilities(&it.Probabilities)
		case "confidence":
			return d.unit(&it.Confidence)
		case "noul":
			return d.unit(&it.Noul)
		case "score":
			return d.finite(&it.Score)
		case "choice":
			return d.str(&it.Choice)
		case "verdict":
			return d.verdict(&it.Verdict)
		case "mode":
			return d.str(&it.Mode)
		case "audit":
			return d.boolean(&it.Audit)
		case "state":
			return d.raw(&it.State)
		case "images":
			return d.images(&it.Images)
		case "created_at":
			return d.time(&it.CreatedAt)
		}
		return errUnknownField
	}, "id", "run_id", "caller", "question", "type", "verdict", "created_at")
	if err != nil {
		return nil, err
	}
	if it.Images == nil {
		it.Images = []ImageRef{}
	}
	return &it, nil
}

// UnmarshalJSON is DecodeReviewItem.
func (it *ReviewItem) UnmarshalJSON(b []byte) error {
	out, err := DecodeReviewItem(b)
	if err != nil {
		return err
	}
	*it = *out
	return nil
}

var errUnknownField = errors.New("unknown field")

// strictDecoder reads the fields of one object strictly; its helpers each consume one value.
type strictDecoder struct {
	p    parser
	what string
}

// decodeStrict checks data as a whole (UTF-8, depth), then walks its top-level object,
// calling field for each key once; a repeated key, an unknown field or a missing required
// field is an error naming it.
func decodeStrict(data []byte, what string, field func(d *strictDecoder, key string) error, required ...string) error {
	if !utf8.Valid(data) {
		return fmt.Errorf("contract: %s: invalid UTF-8 at byte %d", what, firstInvalidUTF8(data))
	}
	if !checkDepth(data, MaxDepth) {
		return fmt.Errorf("contract: %s: nesting deeper than %d levels", what, MaxDepth)
	}
	d := &strictDecoder{p: parser{data: data, strict: true}, what: what}
	if d.p.kind() != kindObject {
		return fmt.Errorf("contract: %s: %w", what, d.p.fail("expected an object"))
	}
	var seen keySet
	err := d.p.object(func(k []byte) error {
		key := string(k)
		if seen.add(key) {
			return fmt.Errorf("field %q: duplicate key", key)
		}
		if err := field(d, key); err != nil {
			return fmt.Errorf("field %q: %w", key, err)
		}
		return nil
	})
	if err == nil {
		err = d.p.end()
	}
	if err == nil && len(d.p.dupes) > 0 {
		err = fmt.Errorf("%s: %s", d.p.dupes[0].Path, d.p.dupes[0].Message)
	}
	if err != nil {
		return fmt.Errorf("contract: %s: %w", what, err)
	}
	for _, r := range required {
		if !seen.has(r) {
			return fmt.Errorf("contract: %s: field %q is required", what, r)
		}
	}
	return nil
}

// has reports whether k was added.
func (s *keySet) has(k string) bool {
	if s.big != nil {
		_, ok := s.big[k]
		return ok
	}
	for _, prev := range s.small[:s.n] {
		if prev == k {
			return true
		}
	}
	return false
}

func (d *strictDecoder) str(dst *string) error {
	if d.p.kind() != kindString {
		return fmt.Errorf("must be a string, got %s", kindName(d.p.kind()))
	}
	s, err := d.p.str()
	*dst = s
	return err
}

func (d *strictDecoder) boolean(dst *bool) error {
	switch d.p.kind() {
	case kindTrue:
		*dst = true
		return d.p.literal("true")
	case kindFalse:
		*dst = false
		return d.p.literal("false")
	}
	return fmt.Errorf("must be true or false, got %s", kindName(d.p.kind()))
}

func (d *strictDecoder) number() (float64, error) {
	if d.p.kind() != kindNumber {
		return 0, fmt.Errorf("must be a number, got %s", kindName(d.p.kind()))
	}
	f, err := d.p.float()
	if err == nil && !finite(f) {
		err = errors.New("must be a finite number")
	}
	return f, err
}

func (d *strictDecoder) finite(dst **float64) error {
	f, err := d.number()
	if err != nil {
		return err
	}
	*dst = &f
	return nil
}

func (d *strictDecoder) unit(dst **float64) error {
	f, err := d.number()
	if err != nil {
		return err
	}
	if !unit(f) {
		return fmt.Errorf("must be within [0, 1], got %v", f)
	}
	*dst = &f
	return nil
}

func (d *strictDecoder) time(dst *time.Time) error {
	var s string
	if err := d.str(&s); err != nil {
		return err
	}
	if err := dst.UnmarshalText([]byte(s)); err != nil {
		return fmt.Errorf("must be an RFC 3339 time: %w", err)
	}
	return nil
}

// raw keeps a value byte for byte (a copy); duplicate keys inside it are errors.
func (d *strictDecoder) raw(dst *json.RawMessage) error {
	s, e, err := d.p.skip()
	if err != nil {
		return err
	}
	if len(d.p.dupes) > 0 {
		return fmt.Errorf("%s", d.p.dupes[0].Message)
	}
	*dst = rawCopy(d.p.data[s:e])
	return nil
}

func (d *strictDecoder) strings(dst *[]string) error {
	var out []string
	err := d.p.array(func() error {
		var s string
		if err := d.str(&s); err != nil {
			return fmt.Errorf("[%d]: %w", len(out), err)
		}
		out = append(out, s)
		return nil
	})
	*dst = out
	return err
}

func (d *strictDecoder) options(dst *[]Option) error {
	var out []Option
	var seen keySet
	err := d.p.object(func(k []byte) error {
		key := string(k)
		if seen.add(key) {
			return fmt.Errorf("duplicate option %q", key)
		}
		o := Option{Key: key}
		switch d.p.kind() {
		case kindNull:
			if err := d.p.literal("null"); err != nil {
				return err
			}
		case kindString:
			s, err := d.p.str()
			if err != nil {
				return err
			}
			o.Description = &s
		default:
			return fmt.Errorf("option %q: description must be a string or null, got %s", key, kindName(d.p.kind()))
		}
		out = append(out, o)
		return nil
	})
	*dst = out
	return err
}

func (d *strictDecoder) probabilities(dst *[]Probability) error {
	var out []Probability
	var seen keySet
	err := d.p.object(func(k []byte) error {
		key := string(k)
		if seen.add(key) {
			return fmt.Errorf("duplicate key %q", key)
		}
		f, err := d.number()
		if err != nil {
			return fmt.Errorf("%q: %w", key, err)
		}
		if !unit(f) {
			return fmt.Errorf("%q: must be within [0, 1], got %v", key, f)
		}
		out = append(out, Probability{Key: key, P: f})
		return nil
	})
	*dst = out
	return err
}

func (d *strictDecoder) images(dst *[]ImageRef) error {
	out := []ImageRef{}
	err := d.p.array(func() error {
		var im ImageRef
		var seen keySet
		err := d.p.object(func(k []byte) error {
			key := string(k)
			if seen.add(key) {
				return fmt.Errorf("duplicate key %q", key)
			}
			switch key {
			case "sha256":
				return d.str(&im.SHA256)
			case "bytes":
				f, err := d.number()
				if err != nil || f < 0 || f > 1<<53 || f != float64(int64(f)) {
					return errors.New("bytes: must be a whole number ≥ 0")
				}
				im.Bytes = int(f)
				return nil
			}
			return fmt.Errorf("%q: %w", key, errUnknownField)
		})
		if err != nil {
			return fmt.Errorf("[%d]: %w", len(out), err)
		}
		out = append(out, im)
		return nil
	})
	*dst = out
	return err
}

func (d *strictDecoder) verdict(v *Verdict) error {
	var seen keySet
	return d.p.object(func(k []byte) error {
		key := string(k)
		if seen.add(key) {
			return fmt.Errorf("duplicate key %q", key)
		}
		var err error
		switch key {
		case "status":
			err = d.str((*string)(&v.Status))
		case "rule":
			err = d.str(&v.Rule)
		case "reason":
			err = d.str(&v.Reason)
		case "audit":
			err = d.boolean(&v.Audit)
		case "calibrated":
			v.Calibrated = new(Calibrated)
			err = d.calibrated(v.Calibrated)
		case "label":
			d.p.skipWS()
			s := d.p.pos
			if err = labelValue(&d.p); err == nil {
				v.Label = rawCopy(d.p.data[s:d.p.pos])
			}
		case "reviewer":
			err = d.str(&v.Reviewer)
		default:
			err = errUnknownField
		}
		if err != nil {
			return fmt.Errorf("%q: %w", key, err)
		}
		return nil
	})
}

func (d *strictDecoder) calibrated(c *Calibrated) error {
	var seen keySet
	return d.p.object(func(k []byte) error {
		key := string(k)
		if seen.add(key) {
			return fmt.Errorf("duplicate key %q", key)
		}
		var err error
		switch key {
		case "probabilities":
			err = d.probabilities(&c.Probabilities)
		case "confidence":
			err = d.unit(&c.Confidence)
		case "noul":
			err = d.unit(&c.Noul)
		case "temperature":
			var f float64
			if f, err = d.number(); err == nil {
				c.Temperature = f
			}
		default:
			err = errUnknownField
		}
		if err != nil {
			return fmt.Errorf("calibrated %q: %w", key, err)
		}
		return nil
	})
}
