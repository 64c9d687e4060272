// Package systemonetest is an in-process fake of a hosted System One server (TypeSafe's Jev
// at api.typesafe.ai, a LiteLLM proxy route, another sys1-compatible gateway), for the tests
// of provider/systemone and of the provider chain.
//
// It is the fake Ollama (provider/ollamatest) behind what a hosted API adds: every route
// requires "Authorization: Bearer <key>" (401 otherwise, with a hosted-style error body),
// GET /v1/models lists the models with their versions (OpenAI's list shape plus a version
// field), GET /health answers for custom probes, and faults are programmable the way a
// hosted API fails: 401, 403, 429/503/529 with Retry-After or retry-after-ms, 5xx, a
// redirect, slow answers, hangs, dropped connections and malformed answers. A valid POST
// /v1/systemone is forwarded to the wrapped fake Ollama, which enforces the request contract
// (400 on a bad body, 413 on a big one, 404 on an unknown model) and answers
// deterministically.
//
//	srv := systemonetest.New(t)                     // closed on t.Cleanup
//	srv.Fail(1, systemonetest.Busy(429, "3"))       // the next call answers 429
//	... point the adapter at srv.URL() with systemonetest.DefaultKey ...
package systemonetest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sys1hq/sys1/provider/ollamatest"
)

// DefaultKey is the API key the fake accepts unless told otherwise.
const DefaultKey = "sk-systemone-test-0f3c9a7e51d2"

// Model is one model the fake serves.
type Model struct {
	ID string
	// Version is what GET /v1/models reports as the model's version; empty leaves the field
	// out (a gateway that tells no version).
	Version string
}

// DefaultModels are the models the fake serves unless told otherwise.
var DefaultModels = []Model{{ID: "jev-1.13.0", Version: "1.13.0"}, {ID: "jev-lite", Version: "2026-09-15.2"}}

// Recorded is one request the fake received (refused ones too).
type Recorded struct {
	Method string
	Path   string
	Header http.Header
	Body   []byte
	At     time.Time
}

// Option configures a Server.
type Option func(*Server)

// WithAPIKey sets the one key the fake accepts.
func WithAPIKey(key string) Option { return func(s *Server) { s.key = key } }

// WithModels sets the models served (and listed by GET /v1/models).
func WithModels(models ...Model) Option {
	return func(s *Server) { s.models = append([]Model(nil), models...) }
}

// WithoutModelsList makes GET /v1/models answer 404, like a gateway that does not offer it.
func WithoutModelsList() Option { return func(s *Server) { s.noList = true } }

// WithLatency delays every answer of the wrapped fake by d.
func WithLatency(d time.Duration) Option { return func(s *Server) { s.latency = d } }

// Server is a running fake. All methods are safe for concurrent use.
type Server struct {
	ts      *httptest.Server
	inner   *ollamatest.Server
	proxy   *httputil.ReverseProxy
	key     string
	latency time.Duration

	mu      sync.Mutex
	models  []Model
	noList  bool
	queue   []queued
	always  *Fault
	records []Recorded

	// exclusive: a malformed answer is made by the wrapped fake, which takes faults from one
	// queue; while one is delivered no other call is forwarded, so it reaches its own call.
	exclusive sync.RWMutex

	calls     atomic.Int64
	inFlight  atomic.Int64
	done      chan struct{}
	closeOnce sync.Once
}

type queued struct {
	left  int
	fault Fault
}

// New starts a fake for a test and closes it when tb ends.
func New(tb testing.TB, opts ...Option) *Server {
	tb.Helper()
	s := NewServer(opts...)
	tb.Cleanup(s.Close)
	return s
}

// NewServer starts a fake outside a test; the caller must Close it.
func NewServer(opts ...Option) *Server {
	s := &Server{key: DefaultKey, models: append([]Model(nil), DefaultModels...), done: make(chan struct{})}
	for _, o := range opts {
		o(s)
	}
	s.inner = ollamatest.NewServer(ollamatest.WithModels(s.modelIDs()...), ollamatest.WithLatency(s.latency))
	target, _ := url.Parse(s.inner.URL())
	s.proxy = &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(target)
			r.Out.Header.Del("Authorization") // the wrapped fake needs no key
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if r.Context().Err() != nil {
				return // the client went away
			}
			writeError(w, http.StatusBadGateway, "api_error", "upstream engine failed")
		},
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/systemone", s.handleSystemOne)
	mux.HandleFunc("GET /v1/models", s.handleModels)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	s.ts = httptest.NewServer(s.authenticate(mux))
	return s
}

// URL is the base URL, what SYS1_SYSTEMONE_BASE_URL would hold.
func (s *Server) URL() string { return s.ts.URL }

