// Package systemone is the provider for hosted servers that speak Ollama's System One
// contract (POST {base}/v1/systemone): TypeSafe's Jev at https://api.typesafe.ai, a LiteLLM
// proxy's route, another sys1-compatible gateway.
//
// It sends the resolved request encoded in order with a bearer API key, bounds every call by
// its timeout merged with the caller's context, validates the answer against the response
// contract (contract.DecodeResponse, as the Ollama adapter does) and maps every failure to a
// SPEC §5 code with a hosted API's meaning: 401/403 are a configuration fault
// (SYS1_NOT_CONFIGURED: no redelivery fixes a revoked key), 429/503/529 are
// SYS1_PROVIDER_BUSY with the server's Retry-After (or retry-after-ms) hint, other 5xx are
// SYS1_UPSTREAM_ERROR. It never retries and never follows redirects (a redirect would carry
// the key elsewhere; it is reported as a configuration fault). The key appears in no error,
// log line, probe finding or record; errors name no host either (the host is in the log line
// for the call).
package systemone

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/provider"
	"github.com/sys1hq/sys1/provider/internal/upstream"
)

// Name is the provider name that goes into replies and run records.
const Name = "systemone"

// Limits and defaults of the adapter.
const (
	// MaxResponseBytes bounds an answer's body (and a model list's); more is SYS1_UPSTREAM_ERROR.
	MaxResponseBytes = 16 << 20
	// DefaultTimeout bounds one call when Config.Timeout is zero.
	DefaultTimeout = 30 * time.Second
	// ModelsPath is the model list hosted APIs offer (OpenAI's shape), used by Probe unless a
	// probe path is configured, and by ModelDigest always.
	ModelsPath = "/v1/models"
	// DigestTTL is how long model versions read from the model list are trusted.
	DigestTTL = time.Minute
	// maxProbeTimeout bounds each probe request.
	maxProbeTimeout = 10 * time.Second
)

// Configuration variables named in messages, so an operator knows what to fix.
const (
	VarBaseURL   = "SYS1_SYSTEMONE_BASE_URL"
	VarAPIKey    = "SYS1_SYSTEMONE_API_KEY"
	VarTimeout   = "SYS1_SYSTEMONE_TIMEOUT_MS"
	VarProbePath = "SYS1_SYSTEMONE_PROBE_PATH"
	VarModels    = "SYS1_SYSTEMONE_MODELS"
)

// errCallTimeout is the cause of our own per-call deadline; it tells it apart from the
// caller's cancellation or deadline.
var errCallTimeout = errors.New("systemone: the call's timeout elapsed")

// Config is the adapter's settings (plain values: the command layer reads the environment).
type Config struct {
	// BaseURL is the server's base URL (https://api.typesafe.ai, a gateway's route prefix).
	BaseURL string
	// APIKey is the bearer token. Its type redacts it whenever it is printed.
	APIKey contract.Secret
	// Timeout bounds one call; zero means DefaultTimeout.
	Timeout time.Duration
	// ProbePath is what Probe GETs instead of /v1/models, for servers that do not offer the
	// model list (any 2xx answer is healthy). Empty: /v1/models.
	ProbePath string
	// Model is the model Probe looks for in the model list (the one the default requested
	// model maps to); empty: none in particular.
	Model string
	// MaxConns sizes the keep-alive pool to the calls in flight; zero: DefaultMaxConns.
	MaxConns int
}

// DefaultMaxConns is the keep-alive pool's size when Config.MaxConns is not set.
const DefaultMaxConns = 16

// Validate returns one error per bad setting, each naming its variable.
func (c *Config) Validate() []error {
	var errs []error
	if strings.TrimSpace(c.BaseURL) == "" {
		errs = append(errs, fmt.Errorf("%s: required for provider systemone (the hosted server's base URL, e.g. https://api.typesafe.ai)", VarBaseURL))
	} else if _, err := upstream.ParseBaseURL(c.BaseURL, VarBaseURL); err != nil {
		errs = append(errs, err)
	}
	if strings.TrimSpace(c.APIKey.Reveal()) == "" {
		errs = append(errs, fmt.Errorf("%s: required for provider systemone (the server's bearer API key)", VarAPIKey))
	} else if strings.ContainsAny(c.APIKey.Reveal(), "\r\n\x00") {
		// the value itself is never echoed
		errs = append(errs, fmt.Errorf("%s: must be one line (it goes into an Authorization header)", VarAPIKey))
	}
	if c.Timeout < 0 || c.Timeout > 24*time.Hour {
		errs = append(errs, fmt.Errorf("%s: %s is not between 1 ms and 24 h", VarTimeout, c.Timeout))
	}
	if p := strings.TrimSpace(c.ProbePath); p != "" {
		if !strings.HasPrefix(p, "/") || strings.ContainsAny(p, "?# \t\r\n") || strings.Contains(p, "//") {
			errs = append(errs, fmt.Errorf("%s: %q must be a path starting with / (no query, fragment or spaces)", VarProbePath, upstream.Clean(p)))
		}
	}
	return errs
}

