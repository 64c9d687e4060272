// Package ollamatest is an in-process fake Ollama that enforces the upstream System One
// contract. Every package that talks to Ollama tests against it instead of a mock.
//
// The fake validates requests by Ollama's rules with its own ordered decoder (independent of
// package contract, so it catches encoding bugs), enforces the 64 KiB / 32 MiB body limits,
// and answers deterministically from model, state, question names and options (see
// provider/internal/synth). Faults (error statuses, malformed answers, hangs, dropped
// connections, latency) are programmable per call, for the next N calls, or per model, as
// Ollama fails (FailModel). It counts calls (in all and per model), the calls in flight and
// the most ever in flight, records what it received, and can report
// every call as it ends — answered, failed as told, or abandoned by its client (WithCallLog).
//
// By default it serves any number of calls at once. WithCapacity turns on a realistic
// serving model instead: a few slots, a FIFO queue behind them and a service time that grows
// with questions × state size, like one Ollama with its model loaded (see Capacity).
//
//	srv := ollamatest.New(t)                         // closed on t.Cleanup
//	srv.Fail(2, ollamatest.Busy(429, "3"))          // the next two calls answer 429
//	... point the adapter at srv.URL() ...
//	srv.MaxConcurrent()                              // concurrency bound reached
package ollamatest

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sys1hq/sys1/provider/internal/synth"
)

// DefaultVersion is the Ollama version the fake reports unless told otherwise.
const DefaultVersion = "0.40.12"

// DefaultModels are the models the fake has "pulled" unless told otherwise.
var DefaultModels = []string{"nimble:latest"}

// DefaultRecordLimit is how many requests the fake keeps by default (the most recent ones).
const DefaultRecordLimit = 1024

// Recorded is one request the fake received.
type Recorded struct {
	Method string
	Path   string
	Header http.Header
	Body   []byte
	At     time.Time
}

// Field returns a top-level field of the JSON body, raw, and whether it was present.
func (r Recorded) Field(name string) (json.RawMessage, bool) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(r.Body, &fields); err != nil {
		return nil, false
	}
	v, ok := fields[name]
	return v, ok
}

// Question is one question of a recorded request, as the fake decoded it.
type Question struct {
	Name string
	Type string
	// Keys are choice option keys or score level labels, in the order received.
	Keys []string
}

// Questions decodes the recorded body with the fake's ordered decoder and returns its
// questions in the order they arrived on the wire.
func (r Recorded) Questions() ([]Question, error) {
	req, err := decodeRequest(r.Body)
	if err != nil {
		return nil, err
	}
	out := make([]Question, len(req.Questions))
	for i, q := range req.Questions {
		out[i] = Question{Name: q.Name, Type: q.Type, Keys: q.Keys}
	}
	return out, nil
}

// Option configures a Server.
type Option func(*Server)

// WithVersion sets the version GET /api/version reports.
func WithVersion(v string) Option { return func(s *Server) { s.version = v } }

// WithModels sets the models that exist (GET /api/tags, and the ones /v1/systemone accepts).
// "nimble" and "nimble:latest" name the same model.
func WithModels(models ...string) Option {
	return func(s *Server) { s.models = append([]string(nil), models...) }
}

// WithLatency delays every System One answer by d (honouring the request's context).
func WithLatency(d time.Duration) Option { return func(s *Server) { s.latency.Store(int64(d)) } }

// WithRecordLimit keeps at most n received requests (the most recent); 0 turns recording off,
// which benchmarks want.
func WithRecordLimit(n int) Option { return func(s *Server) { s.recordLimit = n } }

// WithRecording turns recording on (with DefaultRecordLimit) or off.
func WithRecording(on bool) Option {
	return func(s *Server) {
		s.recordLimit = 0
		if on {
			s.recordLimit = DefaultRecordLimit
		}
	}
}

