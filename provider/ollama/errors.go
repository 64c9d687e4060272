package ollama

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/sys1hq/sys1/contract"
)

// maxUpstreamText bounds the upstream text kept in an error message.
const maxUpstreamText = 512

// maxRetryAfter caps the Retry-After hint: a hint of days is a misconfiguration, and the
// worker's own backoff and deadlines still apply.
const maxRetryAfter = time.Hour

// checkStatus maps a non-2xx answer to its SPEC §5 code (the table in SPEC §5 and issue 3).
func (c *Client) checkStatus(resp *http.Response, body []byte, model string) error {
	status := resp.StatusCode
	if status >= 200 && status <= 299 {
		return nil
	}
	text := c.upstreamText(body)
	detail := ""
	if text != "" {
		detail = ": " + text
	}
	switch {
	case status == http.StatusBadRequest, status == http.StatusUnprocessableEntity:
		return contract.Errorf(contract.CodeInvalidRequest, "ollama rejected the request (HTTP %d)%s", status, detail)
	case status == http.StatusNotFound:
		return contract.Errorf(contract.CodeModelUnavailable, "model %q is not available on ollama at %s (HTTP 404)%s", model, c.base, detail)
	case status == http.StatusRequestEntityTooLarge:
		return contract.Errorf(contract.CodeRequestTooLarge, "ollama refused the request as too large (HTTP 413)%s", detail)
	case status == http.StatusTooManyRequests, status == http.StatusServiceUnavailable:
		after := parseRetryAfter(resp.Header.Get("Retry-After"), time.Now())
		hint := ""
		if after > 0 {
			hint = fmt.Sprintf("; retry after %s", after)
		}
		e := contract.Errorf(contract.CodeProviderBusy, "ollama at %s is busy (HTTP %d)%s%s", c.base, status, detail, hint)
		e.RetryAfter = after
		return e
	case status == http.StatusUnauthorized, status == http.StatusForbidden:
		return contract.Errorf(contract.CodeUpstreamError, "ollama at %s refused the credentials (HTTP %d); check SYS1_OLLAMA_API_KEY%s", c.base, status, detail)
	case status >= 300 && status <= 399:
		return contract.Errorf(contract.CodeUpstreamError, "ollama at %s answered with a redirect (HTTP %d), which is not followed; check SYS1_OLLAMA_BASE_URL", c.base, status)
	default:
		return contract.Errorf(contract.CodeUpstreamError, "ollama at %s failed (HTTP %d)%s", c.base, status, detail)
	}
}

// upstreamText extracts the human message from any upstream error body shape and makes it
// safe to keep: bounded, one line, and never carrying the API key. The key is removed before
// the text is bounded: cutting first could keep the beginning of a key that straddles the
// cut, which no longer matches the whole key.
func (c *Client) upstreamText(body []byte) string {
	text := rawErrorMessage(body)
	if key := c.apiKey.Reveal(); key != "" {
		text = strings.ReplaceAll(text, key, "[REDACTED]")
	}
	return clean(text)
}

// errorMessage reads {"error":"…"} (Ollama), {"error":{"code","message","type"}} (llama-server,
// OpenAI-style proxies), {"detail":"…"} or {"detail":[{"msg":…}]} (FastAPI), {"message":"…"}
// and plain text, bounded to maxUpstreamText.
func errorMessage(body []byte) string { return clean(rawErrorMessage(body)) }

// rawErrorMessage is errorMessage before clean: the message as the body spells it, unbounded.
func rawErrorMessage(body []byte) string {
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

// clean makes upstream text one bounded line: control characters become spaces, runs of
// spaces collapse, and the result is cut at maxUpstreamText bytes on a rune boundary.
func clean(s string) string {
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
		if b.Len()+utf8.RuneLen(r) > maxUpstreamText {
			return strings.TrimSpace(b.String()) + "…"
		}
		b.WriteRune(r)
	}
	return strings.TrimSpace(b.String())
}

// parseRetryAfter reads a Retry-After value: delay-seconds or an HTTP date (RFC 9110 §10.2.3).
// Unparseable, negative or past values give 0 (no hint); the hint is capped at maxRetryAfter.
func parseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	var d time.Duration
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil {
		if secs <= 0 {
			return 0
		}
		if secs > int64(maxRetryAfter/time.Second) {
			return maxRetryAfter
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
	return min(d, maxRetryAfter)
}

func isConnRefused(err error) bool { return errors.Is(err, syscall.ECONNREFUSED) }

func isConnReset(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNABORTED)
}