// Client is the hosted System One provider. It is safe for concurrent use.
type Client struct {
	base      string // display form, for logs only
	endpoint  string // {base}/v1/systemone
	modelsURL string // {base}/v1/models
	probeURL  string // {base}{ProbePath}, empty for the model list
	probePath string
	// key is behind a pointer so that even printing the struct with %+v shows an address:
	// fmt cannot call Secret's String on an unexported field.
	key     *bearer
	redact  []string
	timeout time.Duration
	model   string
	http    *http.Client
	log     zerolog.Logger
	now     func() time.Time

	mu         sync.Mutex
	models     []string          // from the last model list
	versions   map[string]string // model id → version, from the same list
	versionsAt time.Time
	listStatus int        // HTTP status of the last model list read (404: not offered)
	refresh    sync.Mutex // one model-list read at a time for ModelDigest
}

// Deps are the adapter's collaborators; the zero value is usable.
type Deps struct {
	// Log is the logger; calls log through the context's logger when it has one. Zero: none.
	Log zerolog.Logger
	// HTTPClient replaces the HTTP client (tests). Its redirect policy is overridden.
	HTTPClient *http.Client
}

// New builds the adapter. A bad configuration returns an error naming every bad variable.
func New(cfg Config, deps Deps) (*Client, error) {
	if errs := cfg.Validate(); len(errs) > 0 {
		return nil, fmt.Errorf("systemone provider: %w", errors.Join(errs...))
	}
	u, _ := upstream.ParseBaseURL(cfg.BaseURL, VarBaseURL)
	maxConns := cfg.MaxConns
	if maxConns < 1 {
		maxConns = DefaultMaxConns
	}
	timeout := cfg.Timeout
	if timeout == 0 {
		timeout = DefaultTimeout
	}
	base := u.String()
	display := upstream.DisplayURL(u)
	c := &Client{
		base:      display,
		endpoint:  base + "/v1/systemone",
		modelsURL: base + ModelsPath,
		key:       &bearer{strings.TrimSpace(cfg.APIKey.Reveal())},
		redact:    []string{display, u.Host},
		timeout:   timeout,
		model:     cfg.Model,
		http:      upstream.NewHTTPClient(deps.HTTPClient, maxConns),
		log:       deps.Log.With().Str("provider", Name).Logger(),
		now:       time.Now,
	}
	if p := strings.TrimSpace(cfg.ProbePath); p != "" {
		c.probePath, c.probeURL = p, base+p
	}
	return c, nil
}

// Name is "systemone".
func (c *Client) Name() string { return Name }

// Capabilities are the contract's limits (a hosted server refuses what it does not support
// with a 400, which is SYS1_INVALID_REQUEST); Models are the last model list's.
func (c *Client) Capabilities() provider.Capabilities {
	c.mu.Lock()
	defer c.mu.Unlock()
	return provider.Capabilities{MaxOptions: 26, MaxLevels: 26, Images: true, Models: append([]string(nil), c.models...)}
}

// Close releases idle connections.
func (c *Client) Close() { c.http.CloseIdleConnections() }

// Evaluate sends one resolved request. Errors are *contract.Error, except the caller's own
// cancellation or deadline, which is returned wrapped (errors.Is(err, context.Canceled)) and
// never as SYS1_TIMEOUT.
func (c *Client) Evaluate(ctx context.Context, req *contract.Request) (*contract.Response, error) {
	if c == nil || c.endpoint == "" {
		return nil, contract.Errorf(contract.CodeNotConfigured, "the systemone provider is not configured: set %s and %s", VarBaseURL, VarAPIKey)
	}
	if req == nil {
		return nil, contract.Errorf(contract.CodeInternal, "systemone: Evaluate called without a request")
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("systemone: evaluate abandoned by the caller: %w", err)
	}
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
				"systemone answered with a body that breaks the response contract: %s", upstream.TrimCode(derr.Message))
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

func (c *Client) post(ctx context.Context, body []byte) (*http.Response, []byte, error) {
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, c.endpoint, bytes.NewReader(body))
	if err != nil {
		return nil, nil, contract.Wrap(contract.CodeNotConfigured, err, "cannot build a request to systemone; check %s", VarBaseURL)
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Accept", "application/json")
	hreq.Header.Set("User-Agent", "sys1")
	c.authorize(hreq)
	resp, answer, err := upstream.Exchange(c.http, hreq, MaxResponseBytes)
	if errors.Is(err, upstream.ErrTooLarge) {
		return resp, nil, contract.Errorf(contract.CodeUpstreamError, "systemone answered with more than %d MiB", MaxResponseBytes>>20)
	}
	return resp, answer, err
}