// Key is the API key the fake accepts.
func (s *Server) Key() string { return s.key }

// Inner is the wrapped fake Ollama (its counters, its recorded bodies).
func (s *Server) Inner() *ollamatest.Server { return s.inner }

// Close stops the server, releasing hanging calls first. It is idempotent.
func (s *Server) Close() {
	s.closeOnce.Do(func() {
		close(s.done)
		s.ts.Close()
		s.inner.Close()
	})
}

// Calls is the number of POST /v1/systemone requests received, refused ones included.
func (s *Server) Calls() int64 { return s.calls.Load() }

// InFlight is the number of POST /v1/systemone requests being answered now.
func (s *Server) InFlight() int64 { return s.inFlight.Load() }

// Requests returns every request received, oldest first.
func (s *Server) Requests() []Recorded {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Recorded(nil), s.records...)
}

// CountPath is how many requests went to path.
func (s *Server) CountPath(path string) int {
	n := 0
	for _, r := range s.Requests() {
		if r.Path == path {
			n++
		}
	}
	return n
}

// ResetStats forgets the recorded requests and zeroes the call count.
func (s *Server) ResetStats() {
	s.calls.Store(0)
	s.mu.Lock()
	s.records = nil
	s.mu.Unlock()
	s.inner.ResetStats()
}

// SetModels changes the models served and listed (a new Version is a new model build).
func (s *Server) SetModels(models ...Model) {
	s.mu.Lock()
	s.models = append([]Model(nil), models...)
	ids := s.modelIDsLocked()
	s.mu.Unlock()
	s.inner.SetModels(ids...)
}

// SetModelsList turns GET /v1/models on (offered) or off (404).
func (s *Server) SetModelsList(offered bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.noList = !offered
}

// Fail makes the next n POST /v1/systemone calls answer with fault (after those queued before).
func (s *Server) Fail(n int, fault Fault) {
	if n <= 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.queue = append(s.queue, queued{left: n, fault: fault})
}

// FailAlways makes every call without a queued fault answer with fault, until Heal.
func (s *Server) FailAlways(fault Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.always = &fault
}

// Heal removes every queued and permanent fault.
func (s *Server) Heal() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.queue, s.always = nil, nil
}

// AwaitInFlight blocks until exactly n calls are in flight, or ctx ends. It polls: the fake's
// own signal is not worth the code for a handful of test waits.
func (s *Server) AwaitInFlight(ctx context.Context, n int64) error {
	t := time.NewTicker(time.Millisecond)
	defer t.Stop()
	for s.inFlight.Load() != n {
		select {
		case <-t.C:
		case <-ctx.Done():
			return fmt.Errorf("systemonetest: waiting for %d calls in flight (now %d): %w", n, s.inFlight.Load(), ctx.Err())
		}
	}
	return nil
}

func (s *Server) modelIDs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.modelIDsLocked()
}

func (s *Server) modelIDsLocked() []string {
	ids := make([]string, len(s.models))
	for i, m := range s.models {
		ids[i] = m.ID
	}
	return ids
}

func (s *Server) nextFault() (Fault, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.queue) > 0 {
		f := s.queue[0].fault
		s.queue[0].left--
		if s.queue[0].left == 0 {
			s.queue = s.queue[1:]
		}
		return f, true
	}
	if s.always != nil {
		return *s.always, true
	}
	return Fault{}, false
}

func (s *Server) record(r *http.Request, body []byte) {
	rec := Recorded{Method: r.Method, Path: r.URL.Path, Header: r.Header.Clone(), Body: body, At: time.Now()}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.records) < 4096 {
		s.records = append(s.records, rec)
	}
}

// authenticate requires the bearer key on every route, as hosted APIs do.
func (s *Server) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth := r.Header.Get("Authorization")
		switch {
		case auth == "":
			s.refuse(w, r, http.StatusUnauthorized, "authentication_error", "missing API key: send Authorization: Bearer <key>")
		case auth != "Bearer "+s.key:
			s.refuse(w, r, http.StatusUnauthorized, "authentication_error", "invalid API key")
		default:
			next.ServeHTTP(w, r)
		}
	})
}

func (s *Server) refuse(w http.ResponseWriter, r *http.Request, status int, kind, msg string) {
	if r.Method == http.MethodPost && r.URL.Path == "/v1/systemone" {
		s.calls.Add(1)
	}
	s.record(r, nil)
	writeError(w, status, kind, msg)
}

