package ollamatest

import (
	"net/http"
	"time"

	"github.com/sys1hq/sys1/provider/internal/synth"
)

// Fault is what the fake does instead of (or on top of) answering normally. Exactly one of
// Hang, Drop, Status or Malformed should be set; Delay may be combined with any of them.
// The constructors below build the common ones.
type Fault struct {
	// Delay is added to the server's latency before the call is answered.
	Delay time.Duration
	// Hang blocks until the client gives up (its context ends) or the server closes.
	Hang bool
	// Drop hijacks the connection and closes it without answering (a reset).
	Drop bool
	// Status answers with this HTTP status; Body (default {"error": "<Ollama's text>"}),
	// ContentType, RetryAfter and Header shape the answer.
	Status      int
	Body        string
	ContentType string
	RetryAfter  string
	Header      http.Header
	// Malformed answers the (valid) request with a 200 whose body breaks the response
	// contract in the given way.
	Malformed Malformation
}

// Malformation is one way an answer can break the response contract.
type Malformation int

// The malformations. Each applies to the first question unless said otherwise.
const (
	MalformedNone Malformation = iota
	// MalformedWrongType answers the first question with another question type.
	MalformedWrongType
	// MalformedMissingAnswer leaves out the last question's answer.
	MalformedMissingAnswer
	// MalformedBadSum sends probabilities summing to 0.5 (noul: a value of 1.5).
	MalformedBadSum
	// MalformedNaN writes a bare NaN, as Python's json module does: not valid JSON.
	MalformedNaN
	// MalformedExtraAnswer adds an answer to a question that was not asked.
	MalformedExtraAnswer
	// MalformedNotJSON answers 200 with an HTML page, as a misconfigured proxy does.
	MalformedNotJSON
	// MalformedTruncated cuts the answer in half.
	MalformedTruncated
)

func (m Malformation) corruption() synth.Corruption {
	switch m {
	case MalformedWrongType:
		return synth.CorruptWrongType
	case MalformedMissingAnswer:
		return synth.CorruptMissingAnswer
	case MalformedBadSum:
		return synth.CorruptBadSum
	case MalformedNaN:
		return synth.CorruptNaN
	case MalformedExtraAnswer:
		return synth.CorruptExtraAnswer
	}
	return synth.CorruptNone
}

// Status answers with an HTTP status and Ollama's usual {"error": "..."} text for it.
func Status(code int) Fault { return Fault{Status: code} }

// Busy answers 429 or 503 with a Retry-After header (seconds or an HTTP date; empty: none).
func Busy(code int, retryAfter string) Fault { return Fault{Status: code, RetryAfter: retryAfter} }

// Body answers with an HTTP status and a verbatim body, for upstream error shapes other than
// Ollama's own ({"error":{"message":...}}, {"detail":...}, plain text).
func Body(code int, contentType, body string) Fault {
	return Fault{Status: code, ContentType: contentType, Body: body}
}

// Redirect answers with a redirect to location (which a client must not follow).
func Redirect(code int, location string) Fault {
	return Fault{Status: code, Header: http.Header{"Location": {location}}, Body: " ", ContentType: "text/plain"}
}

// Malformed answers 200 with a body that breaks the response contract.
func Malformed(m Malformation) Fault { return Fault{Malformed: m} }

// Hang never answers: the call ends when the client gives up.
func Hang() Fault { return Fault{Hang: true} }

// Drop closes the connection without answering.
func Drop() Fault { return Fault{Drop: true} }

// Delay answers normally after d.
func Delay(d time.Duration) Fault { return Fault{Delay: d} }
