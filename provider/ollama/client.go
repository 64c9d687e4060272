// Package ollama is the provider adapter for Ollama's System One endpoint
// (POST {base}/v1/systemone).
//
// It sends the resolved request encoded in order (questions and options keep their order on
// the wire), bounds every call by SYS1_TIMEOUT_MS merged with the caller's context, validates
// the answer against the response contract and maps every failure to a SPEC §5 code. It never
// retries and never follows redirects: retry policy belongs to the worker, and a redirect
// means a misconfigured base URL. The optional API key is sent as a bearer token and appears
// in no error, log line or record.
//
// Errors go to producers (in replies and records), so they name the provider and the kind of
// failure but never the base URL or host (an internal address is nobody else's business); the
// host is in the adapter's log line for the call and in ProbeResult.Endpoint.
package ollama

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/provider"
	"github.com/sys1hq/sys1/provider/internal/upstream"
)

// Name is the provider name that goes into replies and run records.
const Name = "ollama"

// Limits of the adapter.
const (
	// MaxResponseBytes bounds an answer's body; a bigger one is SYS1_UPSTREAM_ERROR.
	MaxResponseBytes = 16 << 20
	// MinVersion is the first Ollama release with System One.
	MinVersion = "0.35.0"
	// DefaultModel is SYS1_MODEL's default, used by Probe when no model is given.
	DefaultModel = "nimble"
	// maxProbeTimeout bounds each probe request: health checks must answer fast even when
	// SYS1_TIMEOUT_MS is generous.
	maxProbeTimeout = 10 * time.Second
	// DigestTTL is how long a model digest read from /api/tags is trusted (see ModelDigest).
	DigestTTL = 10 * time.Second
)

// errCallTimeout is the cause of our own per-call deadline; it tells it apart from the
// caller's cancellation or deadline.
var errCallTimeout = errors.New("ollama: SYS1_TIMEOUT_MS elapsed")

// Client is the Ollama provider. It is safe for concurrent use.
type Client struct {
	base     string // display form: scheme://host/path, no credentials; for logs only
	endpoint string // {base}/v1/systemone
	version  string // {base}/api/version
	tags     string // {base}/api/tags
	apiKey   Secret
	redact   []string // the base URL and host, removed from upstream text producers see
	timeout  time.Duration
	model    string
	http     *http.Client
	log      zerolog.Logger
	now      func() time.Time

	mu        sync.Mutex
	models    []string          // from the last successful tags read
	digests   map[string]string // canonical model name → digest, from the same read
	digestsAt time.Time         // when digests was read
	refresh   sync.Mutex        // one /api/tags read at a time for ModelDigest
}

// Deps are the adapter's collaborators; the zero value is usable.
type Deps struct {
	// Log gets debug lines only, never request content, response content or the API key;
	// zero: none.
	Log zerolog.Logger
	// HTTPClient replaces the HTTP client (tests). Its redirect policy is overridden: the
	// adapter never follows redirects.
	HTTPClient *http.Client
}

// New builds the adapter. A bad configuration returns an error naming every bad variable.
func New(cfg Config, deps Deps) (*Client, error) {
	if errs := cfg.Validate(); len(errs) > 0 {
		return nil, fmt.Errorf("ollama provider: %w", errors.Join(errs...))
	}
	u, _ := cfg.parseBaseURL()
	timeout, _ := cfg.timeout()
	model, maxConns := cfg.Model, cfg.MaxConns
	if model == "" {
		model = DefaultModel
	}
	if maxConns < 1 {
		maxConns = DefaultMaxConns
	}
	base := u.String()
	display := upstream.DisplayURL(u)
	return &Client{
		base:     display,
		endpoint: base + "/v1/systemone",
		version:  base + "/api/version",
		tags:     base + "/api/tags",
		apiKey:   cfg.APIKey,
		redact:   []string{display, u.Host},
		timeout:  timeout,
		model:    model,
		http:     upstream.NewHTTPClient(deps.HTTPClient, maxConns),
		log:      deps.Log.With().Str("provider", Name).Logger(),
		now:      time.Now,
	}, nil
}

// Name is "ollama".
func (c *Client) Name() string { return Name }

// Capabilities are Ollama's System One limits; Models are the ones seen by the last Probe.
func (c *Client) Capabilities() provider.Capabilities {
	c.mu.Lock()
	defer c.mu.Unlock()
	return provider.Capabilities{
		MaxOptions: 26,
		MaxLevels:  26,
		Images:     true,
		Models:     append([]string(nil), c.models...),
	}
}

// Close releases idle connections.
func (c *Client) Close() { c.http.CloseIdleConnections() }