// Call is one POST /v1/systemone as the fake answered it, reported to WithCallLog when the call
// ends. A soak counts each run's calls from these: how often the model scored it, and which
// calls were failures it was told to fake or answers no client was left to read.
type Call struct {
	// Started is when the call arrived; Ended when the fake was done with it.
	Started, Ended time.Time
	// Body is the request body; it is valid only during the callback (copy what you keep).
	Body []byte
	// Status is the HTTP status answered; 0 when none was (the connection was dropped, or the
	// client went away before the answer).
	Status int
	// Answered is true when a 200 with a whole answer was written while the client was still
	// there: the model scored the request and the caller could read it.
	Answered bool
	// Fault names what was done instead of a plain answer ("" for none): "status 503",
	// "hang", "drop", "delay 2s", "malformed", "client gone".
	Fault string
}

// WithCallLog reports every System One call to log when it ends, from the handler's
// goroutine: log must be quick and safe for concurrent use. Unlike recording it keeps no
// bodies, so a long run can count every call.
func WithCallLog(log func(Call)) Option { return func(s *Server) { s.callLog = log } }

// WithAPIKey makes the fake require "Authorization: Bearer <key>" like Ollama behind an
// authenticating proxy or ollama.com; other requests get 401.
func WithAPIKey(key string) Option { return func(s *Server) { s.apiKey = key } }

// Server is a running fake Ollama. All methods are safe for concurrent use.
type Server struct {
	ts *httptest.Server

	version     string
	models      []string
	apiKey      string
	recordLimit int
	latency     atomic.Int64
	capacity    *capacityQueue // nil: every call is served at once
	callLog     func(Call)     // nil: calls are not reported
	busy        atomic.Int64   // nanoseconds spent serving /v1/systemone calls, summed
	lateness    atomic.Int64   // recent average timer lateness, in nanoseconds (see wait)

	mu     sync.Mutex
	rules  []rule
	queue  []queuedFault
	always *Fault
	// modelFaults are FailModel's, by canonical model name; modelCalls counts valid calls
	// by canonical model name (CallsFor).
	modelFaults map[string]Fault
	modelCalls  map[string]int64
	// records is a ring of the last recordLimit requests; next is where the next one goes.
	records []Recorded
	next    int

	calls    atomic.Int64
	conns    atomic.Int64
	inFlight atomic.Int64
	// inFlightChanged is closed (and replaced) whenever inFlight changes: AwaitInFlight's
	// signal, so tests wait on the event instead of polling.
	inFlightMu      sync.Mutex
	inFlightChanged chan struct{}
	maxInFlight     atomic.Int64

	done      chan struct{} // closed by Close: releases hanging handlers
	closeOnce sync.Once
}

type rule struct {
	match func(body []byte) bool
	fault Fault
}

type queuedFault struct {
	left  int
	fault Fault
}

// New starts a fake Ollama for a test or benchmark and closes it when tb ends.
func New(tb testing.TB, opts ...Option) *Server {
	tb.Helper()
	s := NewServer(opts...)
	tb.Cleanup(s.Close)
	return s
}

// NewServer starts a fake Ollama outside a test (the bench command runs one in-process).
// The caller must Close it.
func NewServer(opts ...Option) *Server {
	s := &Server{
		version:     DefaultVersion,
		models:      append([]string(nil), DefaultModels...),
		recordLimit: DefaultRecordLimit,
		done:        make(chan struct{}),
	}
	for _, o := range opts {
		o(s)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/systemone", s.handleSystemOne)
	mux.HandleFunc("GET /api/version", s.handleVersion)
	mux.HandleFunc("GET /api/tags", s.handleTags)
	s.ts = httptest.NewUnstartedServer(s.authenticate(mux))
	s.ts.Config.ConnState = func(_ net.Conn, state http.ConnState) {
		if state == http.StateNew {
			s.conns.Add(1)
		}
	}
	s.ts.Start()
	return s
}

// URL is the base URL (http://127.0.0.1:port), what SYS1_OLLAMA_BASE_URL would hold.
func (s *Server) URL() string { return s.ts.URL }

// Close stops the server, first releasing any hanging handlers. It is idempotent.
func (s *Server) Close() {
	s.closeOnce.Do(func() {
		close(s.done)
		s.ts.Close()
	})
}

// Calls is the number of POST /v1/systemone requests received.
func (s *Server) Calls() int64 { return s.calls.Load() }

// Connections is the number of TCP connections clients opened; with keep-alive working it
// stays at the client's concurrency however many calls are made.
func (s *Server) Connections() int64 { return s.conns.Load() }

// InFlight is the number of System One calls being answered right now.
func (s *Server) InFlight() int64 { return s.inFlight.Load() }

// MaxConcurrent is the largest number of System One calls ever in flight at once.
func (s *Server) MaxConcurrent() int64 { return s.maxInFlight.Load() }

// SetLatency changes the delay of every later System One answer.
func (s *Server) SetLatency(d time.Duration) { s.latency.Store(int64(d)) }

// SetVersion changes what GET /api/version reports.
func (s *Server) SetVersion(v string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.version = v
}

// SetModels changes the models that exist.
func (s *Server) SetModels(models ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.models = append([]string(nil), models...)
}

// Fail makes the next n System One calls answer with fault (after any faults queued before).
func (s *Server) Fail(n int, fault Fault) {
	if n <= 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.queue = append(s.queue, queuedFault{left: n, fault: fault})
}

// FailAlways makes every System One call without a queued fault answer with fault.
func (s *Server) FailAlways(fault Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.always = &fault
}

// Heal removes every queued, conditional, per-model and permanent fault.
func (s *Server) Heal() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rules = nil
	s.queue = nil
	s.always = nil
	s.modelFaults = nil
}

