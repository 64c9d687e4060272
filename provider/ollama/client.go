// Package ollama is the provider adapter for Ollama's System One endpoint
// (POST {base}/v1/systemone).
//
// It sends the resolved request encoded in order (questions and options keep their order on
// the wire), bounds every call by SYS1_TIMEOUT_MS merged with the caller's context, validates
// the answer against the response contract and maps every failure to a SPEC §5 code. It never
// retries and never follows redirects: retry policy belongs to the worker, and a redirect
// means a misconfigured base URL. The optional API key is sent as a bearer token and appears
// in no error, log line or record.
package ollama

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/provider"
)

// Name is the provider name that goes into replies and run records.
const Name = "ollama"

// Limits of the adapter.
const (
	// MaxResponseBytes bounds an answer's body; a bigger one is SYS1_UPSTREAM_ERROR.
	MaxResponseBytes = 16 << 20
	// maxErrorBodyBytes bounds how much of an error body is read to find its message.
	maxErrorBodyBytes = 64 << 10
	// MinVersion is the first Ollama release with System One.
	MinVersion = "0.35.0"
	// DefaultModel is SYS1_MODEL's default, used by Probe when no model is given.
	DefaultModel = "nimble"
	// maxProbeTimeout bounds each probe request: health checks must answer fast even when
	// SYS1_TIMEOUT_MS is generous.
	maxProbeTimeout = 10 * time.Second
)

// errCallTimeout is the cause of our own per-call deadline; it tells it apart from the
// caller's cancellation or deadline.
var errCallTimeout = errors.New("ollama: SYS1_TIMEOUT_MS elapsed")

// Client is the Ollama provider. It is safe for concurrent use.
type Client struct {
	base     string // display form: scheme://host/path, no credentials
	endpoint string // {base}/v1/systemone
	version  string // {base}/api/version
	tags     string // {base}/api/tags
	apiKey   Secret
	timeout  time.Duration
	model    string
	http     *http.Client
	log      zerolog.Logger

	mu     sync.Mutex
	models []string // from the last successful probe
}

// Option configures a Client.
type Option func(*options)

type options struct {
	model    string
	maxConns int
	log      zerolog.Logger
	client   *http.Client
}

// WithModel sets the default model (SYS1_MODEL) that Probe looks for.
func WithModel(model string) Option { return func(o *options) { o.model = model } }

// WithMaxConns sizes the keep-alive pool; pass the worker's concurrency so every in-flight
// call can reuse a warm connection.
func WithMaxConns(n int) Option { return func(o *options) { o.maxConns = n } }

// WithLogger sets the logger. The adapter logs at debug level only and never logs request
// content, response content or the API key.
func WithLogger(l zerolog.Logger) Option { return func(o *options) { o.log = l } }

// WithHTTPClient replaces the HTTP client (tests). Its redirect policy is overridden: the
// adapter never follows redirects.
func WithHTTPClient(c *http.Client) Option { return func(o *options) { o.client = c } }

// New builds the adapter. A bad configuration returns an error naming every bad variable.
func New(cfg Config, opts ...Option) (*Client, error) {
	if errs := cfg.Validate(); len(errs) > 0 {
		return nil, fmt.Errorf("ollama provider: %w", errors.Join(errs...))
	}
	u, _ := cfg.parseBaseURL()
	timeout, _ := cfg.timeout()
	o := options{model: DefaultModel, maxConns: 16, log: zerolog.Nop()}
	for _, opt := range opts {
		opt(&o)
	}
	if o.maxConns < 1 {
		o.maxConns = 1
	}
	hc := o.client
	if hc == nil {
		hc = &http.Client{Transport: newTransport(o.maxConns)}
	} else {
		copied := *hc
		hc = &copied
	}
	hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	base := u.String()
	return &Client{
		base:     displayURL(u),
		endpoint: base + "/v1/systemone",
		version:  base + "/api/version",
		tags:     base + "/api/tags",
		apiKey:   cfg.APIKey,
		timeout:  timeout,
		model:    o.model,
		http:     hc,
		log:      o.log.With().Str("provider", Name).Logger(),
	}, nil
}

// newTransport is http.DefaultTransport's settings with the idle pool sized to the worker's
// concurrency (the default keeps 2 idle connections per host, which makes a busy worker open
// and close connections on every call).
func newTransport(maxConns int) *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = maxConns + 4 // room for probes
	t.MaxIdleConnsPerHost = maxConns + 4
	t.IdleConnTimeout = 90 * time.Second
	return t
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
		err = c.checkStatus(resp, answer, req.Model)
	}
	var out *contract.Response
	if err == nil {
		var derr *contract.Error
		out, derr = contract.DecodeResponse(req, answer)
		if derr != nil {
			err = contract.Wrap(contract.CodeUpstreamError, fmt.Errorf("%w: %w", provider.ErrMalformed, derr),
				"ollama at %s answered with a body that breaks the response contract: %s", c.base, trimCode(derr.Message))
		}
	}
	if err != nil {
		err = c.classify(ctx, callCtx, err)
	}
	c.logCall(ctx, resp, len(body), len(answer), time.Since(start), err)
	if err != nil {
		return nil, err
	}
	return out, nil
}

