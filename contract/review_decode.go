package contract

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"
)

// A strict reader of review items, for the review page: items cross a trust boundary (anyone
// allowed to publish on sys1.review.> can write one), so the input must be valid UTF-8, nest at
// most MaxDepth levels, hold no duplicate key at any depth and no unknown field, and every
// field must have its type. A failure names the field. (ReviewItem.UnmarshalJSON is the
// lenient reader of review_codec.go.)

// DecodeReviewItem reads one review item strictly (see the file comment): the message of a
// version before ReviewRun, one question per message. id, run_id, caller, question, type,
// verdict and created_at are required; whether the item is consistent (its id derived from
// its run and question, its subject's token the one it was published under) is for the
// reader to check, which knows the subject.
func DecodeReviewItem(data []byte) (*ReviewItem, error) {
	var it ReviewItem
	err := decodeStrict(data, "review item", func(d *strictDecoder, key string) error {
		switch key {
		case "run_id":
			return d.str(&it.RunID)
		case "caller":
			return d.str(&it.Caller)
		case "subject":
			return d.str(&it.Subject)
		case "provider":
			return d.str(&it.Provider)
		case "model":
			return d.str(&it.Model)
		case "state":
			return d.raw(&it.State)
		case "images":
			return d.images(&it.Images)
		case "created_at":
			return d.time(&it.CreatedAt)
		}
		return d.questionField(&it, key)
	}, "id", "run_id", "caller", "question", "type", "verdict", "created_at")
	if err != nil {
		return nil, err
	}
	if it.Images == nil {
		it.Images = []ImageRef{}
	}
	return &it, nil
}

// DecodeReviewMessage reads what a message on SYS1_REVIEW holds, strictly: a ReviewRun (run_id,
// caller, created_at and 1–MaxQuestions items required, each with id, question, type and
// verdict), or a single review item as versions before ReviewRun wrote them, returned as a
// run of one item (Legacy true).
func DecodeReviewMessage(data []byte) (rr *ReviewRun, legacy bool, err error) {
	if !reviewRunShape(data) {
		it, err := DecodeReviewItem(data)
		if err != nil {
			return nil, false, err
		}
		return &ReviewRun{RunID: it.RunID, Caller: it.Caller, Subject: it.Subject, Provider: it.Provider, Model: it.Model,
			State: it.State, Images: it.Images, CreatedAt: it.CreatedAt, Items: []ReviewItem{*it}}, true, nil
	}
	var run ReviewRun
	err = decodeStrict(data, "review message", func(d *strictDecoder, key string) error {
		switch key {
		case "run_id":
			return d.str(&run.RunID)
		case "caller":
			return d.str(&run.Caller)
		case "subject":
			return d.str(&run.Subject)
		case "provider":
			return d.str(&run.Provider)
		case "model":
			return d.str(&run.Model)
		case "state":
			return d.raw(&run.State)
		case "images":
			return d.images(&run.Images)
		case "created_at":
			return d.time(&run.CreatedAt)
		case "items":
			if d.p.kind() != kindArray {
				return fmt.Errorf("must be an array of items, got %s", kindName(d.p.kind()))
			}
			return d.p.array(func() error {
				if len(run.Items) == MaxQuestions {
					return fmt.Errorf("more than %d items (a request has at most %d questions)", MaxQuestions, MaxQuestions)
				}
				var it ReviewItem
				if err := d.item(&it); err != nil {
					return fmt.Errorf("[%d]: %w", len(run.Items), err)
				}
				run.Items = append(run.Items, it)
				return nil
			})
		}
		return errUnknownField
	}, "run_id", "caller", "created_at", "items")
	if err != nil {
		return nil, false, err
	}
	if len(run.Items) == 0 {
		return nil, false, errors.New("contract: review message: items must not be empty")
	}
	if run.Images == nil {
		run.Images = []ImageRef{}
	}
	for i := range run.Items {
		it := &run.Items[i]
		it.RunID, it.Caller, it.Subject, it.Provider, it.Model = run.RunID, run.Caller, run.Subject, run.Provider, run.Model
		it.State, it.Images, it.CreatedAt = run.State, run.Images, run.CreatedAt
	}
	return &run, false, nil
}

// reviewRunShape reports whether a message is a ReviewRun rather than an old single item: a
// run has "items" among its top-level keys, an item never does. Malformed input is left to
// the strict decoders (either says what is wrong).
func reviewRunShape(data []byte) bool {
	if !checkDepth(data, MaxDepth) {
		return false
	}
	p := parser{data: data}
	if p.kind() != kindObject {
		return false
	}
	found := false
	_ = p.object(func(key []byte) error {
		if string(key) == "items" {
			found = true
		}
		_, _, err := p.skip()
		return err
	})
	return found
}

// item reads one element of a ReviewRun's items: an object of id, question and the question's
// fields, strictly.
func (d *strictDecoder) item(it *ReviewItem) error {
	if d.p.kind() != kindObject {
		return fmt.Errorf("must be an object, got %s", kindName(d.p.kind()))
	}
	var seen keySet
	err := d.p.object(func(k []byte) error {
		key := string(k)
		if seen.add(key) {
			return fmt.Errorf("field %q: duplicate key", key)
		}
		if err := d.questionField(it, key); err != nil {
			return fmt.Errorf("field %q: %w", key, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, r := range []string{"id", "question", "type", "verdict"} {
		if !seen.has(r) {
			return fmt.Errorf("field %q is required", r)
		}
	}
	return nil
}

// questionField reads one field of a review item's question part (id, question, type through
// audit).
func (d *strictDecoder) questionField(it *ReviewItem, key string) error {
	switch key {
	case "id":
		return d.str(&it.ID)
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
	}
	return errUnknownField
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
		case "audit_share":
			var f *float64
			if err = d.unit(&f); err == nil {
				v.AuditShare = *f
			}
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

// labelValue consumes one label value: a JSON string, true, false, a non-negative whole
// number written without fraction or exponent, or null ("none of these").
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
