package contract

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Code is a stable, public error code (SPEC §5). Producers branch on it, analysts group by it.
type Code string

// The error codes of SPEC §5 and §8, plus SYS1_NOT_CONFIGURED for a provider that was never configured.
const (
	CodeInvalidInput    Code = "SYS1_INVALID_INPUT"
	CodeModelNotAllowed Code = "SYS1_MODEL_NOT_ALLOWED"
	CodeRequestTooLarge Code = "SYS1_REQUEST_TOO_LARGE"
	CodeInvalidRequest  Code = "SYS1_INVALID_REQUEST"
	CodeUnauthenticated Code = "SYS1_UNAUTHENTICATED"
	CodeForbidden       Code = "SYS1_FORBIDDEN"
	CodeRunIDConflict   Code = "SYS1_RUN_ID_CONFLICT"
	CodeExpired         Code = "SYS1_EXPIRED"
	CodeBudgetExceeded  Code = "SYS1_BUDGET_EXCEEDED"
	// CodeQuotaExceeded: the caller holds more requests waiting than its quota allows
	// (SYS1_REQUESTS_MAX_PER_CALLER); see README, Quotas.
	CodeQuotaExceeded       Code = "SYS1_QUOTA_EXCEEDED"
	CodeModelUnavailable    Code = "SYS1_MODEL_UNAVAILABLE"
	CodeProviderUnavailable Code = "SYS1_PROVIDER_UNAVAILABLE"
	CodeProviderBusy        Code = "SYS1_PROVIDER_BUSY"
	CodeTimeout             Code = "SYS1_TIMEOUT"
	CodeUpstreamError       Code = "SYS1_UPSTREAM_ERROR"
	CodeInternal            Code = "SYS1_INTERNAL"
	CodeNotConfigured       Code = "SYS1_NOT_CONFIGURED"
)

type codeInfo struct {
	status    int
	transient bool
}

// codeTable is SPEC §5: the HTTP-like status of each code and whether the worker retries it.
var codeTable = map[Code]codeInfo{
	CodeInvalidInput:    {400, false},
	CodeModelNotAllowed: {400, false},
	CodeRequestTooLarge: {413, false},
	CodeInvalidRequest:  {400, false},
	CodeUnauthenticated: {401, false},
	CodeForbidden:       {403, false},
	CodeRunIDConflict:   {409, false},
	CodeExpired:         {408, false},
	// A spent budget is the caller's state, not a fault: redelivery would only spend again
	// once the window resets, so it is answered at once (the message says when it resets).
	CodeBudgetExceeded: {429, false},
	// Over its quota a caller is refused at once: the refusal frees what it holds.
	CodeQuotaExceeded:       {429, false},
	CodeModelUnavailable:    {503, true},
	CodeProviderUnavailable: {503, true},
	CodeProviderBusy:        {503, true},
	CodeTimeout:             {504, true},
	CodeUpstreamError:       {502, true},
	CodeInternal:            {500, false},
	// A missing provider configuration is an operations fault that no redelivery can fix.
	CodeNotConfigured: {503, false},
}

// Codes returns every known code in SPEC order; schemas and docs are generated from it.
func Codes() []Code {
	return []Code{
		CodeInvalidInput, CodeModelNotAllowed, CodeRequestTooLarge, CodeInvalidRequest,
		CodeUnauthenticated, CodeForbidden, CodeRunIDConflict, CodeExpired, CodeBudgetExceeded, CodeQuotaExceeded,
		CodeModelUnavailable, CodeProviderUnavailable, CodeProviderBusy, CodeTimeout,
		CodeUpstreamError, CodeInternal, CodeNotConfigured,
	}
}

// Status is the HTTP-like status of the code (500 for an unknown code).
func (c Code) Status() int {
	if info, ok := codeTable[c]; ok {
		return info.status
	}
	return 500
}

// Transient reports whether the worker retries an error with this code by redelivery.
func (c Code) Transient() bool { return codeTable[c].transient }

// Error is the one error type of sys1: a public code, its status, and a message that starts
// with "[CODE] ". It is what replies and run records carry.
type Error struct {
	Code    Code
	Status  int
	Message string
	// RetryAfter is the provider's hint (e.g. Retry-After) for the next attempt; zero means none.
	RetryAfter time.Duration
	// Err is the underlying cause for errors.Is/As; it is never serialized.
	Err error
}

// Errorf builds an Error with the code's status and a "[CODE] "-prefixed message.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Status: code.Status(), Message: "[" + string(code) + "] " + fmt.Sprintf(format, args...)}
}

// Wrap is Errorf that keeps cause reachable through errors.Is/As without putting its text in
// the message (causes can carry URLs or credentials; the caller chooses what to say).
func Wrap(code Code, cause error, format string, args ...any) *Error {
	e := Errorf(code, format, args...)
	e.Err = cause
	return e
}

func (e *Error) Error() string { return e.Message }
func (e *Error) Unwrap() error { return e.Err }

// Transient reports whether the worker should retry by redelivery.
func (e *Error) Transient() bool { return e.Code.Transient() }

// AsError extracts an *Error from err's chain.
func AsError(err error) (*Error, bool) {
	var e *Error
	if errors.As(err, &e) {
		return e, true
	}
	return nil, false
}

// errorJSON is the wire form of SPEC §4: {"code", "message", "status"}.
type errorJSON struct {
	Code    Code   `json:"code"`
	Message string `json:"message"`
	Status  int    `json:"status"`
}

// MarshalJSON encodes the SPEC §4 error object.
func (e *Error) MarshalJSON() ([]byte, error) {
	return e.appendJSON(make([]byte, 0, 64+len(e.Message))), nil
}

// UnmarshalJSON decodes the SPEC §4 error object.
func (e *Error) UnmarshalJSON(b []byte) error {
	var w errorJSON
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	*e = Error{Code: w.Code, Message: w.Message, Status: w.Status}
	return nil
}
