// Package upstream holds what the HTTP provider adapters (provider/ollama,
// provider/systemone) share: the HTTP client that never follows redirects, bounded reads,
// Retry-After hints, upstream error text made safe to keep, transport failure reasons and
// base-URL checks. Each adapter keeps its own status mapping and messages; this package has
// no opinion on codes.
package upstream

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"
)

// MaxErrorBodyBytes bounds how much of a non-2xx body is read to find its message.
const MaxErrorBodyBytes = 64 << 10

// ErrTooLarge is a body over the limit it was read with.
var ErrTooLarge = errors.New("body over the limit")

// NewHTTPClient returns the client an adapter uses: a copy of base (nil: a new one with a
// keep-alive pool sized to maxConns) whose redirect policy is replaced, because a redirect
// means a misconfigured base URL, and following it would send the API key to another place.
func NewHTTPClient(base *http.Client, maxConns int) *http.Client {
	var hc *http.Client
	if base == nil {
		hc = &http.Client{Transport: NewTransport(maxConns)}
	} else {
		copied := *base
		hc = &copied
	}
	hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return hc
}

// NewTransport is http.DefaultTransport's settings with the idle pool sized to the worker's
// concurrency (the default keeps 2 idle connections per host, which makes a busy worker open
// and close connections on every call).
func NewTransport(maxConns int) *http.Transport {
	maxConns = max(maxConns, 1)
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = maxConns + 4 // room for probes
	t.MaxIdleConnsPerHost = maxConns + 4
	t.IdleConnTimeout = 90 * time.Second
	return t
}

// Exchange sends req and reads the whole answer: a 2xx body up to maxOK bytes (more is
// ErrTooLarge, also when Content-Length announces it), any other body up to
// MaxErrorBodyBytes (cut silently: an error body is only read for its message). The body is
// closed.
//
// When req's context carries a trace (the worker's call stage), the exchange is a client span
// under it and the request carries its traceparent upstream (see traceExchange).
func Exchange(hc *http.Client, req *http.Request, maxOK int64) (*http.Response, []byte, error) {
	req, end := traceExchange(req)
	resp, body, err := exchange(hc, req, maxOK)
	end(resp, err)
	return resp, body, err
}

func exchange(hc *http.Client, req *http.Request, maxOK int64) (*http.Response, []byte, error) {
	resp, err := hc.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	ok := resp.StatusCode >= 200 && resp.StatusCode <= 299
	limit := maxOK
	if !ok {
		limit = MaxErrorBodyBytes
	} else if resp.ContentLength > maxOK {
		return resp, nil, ErrTooLarge
	}
	body, err := ReadBounded(resp.Body, resp.ContentLength, limit)
	if errors.Is(err, ErrTooLarge) && !ok {
		return resp, body, nil
	}
	if err != nil {
		return resp, nil, err
	}
	return resp, body, nil
}

// ReadBounded reads at most limit bytes; more is ErrTooLarge (with the first limit bytes).
// It allocates once when the length is announced.
func ReadBounded(r io.Reader, announced, limit int64) ([]byte, error) {
	size := int64(512)
	if announced > 0 && announced <= limit {
		size = announced
	}
	buf := bytes.NewBuffer(make([]byte, 0, size+1)) // +1 to see EOF without growing
	n, err := buf.ReadFrom(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, err
	}
	if n > limit {
		return buf.Bytes()[:limit], ErrTooLarge
	}
	return buf.Bytes(), nil
}

// TransportFailure names a connection-level failure in a few words, never with the
// underlying error's text (which can carry URLs), and says whether it was a network timeout.
func TransportFailure(err error) (reason string, timeout bool) {
	var dnsErr *net.DNSError
	var opErr *net.OpError
	var netErr net.Error
	switch {
	case errors.As(err, &dnsErr):
		return "its host name does not resolve", false
	case errors.Is(err, syscall.ECONNREFUSED):
		return "the connection was refused", false
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE), errors.Is(err, syscall.ECONNABORTED),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "the connection was closed before an answer", false
	case errors.As(err, &opErr) && opErr.Op == "dial":
		return "the connection could not be opened", false
	case errors.As(err, &netErr) && netErr.Timeout():
		return "the network timed out", true
	}
	return "the connection failed", false
}

// ParseBaseURL checks a provider's base URL from the variable named variable: http or https,
// a host, no query or fragment, and no credentials (user:password@ would be sent as basic
// auth by net/http and shows up wherever the URL is printed; keys have their own variables).
// Messages never echo credentials. The path loses trailing slashes.
func ParseBaseURL(raw, variable string) (*url.URL, error) {
	u, err := url.Parse(strings.TrimSpace(raw))
	if err != nil {
		return nil, fmt.Errorf("%s: not a valid URL", variable)
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, fmt.Errorf("%s: %s: scheme must be http or https", variable, DisplayURL(u))
	case u.Host == "":
		return nil, fmt.Errorf("%s: %s: host is missing", variable, DisplayURL(u))
	case u.User != nil:
		return nil, fmt.Errorf("%s: %s: must not carry credentials (user:password@); put the key in its own variable", variable, DisplayURL(u))
	case u.RawQuery != "" || u.Fragment != "" || u.ForceQuery:
		return nil, fmt.Errorf("%s: %s: must not have a query or fragment", variable, DisplayURL(u))
	}
	u.Path = strings.TrimRight(u.Path, "/")
	u.RawPath = ""
	return u, nil
}

// DisplayURL is a URL fit for logs: scheme, host and path only, so credentials in userinfo or
// query parameters never leak.
func DisplayURL(u *url.URL) string {
	return (&url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path}).String()
}

// Logger is the logger a call logs with: the one on ctx (the worker puts the run's there, so
// the line carries the run_id) when it is set and enabled, else fallback.
func Logger(ctx context.Context, fallback *zerolog.Logger) *zerolog.Logger {
	if l := zerolog.Ctx(ctx); l != zerolog.DefaultContextLogger && l.GetLevel() != zerolog.Disabled {
		return l
	}
	return fallback
}

// RequestID is the upstream's id for the call, from the headers hosted APIs and gateways set
// (x-request-id, x-typesafe-request-id, x-litellm-call-id), for the log line that lets the
// provider's support find it. Bounded and cleaned; empty when absent.
func RequestID(h http.Header) string {
	for _, k := range []string{"X-Request-Id", "X-Typesafe-Request-Id", "X-Litellm-Call-Id"} {
		if v := h.Get(k); v != "" {
			return Clean(v[:min(len(v), 128)])
		}
	}
	return ""
}

// TrimCode strips a "[SYS1_…] " prefix so a nested contract error reads as one message.
func TrimCode(msg string) string {
	if len(msg) > 0 && msg[0] == '[' {
		for i := 1; i < len(msg) && i < 40; i++ {
			if msg[i] == ']' {
				if i+2 <= len(msg) {
					return msg[i+2:]
				}
				return msg[i+1:]
			}
		}
	}
	return msg
}
