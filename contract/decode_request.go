package contract

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"
)

// Limits of the contract (SPEC §5, mirroring Ollama's decision package).
const (
	MinQuestions = 1
	MaxQuestions = 64
	MinOptions   = 2
	MaxOptions   = 26
	MinLevels    = 2
	MaxLevels    = 26
	// MaxImages bounds the images of one request. Upstream sets no count, but every image
	// costs hundreds of context tokens, and an unbounded count lets a 32 MiB body of tiny
	// images cost far more memory than its size.
	MaxImages = 64

	// MaxTextBytes bounds the serialized request without images (Ollama's 64 KiB).
	MaxTextBytes = 65536
	// MaxImageRequestBytes bounds the serialized request with images.
	MaxImageRequestBytes = 32 << 20
	// MaxBodyBytes is the largest body DecodeRequest reads at all: the image limit plus slack
	// for white space and a caller's keep_alive, which Resolve replaces.
	MaxBodyBytes = MaxImageRequestBytes + 1<<20
)

// maxListedProblems caps the problems spelled out in one message; a hostile body can hold
// thousands and the message travels in replies and records.
const maxListedProblems = 100

// DecodeRequest strictly decodes and validates an untrusted request body. It rejects invalid
// UTF-8, nesting deeper than MaxDepth (found by a scan that allocates nothing, before any
// parsing), duplicate keys at any depth, unknown fields (keep_alive is accepted and dropped),
// wrong types and every rule of the contract. The SYS1_INVALID_INPUT it returns lists every
// problem with its path; its Err is the Problems. Each image is checked and gets its SHA256
// and Bytes filled in, so nothing downstream decodes it again.
func DecodeRequest(body []byte) (*Request, *Error) {
	if len(body) > MaxBodyBytes {
		return nil, Errorf(CodeRequestTooLarge, "request body is %d bytes; the limit is %d bytes with images and %d without",
			len(body), MaxImageRequestBytes, MaxTextBytes)
	}
	if !utf8.Valid(body) {
		return nil, invalidInput(Problems{{Path: "body", Message: fmt.Sprintf("invalid UTF-8 at byte %d", firstInvalidUTF8(body))}})
	}
	if !checkDepth(body, MaxDepth) {
		return nil, invalidInput(Problems{{Path: "body", Message: fmt.Sprintf("nesting deeper than %d levels", MaxDepth)}})
	}
	// One string copy of the body backs every name, key, description and image; raw values
	// (state, instructions) get their own copies. The caller may reuse body afterwards.
	d := requestDecoder{p: parser{data: body, text: string(body)}, strict: true}
	req, err := d.decode()
	if err != nil {
		d.probs.add("body", err.Error())
		return nil, invalidInput(capProblems(&d.probs))
	}
	validateRequest(req, &d.seen, &d.probs)
	if len(d.probs.list) > 0 {
		return nil, invalidInput(capProblems(&d.probs))
	}
	return req, nil
}

func firstInvalidUTF8(b []byte) int {
	for i := 0; i < len(b); {
		r, size := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && size == 1 {
			return i
		}
		i += size
	}
	return len(b)
}

func capProblems(l *problemList) Problems {
	if len(l.list) <= maxListedProblems && l.dropped == 0 {
		return l.list
	}
	n := min(len(l.list), maxListedProblems)
	out := append(Problems(nil), l.list[:n]...)
	return append(out, Problem{Message: fmt.Sprintf("… and %d more problems", len(l.list)-n+l.dropped)})
}

