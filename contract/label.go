package contract

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Bounds of a submitted label. A label names one question and one option of a request whose
// text fits in 64 KiB, so two of those plus room for the other fields bound the document; it
// is flat, so nesting past a few levels is refused before anything is parsed.
const (
	MaxLabelBytes = 2*MaxTextBytes + 16<<10
	// MaxLabelMessageBytes is the largest message the label streams take (SYS1_LABELS,
	// SYS1_LABEL_SUBMISSIONS): a label of MaxLabelBytes with its headers, of which a bearer
	// JWT alone may take 16 KiB. JetStream refuses anything larger at publish.
	MaxLabelMessageBytes = MaxLabelBytes + 20<<10
	maxLabelDepth        = 4
	maxLabelIDLen        = 256 // run_id
	maxLabelName         = 256 // reviewer, caller
	maxLabelItemID       = 128
)

// Label statuses: what a label submission's reply says.
const (
	LabelAccepted = "accepted"
	LabelRejected = "rejected"
)

// labelFields are the fields DecodeLabel accepts, for its unknown-field message.
const labelFields = "run_id, question, label, reviewer, labelled_at, source, caller, item"

// DecodeLabel strictly decodes a submitted label (a message on sys1.labels.<caller>). It
// refuses bodies over MaxLabelBytes (SYS1_REQUEST_TOO_LARGE), invalid UTF-8, nesting deeper
// than a label has, duplicate keys, unknown fields and wrong types; run_id, question and label
// are required, label must be a JSON string, true/false or a number (CheckLabel decides which
// the question takes), labelled_at RFC 3339 within 1900–2299, source "review" or "producer".
// The question name is trimmed, as request question names are. Every problem is listed with
// its path in one SYS1_INVALID_INPUT whose Err is the Problems.
//
// The submitter's caller, item and source are only claims: whoever checks the label sets
// Caller from the verified identity and Source from where it came.
func DecodeLabel(data []byte) (*Label, *Error) {
	if len(data) > MaxLabelBytes {
		return nil, Errorf(CodeRequestTooLarge, "label is %d bytes; the limit is %d", len(data), MaxLabelBytes)
	}
	if !utf8.Valid(data) {
		return nil, invalidLabel(Problems{{Path: "body", Message: fmt.Sprintf("invalid UTF-8 at byte %d", firstInvalidUTF8(data))}})
	}
	if !checkDepth(data, maxLabelDepth) {
		return nil, invalidLabel(Problems{{Path: "body", Message: fmt.Sprintf("nesting deeper than %d levels (a label is a flat object)", maxLabelDepth)}})
	}
	text := string(data)
	d := labelDecoder{p: parser{data: []byte(text), text: text, strict: true}}
	l, err := d.decode()
	if err != nil {
		d.probs.add("body", err.Error())
	}
	if len(d.probs.list) > 0 {
		return nil, invalidLabel(capProblems(&d.probs))
	}
	return l, nil
}

func invalidLabel(ps Problems) *Error {
	return Wrap(CodeInvalidInput, ps, "invalid label: %s", ps.Error())
}

type labelDecoder struct {
	p     parser
	probs problemList
}

func (d *labelDecoder) skipQuiet() error {
	strict := d.p.strict
	d.p.strict = false
	_, _, err := d.p.skip()
	d.p.strict = strict
	return err
}

// str reads a string field, or records that it is not one.
func (d *labelDecoder) str(path string) (string, bool, error) {
	if k := d.p.kind(); k != kindString {
		d.probs.add(path, "must be a string, got "+kindName(k))
		return "", false, d.skipQuiet()
	}
	s, err := d.p.str()
	return s, err == nil, err
}