// FailModel makes every System One call for model (Ollama's name: "x" is "x:latest") answer
// with fault, until Heal, the way Ollama fails per model: a model it has but cannot run (one
// too large for memory answers 500 while the others answer fine). So the fault comes after
// Ollama's own checks: an invalid request is still 400 and a model the server does not have
// still 404 (WithModels, SetModels). Queued, conditional and permanent faults (Fail, FailIf,
// FailAlways) come first.
func (s *Server) FailModel(model string, fault Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.modelFaults == nil {
		s.modelFaults = map[string]Fault{}
	}
	s.modelFaults[canonicalModel(model)] = fault
}

// CallsFor is the number of System One calls for model (Ollama's name) so far whose request
// passed Ollama's checks, whatever they were answered: 200, FailModel's fault, or 404 for a
// model the server does not have. A call answered by a queued, conditional or permanent
// fault never reaches those checks and is not counted (Calls counts every call).
// ResetStats zeroes it.
func (s *Server) CallsFor(model string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.modelCalls[canonicalModel(model)]
}

// validCall counts a call that passed the request checks and returns its model's fault.
func (s *Server) validCall(model string) (Fault, bool) {
	name := canonicalModel(model)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.modelCalls == nil {
		s.modelCalls = map[string]int64{}
	}
	s.modelCalls[name]++
	f, ok := s.modelFaults[name]
	return f, ok
}

// FailIf makes every System One call whose body satisfies match answer with fault, before any
// queued fault is considered, until Heal. With many concurrent callers it targets one
// request (by its state, say) where the order of Fail's queue would be a race.
func (s *Server) FailIf(match func(body []byte) bool, fault Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rules = append(s.rules, rule{match: match, fault: fault})
}

// Requests returns the recorded requests, oldest first.
func (s *Server) Requests() []Recorded {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Recorded, 0, len(s.records))
	if len(s.records) < s.recordLimit {
		return append(out, s.records...)
	}
	out = append(out, s.records[s.next:]...)
	return append(out, s.records[:s.next]...)
}

// SystemOneRequests returns the recorded POST /v1/systemone requests, oldest first.
func (s *Server) SystemOneRequests() []Recorded {
	var out []Recorded
	for _, r := range s.Requests() {
		if r.Path == "/v1/systemone" {
			out = append(out, r)
		}
	}
	return out
}

// BusyTime is the time spent serving /v1/systemone calls, summed over calls: divided by a
// wall-clock window and a number of slots, how busy the callers kept this provider. Unlike the
// attempts' whole-millisecond latency_ms it has no rounding. With WithCapacity it is the slot
// time only (time queued is not busy time), so divided by the window and Capacity.Slots it is
// the model's utilisation.
func (s *Server) BusyTime() time.Duration { return time.Duration(s.busy.Load()) }