// Validate checks a request built in Go against the contract (DecodeRequest already does
// this for bodies) and fills in each image's SHA256 and Bytes. It returns Problems, or nil.
func (r *Request) Validate() error {
	var probs problemList
	if r.Model != strings.TrimSpace(r.Model) {
		probs.add("model", "must be trimmed")
	}
	// Raw values built in Go were never parsed: MarshalJSON copies them byte for byte, so one
	// that is not a single JSON value would make the whole request invalid JSON (and the
	// content checks assume a parsed value).
	rep := reported{q: make([]questionReported, len(r.Questions))}
	if msg := rawProblem(r.State); msg != "" {
		probs.add("state", msg)
		rep.state = true
	}
	for i := range r.Questions {
		if msg := rawProblem(r.Questions[i].Instructions); msg != "" {
			probs.add(qpath{name: r.Questions[i].Name, raw: r.Questions[i].Name}.at(".instructions"), msg)
			rep.q[i].instructions = true
		}
	}
	validateRequest(r, &rep, &probs)
	if len(probs.list) > 0 {
		return probs.list
	}
	return nil
}

// validateRequest checks the rules that need the whole request; rep says what the reader has
// already reported, so no problem is listed twice.
func validateRequest(req *Request, rep *reported, probs *problemList) {
	if !rep.state {
		if msg := contentProblem(req.State); msg != "" {
			probs.add("state", msg)
		}
	}
	if n := len(req.Questions) + rep.extraQuestions; !rep.questions && (n < MinQuestions || n > MaxQuestions) {
		probs.add("questions", fmt.Sprintf("must have %d–%d questions, got %d", MinQuestions, MaxQuestions, n))
	}
	if n := len(req.Images) + rep.extraImages; n > MaxImages {
		probs.add("images", fmt.Sprintf("must have at most %d images, got %d", MaxImages, n))
	}
	for i := range req.Questions {
		q := &req.Questions[i]
		var qr questionReported
		if i < len(rep.q) {
			qr = rep.q[i]
		}
		qp := qpath{name: q.Name, raw: q.Name}
		if q.Name == "" {
			probs.add("questions", "question name must not be blank")
		} else {
			// Questions are at most 64 here (more is already a problem): a scan beats a map.
			for _, prev := range req.Questions[:i] {
				if prev.Name == q.Name {
					probs.add(qp.at(""), "duplicate question name (names are compared after trimming)")
					break
				}
			}
		}
		if !qr.typ && q.Type != TypeChoice && q.Type != TypeNoul && q.Type != TypeScore {
			probs.add(qp.at(".type"), fmt.Sprintf("must be one of choice, noul, score, got %q", q.Type))
			qr.criteria = true
		}
		if !qr.instructions {
			if msg := contentProblem(q.Instructions); msg != "" {
				probs.add(qp.at(".instructions"), msg)
			}
		}
		if !qr.criteria {
			validateCriteria(q, qp, qr.extraCriteria, probs)
		}
	}
	for i := range req.Images {
		if i < len(rep.images) && rep.images[i] {
			continue
		}
		if err := req.Images[i].check(); err != "" {
			probs.add(fmt.Sprintf("images[%d]", i), err)
		}
	}
}

// rawProblem checks that a raw value built in Go is one JSON value in valid UTF-8, without
// duplicate keys or nesting past MaxDepth, and returns what is wrong, or "". An empty value is
// left to contentProblem ("required").
func rawProblem(raw []byte) string {
	if len(bytes.TrimSpace(raw)) == 0 {
		return ""
	}
	if !utf8.Valid(raw) {
		return fmt.Sprintf("invalid UTF-8 at byte %d", firstInvalidUTF8(raw))
	}
	if !checkDepth(raw, MaxDepth) {
		return fmt.Sprintf("nesting deeper than %d levels", MaxDepth)
	}
	p := parser{data: raw, strict: true}
	if _, _, err := p.skip(); err != nil {
		return err.Error()
	}
	if err := p.end(); err != nil {
		return err.Error()
	}
	if len(p.dupes) > 0 {
		return p.dupes[0].String()
	}
	return ""
}