func (d *labelDecoder) decode() (*Label, error) {
	if k := d.p.kind(); k != kindObject {
		if k == kindEnd {
			return nil, d.p.fail("empty body")
		}
		return nil, d.p.fail("a label must be a JSON object")
	}
	l := &Label{}
	var keys keySet
	var hasRun, hasQuestion, hasLabel bool
	err := d.p.object(func(key []byte) error {
		k := d.p.keyString()
		if keys.add(k) {
			d.probs.add(k, "duplicate key")
			return d.skipQuiet()
		}
		switch k {
		case "run_id":
			hasRun = true
			s, ok, err := d.str(k)
			if ok {
				if msg := labelRunIDProblem(s); msg != "" {
					d.probs.add(k, msg)
				}
				l.RunID = s
			}
			return err
		case "question":
			hasQuestion = true
			s, ok, err := d.str(k)
			if ok {
				s = strings.TrimSpace(s)
				switch {
				case s == "":
					d.probs.add(k, "must not be blank")
				case len(s) > MaxTextBytes:
					d.probs.add(k, fmt.Sprintf("is %d bytes; no question name is longer than %d", len(s), MaxTextBytes))
				}
				l.Question = s
			}
			return err
		case "label":
			hasLabel = true
			switch kd := d.p.kind(); kd {
			case kindString, kindTrue, kindFalse, kindNumber, kindNull: // null: "none of these"
				s, e, err := d.p.skip()
				l.Value = rawCopy(d.p.data[s:e])
				return err
			default:
				d.probs.add(k, "must be an option key (a string), true or false, a level index (an integer), or null (none of these), got "+kindName(kd))
				return d.skipQuiet()
			}
		case "reviewer", "caller":
			s, ok, err := d.str(k)
			if ok {
				if msg := nameProblem(s, maxLabelName); msg != "" {
					d.probs.add(k, msg)
				}
				if k == "reviewer" {
					l.Reviewer = s
				} else {
					l.Caller = s
				}
			}
			return err
		case "item":
			s, ok, err := d.str(k)
			if ok {
				if msg := nameProblem(s, maxLabelItemID); msg != "" {
					d.probs.add(k, msg)
				}
				l.Item = s
			}
			return err
		case "source":
			s, ok, err := d.str(k)
			if ok {
				if s != LabelSourceReview && s != LabelSourceProducer {
					d.probs.add(k, fmt.Sprintf("must be %q or %q, got %q", LabelSourceReview, LabelSourceProducer, clip(s, 64)))
				}
				l.Source = s
			}
			return err
		case "labelled_at":
			s, ok, err := d.str(k)
			if ok {
				t, perr := time.Parse(time.RFC3339Nano, s)
				switch {
				case perr != nil:
					d.probs.add(k, fmt.Sprintf("must be an RFC 3339 time, got %q", clip(s, 64)))
				case t.UTC().Year() < 1900 || t.UTC().Year() > 2299:
					d.probs.add(k, fmt.Sprintf("must lie between 1900 and 2299, got %s", t.UTC().Format(time.RFC3339)))
				default:
					l.LabelledAt = t
				}
			}
			return err
		default:
			d.probs.add(k, "unknown field (allowed: "+labelFields+")")
			return d.skipQuiet()
		}
	})
	if err != nil {
		return nil, err
	}
	if err := d.p.end(); err != nil {
		return nil, err
	}
	for _, f := range []struct {
		name string
		seen bool
	}{{"run_id", hasRun}, {"question", hasQuestion}, {"label", hasLabel}} {
		if !f.seen {
			d.probs.add(f.name, "required")
		}
	}
	return l, nil
}

// labelRunIDProblem checks a run id a label names: the ids SPEC §3 allows (1–128 of
// A-Za-z0-9._:-) and the ids a worker derives (<stream>~<seq>~<epoch>).
func labelRunIDProblem(id string) string {
	if id == "" {
		return "must not be empty"
	}
	if len(id) > maxLabelIDLen {
		return fmt.Sprintf("is %d bytes; run ids are at most %d", len(id), maxLabelIDLen)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("._:-~", c) >= 0) {
			return fmt.Sprintf("byte %d is %q; a run id holds only A-Za-z0-9._:- (and ~ in derived ids)", i, c)
		}
	}
	return ""
}

// nameProblem bounds a name that ends up in logs and on a web page: no control characters.
func nameProblem(s string, max int) string {
	if len(s) > max {
		return fmt.Sprintf("is %d bytes; the limit is %d", len(s), max)
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) || r == '\u2028' || r == '\u2029' {
			return "must not hold control characters"
		}
	}
	return ""
}