// ResetStats zeroes the counters (not the in-flight gauge) and forgets recorded requests.
func (s *Server) ResetStats() {
	s.calls.Store(0)
	s.busy.Store(0)
	if q := s.capacity; q != nil {
		q.mu.Lock()
		q.stats = QueueStats{MaxWaiting: len(q.waiting)}
		q.notify()
		q.mu.Unlock()
	}
	s.maxInFlight.Store(s.inFlight.Load())
	s.mu.Lock()
	s.records = nil
	s.next = 0
	s.modelCalls = nil
	s.mu.Unlock()
}

func (s *Server) nextFault(body []byte) (Fault, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.rules {
		if r.match(body) {
			return r.fault, true
		}
	}
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
	if s.recordLimit <= 0 {
		return
	}
	rec := Recorded{Method: r.Method, Path: r.URL.Path, Header: r.Header.Clone(), Body: body, At: time.Now()}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.records) < s.recordLimit {
		s.records = append(s.records, rec)
		return
	}
	s.records[s.next] = rec // overwrite the oldest
	s.next = (s.next + 1) % s.recordLimit
}

func (s *Server) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.apiKey != "" && r.Header.Get("Authorization") != "Bearer "+s.apiKey {
			if r.URL.Path != "/v1/systemone" {
				s.record(r, nil)
			}
			writeError(w, http.StatusUnauthorized, "unauthorized")
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (s *Server) handleVersion(w http.ResponseWriter, r *http.Request) {
	s.record(r, nil)
	s.mu.Lock()
	v := s.version
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]string{"version": v})
}

type tagModel struct {
	Name       string    `json:"name"`
	Model      string    `json:"model"`
	ModifiedAt time.Time `json:"modified_at"`
	Size       int64     `json:"size"`
	Digest     string    `json:"digest"`
}

func (s *Server) handleTags(w http.ResponseWriter, r *http.Request) {
	s.record(r, nil)
	s.mu.Lock()
	models := append([]string(nil), s.models...)
	s.mu.Unlock()
	out := struct {
		Models []tagModel `json:"models"`
	}{Models: []tagModel{}}
	for i, m := range models {
		out.Models = append(out.Models, tagModel{
			Name: m, Model: m, ModifiedAt: time.Unix(1767225600, 0).UTC(),
			Size: 1 << 30, Digest: fmt.Sprintf("%064x", i+1),
		})
	}
	writeJSON(w, http.StatusOK, out)
}

// canonicalModel gives an untagged model name the implicit ":latest" tag, as Ollama does.
func canonicalModel(name string) string {
	name = strings.TrimSpace(name)
	if i := strings.LastIndexByte(name, '/'); i >= 0 {
		if !strings.Contains(name[i+1:], ":") {
			return name + ":latest"
		}
		return name
	}
	if !strings.Contains(name, ":") {
		return name + ":latest"
	}
	return name
}

func (s *Server) hasModel(name string) bool {
	want := canonicalModel(name)
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range s.models {
		if canonicalModel(m) == want {
			return true
		}
	}
	return false
}

