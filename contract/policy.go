package contract

import (
	"fmt"
	"strings"
	"time"
)

// CheckKeepAlive says what is wrong with a keep_alive setting (SYS1_KEEP_ALIVE), or nil:
// unset, all digits (seconds), or a Go duration such as "5m" (negative: keep forever).
func CheckKeepAlive(v string) error { return checkKeepAlive(strings.TrimSpace(v)) }

func checkKeepAlive(v string) error {
	if v == "" || isDigits(v) {
		return nil
	}
	if _, err := time.ParseDuration(v); err != nil {
		return fmt.Errorf("%q is neither a number of seconds nor a duration like 5m or 1h30m", v)
	}
	return nil
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// Policy is the server's resolution policy (SYS1_MODEL, SYS1_ALLOWED_MODELS, SYS1_KEEP_ALIVE).
type Policy struct {
	DefaultModel  string
	AllowedModels []string
	KeepAlive     string
}

// Allowed returns the allow-list: DefaultModel first, then AllowedModels without repeats.
func (p Policy) Allowed() []string {
	out := make([]string, 0, 1+len(p.AllowedModels))
	if p.DefaultModel != "" {
		out = append(out, p.DefaultModel)
	}
	for _, m := range p.AllowedModels {
		dup := false
		for _, o := range out {
			if o == m {
				dup = true
				break
			}
		}
		if !dup {
			out = append(out, m)
		}
	}
	return out
}

func (p Policy) allows(model string) bool {
	if model == p.DefaultModel {
		return true
	}
	for _, m := range p.AllowedModels {
		if m == model {
			return true
		}
	}
	return false
}

// keepAliveJSON is the keep_alive value sent upstream: nil (omit), a number of seconds, or a
// duration string.
func (p Policy) keepAliveJSON() []byte {
	v := strings.TrimSpace(p.KeepAlive)
	switch {
	case v == "":
		return nil
	case isDigits(v):
		// JSON numbers carry no leading zeros.
		if v = strings.TrimLeft(v, "0"); v == "" {
			v = "0"
		}
		return []byte(v)
	default:
		return appendString(nil, v)
	}
}

// Resolve applies the policy to a decoded request and returns a resolved copy; req is never
// modified (the copy shares questions and images, which nothing modifies). Every path that
// sends a request upstream uses it: the model defaults to DefaultModel and must be in the
// allow-list (SYS1_MODEL_NOT_ALLOWED names the allowed models), keep_alive is the policy's,
// never the caller's, and the serialized body must fit: 65,536 bytes without images, or
// 32 MiB with images, text included (SPEC §5; upstream's own limits, SYS1_REQUEST_TOO_LARGE).
func (p Policy) Resolve(req *Request) (*Request, *Error) {
	out := *req
	out.Model = strings.TrimSpace(out.Model)
	if out.Model == "" {
		out.Model = p.DefaultModel
	}
	if out.Model == "" {
		return nil, Errorf(CodeModelNotAllowed, "no model requested and no default model configured")
	}
	if !p.allows(out.Model) {
		// The name is the caller's and unbounded: quote only its start.
		return nil, Errorf(CodeModelNotAllowed, "model %q is not allowed; allowed models: %s",
			clip(out.Model, maxProblemPath), strings.Join(p.Allowed(), ", "))
	}
	out.KeepAlive = p.keepAliveJSON()
	if err := checkSize(&out); err != nil {
		return nil, err
	}
	return &out, nil
}

// checkSize bounds the serialized request without building the image part: its size is
// computed from the image lengths.
func checkSize(r *Request) *Error {
	text := len(r.appendText(make([]byte, 0, r.sizeHint()), true))
	if len(r.KeepAlive) > 0 {
		text += len(`,"keep_alive":`) + len(r.KeepAlive)
	}
	if len(r.Images) == 0 {
		if text > MaxTextBytes {
			return Errorf(CodeRequestTooLarge, "request is %d bytes serialized; the limit without images is %d", text, MaxTextBytes)
		}
		return nil
	}
	// With images upstream bounds only the whole body: the text part may pass 64 KiB.
	total := text + len(`,"images":[]`)
	for i := range r.Images {
		im := &r.Images[i]
		if im.Data != "" {
			// Base64 needs no escaping, but the line breaks a decoder skips (and validation
			// lets through) are written as two bytes each, \n and \r.
			total += len(im.Data) + 2 + strings.Count(im.Data, "\n") + strings.Count(im.Data, "\r")
		} else {
			total += len(im.Ref().appendJSON(nil))
		}
		if i > 0 {
			total++
		}
	}
	if total > MaxImageRequestBytes {
		return Errorf(CodeRequestTooLarge, "request is %d bytes serialized; the limit with images is %d", total, MaxImageRequestBytes)
	}
	return nil
}

// Redact returns the storable form of req: a copy whose images hold only their SHA256 and
// Bytes (encoded as {"sha256": hex, "bytes": n}) and without keep_alive (server policy, not
// part of what the caller asked). req is never modified. Images not yet hashed are hashed here.
func Redact(req *Request) *Request {
	if req == nil {
		return nil
	}
	out := *req
	out.KeepAlive = nil
	if len(req.Images) > 0 {
		// Decoded strings are slices of the body, images included: a redacted copy that
		// shared them would keep megabytes of base64 alive in whatever holds the record.
		out.Model = strings.Clone(req.Model)
		out.Questions = cloneQuestions(req.Questions)
		out.Images = make([]Image, len(req.Images))
		for i, im := range req.Images {
			if im.Data != "" && im.SHA256 == "" {
				im.check() // a Go-built request that skipped validation; hash what is there
			}
			out.Images[i] = Image{SHA256: im.SHA256, Bytes: im.Bytes}
		}
	}
	return &out
}

// ImageRefs returns the stored identities of the request's images, in order.
func (r *Request) ImageRefs() []ImageRef {
	if len(r.Images) == 0 {
		return nil
	}
	out := make([]ImageRef, len(r.Images))
	for i, im := range r.Images {
		out[i] = im.Ref()
	}
	return out
}

// cloneQuestions deep-copies questions so that no string aliases the decoded body.
func cloneQuestions(qs []Question) []Question {
	out := make([]Question, len(qs))
	for i, q := range qs {
		q.Name = strings.Clone(q.Name)
		q.Type = QuestionType(strings.Clone(string(q.Type)))
		if q.Options != nil {
			opts := make([]Option, len(q.Options))
			for j, o := range q.Options {
				opts[j].Key = strings.Clone(o.Key)
				if o.Description != nil {
					d := strings.Clone(*o.Description)
					opts[j].Description = &d
				}
			}
			q.Options = opts
		}
		if q.Levels != nil {
			lv := make([]string, len(q.Levels))
			for j, l := range q.Levels {
				lv[j] = strings.Clone(l)
			}
			q.Levels = lv
		}
		out[i] = q
	}
	return out
}
