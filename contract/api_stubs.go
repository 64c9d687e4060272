package contract

// TEMPORARY: signatures agreed between packages; the contract work replaces every body here
// and deletes this file.

import "errors"

var errNotImplemented = errors.New("not implemented yet")

// Policy is the server's resolution policy (SYS1_MODEL, SYS1_ALLOWED_MODELS, SYS1_KEEP_ALIVE).
type Policy struct {
	DefaultModel  string
	AllowedModels []string
	KeepAlive     string
}

// DecodeRequest strictly decodes and validates a request body.
func DecodeRequest(body []byte) (*Request, *Error) {
	return nil, Wrap(CodeInternal, errNotImplemented, "not implemented")
}

// Resolve applies the policy and returns a resolved copy.
func (p Policy) Resolve(req *Request) (*Request, *Error) {
	return nil, Wrap(CodeInternal, errNotImplemented, "not implemented")
}

// Redact returns a copy of req with images replaced by their hash and size.
func Redact(req *Request) *Request { return req }

// DecodeResponse decodes and validates a provider's answer to req.
func DecodeResponse(req *Request, body []byte) (*Response, *Error) {
	return nil, Wrap(CodeInternal, errNotImplemented, "not implemented")
}