func (s *Server) handleModels(w http.ResponseWriter, r *http.Request) {
	s.record(r, nil)
	s.mu.Lock()
	models, noList := append([]Model(nil), s.models...), s.noList
	s.mu.Unlock()
	if noList {
		writeError(w, http.StatusNotFound, "not_found_error", "no route GET /v1/models")
		return
	}
	type entry struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		OwnedBy string `json:"owned_by"`
		Version string `json:"version,omitempty"`
	}
	out := struct {
		Object string  `json:"object"`
		Data   []entry `json:"data"`
	}{Object: "list", Data: []entry{}}
	for _, m := range models {
		out.Data = append(out.Data, entry{ID: m.ID, Object: "model", Created: 1767225600, OwnedBy: "typesafe", Version: m.Version})
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) handleSystemOne(w http.ResponseWriter, r *http.Request) {
	s.calls.Add(1)
	s.inFlight.Add(1)
	defer s.inFlight.Add(-1)
	body, err := io.ReadAll(io.LimitReader(r.Body, ollamatest.MaxBodyWithImages+1))
	if err != nil {
		return // the client went away mid-body
	}
	s.record(r, body)
	fault, faulty := s.nextFault()
	if fault.Delay > 0 && !s.wait(w, r, fault.Delay) {
		return
	}
	if faulty {
		switch {
		case fault.Hang:
			select {
			case <-r.Context().Done():
			case <-s.done:
				dropConnection(w)
			}
			return
		case fault.Drop:
			dropConnection(w)
			return
		case fault.Status != 0:
			writeFault(w, fault)
			return
		}
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	if faulty && fault.Malformed != ollamatest.MalformedNone {
		s.exclusive.Lock()
		defer s.exclusive.Unlock()
		s.inner.Fail(1, ollamatest.Malformed(fault.Malformed))
	} else {
		s.exclusive.RLock()
		defer s.exclusive.RUnlock()
	}
	s.proxy.ServeHTTP(w, r)
}

func (s *Server) wait(w http.ResponseWriter, r *http.Request, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-r.Context().Done():
		return false
	case <-s.done:
		dropConnection(w)
		return false
	}
}

func dropConnection(w http.ResponseWriter) {
	hj, ok := w.(http.Hijacker)
	if !ok {
		panic("systemonetest: response writer cannot hijack") // httptest's HTTP/1.1 server always can
	}
	conn, _, err := hj.Hijack()
	if err != nil {
		return
	}
	_ = conn.Close()
}

func writeFault(w http.ResponseWriter, f Fault) {
	for k, vs := range f.Header {
		for _, v := range vs {
			w.Header().Add(k, v)
		}
	}
	if f.RetryAfter != "" {
		w.Header().Set("Retry-After", f.RetryAfter)
	}
	if f.RetryAfterMS != "" {
		w.Header().Set("Retry-After-Ms", f.RetryAfterMS)
	}
	if f.Body != "" {
		ct := f.ContentType
		if ct == "" {
			ct = "application/json"
		}
		w.Header().Set("Content-Type", ct)
		w.Header().Set("Content-Length", strconv.Itoa(len(f.Body)))
		w.WriteHeader(f.Status)
		_, _ = io.WriteString(w, f.Body)
		return
	}
	kind, msg := defaultError(f.Status)
	writeError(w, f.Status, kind, msg)
}

// defaultError is a hosted API's error type and text for a status.
func defaultError(status int) (kind, msg string) {
	switch status {
	case http.StatusUnauthorized:
		return "authentication_error", "invalid API key"
	case http.StatusForbidden:
		return "permission_error", "this API key may not use this model"
	case http.StatusTooManyRequests:
		return "rate_limit_error", "rate limit exceeded for this API key"
	case http.StatusServiceUnavailable:
		return "overloaded_error", "the service is temporarily unavailable"
	case 529:
		return "overloaded_error", "overloaded"
	case http.StatusBadRequest:
		return "invalid_request_error", "malformed request body"
	case http.StatusUnprocessableEntity:
		return "invalid_request_error", "questions.q: a score needs at least two levels"
	case http.StatusRequestEntityTooLarge:
		return "request_too_large", "request exceeds the maximum size"
	case http.StatusNotFound:
		return "not_found_error", "model does not exist"
	}
	if status >= 500 {
		return "api_error", "internal server error"
	}
	return "api_error", http.StatusText(status)
}

// writeError writes the hosted error shape: {"error":{"type":…,"message":…}}.
func writeError(w http.ResponseWriter, status int, kind, msg string) {
	writeJSON(w, status, map[string]map[string]string{"error": {"type": kind, "message": msg}})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // only fixed shapes are written
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.Header().Set("X-Request-Id", "req_"+strconv.FormatInt(time.Now().UnixNano(), 36))
	w.WriteHeader(status)
	_, _ = w.Write(b)
}