// CheckLabel checks a label value against the answer it labels and returns its canonical
// text form, which is what sys1.labels stores: null is "none of these" for any question and
// reads as the empty text; a choice label is a JSON string naming one of
// the answer's options (its probabilities' keys) and reads as that key; a noul label is true
// or false and reads "true" or "false"; a score label is an integer level index within the
// answer's levels (0 … N−1) and reads as that index in decimal. Anything else is a
// SYS1_INVALID_INPUT naming what the question accepts.
func CheckLabel(answer Answer, value json.RawMessage) (string, *Error) {
	bad := func(format string, args ...any) (string, *Error) {
		return "", invalidLabel(Problems{{Path: "label", Message: fmt.Sprintf(format, args...)}})
	}
	raw := bytes.TrimSpace(value)
	if len(raw) == 0 {
		return bad("required")
	}
	if string(raw) == "null" {
		// "None of these": the truth is none of the options or levels (a reviewer's answer
		// too). Its canonical text is empty, so it is never counted correct.
		return "", nil
	}
	p := parser{data: raw}
	kind := p.kind()
	switch answer.Type {
	case TypeChoice:
		keys := make([]string, len(answer.Probabilities))
		for i, pr := range answer.Probabilities {
			keys[i] = pr.Key
		}
		if len(keys) == 0 {
			return bad("the answer lists no options to check the label against")
		}
		if kind != kindString {
			return bad("a choice question takes an option key as a JSON string (%s), got %s", listKeys(keys), kindName(kind))
		}
		s, err := p.str()
		if err != nil || p.end() != nil {
			return bad("not a single JSON string")
		}
		if !contains(keys, s) {
			return bad("%q is not one of the options (%s)", clip(s, maxProblemPath), listKeys(keys))
		}
		return s, nil
	case TypeNoul:
		switch {
		case string(raw) == "true":
			return "true", nil
		case string(raw) == "false":
			return "false", nil
		}
		return bad("a noul question takes true or false, got %s", kindName(kind))
	case TypeScore:
		n := len(answer.Probabilities)
		if n == 0 {
			n = len(answer.Legend)
		}
		if n == 0 {
			return bad("the answer lists no levels to check the label against")
		}
		if kind != kindNumber {
			return bad("a score question takes a level index, an integer in [0, %d], got %s", n-1, kindName(kind))
		}
		f, err := p.float()
		if err != nil || p.end() != nil {
			return bad("not a single JSON number")
		}
		if f != math.Trunc(f) || f < 0 || f > float64(n-1) {
			return bad("a score question takes a level index, an integer in [0, %d], got %s", n-1, clip(string(raw), 64))
		}
		return strconv.Itoa(int(f)), nil
	}
	return bad("a %q question cannot be labelled", clip(string(answer.Type), 64))
}

func listKeys(keys []string) string {
	var sb strings.Builder
	for i, k := range keys {
		if i > 0 {
			sb.WriteString(", ")
		}
		if sb.Len() > maxProblemMessage/2 {
			fmt.Fprintf(&sb, "… %d more", len(keys)-i)
			break
		}
		sb.WriteString(clip(k, 64))
	}
	return sb.String()
}

// LabelText is the canonical text of a label value that was already checked (what CheckLabel
// returned): a JSON string's text, "true" or "false", an integer in decimal. ok is false for
// anything else.
func LabelText(value json.RawMessage) (text string, ok bool) {
	raw := bytes.TrimSpace(value)
	p := parser{data: raw}
	switch p.kind() {
	case kindNull:
		return "", string(raw) == "null" // none of these
	case kindString:
		s, err := p.str()
		if err != nil || p.end() != nil {
			return "", false
		}
		return s, true
	case kindTrue, kindFalse:
		if string(raw) == "true" || string(raw) == "false" {
			return string(raw), true
		}
	case kindNumber:
		f, err := p.float()
		if err != nil || p.end() != nil || f != math.Trunc(f) || math.Abs(f) > 1<<53 {
			return "", false
		}
		return strconv.FormatInt(int64(f), 10), true
	}
	return "", false
}

// MarshalJSON encodes the label in field order; labelled_at is left out while unset, source,
// caller and item while empty.
func (l Label) MarshalJSON() ([]byte, error) {
	return l.AppendJSON(make([]byte, 0, 128+len(l.Question)+len(l.Value))), nil
}

// AppendJSON appends the label's JSON (see MarshalJSON) to b.
func (l *Label) AppendJSON(b []byte) []byte {
	b = append(b, `{"run_id":`...)
	b = appendString(b, l.RunID)
	b = append(b, `,"question":`...)
	b = appendString(b, l.Question)
	b = append(b, `,"label":`...)
	b = appendCompact(b, l.Value)
	b = append(b, `,"reviewer":`...)
	b = appendString(b, l.Reviewer)
	if !l.LabelledAt.IsZero() {
		b = append(b, `,"labelled_at":`...)
		b = appendTime(b, l.LabelledAt)
	}
	if l.Source != "" {
		b = append(b, `,"source":`...)
		b = appendString(b, l.Source)
	}
	if l.Caller != "" {
		b = append(b, `,"caller":`...)
		b = appendString(b, l.Caller)
	}
	if l.Item != "" {
		b = append(b, `,"item":`...)
		b = appendString(b, l.Item)
	}
	return append(b, '}')
}