// Evaluate sends one resolved request. Errors are *contract.Error, except the caller's own
// cancellation or deadline, which is returned wrapped (errors.Is(err, context.Canceled)) and
// never as SYS1_TIMEOUT.
func (c *Client) Evaluate(ctx context.Context, req *contract.Request) (*contract.Response, error) {
	if c == nil || c.endpoint == "" {
		return nil, contract.Errorf(contract.CodeNotConfigured, "the ollama provider is not configured: set SYS1_OLLAMA_BASE_URL or OLLAMA_API_URL")
	}
	if req == nil {
		return nil, contract.Errorf(contract.CodeInternal, "ollama: Evaluate called without a request")
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("ollama: evaluate abandoned by the caller: %w", err)
	}
	// AppendJSON is the ordered wire encoding (what json.Marshal(req) produces, minus
	// encoding/json's re-scan and HTML escaping): state and instructions go out byte for byte.
	body := req.AppendJSON(nil)

	start := time.Now()
	callCtx, cancel := context.WithTimeoutCause(ctx, c.timeout, errCallTimeout)
	defer cancel()
	resp, answer, err := c.post(callCtx, body)
	if err == nil {
		err = c.checkStatus(resp, req.Model)
	}
	var out *contract.Response
	if err == nil {
		var derr *contract.Error
		out, derr = contract.DecodeResponse(req, answer)
		if derr != nil {
			err = contract.Wrap(contract.CodeUpstreamError, fmt.Errorf("%w: %w", provider.ErrMalformed, derr),
				"ollama answered with a body that breaks the response contract: %s", upstream.TrimCode(derr.Message))
		}
	}
	if err != nil {
		err = c.classify(ctx, callCtx, err)
	}
	var text string
	if resp != nil && (resp.StatusCode < 200 || resp.StatusCode > 299) {
		text = upstream.ForLog(c.upstreamText(answer), req)
	}
	c.logCall(ctx, resp, len(body), len(answer), time.Since(start), err, text)
	if err != nil {
		return nil, err
	}
	return out, nil
}

// post sends the body and reads the whole answer (bounded, see upstream.Exchange).
func (c *Client) post(ctx context.Context, body []byte) (*http.Response, []byte, error) {
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, c.endpoint, bytes.NewReader(body))
	if err != nil {
		return nil, nil, contract.Wrap(contract.CodeNotConfigured, err, "cannot build a request to ollama")
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Accept", "application/json")
	hreq.Header.Set("User-Agent", "sys1")
	c.authorize(hreq)
	resp, answer, err := upstream.Exchange(c.http, hreq, MaxResponseBytes)
	if errors.Is(err, upstream.ErrTooLarge) {
		return resp, nil, contract.Errorf(contract.CodeUpstreamError, "ollama answered with more than %d MiB", MaxResponseBytes>>20)
	}
	return resp, answer, err
}

func (c *Client) authorize(r *http.Request) {
	if c.apiKey != "" {
		r.Header.Set("Authorization", "Bearer "+c.apiKey.Reveal())
	}
}

// classify turns a failure into what Evaluate returns: the caller's cancellation as is
// (wrapped), our own deadline as SYS1_TIMEOUT, a transport failure as
// SYS1_PROVIDER_UNAVAILABLE, and an already classified *contract.Error unchanged.
func (c *Client) classify(caller, call context.Context, err error) error {
	if cerr := caller.Err(); cerr != nil {
		return fmt.Errorf("ollama: evaluate abandoned by the caller: %w", cerr)
	}
	if errors.Is(context.Cause(call), errCallTimeout) {
		return contract.Wrap(contract.CodeTimeout, err, "ollama did not answer within %s (SYS1_TIMEOUT_MS)", c.timeout)
	}
	if _, ok := contract.AsError(err); ok {
		return err
	}
	return c.transportError(err)
}

// transportError maps a connection-level failure. The message names the kind of failure,
// never the underlying error text (which can carry URLs) nor the host.
func (c *Client) transportError(err error) *contract.Error {
	reason, timeout := upstream.TransportFailure(err)
	if timeout {
		return contract.Wrap(contract.CodeTimeout, err, "ollama timed out at the network level")
	}
	return contract.Wrap(contract.CodeProviderUnavailable, err, "ollama is unavailable: %s", reason)
}

// logCall writes one line per call: sizes, status, latency, the host and the code. No
// content. A success is a debug line; a failure is a warning, because producers are told only
// the code and a generic message, so this line is where an operator finds which host failed.
// A logger on ctx (the worker puts the run's there) wins, so the line carries the run_id.
func (c *Client) logCall(ctx context.Context, resp *http.Response, sent, received int, took time.Duration, err error, upstreamText string) {
	log := upstream.Logger(ctx, &c.log)
	ev := log.Debug()
	if err != nil {
		if _, ok := contract.AsError(err); ok {
			ev = log.Warn()
		} // a caller's cancellation stays a debug line: nothing failed
	}
	if !ev.Enabled() {
		return
	}
	ev = ev.Str("upstream", c.base).Int("request_bytes", sent).Int("response_bytes", received).Int64("latency_ms", took.Milliseconds())
	if resp != nil {
		ev = ev.Int("http_status", resp.StatusCode)
		if id := upstream.RequestID(resp.Header); id != "" {
			ev = ev.Str("upstream_request_id", id)
		}
	}
	if err != nil {
		if e, ok := contract.AsError(err); ok {
			ev = ev.Str("error_code", string(e.Code))
			if resp == nil {
				// Our own words (a transport failure, a timeout): no upstream text in them.
				ev = ev.Str("error", e.Message)
			}
			// Otherwise the code only: the message may quote upstream's error body, and a
			// proxy can echo the request (state, instructions) there. The message is in the
			// attempt's detail in the reply and the record, where the request's content
			// already lives.
		} else {
			ev = ev.Str("error", err.Error())
		}
	}
	if upstreamText != "" {
		// The upstream's own words, redacted, bounded and with the request's content masked:
		// for the operator only, never in a reply or record.
		ev = ev.Str("upstream_error", upstreamText)
	}
	ev.Msg("ollama call")
}

var _ provider.Provider = (*Client)(nil)
