package contract

import (
	"fmt"
	"strconv"
	"strings"
)

// MarshalJSON encodes the request in wire order: model, state, questions, images, keep_alive.
// Empty model, images and keep_alive are omitted; state and instructions are written byte for
// byte; redacted images are written as {"sha256": hex, "bytes": n}.
func (r *Request) MarshalJSON() ([]byte, error) {
	return r.AppendJSON(make([]byte, 0, r.sizeHint())), nil
}

// AppendJSON appends the request's JSON (see MarshalJSON) to b.
func (r *Request) AppendJSON(b []byte) []byte {
	b = r.appendText(b, false)
	if len(r.Images) > 0 {
		b = append(b, `,"images":[`...)
		for i := range r.Images {
			if i > 0 {
				b = append(b, ',')
			}
			b = r.Images[i].appendJSON(b)
		}
		b = append(b, ']')
	}
	if len(r.KeepAlive) > 0 {
		b = append(b, `,"keep_alive":`...)
		b = append(b, r.KeepAlive...)
	}
	return append(b, '}')
}

// appendText appends everything but images and keep_alive, leaving the object open. With
// closed it also closes the object (the "text part" whose size Resolve bounds).
func (r *Request) appendText(b []byte, closed bool) []byte {
	b = append(b, '{')
	if r.Model != "" {
		b = append(b, `"model":`...)
		b = appendString(b, r.Model)
		b = append(b, ',')
	}
	b = append(b, `"state":`...)
	b = appendRaw(b, r.State)
	b = append(b, `,"questions":{`...)
	for i := range r.Questions {
		if i > 0 {
			b = append(b, ',')
		}
		q := &r.Questions[i]
		b = appendString(b, q.Name)
		b = append(b, ':')
		b = q.appendJSON(b)
	}
	b = append(b, '}')
	if closed {
		b = append(b, '}')
	}
	return b
}

// sizeHint estimates the encoded size so MarshalJSON allocates once.
func (r *Request) sizeHint() int {
	n := 64 + len(r.Model) + len(r.State) + len(r.KeepAlive)
	for i := range r.Questions {
		q := &r.Questions[i]
		n += 64 + len(q.Name) + len(q.Instructions)
		for _, o := range q.Options {
			n += 8 + len(o.Key)
			if o.Description != nil {
				n += len(*o.Description)
			}
		}
		for _, l := range q.Levels {
			n += 4 + len(l)
		}
	}
	for _, im := range r.Images {
		n += 96 + len(im.Data)
	}
	return n
}