// LabelReply answers a label submission on its Sys1-Reply-To subject.
type LabelReply struct {
	RunID    string `json:"run_id"`
	Question string `json:"question"`
	// Status is accepted or rejected.
	Status string `json:"status"`
	// Label is the stored label value (canonical JSON) when accepted; null when rejected.
	Label json.RawMessage `json:"label"`
	// Error says why a label was rejected (every problem with its path); null when accepted.
	Error *Error `json:"error"`
}

// MarshalJSON encodes the reply in field order.
func (r LabelReply) MarshalJSON() ([]byte, error) {
	b := make([]byte, 0, 128+len(r.Question))
	b = append(b, `{"run_id":`...)
	b = appendString(b, r.RunID)
	b = append(b, `,"question":`...)
	b = appendString(b, r.Question)
	b = append(b, `,"status":`...)
	b = appendString(b, r.Status)
	b = append(b, `,"label":`...)
	b = appendCompact(b, r.Label)
	b = append(b, `,"error":`...)
	if r.Error != nil {
		b = r.Error.appendJSON(b)
	} else {
		b = append(b, "null"...)
	}
	return append(b, '}'), nil
}

// LabelRejection is a submitted label that failed its check, published on
// sys1.labels.<caller>.rejected; the sink parks it in the dead-letter table with its reason.
// The submission itself leaves SYS1_LABEL_SUBMISSIONS once checked; this is what is kept.
type LabelRejection struct {
	// Caller is the verified submitter; empty when the submitter could not be verified.
	Caller string `json:"caller"`
	// Subject and Seq are where the submission was (SYS1_LABEL_SUBMISSIONS).
	Subject string `json:"subject"`
	Seq     uint64 `json:"seq"`
	// Submission is the submitted body (white space outside strings removed) when it was
	// valid JSON in UTF-8 of at most MaxLabelBytes; null otherwise (Bytes and SHA256 still
	// identify it).
	Submission json.RawMessage `json:"submission"`
	Bytes      int             `json:"bytes"`
	SHA256     string          `json:"sha256"`
	// Error is why: its code, and a message naming every problem with its path.
	Error      *Error    `json:"error"`
	RejectedAt time.Time `json:"rejected_at"`
}

// NewLabelRejection describes a refused submission body.
func NewLabelRejection(body []byte, caller, subject string, seq uint64, cause *Error, at time.Time) LabelRejection {
	sum := sha256.Sum256(body)
	r := LabelRejection{
		Caller: caller, Subject: subject, Seq: seq, Bytes: len(body), SHA256: hex.EncodeToString(sum[:]),
		Error: cause, RejectedAt: at.UTC(),
	}
	if len(body) <= MaxLabelBytes && utf8.Valid(body) && json.Valid(body) {
		r.Submission = bytes.Clone(body)
	}
	if r.Error == nil {
		r.Error = Errorf(CodeInvalidInput, "label rejected")
	}
	return r
}

// Reason is the rejection's message, for the dead-letter table.
func (r *LabelRejection) Reason() string {
	if r.Error == nil || r.Error.Message == "" {
		return "label rejected (no reason given)"
	}
	return r.Error.Message
}

// MarshalJSON encodes the rejection in field order.
func (r LabelRejection) MarshalJSON() ([]byte, error) {
	b := make([]byte, 0, 256+len(r.Submission))
	b = append(b, `{"caller":`...)
	b = appendString(b, r.Caller)
	b = append(b, `,"subject":`...)
	b = appendString(b, r.Subject)
	b = append(b, `,"seq":`...)
	b = strconv.AppendUint(b, r.Seq, 10)
	b = append(b, `,"submission":`...)
	b = appendCompact(b, r.Submission)
	b = append(b, `,"bytes":`...)
	b = strconv.AppendInt(b, int64(r.Bytes), 10)
	b = append(b, `,"sha256":`...)
	b = appendString(b, r.SHA256)
	b = append(b, `,"error":`...)
	if r.Error != nil {
		b = r.Error.appendJSON(b)
	} else {
		b = append(b, "null"...)
	}
	b = append(b, `,"rejected_at":`...)
	b = appendTime(b, r.RejectedAt)
	return append(b, '}'), nil
}
