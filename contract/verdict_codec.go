package contract

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"unicode/utf8"
)

// Verdicts are a run's verdicts in request order. In JSON they are an object keyed by
// question name (each Verdict's Question), in that order, like answers; Go maps are never
// used for them, so the order survives.
type Verdicts []Verdict

// MarshalJSON encodes {"<question>": {verdict}, …} in order.
func (vs Verdicts) MarshalJSON() ([]byte, error) {
	return appendVerdicts(make([]byte, 0, 96*len(vs)), vs), nil
}

// UnmarshalJSON reads the object form back, keeping its order; null means no verdicts.
// Unknown fields inside a verdict are ignored, wrong types are an error.
func (vs *Verdicts) UnmarshalJSON(b []byte) error {
	d := newLenientDecoder(b)
	var out Verdicts
	if err := d.verdicts(&out); err != nil {
		return fmt.Errorf("contract: decode verdicts: %w", err)
	}
	if err := d.p.end(); err != nil {
		return fmt.Errorf("contract: decode verdicts: %w", err)
	}
	*vs = out
	return nil
}

// Get returns the verdict of the named question.
func (vs Verdicts) Get(question string) (Verdict, bool) {
	for _, v := range vs {
		if v.Question == question {
			return v, true
		}
	}
	return Verdict{}, false
}

// MarshalJSON encodes one verdict (without its question, which is its key in "verdicts").
func (v Verdict) MarshalJSON() ([]byte, error) { return v.appendJSON(make([]byte, 0, 96)), nil }

// UnmarshalJSON reads one verdict object; Question is left empty.
func (v *Verdict) UnmarshalJSON(b []byte) error {
	d := newLenientDecoder(b)
	var out Verdict
	if err := d.verdict(&out); err != nil {
		return fmt.Errorf("contract: decode verdict: %w", err)
	}
	if err := d.p.end(); err != nil {
		return fmt.Errorf("contract: decode verdict: %w", err)
	}
	*v = out
	return nil
}

// MarshalJSON encodes {"probabilities": {key: p, …}, "confidence", "noul", "temperature"},
// each of the first three only when set.
func (c Calibrated) MarshalJSON() ([]byte, error) { return c.appendJSON(make([]byte, 0, 64)), nil }

// UnmarshalJSON reads a calibrated distribution, keeping the order of its probabilities.
func (c *Calibrated) UnmarshalJSON(b []byte) error {
	d := newLenientDecoder(b)
	var out Calibrated
	if err := d.calibrated(&out); err != nil {
		return fmt.Errorf("contract: decode calibrated: %w", err)
	}
	if err := d.p.end(); err != nil {
		return fmt.Errorf("contract: decode calibrated: %w", err)
	}
	*c = out
	return nil
}

func appendVerdicts(b []byte, vs Verdicts) []byte {
	b = append(b, '{')
	for i := range vs {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, vs[i].Question)
		b = append(b, ':')
		b = vs[i].appendJSON(b)
	}
	return append(b, '}')
}

func (v *Verdict) appendJSON(b []byte) []byte {
	b = append(b, `{"status":`...)
	b = appendString(b, string(v.Status))
	b = append(b, `,"rule":`...)
	b = appendString(b, v.Rule)
	b = append(b, `,"reason":`...)
	b = appendString(b, v.Reason)
	if v.Audit {
		b = append(b, `,"audit":true`...)
	}
	if v.AuditShare > 0 {
		b = append(b, `,"audit_share":`...)
		b = appendFloat(b, v.AuditShare)
	}
	if v.Calibrated != nil {
		b = append(b, `,"calibrated":`...)
		b = v.Calibrated.appendJSON(b)
	}
	// A label that is not JSON (only a caller's own struct can hold one) is left out, as if
	// unset, so that what decodes encodes the same again.
	if len(v.Label) > 0 && utf8.Valid(v.Label) && json.Valid(v.Label) {
		b = append(b, `,"label":`...)
		b = appendCompact(b, v.Label)
	}
	if v.Reviewer != "" {
		b = append(b, `,"reviewer":`...)
		b = appendString(b, v.Reviewer)
	}
	return append(b, '}')
}

func (c *Calibrated) appendJSON(b []byte) []byte {
	b = append(b, '{')
	if len(c.Probabilities) > 0 {
		b = append(b, `"probabilities":`...)
		b = appendProbabilities(b, c.Probabilities)
		b = append(b, ',')
	}
	if c.Confidence != nil {
		b = append(b, `"confidence":`...)
		b = appendFloat(b, *c.Confidence)
		b = append(b, ',')
	}
	if c.Noul != nil {
		b = append(b, `"noul":`...)
		b = appendFloat(b, *c.Noul)
		b = append(b, ',')
	}
	b = append(b, `"temperature":`...)
	b = appendFloat(b, c.Temperature)
	return append(b, '}')
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

func (r *ReviewRef) appendJSON(b []byte) []byte {
	b = append(b, `{"status":`...)
	b = appendString(b, r.Status)
	b = append(b, `,"item":`...)
	b = appendString(b, r.Item)
	if len(r.Items) > 0 {
		b = append(b, `,"items":`...)
		b = appendStrings(b, r.Items)
	}
	if r.Reason != "" {
		b = append(b, `,"reason":`...)
		b = appendString(b, r.Reason)
	}
	return append(b, '}')
}

// appendCompact appends a raw JSON value without insignificant white space, or null when it
// is empty, not valid JSON or not UTF-8: a Go-built value must never make the document around
// it invalid. Values here are small (a label), so the check costs nothing that matters.
func appendCompact(b []byte, raw []byte) []byte {
	if len(raw) == 0 || !utf8.Valid(raw) || !json.Valid(raw) {
		return append(b, "null"...)
	}
	if !bytes.ContainsAny(raw, " \t\r\n") {
		return append(b, raw...)
	}
	inString := false
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		if inString {
			b = append(b, c)
			switch c {
			case '\\':
				i++
				b = append(b, raw[i])
			case '"':
				inString = false
			}
			continue
		}
		switch c {
		case ' ', '\t', '\r', '\n':
			continue
		case '"':
			inString = true
		}
		b = append(b, c)
	}
	return b
}

