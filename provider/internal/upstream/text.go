package upstream

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/sys1hq/sys1/contract"
)

// MaxText bounds the upstream text kept in an error message.
const MaxText = 512

// MaxRetryAfter caps a Retry-After hint: a hint of days is a misconfiguration, and the
// worker's own backoff and deadlines still apply.
const MaxRetryAfter = time.Hour

// Text extracts the human message from an upstream error body of any common shape and makes
// it safe to keep: every redact string (the API key, the provider's host) is replaced by
// "[REDACTED]", then the text is made one bounded line. Redaction comes first: cutting first
// could keep the beginning of a key that straddles the cut, which no longer matches it.
func Text(body []byte, redact ...string) string {
	text := RawErrorMessage(body)
	for _, s := range redact {
		if s != "" {
			text = strings.ReplaceAll(text, s, "[REDACTED]")
		}
	}
	return Clean(text)
}

// ErrorMessage reads {"error":"…"} (Ollama), {"error":{"code","message","type"}} (llama-server,
// OpenAI-style proxies, hosted APIs), {"detail":"…"} or {"detail":[{"msg":…}]} (FastAPI),
// {"message":"…"} and plain text, bounded to MaxText.
func ErrorMessage(body []byte) string { return Clean(RawErrorMessage(body)) }

// RawErrorMessage is ErrorMessage before Clean: the message as the body spells it, unbounded.
func RawErrorMessage(body []byte) string {
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) == 0 {
		return ""
	}
	if trimmed[0] == '{' {
		var shape struct {
			Error   json.RawMessage `json:"error"`
			Detail  json.RawMessage `json:"detail"`
			Message json.RawMessage `json:"message"`
		}
		if json.Unmarshal(trimmed, &shape) == nil {
			for _, raw := range []json.RawMessage{shape.Error, shape.Detail, shape.Message} {
				if msg := messageOf(raw); msg != "" {
					return msg
				}
			}
		}
	}
	return string(trimmed)
}

// messageOf turns one error value into text: a string as is, an object by its message (with
// code and type when present), a list by its entries' messages, anything else as compact JSON.
func messageOf(raw json.RawMessage) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return ""
	}
	switch raw[0] {
	case '"':
		var s string
		if json.Unmarshal(raw, &s) == nil {
			return s
		}
	case '{':
		var obj struct {
			Code    json.RawMessage `json:"code"`
			Message string          `json:"message"`
			Msg     string          `json:"msg"`
			Type    string          `json:"type"`
			Loc     []any           `json:"loc"`
		}
		if json.Unmarshal(raw, &obj) == nil {
			msg := obj.Message
			if msg == "" {
				msg = obj.Msg
			}
			if len(obj.Loc) > 0 {
				parts := make([]string, len(obj.Loc))
				for i, p := range obj.Loc {
					parts[i] = fmt.Sprint(p)
				}
				msg = strings.Join(parts, ".") + ": " + msg
			}
			var tags []string
			if obj.Type != "" {
				tags = append(tags, obj.Type)
			}
			if code := strings.Trim(string(bytes.TrimSpace(obj.Code)), `"`); code != "" && code != "null" {
				tags = append(tags, code)
			}
			if msg != "" && len(tags) > 0 {
				return msg + " (" + strings.Join(tags, ", ") + ")"
			}
			if msg != "" {
				return msg
			}
		}
	case '[':
		var items []json.RawMessage
		if json.Unmarshal(raw, &items) == nil {
			var msgs []string
			for _, it := range items {
				if m := messageOf(it); m != "" {
					msgs = append(msgs, m)
				}
			}
			if len(msgs) > 0 {
				return strings.Join(msgs, "; ")
			}
		}
	}
	var compact bytes.Buffer
	if json.Compact(&compact, raw) == nil {
		return compact.String()
	}
	return string(raw)
}