// contentProblem checks state or instructions (a non-blank string, an object or an array)
// and returns what is wrong, or "".
func contentProblem(raw []byte) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return "required"
	}
	switch raw[0] {
	case '{', '[':
		return ""
	case '"':
		if isBlankJSONString(raw) {
			return "must not be blank"
		}
		return ""
	default:
		p := parser{data: raw}
		return "must be a non-blank string, an object or an array, got " + kindName(p.kind())
	}
}

func validateCriteria(q *Question, qp qpath, extra int, probs *problemList) {
	path := func(suffix string) string { return qp.at(".criteria" + suffix) }
	switch q.Type {
	case TypeChoice:
		if n := len(q.Options) + extra; n < MinOptions || n > MaxOptions {
			probs.add(path(""), fmt.Sprintf("must have %d–%d options, got %d", MinOptions, MaxOptions, n))
		}
		for i, o := range q.Options {
			if o.Key == "" {
				probs.add(path(""), "option key must not be blank")
				continue
			}
			for _, prev := range q.Options[:i] {
				if prev.Key == o.Key {
					probs.add(path("."+o.Key), "duplicate option key (keys are compared after trimming)")
					break
				}
			}
		}
	case TypeNoul:
		for i, o := range q.Options {
			if o.Key != "true" && o.Key != "false" {
				probs.add(path("."+o.Key), `unknown key; a noul question's criteria may only hold "true" and "false"`)
				continue
			}
			if o.Description == nil {
				probs.add(path("."+o.Key), "must be a string, got null")
			}
			for _, prev := range q.Options[:i] {
				if prev.Key == o.Key {
					probs.add(path("."+o.Key), "duplicate key")
					break
				}
			}
		}
	case TypeScore:
		if n := len(q.Levels) + extra; n < MinLevels || n > MaxLevels {
			probs.add(path(""), fmt.Sprintf("must have %d–%d levels, got %d", MinLevels, MaxLevels, n))
		}
	}
}

// Image magic numbers: what the bytes must start with once decoded.
var (
	magicPNG  = []byte("\x89PNG\r\n\x1a\n")
	magicJPEG = []byte{0xFF, 0xD8, 0xFF}
)

func isImage(head []byte) bool {
	return bytes.HasPrefix(head, magicPNG) || bytes.HasPrefix(head, magicJPEG) ||
		(len(head) >= 12 && string(head[:4]) == "RIFF" && string(head[8:12]) == "WEBP")
}

// check validates the image's base64 and content type and fills SHA256 and Bytes, returning a
// problem message or "". It decodes in a stream: a 24 MiB image costs a few KiB.
func (im *Image) check() string {
	if im.Data == "" {
		if im.SHA256 != "" {
			return "holds a redacted reference, not image data"
		}
		return "must not be empty"
	}
	if len(im.Data) >= 5 && strings.EqualFold(im.Data[:5], "data:") {
		return "must be raw base64, not a data: URL"
	}
	dec := base64.NewDecoder(base64.StdEncoding, strings.NewReader(im.Data))
	// Read the head by hand: io.ReadFull would mask the decoder's io.ErrUnexpectedEOF, which
	// is how it reports base64 whose length is not a multiple of 4.
	var head [12]byte
	n := 0
	for n < len(head) {
		m, err := dec.Read(head[n:])
		n += m
		if err == io.EOF {
			break
		}
		if err != nil {
			return base64Problem(err)
		}
	}
	if !isImage(head[:n]) {
		return "must be a PNG, JPEG or WebP image (its first bytes match none)"
	}
	h := sha256.New()
	h.Write(head[:n])
	rest, err := io.Copy(h, dec)
	if err != nil {
		return base64Problem(err)
	}
	im.SHA256 = hex.EncodeToString(h.Sum(nil))
	im.Bytes = n + int(rest)
	return ""
}

func base64Problem(err error) string {
	if err == io.ErrUnexpectedEOF {
		return "is not valid base64: truncated (its length is not a multiple of 4)"
	}
	return "is not valid base64: " + err.Error()
}