// newLenientDecoder reads a document sys1 wrote (a record, a reply, a review item): types are
// checked, unknown fields ignored, null leaves a field unset. Strings are sliced from one
// private copy of b, so the caller may reuse b.
func newLenientDecoder(b []byte) *recordDecoder {
	text := string(b)
	return &recordDecoder{p: parser{data: []byte(text), text: text}}
}

// boolean reads true, false or null (no change).
func (d *recordDecoder) boolean(dst *bool) error {
	switch d.p.kind() {
	case kindNull:
		return d.p.literal("null")
	case kindTrue:
		*dst = true
		return d.p.literal("true")
	case kindFalse:
		*dst = false
		return d.p.literal("false")
	}
	return d.p.fail("expected true or false")
}

// float64 reads a finite number; an out-of-range number is an error, as in json.Unmarshal.
func (d *recordDecoder) float64() (float64, error) {
	if d.p.kind() != kindNumber {
		return 0, d.p.fail("expected a number")
	}
	s, e, err := d.p.number()
	if err != nil {
		return 0, err
	}
	f, perr := strconv.ParseFloat(d.p.text[s:e], 64)
	if perr != nil {
		return 0, d.p.fail(fmt.Sprintf("number %s is out of range", d.p.text[s:e]))
	}
	return f, nil
}

// floatPtr reads a number into a new pointer, or null into nil.
func (d *recordDecoder) floatPtr(dst **float64) error {
	if null, err := d.null(); null || err != nil {
		if null {
			*dst = nil
		}
		return err
	}
	f, err := d.float64()
	if err != nil {
		return err
	}
	*dst = &f
	return nil
}

func (d *recordDecoder) verdicts(dst *Verdicts) error {
	if null, err := d.null(); null || err != nil {
		if null {
			*dst = nil
		}
		return err
	}
	if d.p.kind() != kindObject {
		return d.p.fail("verdicts must be an object keyed by question name")
	}
	out := make(Verdicts, 0, 4)
	err := d.p.object(func([]byte) error {
		v := Verdict{Question: d.p.keyString()}
		err := d.verdict(&v)
		out = append(out, v)
		return err
	})
	*dst = out
	return err
}

func (d *recordDecoder) verdict(v *Verdict) error {
	if d.p.kind() != kindObject {
		return d.p.fail("a verdict must be an object")
	}
	return d.p.object(func(key []byte) error {
		switch string(key) {
		case "status":
			return d.str((*string)(&v.Status))
		case "rule":
			return d.str(&v.Rule)
		case "reason":
			return d.str(&v.Reason)
		case "audit":
			return d.boolean(&v.Audit)
		case "audit_share":
			if null, err := d.null(); null || err != nil {
				return err
			}
			f, err := d.float64()
			v.AuditShare = f
			return err
		case "reviewer":
			return d.str(&v.Reviewer)
		case "label":
			// null is a label ("none of these"), kept as such.
			raw, err := d.raw()
			v.Label = raw
			return err
		case "calibrated":
			if null, err := d.null(); null || err != nil {
				if null {
					v.Calibrated = nil
				}
				return err
			}
			c := new(Calibrated)
			v.Calibrated = c
			return d.calibrated(c)
		}
		_, _, err := d.p.skip()
		return err
	})
}

func (d *recordDecoder) calibrated(c *Calibrated) error {
	if d.p.kind() != kindObject {
		return d.p.fail("calibrated must be an object")
	}
	return d.p.object(func(key []byte) error {
		switch string(key) {
		case "probabilities":
			if null, err := d.null(); null || err != nil {
				if null {
					c.Probabilities = nil
				}
				return err
			}
			return d.probabilities(&c.Probabilities)
		case "confidence":
			return d.floatPtr(&c.Confidence)
		case "noul":
			return d.floatPtr(&c.Noul)
		case "temperature":
			if null, err := d.null(); null || err != nil {
				return err
			}
			f, err := d.float64()
			c.Temperature = f
			return err
		}
		_, _, err := d.p.skip()
		return err
	})
}

// probabilities reads an object of key → number in order.
func (d *recordDecoder) probabilities(dst *[]Probability) error {
	if d.p.kind() != kindObject {
		return d.p.fail("probabilities must be an object of key → probability")
	}
	out := make([]Probability, 0, 4)
	err := d.p.object(func([]byte) error {
		k := d.p.keyString()
		f, err := d.float64()
		out = append(out, Probability{Key: k, P: f})
		return err
	})
	*dst = out
	return err
}

// reviewRef reads {"status", "item", "items"} into *dst, as json.Unmarshal does into a pointer field:
// null sets it to nil, an object fills the existing value (or a new one).
func (d *recordDecoder) reviewRef(dst **ReviewRef) error {
	if null, err := d.null(); null || err != nil {
		if null {
			*dst = nil
		}
		return err
	}
	if d.p.kind() != kindObject {
		return d.p.fail("review must be an object")
	}
	if *dst == nil {
		*dst = new(ReviewRef)
	}
	r := *dst
	return d.p.object(func(key []byte) error {
		switch string(key) {
		case "status":
			return d.str(&r.Status)
		case "item":
			return d.str(&r.Item)
		case "items":
			return d.strings(&r.Items)
		case "reason":
			return d.str(&r.Reason)
		}
		_, _, err := d.p.skip()
		return err
	})
}
