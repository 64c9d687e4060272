package chain_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/provider"
	"github.com/sys1hq/sys1/provider/chain"
	"github.com/sys1hq/sys1/provider/limit"
	"github.com/sys1hq/sys1/provider/ollama"
	"github.com/sys1hq/sys1/provider/ollamatest"
	"github.com/sys1hq/sys1/provider/simulator"
	"github.com/sys1hq/sys1/provider/systemone"
	"github.com/sys1hq/sys1/provider/systemonetest"
	"github.com/sys1hq/sys1/worker/natsconn/natstest"
)

const body = `{"model":"%s","state":{"ticket":"the app crashes"},"questions":{
 "label":{"type":"choice","instructions":"Which team?","criteria":{"bug":"a defect","billing":"money"}},
 "urgent":{"type":"noul","instructions":"Is it urgent?"}}}`

func request(t testing.TB, model string) *contract.Request {
	t.Helper()
	req, err := contract.DecodeRequest(fmt.Appendf(nil, body, model))
	if err != nil {
		t.Fatal(err)
	}
	out, err := contract.Policy{DefaultModel: "nimble", AllowedModels: []string{"fast", "other"}}.Resolve(req)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func ollamaAt(t testing.TB, base string, timeout string) *ollama.Client {
	t.Helper()
	c, err := ollama.New(ollama.Config{BaseURL: base, TimeoutMS: timeout}, ollama.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// systemoneAt is a systemone client of srv; model, when given, is the one its probe looks for.
func systemoneAt(t testing.TB, srv *systemonetest.Server, model ...string) *systemone.Client {
	t.Helper()
	cfg := systemone.Config{BaseURL: srv.URL(), APIKey: contract.Secret(srv.Key()), Timeout: 5 * time.Second}
	if len(model) > 0 {
		cfg.Model = model[0]
	}
	c, err := systemone.New(cfg, systemone.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func models(t testing.TB, s string) chain.ModelMap {
	t.Helper()
	m, err := chain.ParseModelMap(s)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func newChain(t testing.TB, cfg chain.Config, links ...chain.Link) *chain.Chain {
	t.Helper()
	c, err := chain.New(cfg, links...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// closedURL is a base URL nothing listens at (connection refused).
func closedURL(t testing.TB) string {
	srv := ollamatest.NewServer()
	u := srv.URL()
	srv.Close()
	return u
}

func code(err error) contract.Code {
	if e, ok := contract.AsError(err); ok {
		return e.Code
	}
	return ""
}

func outcomes(as []contract.Attempt) string {
	parts := make([]string, len(as))
	for i, a := range as {
		parts[i] = a.Provider + "/" + a.Model + ":" + a.Outcome
	}
	return strings.Join(parts, " ")
}

func TestPrimaryDownTheSecondAnswers(t *testing.T) {
	hosted := systemonetest.New(t)
	c := newChain(t, chain.Config{},
		chain.Link{Provider: ollamaAt(t, closedURL(t), "2000")},
		chain.Link{Provider: systemoneAt(t, hosted), Models: models(t, "nimble=jev-1.13.0,fast=jev-lite")},
	)
	req := request(t, "nimble")
	res, err := c.Evaluate(context.Background(), req, 2)
	if err != nil {
		t.Fatalf("Evaluate: %v (attempts %s)", err, outcomes(res.Attempts))
	}
	if res.Provider != "systemone" || res.Model != "jev-1.13.0" || res.Response == nil || res.Response.Model != "jev-1.13.0" {
		t.Fatalf("answered by %s with %s (response model %v)", res.Provider, res.Model, res.Response)
	}
	if got := outcomes(res.Attempts); got != "ollama/nimble:unavailable systemone/jev-1.13.0:ok" {
		t.Fatalf("attempts %s", got)
	}
	a := res.Attempts[0]
	if a.ErrorCode != contract.CodeProviderUnavailable || a.Detail != "[SYS1_PROVIDER_UNAVAILABLE] ollama is unavailable: the connection was refused" ||
		a.Delivery != 2 || a.StartedAt.IsZero() || res.Attempts[1].Delivery != 2 || res.Attempts[1].ErrorCode != "" {
		t.Fatalf("first attempt %+v, second %+v", a, res.Attempts[1])
	}
	// the hosted provider was sent its own model name; the caller's request is untouched
	sent, _ := hosted.Inner().SystemOneRequests()[0].Field("model")
	if string(sent) != `"jev-1.13.0"` || req.Model != "nimble" {
		t.Fatalf("sent %s, request model now %q", sent, req.Model)
	}
}

func TestEveryProviderDownReturnsTheLastTransientError(t *testing.T) {
	local := ollamatest.New(t)
	hosted := systemonetest.New(t)
	c := newChain(t, chain.Config{},
		chain.Link{Provider: ollamaAt(t, local.URL(), "2000")},
		chain.Link{Provider: systemoneAt(t, hosted), Models: models(t, "nimble=jev-1.13.0")},
	)
	local.Fail(1, ollamatest.Busy(503, "4"))
	hosted.Fail(1, systemonetest.Status(502))
	res, err := c.Evaluate(context.Background(), request(t, "nimble"), 1)
	if code(err) != contract.CodeUpstreamError || !strings.Contains(err.Error(), "systemone failed (HTTP 502)") {
		t.Fatalf("got %v, want the last provider's error", err)
	}
	if e, _ := contract.AsError(err); !e.Transient() {
		t.Fatal("the chain's error must stay transient so the worker redelivers")
	}
	if got := outcomes(res.Attempts); got != "ollama/nimble:busy systemone/jev-1.13.0:error" || res.Response != nil || res.Provider != "" {
		t.Fatalf("attempts %s, provider %q", got, res.Provider)
	}

	// A transient failure then the fallback's configuration fault: the transient error is
	// returned, so a redelivery can still reach the primary.
	local.Fail(1, ollamatest.Status(500))
	hosted.Fail(1, systemonetest.Unauthorized())
	res, err = c.Evaluate(context.Background(), request(t, "nimble"), 1)
	if code(err) != contract.CodeUpstreamError || !strings.Contains(err.Error(), "ollama failed (HTTP 500)") {
		t.Fatalf("got %v, want the primary's transient error", err)
	}
	if got := outcomes(res.Attempts); got != "ollama/nimble:error systemone/jev-1.13.0:unavailable" || res.Attempts[1].ErrorCode != contract.CodeNotConfigured {
		t.Fatalf("attempts %s %+v", got, res.Attempts)
	}
}

func TestAPermanentErrorStopsTheChain(t *testing.T) {
	local := ollamatest.New(t)
	hosted := systemonetest.New(t)
	c := newChain(t, chain.Config{},
		chain.Link{Provider: ollamaAt(t, local.URL(), "2000")},
		chain.Link{Provider: systemoneAt(t, hosted), Models: models(t, "nimble=jev-1.13.0")},
	)
	for _, tc := range []struct {
		fault ollamatest.Fault
		code  contract.Code
	}{
		{ollamatest.Status(400), contract.CodeInvalidRequest},
		{ollamatest.Status(413), contract.CodeRequestTooLarge},
	} {
		local.Fail(1, tc.fault)
		res, err := c.Evaluate(context.Background(), request(t, "nimble"), 1)
		if code(err) != tc.code || len(res.Attempts) != 1 || res.Attempts[0].ErrorCode != tc.code {
			t.Fatalf("got %v with attempts %s, want %s and no fallback", err, outcomes(res.Attempts), tc.code)
		}
	}
	if hosted.Calls() != 0 {
		t.Fatalf("the fallback was called %d times after a permanent error", hosted.Calls())
	}
}

// A provider's own configuration fault (a refused key) is its problem, not the request's:
// the next provider answers.
func TestAConfigurationFaultFallsBack(t *testing.T) {
	hosted := systemonetest.New(t, systemonetest.WithAPIKey("the-right-key"))
	wrongKey, err := systemone.New(systemone.Config{BaseURL: hosted.URL(), APIKey: "an-old-key"}, systemone.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	c := newChain(t, chain.Config{},
		chain.Link{Provider: wrongKey, Models: models(t, "nimble=jev-1.13.0")},
		chain.Link{Provider: simulator.New(0)},
	)
	res, err := c.Evaluate(context.Background(), request(t, "nimble"), 1)
	if err != nil || res.Provider != "simulator" || res.Model != "nimble" {
		t.Fatalf("got %v from %q", err, res.Provider)
	}
	if got := outcomes(res.Attempts); got != "systemone/jev-1.13.0:unavailable simulator/nimble:ok" || res.Attempts[0].ErrorCode != contract.CodeNotConfigured {
		t.Fatalf("attempts %s", got)
	}
}

func TestUnmappedModelsAreSkipped(t *testing.T) {
	local := ollamatest.New(t)
	hosted := systemonetest.New(t)
	c := newChain(t, chain.Config{},
		chain.Link{Provider: ollamaAt(t, local.URL(), "2000"), Models: models(t, "nimble=nimble:latest")},
		chain.Link{Provider: systemoneAt(t, hosted), Models: models(t, "fast=jev-lite")},
	)
	res, err := c.Evaluate(context.Background(), request(t, "fast"), 1)
	if err != nil || res.Provider != "systemone" || res.Model != "jev-lite" {
		t.Fatalf("got %v from %s/%s", err, res.Provider, res.Model)
	}
	if got := outcomes(res.Attempts); got != "ollama/:skipped systemone/jev-lite:ok" {
		t.Fatalf("attempts %s", got)
	}
	if d := res.Attempts[0].Detail; d != `model "fast" is not in the model map of ollama` || res.Attempts[0].LatencyMS != 0 || res.Attempts[0].ErrorCode != "" {
		t.Fatalf("skip %+v", res.Attempts[0])
	}
	if local.Calls() != 0 {
		t.Fatal("an unmapped provider was called")
	}
	// a model nobody maps: a configuration fault, not a redelivery, and no call at all
	calls := local.Calls() + hosted.Calls()
	res, err = c.Evaluate(context.Background(), request(t, "other"), 1)
	if e, ok := contract.AsError(err); !ok || e.Code != contract.CodeNotConfigured || e.Transient() || !strings.Contains(e.Message, `no provider of the chain serves model "other"`) {
		t.Fatalf("got %v", err)
	}
	if got := outcomes(res.Attempts); got != "ollama/:skipped systemone/:skipped" || local.Calls()+hosted.Calls() != calls {
		t.Fatalf("attempts %s", got)
	}
	// without a map the requested model goes through as is
	pass := newChain(t, chain.Config{}, chain.Link{Provider: ollamaAt(t, local.URL(), "2000")})
	if res, err := pass.Evaluate(context.Background(), request(t, "nimble"), 1); err != nil || res.Model != "nimble" {
		t.Fatalf("pass-through: %v %q", err, res.Model)
	}
}

// fakeClock is a clock tests move by hand.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *fakeClock { return &fakeClock{t: time.Unix(1_800_000_000, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// routeOf is model's route on the named provider as health lists it; a route health does
// not list reads closed.
func routeOf(c *chain.Chain, providerName, model string) chain.RouteHealth {
	for _, p := range c.Health().Providers {
		if p.Name != providerName {
			continue
		}
		for _, r := range p.Routes.Listed {
			if r.Model == model {
				return r
			}
		}
	}
	return chain.RouteHealth{Model: model, State: chain.BreakerClosed}
}

// A model's 5xx opens its route (provider × model) after the threshold, half-opens after the
// cool-down and closes on a successful trial, with the half-open trial logic of a provider's
// breaker; the provider's own circuit stays closed throughout.
func TestARouteBreakerOpensHalfOpensAndCloses(t *testing.T) {
	local := ollamatest.New(t)
	clock := newClock()
	c := newChain(t, chain.Config{BreakerFailures: 3, BreakerCooldown: 30 * time.Second, Clock: clock},
		chain.Link{Provider: ollamaAt(t, local.URL(), "2000")},
		chain.Link{Provider: simulator.New(0)},
	)
	breaker := func() chain.BreakerState { return routeOf(c, "ollama", "nimble").State }
	local.FailAlways(ollamatest.Status(500))
	for i := 0; i < 3; i++ {
		res, err := c.Evaluate(context.Background(), request(t, "nimble"), 1)
		if err != nil || res.Provider != "simulator" || outcomes(res.Attempts) != "ollama/nimble:error simulator/nimble:ok" {
			t.Fatalf("call %d: %v %s", i, err, outcomes(res.Attempts))
		}
	}
	if breaker() != chain.BreakerOpen || local.Calls() != 3 {
		t.Fatalf("after 3 failures: route %s, %d calls", breaker(), local.Calls())
	}
	if p := c.Health().Providers[0]; p.Breaker != chain.BreakerClosed || !(p.Routes.Counts == chain.RouteCounts{Open: 1}) {
		t.Fatalf("the provider after one model's failures: %+v", p)
	}
	res, _ := c.Evaluate(context.Background(), request(t, "nimble"), 1)
	if got := outcomes(res.Attempts); got != "ollama/nimble:skipped simulator/nimble:ok" || res.Attempts[0].Detail != "circuit open for this model" || local.Calls() != 3 {
		t.Fatalf("while open: %s (%q), %d calls", got, res.Attempts[0].Detail, local.Calls())
	}

	// the cool-down passes; the trial fails: open again at once (one failure is enough)
	clock.Advance(30 * time.Second)
	if breaker() != chain.BreakerHalfOpen {
		t.Fatalf("after the cool-down: %s", breaker())
	}
	res, _ = c.Evaluate(context.Background(), request(t, "nimble"), 1)
	if got := outcomes(res.Attempts); got != "ollama/nimble:error simulator/nimble:ok" || breaker() != chain.BreakerOpen || local.Calls() != 4 {
		t.Fatalf("failed trial: %s, route %s, %d calls", got, breaker(), local.Calls())
	}
	clock.Advance(29 * time.Second)
	if res, _ = c.Evaluate(context.Background(), request(t, "nimble"), 1); res.Attempts[0].Outcome != contract.OutcomeSkipped {
		t.Fatalf("re-opened circuit let a call through: %s", outcomes(res.Attempts))
	}

	// the next cool-down passes; the trial succeeds: closed, and calls go through again
	clock.Advance(time.Second)
	local.Heal()
	res, err := c.Evaluate(context.Background(), request(t, "nimble"), 1)
	if err != nil || res.Provider != "ollama" || breaker() != chain.BreakerClosed {
		t.Fatalf("successful trial: %v from %s, route %s", err, res.Provider, breaker())
	}
	// closed means counting from zero: two failures do not open it
	local.Fail(2, ollamatest.Status(500))
	for range 2 {
		_, _ = c.Evaluate(context.Background(), request(t, "nimble"), 1)
	}
	if res, _ = c.Evaluate(context.Background(), request(t, "nimble"), 1); res.Provider != "ollama" || breaker() != chain.BreakerClosed {
		t.Fatalf("after 2 failures and a success: %s, %s", res.Provider, breaker())
	}
}

// A permanent refusal of one request proves the model answers: it resets the route's count
// and does not open it.
func TestARefusedRequestIsNotABreakerFailure(t *testing.T) {
	local := ollamatest.New(t)
	c := newChain(t, chain.Config{BreakerFailures: 2, Clock: newClock()},
		chain.Link{Provider: ollamaAt(t, local.URL(), "2000")}, chain.Link{Provider: simulator.New(0)})
	local.Fail(1, ollamatest.Status(500))
	local.Fail(1, ollamatest.Status(400))
	local.Fail(1, ollamatest.Status(500))
	for range 3 {
		_, _ = c.Evaluate(context.Background(), request(t, "nimble"), 1)
	}
	if r := routeOf(c, "ollama", "nimble"); r.State != chain.BreakerClosed {
		t.Fatalf("route %+v after 500, 400, 500", r)
	}
	// the count stood at 1: one more failure reaches the threshold of 2
	local.Fail(1, ollamatest.Status(500))
	_, _ = c.Evaluate(context.Background(), request(t, "nimble"), 1)
	if r := routeOf(c, "ollama", "nimble"); r.State != chain.BreakerOpen || r.Failures != 2 {
		t.Fatalf("route %+v after one more 500", r)
	}
	if h := c.Health().Providers[0]; h.Breaker != chain.BreakerClosed || h.Failures != 0 {
		t.Fatalf("provider breaker %s with %d failures", h.Breaker, h.Failures)
	}
}

// scripted is a provider whose answers a test controls.
type scripted struct {
	name  string
	calls atomic.Int64
	fn    func(ctx context.Context, req *contract.Request) (*contract.Response, error)
}

func (s *scripted) Name() string                        { return s.name }
func (s *scripted) Capabilities() provider.Capabilities { return provider.Capabilities{MaxOptions: 26} }
func (s *scripted) Probe(context.Context) provider.ProbeResult {
	return provider.ProbeResult{Reachable: true, VersionOK: true, ModelPresent: true}
}
func (s *scripted) Evaluate(ctx context.Context, req *contract.Request) (*contract.Response, error) {
	s.calls.Add(1)
	return s.fn(ctx, req)
}

func answer(ctx context.Context, req *contract.Request) (*contract.Response, error) {
	return simulator.New(0).Evaluate(ctx, req)
}

// Half-open lets exactly one call through however many arrive at once; the others skip the
// provider with "circuit open" and are answered by the next one.
func TestHalfOpenAdmitsExactlyOneConcurrentTrial(t *testing.T) {
	clock := newClock()
	release := make(chan struct{})
	var trialStarted atomic.Bool
	primary := &scripted{name: "primary"}
	primary.fn = func(ctx context.Context, req *contract.Request) (*contract.Response, error) {
		if !trialStarted.Load() {
			return nil, contract.Errorf(contract.CodeProviderUnavailable, "down")
		}
		<-release
		return answer(ctx, req)
	}
	c := newChain(t, chain.Config{BreakerFailures: 2, BreakerCooldown: time.Minute, Clock: clock},
		chain.Link{Provider: primary}, chain.Link{Provider: simulator.New(0)})
	for range 2 {
		_, _ = c.Evaluate(context.Background(), request(t, "nimble"), 1)
	}
	if c.Health().Providers[0].Breaker != chain.BreakerOpen {
		t.Fatal("not open")
	}
	clock.Advance(time.Minute)
	trialStarted.Store(true)

	const callers = 16
	results := make(chan chain.Result, callers)
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			res, err := c.Evaluate(context.Background(), request(t, "nimble"), 1)
			if err != nil {
				t.Errorf("Evaluate: %v", err)
			}
			results <- res
		})
	}
	// every caller but the trial finishes through the fallback while the trial is held
	var viaFallback []chain.Result
	deadline := time.After(10 * time.Second)
	for len(viaFallback) < callers-1 {
		select {
		case res := <-results:
			viaFallback = append(viaFallback, res)
		case <-deadline:
			t.Fatalf("only %d of %d callers finished while the trial was held", len(viaFallback), callers-1)
		}
	}
	for _, res := range viaFallback {
		if got := outcomes(res.Attempts); got != "primary/nimble:skipped simulator/nimble:ok" || res.Attempts[0].Detail != "circuit open" {
			t.Fatalf("a caller during the trial: %s", got)
		}
	}
	if n := primary.calls.Load(); n != 3 {
		t.Fatalf("the primary got %d calls: 2 failures and exactly 1 trial expected", n)
	}
	close(release)
	wg.Wait()
	trial := <-results
	if trial.Provider != "primary" || c.Health().Providers[0].Breaker != chain.BreakerClosed {
		t.Fatalf("the trial answered from %s, breaker %s", trial.Provider, c.Health().Providers[0].Breaker)
	}
}

// A trial that says nothing (the caller gave up) leaves the circuit half-open: the next call
// is the trial.
func TestAnAbandonedTrialLetsTheNextCallTry(t *testing.T) {
	clock := newClock()
	var mode atomic.Int32 // 0 fail, 1 wait for ctx, 2 answer
	trialRunning := make(chan struct{})
	primary := &scripted{name: "primary", fn: func(ctx context.Context, req *contract.Request) (*contract.Response, error) {
		switch mode.Load() {
		case 0:
			return nil, contract.Errorf(contract.CodeTimeout, "slow")
		case 1:
			close(trialRunning)
			<-ctx.Done()
			return nil, fmt.Errorf("abandoned: %w", ctx.Err())
		}
		return answer(ctx, req)
	}}
	c := newChain(t, chain.Config{BreakerFailures: 1, BreakerCooldown: time.Second, Clock: clock},
		chain.Link{Provider: primary}, chain.Link{Provider: simulator.New(0)})
	_, _ = c.Evaluate(context.Background(), request(t, "nimble"), 1)
	clock.Advance(time.Second)
	mode.Store(1)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-trialRunning
		cancel() // the shutdown arrives while the trial runs
	}()
	res, err := c.Evaluate(ctx, request(t, "nimble"), 1)
	if !errors.Is(err, context.Canceled) || code(err) != "" || outcomes(res.Attempts) != "primary/nimble:error" || res.Attempts[0].Detail != "cancelled" {
		t.Fatalf("shutdown during the trial: %v, %s", err, outcomes(res.Attempts))
	}
	if b := c.Health().Providers[0].Breaker; b != chain.BreakerHalfOpen {
		t.Fatalf("after an abandoned trial: %s", b)
	}
	mode.Store(2)
	if res, err := c.Evaluate(context.Background(), request(t, "nimble"), 1); err != nil || res.Provider != "primary" {
		t.Fatalf("next trial: %v from %s", err, res.Provider)
	}
}

// The request's deadline bounds the wait for a limiter slot: once it passes, the provider is
// not called and the error is SYS1_EXPIRED, as the worker's own slot wait did.
func TestTheDeadlinePassesWhileWaitingForASlot(t *testing.T) {
	hold, holding := make(chan struct{}), make(chan struct{})
	busy := &scripted{name: "primary", fn: func(ctx context.Context, req *contract.Request) (*contract.Response, error) {
		close(holding)
		<-hold
		return answer(ctx, req)
	}}
	lim := limit.NewFixed(1)
	second := &scripted{name: "second", fn: answer}
	c := newChain(t, chain.Config{}, chain.Link{Provider: busy, Limiter: lim}, chain.Link{Provider: second})
	first := make(chan error, 1)
	go func() {
		_, err := c.Evaluate(context.Background(), request(t, "nimble"), 1)
		first <- err
	}()
	<-holding // the only slot is taken by a running call
	deadline := time.Now().Add(50 * time.Millisecond)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	res, err := c.Evaluate(ctx, request(t, "nimble"), 3)
	want := "[SYS1_EXPIRED] deadline " + deadline.UTC().Format(time.RFC3339Nano) + " passed before the provider was called"
	if e, ok := contract.AsError(err); !ok || e.Message != want {
		t.Fatalf("got %v, want %s", err, want)
	}
	if len(res.Attempts) != 0 || busy.calls.Load() != 1 || second.calls.Load() != 0 {
		t.Fatalf("attempts %s; calls %d and %d: nothing may be called after the deadline", outcomes(res.Attempts), busy.calls.Load(), second.calls.Load())
	}
	close(hold)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if lim.InFlight() != 0 {
		t.Fatalf("%d slots still held", lim.InFlight())
	}
	// an already passed deadline calls nothing either
	past, cancel2 := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel2()
	if _, err := c.Evaluate(past, request(t, "nimble"), 1); code(err) != contract.CodeExpired || busy.calls.Load() != 1 {
		t.Fatalf("past deadline: %v", err)
	}
}

// A call the request's deadline cuts short is SYS1_EXPIRED with outcome timeout, and no
// later provider is tried.
func TestTheDeadlineCutsACallShort(t *testing.T) {
	local := ollamatest.New(t)
	local.FailAlways(ollamatest.Hang())
	second := &scripted{name: "second", fn: answer}
	c := newChain(t, chain.Config{}, chain.Link{Provider: ollamaAt(t, local.URL(), "60000")}, chain.Link{Provider: second})
	deadline := time.Now().Add(80 * time.Millisecond)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	res, err := c.Evaluate(ctx, request(t, "nimble"), 1)
	want := "[SYS1_EXPIRED] deadline " + deadline.UTC().Format(time.RFC3339Nano) + " passed while the provider was running"
	if e, ok := contract.AsError(err); !ok || e.Message != want {
		t.Fatalf("got %v", err)
	}
	if len(res.Attempts) != 1 || res.Attempts[0].Outcome != contract.OutcomeTimeout || res.Attempts[0].ErrorCode != contract.CodeExpired || res.Attempts[0].Detail != want {
		t.Fatalf("attempts %+v", res.Attempts)
	}
	if second.calls.Load() != 0 {
		t.Fatal("a provider was called after the deadline")
	}
	// the provider's own timeout, well before the deadline, is SYS1_TIMEOUT and falls back
	quick := newChain(t, chain.Config{}, chain.Link{Provider: ollamaAt(t, local.URL(), "30")}, chain.Link{Provider: second})
	ctx2, cancel2 := context.WithTimeout(context.Background(), time.Minute)
	defer cancel2()
	res, err = quick.Evaluate(ctx2, request(t, "nimble"), 1)
	if err != nil || res.Provider != "second" || res.Attempts[0].ErrorCode != contract.CodeTimeout || res.Attempts[0].Outcome != contract.OutcomeTimeout {
		t.Fatalf("own timeout: %v, %+v", err, res.Attempts)
	}
}

// A provider that panics gives its slot and its breaker trial back; the panic goes on to the
// worker's recover.
func TestAPanickingProviderGivesItsSlotBack(t *testing.T) {
	lim := limit.NewFixed(1)
	p := &scripted{name: "primary", fn: func(context.Context, *contract.Request) (*contract.Response, error) { panic("boom") }}
	c := newChain(t, chain.Config{}, chain.Link{Provider: p, Limiter: lim})
	func() {
		defer func() {
			if r := recover(); r != "boom" {
				t.Fatalf("recovered %v", r)
			}
		}()
		_, _ = c.Evaluate(context.Background(), request(t, "nimble"), 1)
	}()
	if lim.InFlight() != 0 {
		t.Fatal("the slot was lost")
	}
}

func TestHealthStatuses(t *testing.T) {
	local := ollamatest.New(t)
	hosted := systemonetest.New(t)
	clock := newClock()
	c := newChain(t, chain.Config{BreakerFailures: 1, Clock: clock},
		chain.Link{Provider: ollamaAt(t, local.URL(), "2000")},
		chain.Link{Provider: systemoneAt(t, hosted, "jev-1.13.0"), Models: models(t, "nimble=jev-1.13.0")},
	)
	if h := c.Health(); h.Status != chain.StatusDown || h.Providers[0].Detail != "not probed yet" {
		t.Fatalf("before any probe: %+v", h)
	}
	h := c.ProbeNow(context.Background())
	if h.Status != chain.StatusOK || !h.Providers[0].OK || !h.Providers[1].OK || h.Providers[0].Role != chain.RolePrimary || h.Providers[1].Role != chain.RoleFallback {
		t.Fatalf("both up: %+v", h)
	}
	if h.Providers[0].Version != ollamatest.DefaultVersion || h.Providers[1].Limit != chain.DefaultLimit || h.Providers[0].CheckedAt.IsZero() {
		t.Fatalf("details: %+v", h.Providers)
	}
	// Health serves the last probe: no provider traffic per call
	before := len(local.Requests()) + len(hosted.Requests())
	for range 50 {
		c.Health()
	}
	if after := len(local.Requests()) + len(hosted.Requests()); after != before {
		t.Fatalf("Health made %d requests", after-before)
	}

	local.SetModels("other") // the primary lost its model
	if h = c.ProbeNow(context.Background()); h.Status != chain.StatusDegraded || h.Providers[0].OK || !strings.Contains(h.Providers[0].Detail, `model "nimble" is not pulled`) {
		t.Fatalf("primary down: %+v", h)
	}
	hosted.SetModels() // and the fallback lost its model too
	if h = c.ProbeNow(context.Background()); h.Status != chain.StatusDown {
		t.Fatalf("both down: %+v", h)
	}
	local.SetModels("nimble")
	hosted.SetModels(systemonetest.DefaultModels...)
	if h = c.ProbeNow(context.Background()); h.Status != chain.StatusOK {
		t.Fatalf("recovered: %+v", h)
	}
	// an open circuit makes a provider down whatever its probe says
	local.Fail(1, ollamatest.Drop())
	_, _ = c.Evaluate(context.Background(), request(t, "nimble"), 1)
	if h = c.Health(); h.Status != chain.StatusDegraded || h.Providers[0].Breaker != chain.BreakerOpen || h.Providers[0].OK {
		t.Fatalf("circuit open: %+v", h.Providers[0])
	}
}

func TestStartProbesInTheBackground(t *testing.T) {
	local := ollamatest.New(t)
	c := newChain(t, chain.Config{}, chain.Link{Provider: ollamaAt(t, local.URL(), "2000")})
	ctx, cancel := context.WithCancel(context.Background())
	done := c.Start(ctx, 20*time.Millisecond)
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		natstest.WaitFor(t, 10*time.Second, what, cond)
	}
	waitFor("the first probe", func() bool { return c.Health().Status == chain.StatusOK })
	local.SetModels()
	waitFor("a later probe to see the model gone", func() bool { return c.Health().Status == chain.StatusDown })
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the prober did not stop")
	}
}

// Describe, Health and every attempt carry no API key and no host; the transitions and probe
// failures are in the log, with the host.
func TestNoSecretOrHostInDescribeHealthOrAttempts(t *testing.T) {
	const key = "sk-ts-live-chain-secret-99"
	hosted := systemonetest.New(t, systemonetest.WithAPIKey(key))
	local := ollamatest.New(t)
	var logs syncBuffer
	log := zerolog.New(&logs)
	sys, err := systemone.New(systemone.Config{BaseURL: hosted.URL(), APIKey: key, ProbePath: "/health"}, systemone.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	c := newChain(t, chain.Config{BreakerFailures: 1, Logger: log, Clock: newClock()},
		chain.Link{Provider: ollamaAt(t, local.URL(), "2000")},
		chain.Link{Provider: sys, Models: models(t, "nimble=jev-1.13.0,fast=jev-lite"), Settings: map[string]string{"timeout_ms": "30000", "probe_path": "/health"}},
	)
	local.FailAlways(ollamatest.Drop())
	hosted.Fail(1, systemonetest.Body(500, "text/plain", "upstream "+hosted.URL()+" rejected key "+key))
	res, _ := c.Evaluate(context.Background(), request(t, "nimble"), 1)
	local.SetModels()
	c.ProbeNow(context.Background())
	d, _ := json.Marshal(c.Describe())
	h, _ := json.Marshal(c.Health())
	a, _ := json.Marshal(res.Attempts)
	for what, s := range map[string]string{"describe": string(d), "health": string(h), "attempts": string(a)} {
		for _, bad := range []string{key, strings.TrimPrefix(hosted.URL(), "http://"), strings.TrimPrefix(local.URL(), "http://")} {
			if strings.Contains(s, bad) {
				t.Errorf("%s holds %q: %s", what, bad, s)
			}
		}
	}
	if strings.Contains(logs.String(), key) {
		t.Fatalf("the key is in the log: %s", logs.String())
	}
	if !strings.Contains(logs.String(), `"upstream":"`+local.URL()+`"`) || !strings.Contains(logs.String(), "circuit opened") {
		t.Fatalf("the log lacks the host or the transition: %s", logs.String())
	}
	want := `{"providers":[{"name":"ollama","role":"primary","pass_through":true,"models":[],"concurrency":16,"max_options":26,"max_levels":26,"images":true,"known_models":[],"settings":{},` +
		`"routes":{"counts":{"closed":1,"open":0,"half_open":0,"absent":0},"listed":[],"unlisted":0}},` +
		`{"name":"systemone","role":"fallback","pass_through":false,"models":[{"requested":"nimble","sent":"jev-1.13.0"},{"requested":"fast","sent":"jev-lite"}],"concurrency":16,"max_options":26,"max_levels":26,"images":true,"known_models":[],"settings":{"probe_path":"/health","timeout_ms":"30000"},` +
		`"routes":{"counts":{"closed":0,"open":1,"half_open":0,"absent":0},"listed":[{"model":"jev-1.13.0","state":"open","consecutive_failures":1,"last_error_code":"SYS1_UPSTREAM_ERROR","reopens_at":"2027-01-15T08:00:30Z"}],"unlisted":0}}],` +
		`"breaker":{"failures":1,"cooldown_ms":30000,"absence_ttl_ms":30000,"provider_models":3,"max_routes":1024}}`
	if string(d) != want {
		t.Fatalf("Describe:\n got %s\nwant %s", d, want)
	}
}

func TestRoutesAndModelDigest(t *testing.T) {
	local := ollamatest.New(t)
	hosted := systemonetest.New(t)
	c := newChain(t, chain.Config{},
		chain.Link{Provider: ollamaAt(t, local.URL(), "2000"), Models: models(t, "nimble=nimble:latest")},
		chain.Link{Provider: systemoneAt(t, hosted), Models: models(t, "nimble=jev-1.13.0,fast=jev-lite")},
		chain.Link{Provider: simulator.New(0)},
	)
	if got := fmt.Sprint(c.Routes("nimble")); got != "[{ollama primary nimble:latest false} {systemone fallback jev-1.13.0 false} {simulator fallback nimble false}]" {
		t.Fatalf("routes %s", got)
	}
	if got := fmt.Sprint(c.Routes("fast")); got != "[{systemone fallback jev-lite false} {simulator fallback fast false}]" {
		t.Fatalf("routes %s", got)
	}
	if d, err := c.ModelDigest(context.Background(), "ollama", "nimble:latest"); err != nil || d != fmt.Sprintf("%064x", 1) {
		t.Fatalf("ollama digest %q %v", d, err)
	}
	if d, err := c.ModelDigest(context.Background(), "systemone", "jev-lite"); err != nil || d != "jev-lite@2026-09-15.2" {
		t.Fatalf("systemone digest %q %v", d, err)
	}
	if _, err := c.ModelDigest(context.Background(), "simulator", "nimble"); !errors.Is(err, provider.ErrNoModelDigest) {
		t.Fatalf("simulator digest: %v", err)
	}
	if fmt.Sprint(c.Names()) != "[ollama systemone simulator]" {
		t.Fatal(c.Names())
	}
}

func TestNewRefusesABadChain(t *testing.T) {
	sim := simulator.New(0)
	for _, tc := range []struct {
		links []chain.Link
		want  string
	}{
		{nil, "no providers"},
		{[]chain.Link{{Provider: sim}, {Provider: sim}}, `provider "simulator" is in the chain twice`},
		{[]chain.Link{{}}, "link 1 has no provider"},
		{[]chain.Link{{Provider: sim, Role: "backup"}}, `role "backup" is not primary or fallback`},
	} {
		if _, err := chain.New(chain.Config{}, tc.links...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.links, err, tc.want)
		}
	}
}

// syncBuffer is a bytes.Buffer safe for the concurrent writes of a shared logger.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