func (q *Question) appendJSON(b []byte) []byte {
	b = append(b, `{"type":`...)
	b = appendString(b, string(q.Type))
	b = append(b, `,"instructions":`...)
	b = appendRaw(b, q.Instructions)
	switch {
	case q.Type == TypeScore || len(q.Levels) > 0:
		b = append(b, `,"criteria":[`...)
		for i, l := range q.Levels {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, l)
		}
		b = append(b, ']')
	case q.Type == TypeChoice || q.HasCriteria || len(q.Options) > 0:
		b = append(b, `,"criteria":{`...)
		for i, o := range q.Options {
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
	return append(b, '}')
}

// appendJSON writes the image's base64 string, or its reference object when redacted.
func (im *Image) appendJSON(b []byte) []byte {
	if im.Data != "" {
		// Base64 never needs escaping; appendString still guards Go-built values.
		return appendString(b, im.Data)
	}
	return im.Ref().appendJSON(b)
}

func (r ImageRef) appendJSON(b []byte) []byte {
	b = append(b, `{"sha256":`...)
	b = appendString(b, r.SHA256)
	b = append(b, `,"bytes":`...)
	b = strconv.AppendInt(b, int64(r.Bytes), 10)
	return append(b, '}')
}

// UnmarshalJSON reads a request structurally and leniently: key order is kept, but nothing
// is validated, unknown fields are ignored, keep_alive is kept and redacted image objects are
// accepted. It is how stored run records are read back; untrusted bodies go through
// DecodeRequest instead.
func (r *Request) UnmarshalJSON(b []byte) error {
	// Strings are sliced from one copy of b: encoding/json reuses its buffer after we return.
	d := requestDecoder{p: parser{data: b, text: string(b)}}
	req, err := d.decode()
	if err != nil {
		return fmt.Errorf("contract: decode request: %w", err)
	}
	if len(d.probs.list) > 0 {
		return fmt.Errorf("contract: decode request: %w", d.probs.list)
	}
	*r = *req
	return nil
}

// requestDecoder reads a request, strictly (DecodeRequest) or leniently (UnmarshalJSON).
// Strict mode records every problem it can see while reading; problems that need the whole
// request (counts, uniqueness, images) are left to validateRequest, which skips whatever the
// reader already reported so each problem is listed once.
type requestDecoder struct {
	p      parser
	strict bool
	probs  problemList
	seen   reported
	descs  []string
	// extraCriteria counts the current question's options or levels past the limit.
	extraCriteria int
}

// reported tracks what the reader already found wrong or missing.
type reported struct {
	state, questions bool
	q                []questionReported
	images           []bool
	// Items past a limit are counted, not kept: a 32 MiB body of tiny questions, options or
	// images must not turn into gigabytes of structs. Validation reports the full count.
	extraQuestions, extraImages int
}

type questionReported struct {
	typ, instructions, criteria bool
	extraCriteria               int // options or levels past the limit, counted only
}

// Top-level fields, as bits for duplicate detection.
const (
	fieldModel = 1 << iota
	fieldState
	fieldQuestions
	fieldImages
	fieldKeepAlive
)

// take records that a field was seen, reporting a duplicate in strict mode.
func (d *requestDecoder) take(seen *int, bit int, path string) {
	if *seen&bit != 0 && d.strict {
		d.probs.add(path, "duplicate key")
	}
	*seen |= bit
}

// qpath names a question in problem paths; it is only rendered when there is a problem, so
// a valid request builds no path strings.
type qpath struct{ name, raw string }

// at returns "questions.<name>" + suffix (the raw key, quoted, when the name is blank).
func (q qpath) at(suffix string) string {
	return "questions." + q.display() + suffix
}

// display is the question's name in paths: the raw key, quoted, when the name is blank.
func (q qpath) display() string {
	if q.name == "" {
		return strconv.Quote(q.raw)
	}
	return q.name
}

// skipRaw skips a value at the path made of segs, collecting duplicate keys inside it
// (strict), and returns a copy of its bytes.
func (d *requestDecoder) skipRaw(segs ...string) ([]byte, error) {
	d.p.path = d.p.path[:0]
	for _, seg := range segs {
		d.p.path = append(d.p.path, pathSeg{key: seg, index: -1})
	}
	s, e, err := d.p.skip()
	d.p.path = d.p.path[:0]
	d.flushDupes()
	if err != nil {
		return nil, err
	}
	return rawCopy(d.p.data[s:e]), nil
}

func (d *requestDecoder) flushDupes() { d.probs.take(&d.p) }

// skipQuiet skips a value without collecting duplicates (they are reported elsewhere or the
// value is dropped).
func (d *requestDecoder) skipQuiet() error {
	strict := d.p.strict
	d.p.strict = false
	_, _, err := d.p.skip()
	d.p.strict = strict
	return err
}

// description returns a stable pointer to s from a slab, so option descriptions cost one
// allocation per 32 instead of one each. Slabs are never grown, so pointers stay valid.
func (d *requestDecoder) description(s string) *string {
	if len(d.descs) == cap(d.descs) {
		d.descs = make([]string, 0, 32)
	}
	d.descs = append(d.descs, s)
	return &d.descs[len(d.descs)-1]
}

func (d *requestDecoder) decode() (*Request, error) {
	d.p.strict = d.strict
	req := &Request{}
	if k := d.p.kind(); k != kindObject {
		if k == kindEnd {
			return nil, d.p.fail("empty body")
		}
		return nil, d.p.fail("the request must be a JSON object")
	}
	seen := 0
	err := d.p.object(func(key []byte) error {
		switch string(key) {
		case "model":
			d.take(&seen, fieldModel, "model")
			switch k := d.p.kind(); k {
			case kindString:
				s, err := d.p.str()
				if err != nil {
					return err
				}
				req.Model = strings.TrimSpace(s)
				if req.Model == "" && d.strict {
					d.probs.add("model", "must not be blank (omit it to use the server's default model)")
				}
				return nil
			case kindNull:
				return d.skipQuiet()
			default:
				if d.strict {
					d.probs.add("model", "must be a string, got "+kindName(k))
				}
				return d.skipQuiet()
			}
		case "state":
			d.take(&seen, fieldState, "state")
			raw, err := d.skipRaw("state")
			req.State = raw
			return err
		case "questions":
			d.take(&seen, fieldQuestions, "questions")
			return d.questions(req)
		case "images":
			d.take(&seen, fieldImages, "images")
			return d.images(req)
		case "keep_alive":
			d.take(&seen, fieldKeepAlive, "keep_alive")
			if d.strict {
				// Accepted for compatibility with Ollama clients and dropped: keep_alive is
				// server policy (SYS1_KEEP_ALIVE), never the caller's choice.
				_, err := d.skipRaw("keep_alive")
				return err
			}
			raw, err := d.skipRaw("keep_alive")
			req.KeepAlive = raw
			return err
		default:
			if d.strict {
				d.probs.add(string(key), "unknown field (allowed: model, state, questions, images, keep_alive)")
			}
			return d.skipQuiet()
		}
	})
	if err != nil {
		return nil, err
	}
	if err := d.p.end(); err != nil {
		return nil, err
	}
	if d.strict {
		if seen&fieldState == 0 {
			d.probs.add("state", "required")
			d.seen.state = true
		}
		if seen&fieldQuestions == 0 {
			d.probs.add("questions", "required")
			d.seen.questions = true
		}
	}
	return req, nil
}

func (d *requestDecoder) questions(req *Request) error {
	if k := d.p.kind(); k != kindObject {
		if d.strict {
			d.probs.add("questions", "must be an object of named questions, got "+kindName(k))
		}
		d.seen.questions = true
		return d.skipQuiet()
	}
	// Raw keys seen so far; questions are few (≤ 64 valid), so a linear scan is cheapest.
	var rawKeys []string
	return d.p.object(func(key []byte) error {
		if d.strict && len(req.Questions) >= MaxQuestions {
			d.seen.extraQuestions++
			return d.skipQuiet()
		}
		rawKey := d.p.keyString()
		for _, k := range rawKeys {
			if k == rawKey {
				if d.strict {
					d.probs.add("questions", fmt.Sprintf("duplicate key %q", rawKey))
				}
				return d.skipQuiet()
			}
		}
		if rawKeys == nil {
			rawKeys = make([]string, 0, 16)
			req.Questions = make([]Question, 0, 8)
		}
		rawKeys = append(rawKeys, rawKey)
		name := strings.TrimSpace(rawKey)
		q, rep, err := d.question(name, qpath{name, rawKey})
		if err != nil {
			return err
		}
		rep.extraCriteria = d.extraCriteria
		req.Questions = append(req.Questions, q)
		d.seen.q = append(d.seen.q, rep)
		return nil
	})
}

// question reads one question object.
func (d *requestDecoder) question(name string, path qpath) (Question, questionReported, error) {
	q := Question{Name: name}
	var rep questionReported
	d.extraCriteria = 0
	if k := d.p.kind(); k != kindObject {
		if d.strict {
			d.probs.add(path.at(""), "must be an object with type, instructions and criteria, got "+kindName(k))
		}
		return q, questionReported{typ: true, instructions: true, criteria: true}, d.skipQuiet()
	}
	const (
		fType = 1 << iota
		fInstructions
		fCriteria
	)
	seen := 0
	typeKnown := false
	critStart, critDone := -1, false
	err := d.p.object(func(key []byte) error {
		switch string(key) {
		case "type":
			if seen&fType != 0 && d.strict {
				d.probs.add(path.at(".type"), "duplicate key")
			}
			seen |= fType
			if k := d.p.kind(); k != kindString {
				if d.strict {
					d.probs.add(path.at(".type"), "must be one of choice, noul, score, got "+kindName(k))
				}
				rep.typ = true
				return d.skipQuiet()
			}
			s, err := d.p.str()
			if err != nil {
				return err
			}
			q.Type = QuestionType(s)
			typeKnown = true
			return nil
		case "instructions":
			if seen&fInstructions != 0 && d.strict {
				d.probs.add(path.at(".instructions"), "duplicate key")
			}
			seen |= fInstructions
			raw, err := d.skipRaw("questions", path.display(), "instructions")
			q.Instructions = raw
			return err
		case "criteria":
			if seen&fCriteria != 0 && d.strict {
				d.probs.add(path.at(".criteria"), "duplicate key")
			}
			seen |= fCriteria
			if typeKnown || !d.strict {
				critDone = true
				return d.criteria(&q, &rep, path, typeKnown)
			}
			// The type comes later in this object: read the criteria once it is known.
			critStart = d.p.pos
			return d.skipQuiet()
		default:
			if d.strict {
				d.probs.add(path.at("."+string(key)), "unknown field (allowed: type, instructions, criteria)")
			}
			return d.skipQuiet()
		}
	})
	if err != nil {
		return q, rep, err
	}
	if critStart >= 0 && !critDone {
		end := d.p.pos
		depth := d.p.depth
		d.p.pos = critStart
		d.p.depth = depth + 1 // inside the question object
		err := d.criteria(&q, &rep, path, typeKnown)
		d.p.pos, d.p.depth = end, depth
		if err != nil {
			return q, rep, err
		}
	}
	if d.strict {
		if seen&fType == 0 {
			d.probs.add(path.at(".type"), "required (one of choice, noul, score)")
			rep.typ = true
		}
		if seen&fInstructions == 0 {
			d.probs.add(path.at(".instructions"), "required")
			rep.instructions = true
		}
		if seen&fCriteria == 0 && (q.Type == TypeChoice || q.Type == TypeScore) {
			d.probs.add(path.at(".criteria"), "required for a "+string(q.Type)+" question")
			rep.criteria = true
		}
	}
	return q, rep, nil
}

// criteria reads a question's criteria according to its type. In lenient mode, or when the
// type is unknown, the shape decides: an object holds options, an array holds levels.
func (d *requestDecoder) criteria(q *Question, rep *questionReported, qp qpath, typeKnown bool) error {
	k := d.p.kind()
	typ := q.Type
	if !d.strict || !typeKnown || (typ != TypeChoice && typ != TypeNoul && typ != TypeScore) {
		if d.strict {
			// The type is wrong or missing and reported as such; criteria cannot be judged.
			rep.criteria = true
			return d.skipQuiet()
		}
		switch k {
		case kindObject:
			q.HasCriteria = true
			return d.options(q, qp, false)
		case kindArray:
			return d.levels(q, qp)
		}
		return d.skipQuiet()
	}
	switch typ {
	case TypeChoice:
		if k != kindObject {
			d.probs.add(qp.at(".criteria"), "must be an object mapping option keys to descriptions (a string or null), got "+kindName(k))
			rep.criteria = true
			return d.skipQuiet()
		}
		return d.options(q, qp, false)
	case TypeNoul:
		if k == kindNull {
			return d.skipQuiet()
		}
		if k != kindObject {
			d.probs.add(qp.at(".criteria"), `must be an object with optional "true" and "false" descriptions, got `+kindName(k))
			rep.criteria = true
			return d.skipQuiet()
		}
		q.HasCriteria = true
		return d.options(q, qp, true)
	default: // TypeScore
		if k != kindArray {
			d.probs.add(qp.at(".criteria"), "must be an array of 2–26 level descriptions, got "+kindName(k))
			rep.criteria = true
			return d.skipQuiet()
		}
		return d.levels(q, qp)
	}
}

// options reads an object of option key → description. noul restricts keys to "true" and
// "false" with string values.
func (d *requestDecoder) options(q *Question, qp qpath, noul bool) error {
	var small [8]string
	rawKeys := small[:0]
	return d.p.object(func(key []byte) error {
		if d.strict && len(q.Options) >= MaxOptions {
			d.extraCriteria++
			return d.skipQuiet()
		}
		rawKey := d.p.keyString()
		for _, k := range rawKeys {
			if k == rawKey {
				if d.strict {
					d.probs.add(qp.at(".criteria"), fmt.Sprintf("duplicate key %q", rawKey))
				}
				return d.skipQuiet()
			}
		}
		if q.Options == nil {
			q.Options = make([]Option, 0, 4)
		}
		rawKeys = append(rawKeys, rawKey)
		opt := Option{Key: strings.TrimSpace(rawKey)}
		if noul && d.strict && rawKey != "true" && rawKey != "false" {
			d.probs.add(qp.at(".criteria."+rawKey), `unknown key; a noul question's criteria may only hold "true" and "false"`)
			return d.skipQuiet()
		}
		switch k := d.p.kind(); {
		case k == kindString:
			s, err := d.p.str()
			if err != nil {
				return err
			}
			opt.Description = d.description(s)
		case k == kindNull && !noul:
			if err := d.p.literal("null"); err != nil {
				return err
			}
		default:
			if d.strict {
				want := "must be a string or null, got "
				if noul {
					want = "must be a string, got "
				}
				d.probs.add(qp.at(".criteria."+rawKey), want+kindName(k))
			}
			if noul && d.strict {
				return d.skipQuiet() // reported; validation must not see it again
			}
			if err := d.skipQuiet(); err != nil {
				return err
			}
		}
		q.Options = append(q.Options, opt)
		return nil
	})
}

func (d *requestDecoder) levels(q *Question, qp qpath) error {
	q.Levels = make([]string, 0, 8)
	i := 0
	return d.p.array(func() error {
		defer func() { i++ }()
		if d.strict && len(q.Levels) >= MaxLevels {
			d.extraCriteria++
			return d.skipQuiet()
		}
		if k := d.p.kind(); k != kindString {
			if d.strict {
				d.probs.add(fmt.Sprintf("%s[%d]", qp.at(".criteria"), i), "must be a string, got "+kindName(k))
			}
			q.Levels = append(q.Levels, "")
			return d.skipQuiet()
		}
		s, err := d.p.str()
		if err != nil {
			return err
		}
		q.Levels = append(q.Levels, s)
		return nil
	})
}

func (d *requestDecoder) images(req *Request) error {
	k := d.p.kind()
	if k == kindNull {
		return d.skipQuiet()
	}
	if k != kindArray {
		if d.strict {
			d.probs.add("images", "must be an array of base64 strings, got "+kindName(k))
		}
		return d.skipQuiet()
	}
	i := 0
	return d.p.array(func() error {
		defer func() { i++ }()
		if d.strict && len(req.Images) >= MaxImages {
			d.seen.extraImages++
			return d.skipQuiet()
		}
		switch k := d.p.kind(); {
		case k == kindString:
			s, err := d.p.str()
			if err != nil {
				return err
			}
			req.Images = append(req.Images, Image{Data: s})
			d.seen.images = append(d.seen.images, false)
			return nil
		case k == kindObject && !d.strict:
			ref, err := d.imageRef()
			req.Images = append(req.Images, Image{SHA256: ref.SHA256, Bytes: ref.Bytes})
			return err
		default:
			if d.strict {
				d.probs.add(fmt.Sprintf("images[%d]", i), "must be a base64 string, got "+kindName(k))
			}
			req.Images = append(req.Images, Image{})
			d.seen.images = append(d.seen.images, true)
			return d.skipQuiet()
		}
	})
}

// imageRef reads a redacted image {"sha256": hex, "bytes": n} (lenient mode only).
func (d *requestDecoder) imageRef() (ImageRef, error) {
	var ref ImageRef
	err := d.p.object(func(key []byte) error {
		switch string(key) {
		case "sha256":
			if d.p.kind() == kindString {
				s, err := d.p.str()
				ref.SHA256 = s
				return err
			}
		case "bytes":
			if d.p.kind() == kindNumber {
				f, err := d.p.float()
				ref.Bytes = int(f)
				return err
			}
		}
		return d.skipQuiet()
	})
	return ref, err
}
