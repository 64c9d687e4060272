package systemonetest

import (
	"net/http"
	"time"

	"github.com/sys1hq/sys1/provider/ollamatest"
)

// Fault is what the fake does instead of (or before) answering a POST /v1/systemone. Set one
// of Hang, Drop, Status or Malformed; Delay may be combined with any of them.
type Fault struct {
	// Delay waits before answering (a slow answer).
	Delay time.Duration
	// Hang never answers: the call ends when the client gives up or the server closes.
	Hang bool
	// Drop closes the connection without answering.
	Drop bool
	// Status answers with this HTTP status; Body (default: the hosted error shape with the
	// status's usual text), ContentType, RetryAfter, RetryAfterMS and Header shape it.
	Status       int
	Body         string
	ContentType  string
	RetryAfter   string
	RetryAfterMS string
	Header       http.Header
	// Malformed answers the (valid) request with a 200 whose body breaks the response
	// contract, made by the wrapped fake Ollama.
	Malformed ollamatest.Malformation
}

// Status answers with an HTTP status and the hosted error body for it.
func Status(code int) Fault { return Fault{Status: code} }

// Unauthorized is a 401: the key is wrong or revoked.
func Unauthorized() Fault { return Fault{Status: http.StatusUnauthorized} }

// Forbidden is a 403: the key may not use the model.
func Forbidden() Fault { return Fault{Status: http.StatusForbidden} }

// Busy answers 429, 503 or 529 with a Retry-After header (seconds or an HTTP date; empty:
// none).
func Busy(code int, retryAfter string) Fault { return Fault{Status: code, RetryAfter: retryAfter} }

// BusyMS answers code with retry-after-ms (milliseconds) and Retry-After (whole seconds).
func BusyMS(code int, retryAfterMS, retryAfter string) Fault {
	return Fault{Status: code, RetryAfterMS: retryAfterMS, RetryAfter: retryAfter}
}

// Body answers with a status and a verbatim body.
func Body(code int, contentType, body string) Fault {
	return Fault{Status: code, ContentType: contentType, Body: body}
}

// Redirect answers with a redirect to location, which a client must not follow.
func Redirect(code int, location string) Fault {
	return Fault{Status: code, Header: http.Header{"Location": {location}}, Body: " ", ContentType: "text/plain"}
}

// Slow answers normally after d.
func Slow(d time.Duration) Fault { return Fault{Delay: d} }

// Hang never answers.
func Hang() Fault { return Fault{Hang: true} }

// Drop closes the connection without answering.
func Drop() Fault { return Fault{Drop: true} }

// Malformed answers 200 with a body that breaks the response contract in the given way.
func Malformed(m ollamatest.Malformation) Fault { return Fault{Malformed: m} }