func (s *Server) handleSystemOne(w http.ResponseWriter, r *http.Request) {
	arrived := time.Now()
	if s.capacity == nil {
		defer func() { s.busy.Add(int64(time.Since(arrived))) }()
	}
	s.calls.Add(1)
	cur := s.addInFlight(1)
	defer s.addInFlight(-1)
	for {
		old := s.maxInFlight.Load()
		if cur <= old || s.maxInFlight.CompareAndSwap(old, cur) {
			break
		}
	}

	body, err := io.ReadAll(io.LimitReader(r.Body, MaxBodyWithImages+1))
	if err != nil {
		return // the client went away mid-body
	}
	s.record(r, body)

	fault, faulty := s.nextFault(body)
	if s.callLog != nil {
		cw := &callWriter{ResponseWriter: w}
		w = cw
		defer func() { s.callLog(cw.call(arrived, body, r, fault, faulty)) }()
	}
	if !s.wait(w, r, arrived.Add(time.Duration(s.latency.Load())+fault.Delay)) {
		return
	}
	if faulty && s.misbehave(w, r, fault) {
		return
	}

	if len(body) > MaxBodyWithImages {
		writeError(w, http.StatusRequestEntityTooLarge, "request body too large")
		return
	}
	req, err := decodeRequest(body)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if req.Images == 0 && len(body) > MaxBodyNoImages {
		writeError(w, http.StatusRequestEntityTooLarge, "request body too large")
		return
	}
	modelFault, modelFails := s.validCall(req.Model)
	if !s.hasModel(req.Model) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("model '%s' not found", req.Model))
		return
	}
	if modelFails && !faulty {
		fault, faulty = modelFault, true
		if fault.Delay > 0 && !s.wait(w, r, time.Now().Add(fault.Delay)) {
			return
		}
		if s.misbehave(w, r, fault) {
			return
		}
	}
	if s.capacity != nil && !s.serve(w, r, len(req.Questions), len(req.State)) {
		return
	}

	if faulty && fault.Malformed == MalformedNotJSON {
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, "<html><body>502 Bad Gateway</body></html>")
		return
	}
	tokens := int64(len(body) / 4)
	if tokens < 1 {
		tokens = 1
	}
	out := synth.Append(make([]byte, 0, 256+len(req.Questions)*256), synth.Response{
		Model:        req.Model,
		State:        req.State,
		Questions:    req.Questions,
		InputTokens:  tokens,
		OutputTokens: 1,
		Corrupt:      fault.Malformed.corruption(),
	})
	if faulty && fault.Malformed == MalformedTruncated {
		out = out[:len(out)/2]
	}
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("Content-Length", strconv.Itoa(len(out)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(out)
}

// misbehave carries out a fault that replaces the answer (a hang, a dropped connection, an
// error status) and reports whether it did; a malformation or a delay alone leaves the
// answer to be written.
func (s *Server) misbehave(w http.ResponseWriter, r *http.Request, fault Fault) bool {
	switch {
	case fault.Hang:
		select {
		case <-r.Context().Done():
		case <-s.done:
			dropConnection(w) // a hung call ends as a broken connection, never as a 200
		}
		return true
	case fault.Drop:
		dropConnection(w)
		return true
	case fault.Status != 0:
		writeFault(w, fault)
		return true
	}
	return false
}

// wait sleeps for d unless the request or the server ends first; it reports whether to go on.
// A server closing mid-wait drops the connection so the client never reads an empty 200.
func (s *Server) wait(w http.ResponseWriter, r *http.Request, until time.Time) bool {
	// Timers fire late on a busy machine (by most of a millisecond on a loaded 2-core guest),
	// which would make every call slower than the latency asked for and charge the fake's
	// imprecision to whatever is measured through it. So each wait ends earlier by the
	// recent average lateness, and the lateness actually seen is folded back in.
	early := time.Duration(s.lateness.Load())
	d := time.Until(until) - early
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		s.noteLateness(time.Since(until.Add(-early)))
		return true
	case <-r.Context().Done():
		return false
	case <-s.done:
		dropConnection(w)
		return false
	}
}

// hold sleeps until until whatever the client does (a slot's service time), correcting for
// timer lateness like wait; it reports false when the server closed first.
func (s *Server) hold(until time.Time) bool {
	early := time.Duration(s.lateness.Load())
	d := time.Until(until) - early
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		s.noteLateness(time.Since(until.Add(-early)))
		return true
	case <-s.done:
		return false
	}
}

// maxLateness bounds one lateness sample. Timers run late by up to about a millisecond on
// a loaded machine; a longer delay is the goroutine being descheduled, which says nothing
// about the next timer. Unbounded, one stall longer than the waits themselves would make
// every later wait end at once, and with no wait left to sample the average never recovered.
const maxLateness = 2 * time.Millisecond

// noteLateness folds one timer's lateness into the recent average: an exponentially
// weighted average (1/16 of each new sample, each at most maxLateness), never negative.
func (s *Server) noteLateness(late time.Duration) {
	late = min(late, maxLateness)
	for {
		old := s.lateness.Load()
		next := max(old+(int64(late)-old)/16, 0)
		if s.lateness.CompareAndSwap(old, next) {
			return
		}
	}
}