// bearer holds the API key.
type bearer struct{ key string }

func (c *Client) authorize(r *http.Request) {
	r.Header.Set("Authorization", "Bearer "+c.key.key)
}

// classify: the caller's cancellation as is (wrapped), our own deadline as SYS1_TIMEOUT, a
// transport failure as SYS1_PROVIDER_UNAVAILABLE, a classified *contract.Error unchanged.
func (c *Client) classify(caller, call context.Context, err error) error {
	if cerr := caller.Err(); cerr != nil {
		return fmt.Errorf("systemone: evaluate abandoned by the caller: %w", cerr)
	}
	if errors.Is(context.Cause(call), errCallTimeout) {
		return contract.Wrap(contract.CodeTimeout, err, "systemone did not answer within %s (%s)", c.timeout, VarTimeout)
	}
	if _, ok := contract.AsError(err); ok {
		return err
	}
	reason, timeout := upstream.TransportFailure(err)
	if timeout {
		return contract.Wrap(contract.CodeTimeout, err, "systemone timed out at the network level")
	}
	return contract.Wrap(contract.CodeProviderUnavailable, err, "systemone is unavailable: %s", reason)
}

// checkStatus maps a non-2xx answer to its SPEC §5 code. Messages name the provider and the
// status, never the answer's body: upstream error text (a gateway's internals) reaches only
// the operator's log (logCall), never the producer's reply.
func (c *Client) checkStatus(resp *http.Response, model string) error {
	status := resp.StatusCode
	if status >= 200 && status <= 299 {
		return nil
	}
	switch {
	case status == http.StatusBadRequest, status == http.StatusUnprocessableEntity:
		return contract.Errorf(contract.CodeInvalidRequest, "systemone rejected the request (HTTP %d)", status)
	case status == http.StatusUnauthorized:
		return contract.Errorf(contract.CodeNotConfigured, "systemone refused the API key (HTTP 401); check %s", VarAPIKey)
	case status == http.StatusForbidden:
		return contract.Errorf(contract.CodeNotConfigured, "systemone refused access to model %q with this API key (HTTP 403); check %s and %s", model, VarAPIKey, VarModels)
	case status == http.StatusNotFound:
		return contract.Errorf(contract.CodeModelUnavailable, "model %q is not available on systemone (HTTP 404)", model)
	case status == http.StatusRequestTimeout:
		return contract.Errorf(contract.CodeTimeout, "systemone gave up on the request (HTTP 408)")
	case status == http.StatusRequestEntityTooLarge:
		return contract.Errorf(contract.CodeRequestTooLarge, "systemone refused the request as too large (HTTP 413)")
	case status == http.StatusTooManyRequests, status == http.StatusServiceUnavailable, status == 529:
		// 529 is the "overloaded" status of Anthropic-style hosted APIs, Jev's among them.
		after := upstream.RetryAfter(resp.Header, c.now())
		hint := ""
		if after > 0 {
			hint = fmt.Sprintf("; retry after %s", after)
		}
		e := contract.Errorf(contract.CodeProviderBusy, "systemone is busy (HTTP %d)%s", status, hint)
		e.RetryAfter = after
		return e
	case status >= 300 && status <= 399:
		// Following would send the key wherever Location says; the base URL is wrong.
		return contract.Errorf(contract.CodeNotConfigured, "systemone answered with a redirect (HTTP %d), which is not followed; check %s", status, VarBaseURL)
	default:
		return contract.Errorf(contract.CodeUpstreamError, "systemone failed (HTTP %d)", status)
	}
}

// upstreamText is the upstream error message, safe to keep: bounded, one line, without the
// API key, the base URL or the host.
func (c *Client) upstreamText(body []byte) string {
	return upstream.Text(body, append([]string{c.key.key}, c.redact...)...)
}

// logCall writes one line per call, with the host: debug on success, a warning on failure.
// No content, no key, no upstream text (a gateway can echo the request in its error body).
func (c *Client) logCall(ctx context.Context, resp *http.Response, sent, received int, took time.Duration, err error, upstreamText string) {
	log := upstream.Logger(ctx, &c.log)
	ev := log.Debug()
	if _, ok := contract.AsError(err); ok {
		ev = log.Warn()
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
				ev = ev.Str("error", e.Message) // our own words: a transport failure or a timeout
			}
		} else {
			ev = ev.Str("error", err.Error())
		}
	}
	if upstreamText != "" {
		// The upstream's own words, redacted, bounded and with the request's content masked:
		// for the operator only, never in a reply or record.
		ev = ev.Str("upstream_error", upstreamText)
	}
	ev.Msg("systemone call")
}

var (
	_ provider.Provider      = (*Client)(nil)
	_ provider.ModelDigester = (*Client)(nil)
)
