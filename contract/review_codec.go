package contract

import "fmt"

// MarshalJSON encodes a review item in field order. Options and probabilities are objects in
// their order (option key → description or null; key → probability), like a request's
// criteria and an answer's probabilities; instructions and state are written byte for byte.
func (it ReviewItem) MarshalJSON() ([]byte, error) {
	return it.AppendJSON(make([]byte, 0, it.sizeHint())), nil
}

func (it *ReviewItem) sizeHint() int {
	n := 512 + len(it.Subject) + len(it.Question) + len(it.Instructions) + len(it.State) + 96*len(it.Images)
	for _, o := range it.Options {
		n += 8 + len(o.Key)
		if o.Description != nil {
			n += len(*o.Description)
		}
	}
	for _, l := range it.Levels {
		n += 4 + len(l)
	}
	for _, p := range it.Probabilities {
		n += 28 + len(p.Key)
	}
	return n
}

// AppendJSON appends the item's JSON (see MarshalJSON) to b.
func (it *ReviewItem) AppendJSON(b []byte) []byte {
	b = append(b, `{"id":`...)
	b = appendString(b, it.ID)
	b = append(b, `,"run_id":`...)
	b = appendString(b, it.RunID)
	b = append(b, `,"caller":`...)
	b = appendString(b, it.Caller)
	if it.Subject != "" {
		b = append(b, `,"subject":`...)
		b = appendString(b, it.Subject)
	}
	b = append(b, `,"provider":`...)
	b = appendString(b, it.Provider)
	b = append(b, `,"model":`...)
	b = appendString(b, it.Model)
	b = append(b, `,"question":`...)
	b = appendString(b, it.Question)
	b = it.appendQuestion(b)
	if len(it.State) > 0 {
		b = append(b, `,"state":`...)
		b = append(b, it.State...)
	}
	b = appendImageRefs(b, it.Images)
	b = append(b, `,"created_at":`...)
	b = appendTime(b, it.CreatedAt)
	return append(b, '}')
}

// appendQuestion appends the fields of one question after its name: type through audit.
func (it *ReviewItem) appendQuestion(b []byte) []byte {
	b = append(b, `,"type":`...)
	b = appendString(b, string(it.Type))
	b = append(b, `,"instructions":`...)
	b = appendRaw(b, it.Instructions)
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
	for _, f := range []struct {
		key string
		v   *float64
	}{{`,"confidence":`, it.Confidence}, {`,"noul":`, it.Noul}, {`,"score":`, it.Score}} {
		if f.v != nil {
			b = append(b, f.key...)
			b = appendFloat(b, *f.v)
		}
	}
	if it.Choice != "" {
		b = append(b, `,"choice":`...)
		b = appendString(b, it.Choice)
	}
	b = append(b, `,"verdict":`...)
	b = it.Verdict.appendJSON(b)
	b = append(b, `,"mode":`...)
	b = appendString(b, it.Mode)
	if it.Audit {
		b = append(b, `,"audit":true`...)
	}
	return b
}

func appendImageRefs(b []byte, images []ImageRef) []byte {
	b = append(b, `,"images":[`...)
	for i, im := range images {
		if i > 0 {
			b = append(b, ',')
		}
		b = im.appendJSON(b)
	}
	return append(b, ']')
}

// MarshalJSON encodes the run's review message: its fields once, then each item's question
// fields (see ReviewRun).
func (rr ReviewRun) MarshalJSON() ([]byte, error) {
	n := 256 + len(rr.Subject) + len(rr.State) + 96*len(rr.Images)
	for i := range rr.Items {
		n += rr.Items[i].sizeHint() - 256
	}
	return rr.AppendJSON(make([]byte, 0, n)), nil
}

// AppendJSON appends the message's JSON (see MarshalJSON) to b.
func (rr *ReviewRun) AppendJSON(b []byte) []byte {
	b = append(b, `{"run_id":`...)
	b = appendString(b, rr.RunID)
	b = append(b, `,"caller":`...)
	b = appendString(b, rr.Caller)
	if rr.Subject != "" {
		b = append(b, `,"subject":`...)
		b = appendString(b, rr.Subject)
	}
	b = append(b, `,"provider":`...)
	b = appendString(b, rr.Provider)
	b = append(b, `,"model":`...)
	b = appendString(b, rr.Model)
	if len(rr.State) > 0 {
		b = append(b, `,"state":`...)
		b = append(b, rr.State...)
	}
	b = appendImageRefs(b, rr.Images)
	b = append(b, `,"created_at":`...)
	b = appendTime(b, rr.CreatedAt)
	b = append(b, `,"items":[`...)
	for i := range rr.Items {
		it := &rr.Items[i]
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"id":`...)
		b = appendString(b, it.ID)
		b = append(b, `,"question":`...)
		b = appendString(b, it.Question)
		b = it.appendQuestion(b)
		b = append(b, '}')
	}
	return append(b, "]}"...)
}

// UnmarshalJSON reads a review item as sys1 wrote it: types are checked, the order of
// options and probabilities is kept, instructions and state keep their bytes, unknown fields
// are ignored and null leaves a field unset.
func (it *ReviewItem) UnmarshalJSON(data []byte) error {
	d := newLenientDecoder(data)
	var out ReviewItem
	if d.p.kind() != kindObject {
		return fmt.Errorf("contract: decode review item: %w", d.p.fail("expected an object"))
	}
	err := d.p.object(func(key []byte) error { return d.reviewItemField(&out, key) })
	if err == nil {
		err = d.p.end()
	}
	if err != nil {
		return fmt.Errorf("contract: decode review item: %w", err)
	}
	*it = out
	return nil
}

func (d *recordDecoder) reviewItemField(it *ReviewItem, key []byte) error {
	switch string(key) {
	case "id":
		return d.str(&it.ID)
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
	case "question":
		return d.str(&it.Question)
	case "type":
		return d.str((*string)(&it.Type))
	case "instructions", "state":
		if null, err := d.null(); null || err != nil {
			return err
		}
		raw, err := d.raw()
		if string(key) == "state" {
			it.State = raw
		} else {
			it.Instructions = raw
		}
		return err
	case "options":
		if null, err := d.null(); null || err != nil {
			return err
		}
		if d.p.kind() != kindObject {
			return d.p.fail("options must be an object of option key → description")
		}
		it.Options = make([]Option, 0, 4)
		return d.p.object(func([]byte) error {
			o := Option{Key: d.p.keyString()}
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
				return d.p.fail("an option's description must be a string or null")
			}
			it.Options = append(it.Options, o)
			return nil
		})
	case "levels":
		return d.strings(&it.Levels)
	case "probabilities":
		if null, err := d.null(); null || err != nil {
			return err
		}
		return d.probabilities(&it.Probabilities)
	case "confidence":
		return d.floatPtr(&it.Confidence)
	case "noul":
		return d.floatPtr(&it.Noul)
	case "score":
		return d.floatPtr(&it.Score)
	case "choice":
		return d.str(&it.Choice)
	case "verdict":
		if null, err := d.null(); null || err != nil {
			return err
		}
		return d.verdict(&it.Verdict)
	case "mode":
		return d.str(&it.Mode)
	case "audit":
		return d.boolean(&it.Audit)
	case "images":
		if null, err := d.null(); null || err != nil {
			it.Images = nil
			return err
		}
		out := []ImageRef{}
		err := d.p.array(func() error {
			var im ImageRef
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
		it.Images = out
		return err
	case "created_at":
		return d.time(&it.CreatedAt)
	}
	_, _, err := d.p.skip()
	return err
}