// Clean makes upstream text one bounded line: control characters become spaces, runs of
// spaces collapse, and the result is cut at MaxText bytes on a rune boundary.
func Clean(s string) string {
	var b strings.Builder
	space := false
	for _, r := range s {
		if r == utf8.RuneError || unicode.IsControl(r) || unicode.IsSpace(r) {
			if !space && b.Len() > 0 {
				b.WriteByte(' ')
			}
			space = true
			continue
		}
		space = false
		if b.Len()+utf8.RuneLen(r) > MaxText {
			return strings.TrimSpace(b.String()) + "…"
		}
		b.WriteRune(r)
	}
	return strings.TrimSpace(b.String())
}

// RetryAfter is the hint of a busy answer: retry-after-ms (milliseconds, sent by hosted APIs
// and their SDKs for sub-second precision) when valid, else Retry-After.
func RetryAfter(h http.Header, now time.Time) time.Duration {
	if v := strings.TrimSpace(h.Get("Retry-After-Ms")); v != "" {
		if ms, err := strconv.ParseFloat(v, 64); err == nil && ms > 0 {
			if ms >= float64(MaxRetryAfter/time.Millisecond) {
				return MaxRetryAfter
			}
			return time.Duration(ms * float64(time.Millisecond))
		}
	}
	return ParseRetryAfter(h.Get("Retry-After"), now)
}

// ParseRetryAfter reads a Retry-After value: delay-seconds or an HTTP date (RFC 9110 §10.2.3).
// Unparseable, negative or past values give 0 (no hint); the hint is capped at MaxRetryAfter.
func ParseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	var d time.Duration
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil {
		if secs <= 0 {
			return 0
		}
		if secs > int64(MaxRetryAfter/time.Second) {
			return MaxRetryAfter
		}
		d = time.Duration(secs) * time.Second
	} else if t, err := http.ParseTime(v); err == nil {
		d = t.Sub(now)
		if d <= 0 {
			return 0
		}
		// HTTP dates have one-second precision; round up so the hint is never early
		d = d.Truncate(time.Second)
		if t.Sub(now) > d {
			d += time.Second
		}
	} else {
		return 0
	}
	return min(d, MaxRetryAfter)
}

// ForLog is upstream error text as the operator's log keeps it: Text's redacted, bounded
// line, with every word of the request's content masked. A proxy or gateway may quote the body
// it could not forward, and a request's state, instructions and options never reach a log: a
// word of theirs (three characters or more) in the text becomes "…". Producers never see
// upstream text at all; their error names the status (see the adapters' checkStatus).
func ForLog(text string, req *contract.Request) string {
	if text == "" || req == nil {
		return text
	}
	words := map[string]struct{}{}
	add := func(b []byte) {
		for _, w := range bytes.FieldsFunc(b, notWordRune) {
			if utf8.RuneCount(w) >= 3 {
				words[string(w)] = struct{}{}
			}
		}
	}
	add(req.State)
	for _, q := range req.Questions {
		add(q.Instructions)
		for _, o := range q.Options {
			add([]byte(o.Key))
			if o.Description != nil {
				add([]byte(*o.Description))
			}
		}
		for _, l := range q.Levels {
			add([]byte(l))
		}
	}
	var b strings.Builder
	rest := text
	for rest != "" {
		i := strings.IndexFunc(rest, func(r rune) bool { return !notWordRune(r) })
		if i < 0 {
			b.WriteString(rest)
			break
		}
		b.WriteString(rest[:i])
		rest = rest[i:]
		j := strings.IndexFunc(rest, notWordRune)
		if j < 0 {
			j = len(rest)
		}
		if _, secret := words[rest[:j]]; secret {
			b.WriteString("…")
		} else {
			b.WriteString(rest[:j])
		}
		rest = rest[j:]
	}
	return b.String()
}

func notWordRune(r rune) bool { return !unicode.IsLetter(r) && !unicode.IsDigit(r) }