// post sends the body and reads the whole answer (bounded). A non-2xx answer's body is read up
// to maxErrorBodyBytes only.
func (c *Client) post(ctx context.Context, body []byte) (*http.Response, []byte, error) {
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, c.endpoint, bytes.NewReader(body))
	if err != nil {
		return nil, nil, contract.Wrap(contract.CodeNotConfigured, err, "cannot build a request to ollama at %s", c.base)
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Accept", "application/json")
	hreq.Header.Set("User-Agent", "sys1")
	c.authorize(hreq)
	resp, err := c.http.Do(hreq)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	limit := int64(MaxResponseBytes)
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		limit = maxErrorBodyBytes
	} else if resp.ContentLength > MaxResponseBytes {
		return resp, nil, c.tooLarge()
	}
	answer, err := readBounded(resp.Body, resp.ContentLength, limit)
	if err != nil {
		if errors.Is(err, errTooLarge) {
			if limit == MaxResponseBytes {
				return resp, nil, c.tooLarge()
			}
			// an error body is only read for its message: a truncated one is fine
			return resp, answer, nil
		}
		return resp, nil, err
	}
	return resp, answer, nil
}

func (c *Client) tooLarge() error {
	return contract.Errorf(contract.CodeUpstreamError, "ollama at %s answered with more than %d MiB", c.base, MaxResponseBytes>>20)
}

func (c *Client) authorize(r *http.Request) {
	if c.apiKey != "" {
		r.Header.Set("Authorization", "Bearer "+c.apiKey.Reveal())
	}
}

var errTooLarge = errors.New("body over the limit")

// readBounded reads at most limit bytes; more is errTooLarge (with the first limit bytes).
// It allocates once when the length is announced.
func readBounded(r io.Reader, announced, limit int64) ([]byte, error) {
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
		return buf.Bytes()[:limit], errTooLarge
	}
	return buf.Bytes(), nil
}

// classify turns a failure into what Evaluate returns: the caller's cancellation as is
// (wrapped), our own deadline as SYS1_TIMEOUT, a transport failure as
// SYS1_PROVIDER_UNAVAILABLE, and an already classified *contract.Error unchanged.
func (c *Client) classify(caller, call context.Context, err error) error {
	if cerr := caller.Err(); cerr != nil {
		return fmt.Errorf("ollama: evaluate abandoned by the caller: %w", cerr)
	}
	if errors.Is(context.Cause(call), errCallTimeout) {
		return contract.Wrap(contract.CodeTimeout, err, "ollama at %s did not answer within %s (SYS1_TIMEOUT_MS)", c.base, c.timeout)
	}
	if _, ok := contract.AsError(err); ok {
		return err
	}
	return c.transportError(err)
}

// transportError maps a connection-level failure. The message names the kind of failure,
// never the underlying error text (which can carry URLs).
func (c *Client) transportError(err error) *contract.Error {
	var dnsErr *net.DNSError
	var opErr *net.OpError
	var netErr net.Error
	reason := "the connection failed"
	switch {
	case errors.As(err, &dnsErr):
		reason = "its host name does not resolve"
	case isConnRefused(err):
		reason = "the connection was refused"
	case isConnReset(err), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		reason = "the connection was closed before an answer"
	case errors.As(err, &opErr) && opErr.Op == "dial":
		reason = "the connection could not be opened"
	case errors.As(err, &netErr) && netErr.Timeout():
		return contract.Wrap(contract.CodeTimeout, err, "ollama at %s timed out at the network level", c.base)
	}
	return contract.Wrap(contract.CodeProviderUnavailable, err, "ollama at %s is unavailable: %s", c.base, reason)
}

// logCall writes one debug line per call: sizes, status, latency and the code. No content.
// A logger on ctx (the worker puts the run's there) wins, so the line carries the run_id.
func (c *Client) logCall(ctx context.Context, resp *http.Response, sent, received int, took time.Duration, err error) {
	log := &c.log
	if l := zerolog.Ctx(ctx); l != zerolog.DefaultContextLogger && l.GetLevel() != zerolog.Disabled {
		log = l
	}
	ev := log.Debug()
	if !ev.Enabled() {
		return
	}
	ev = ev.Int("request_bytes", sent).Int("response_bytes", received).Int64("latency_ms", took.Milliseconds())
	if resp != nil {
		ev = ev.Int("http_status", resp.StatusCode)
	}
	if err != nil {
		if e, ok := contract.AsError(err); ok {
			// The code only: the message may quote upstream's error body, and a proxy can echo
			// the request (state, instructions) there. The message is in the attempt's detail
			// in the reply and the record, where the request's content already lives.
			ev = ev.Str("error_code", string(e.Code))
		} else {
			ev = ev.Str("error", err.Error())
		}
	}
	ev.Msg("ollama call")
}

// trimCode strips a "[SYS1_…] " prefix so a nested contract error reads as one message.
func trimCode(msg string) string {
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

var _ provider.Provider = (*Client)(nil)