func dropConnection(w http.ResponseWriter) {
	hj, ok := w.(http.Hijacker)
	if !ok {
		panic("ollamatest: response writer cannot hijack") // httptest's HTTP/1.1 server always can
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
	if f.Body != "" {
		ct := f.ContentType
		if ct == "" {
			ct = "application/json; charset=utf-8"
		}
		w.Header().Set("Content-Type", ct)
		w.Header().Set("Content-Length", strconv.Itoa(len(f.Body)))
		w.WriteHeader(f.Status)
		_, _ = io.WriteString(w, f.Body)
		return
	}
	writeError(w, f.Status, defaultMessage(f.Status))
}

func defaultMessage(status int) string {
	switch status {
	case http.StatusBadRequest:
		return "input length exceeds the model's context length"
	case http.StatusNotFound:
		return "model not found, try pulling it first"
	case http.StatusRequestEntityTooLarge:
		return "request body too large"
	case http.StatusTooManyRequests:
		return "server busy, please try again. maximum pending requests exceeded"
	case http.StatusServiceUnavailable:
		return "server overloaded, please retry"
	}
	return strings.ToLower(http.StatusText(status))
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"error": msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // only fixed shapes are written
	}
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// addInFlight changes the in-flight count and wakes AwaitInFlight.
func (s *Server) addInFlight(d int64) int64 {
	s.inFlightMu.Lock()
	defer s.inFlightMu.Unlock()
	n := s.inFlight.Add(d)
	if s.inFlightChanged != nil {
		close(s.inFlightChanged)
		s.inFlightChanged = nil
	}
	return n
}

// AwaitInFlight blocks until exactly n /v1/systemone calls are in flight, or ctx ends.
func (s *Server) AwaitInFlight(ctx context.Context, n int64) error {
	for {
		s.inFlightMu.Lock()
		if s.inFlight.Load() == n {
			s.inFlightMu.Unlock()
			return nil
		}
		if s.inFlightChanged == nil {
			s.inFlightChanged = make(chan struct{})
		}
		changed := s.inFlightChanged
		s.inFlightMu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("ollamatest: waiting for %d calls in flight (now %d): %w", n, s.inFlight.Load(), ctx.Err())
		}
	}
}

// callWriter notes what a System One handler wrote, for WithCallLog. It passes Hijack through,
// which dropConnection needs.
type callWriter struct {
	http.ResponseWriter
	status   int
	wrote    int
	writeErr error
	dropped  bool
}

func (c *callWriter) WriteHeader(status int) {
	c.status = status
	c.ResponseWriter.WriteHeader(status)
}

func (c *callWriter) Write(b []byte) (int, error) {
	if c.status == 0 {
		c.status = http.StatusOK
	}
	n, err := c.ResponseWriter.Write(b)
	c.wrote += n
	if err != nil {
		c.writeErr = err
	}
	return n, err
}

func (c *callWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c.dropped = true
	hj, ok := c.ResponseWriter.(http.Hijacker)
	if !ok {
		return nil, nil, errors.New("ollamatest: response writer cannot hijack")
	}
	return hj.Hijack()
}

func (c *callWriter) call(arrived time.Time, body []byte, r *http.Request, fault Fault, faulty bool) Call {
	out := Call{Started: arrived, Ended: time.Now(), Body: body}
	if !c.dropped {
		out.Status = c.status
	}
	// The answer is whole when as many bytes went out as it declared; the client was there to
	// read it when its request's context had not ended by the time the handler finished.
	whole := c.writeErr == nil && c.wrote > 0 && strconv.Itoa(c.wrote) == c.Header().Get("Content-Length")
	gone := r.Context().Err() != nil
	out.Answered = out.Status == http.StatusOK && whole && !gone && !(faulty && fault.Malformed != MalformedNone)
	switch {
	case faulty && fault.Hang:
		out.Fault = "hang"
	case faulty && fault.Drop:
		out.Fault = "drop"
	case faulty && fault.Status != 0:
		out.Fault = "status " + strconv.Itoa(fault.Status)
	case faulty && fault.Malformed != MalformedNone:
		out.Fault = "malformed"
	case gone || out.Status == 0:
		out.Fault = "client gone"
	case faulty && fault.Delay > 0:
		out.Fault = "delay " + fault.Delay.String()
	}
	return out
}
