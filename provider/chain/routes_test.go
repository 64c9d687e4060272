package chain_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/provider/chain"
	"github.com/sys1hq/sys1/provider/ollamatest"
	"github.com/sys1hq/sys1/provider/simulator"
)

// requestFor is a resolved request for any model.
func requestFor(t testing.TB, model string) *contract.Request {
	t.Helper()
	req, err := contract.DecodeRequest(fmt.Appendf(nil, body, model))
	if err != nil {
		t.Fatal(err)
	}
	out, err := contract.Policy{DefaultModel: "nimble", AllowedModels: []string{model}}.Resolve(req)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// evaluate runs one request for model and returns its error (nil on success).
func evaluate(t testing.TB, c *chain.Chain, model string) (chain.Result, *contract.Error) {
	t.Helper()
	res, err := c.Evaluate(context.Background(), requestFor(t, model), 1)
	if err == nil {
		return res, nil
	}
	e, ok := contract.AsError(err)
	if !ok {
		t.Fatalf("%s: not a contract error: %v", model, err)
	}
	return res, e
}

// A model the server answers 500 for opens its route only: other models on the same provider
// go on being called and answered, the provider's circuit stays closed, and once the route
// is open a request for the broken model fails without a call, keeping its own code.
func TestABrokenModelOpensItsRouteOnly(t *testing.T) {
	local := ollamatest.New(t, ollamatest.WithModels("nimble:latest", "broken:latest"))
	local.FailModel("broken", ollamatest.Status(500))
	clock := newClock()
	c := newChain(t, chain.Config{Clock: clock}, chain.Link{Provider: ollamaAt(t, local.URL(), "2000")})
	for i := range chain.DefaultBreakerFailures {
		if _, e := evaluate(t, c, "broken"); e == nil || e.Code != contract.CodeUpstreamError || e.Message != "[SYS1_UPSTREAM_ERROR] ollama failed (HTTP 500)" {
			t.Fatalf("broken call %d: %v", i, e)
		}
		if _, e := evaluate(t, c, "nimble"); e != nil {
			t.Fatalf("nimble between broken calls: %v", e)
		}
	}
	if n := local.CallsFor("broken"); n != chain.DefaultBreakerFailures {
		t.Fatalf("%d calls for broken", n)
	}
	clock.Advance(18 * time.Second)
	res, e := evaluate(t, c, "broken")
	want := `[SYS1_UPSTREAM_ERROR] circuit open for model "broken" on ollama after 5 consecutive failures (last: ollama failed (HTTP 500)); next trial in 12s`
	if e == nil || e.Message != want || e.RetryAfter != 12*time.Second || !e.Transient() {
		t.Fatalf("with the route open: %v (retry after %v), want %s", e, e.RetryAfter, want)
	}
	if got := outcomes(res.Attempts); got != "ollama/broken:skipped" || res.Attempts[0].Detail != "circuit open for this model" || local.CallsFor("broken") != chain.DefaultBreakerFailures {
		t.Fatalf("attempts %s (%q), %d calls", got, res.Attempts[0].Detail, local.CallsFor("broken"))
	}
	for range 20 {
		if _, e := evaluate(t, c, "nimble"); e != nil {
			t.Fatalf("nimble with broken's route open: %v", e)
		}
	}
	if p := c.Health().Providers[0]; p.Breaker != chain.BreakerClosed || p.Failures != 0 ||
		!(p.Routes.Counts == chain.RouteCounts{Closed: 1, Open: 1}) || len(p.Routes.Listed) != 1 {
		t.Fatalf("health %+v", p)
	}
	r := routeOf(c, "ollama", "broken")
	if r.State != chain.BreakerOpen || r.Failures != 5 || r.LastErrorCode != contract.CodeUpstreamError || r.ReopensAt == nil || !r.ReopensAt.Equal(clock.Now().Add(12*time.Second)) {
		t.Fatalf("route %+v", r)
	}
	if got := fmt.Sprint(c.Routes("broken"), c.Routes("nimble")); got != "[{ollama primary broken true}] [{ollama primary nimble false}]" {
		t.Fatalf("Routes: %s", got)
	}
}

// A 404 means the provider does not have the model: the next provider answers, the absence
// is remembered (the provider skipped for that model, no call) until the TTL passes, then one
// call asks again. Absences never open anything: many missing models leave the provider and
// its other models alone.
func TestAMissingModelIsSkippedRememberedAndReprobed(t *testing.T) {
	local := ollamatest.New(t) // has nimble only
	second := &scripted{name: "second", fn: answer}
	clock := newClock()
	c := newChain(t, chain.Config{Clock: clock, AbsenceTTL: 20 * time.Second},
		chain.Link{Provider: ollamaAt(t, local.URL(), "2000")}, chain.Link{Provider: second})

	res, e := evaluate(t, c, "fresh")
	if e != nil || res.Provider != "second" || outcomes(res.Attempts) != "ollama/fresh:unavailable second/fresh:ok" ||
		res.Attempts[0].ErrorCode != contract.CodeModelUnavailable {
		t.Fatalf("first: %v from %s, %s", e, res.Provider, outcomes(res.Attempts))
	}
	for range 3 {
		res, e = evaluate(t, c, "fresh")
		if e != nil || outcomes(res.Attempts) != "ollama/fresh:skipped second/fresh:ok" || res.Attempts[0].Detail != "model not found here (a 404, remembered)" {
			t.Fatalf("remembered: %v, %s (%q)", e, outcomes(res.Attempts), res.Attempts[0].Detail)
		}
	}
	if n := local.CallsFor("fresh"); n != 1 {
		t.Fatalf("%d calls for a model remembered absent", n)
	}
	if r := routeOf(c, "ollama", "fresh"); r.State != chain.BreakerAbsent || r.Failures != 0 || r.LastErrorCode != contract.CodeModelUnavailable || r.ReopensAt == nil {
		t.Fatalf("route %+v", r)
	}
	if !c.Routes("fresh")[0].CircuitOpen || c.Routes("fresh")[1].CircuitOpen {
		t.Fatalf("Routes: %v", c.Routes("fresh"))
	}

	// the TTL passes and the model has been pulled meanwhile: the next request asks again
	clock.Advance(20 * time.Second)
	if r := routeOf(c, "ollama", "fresh"); r.State != chain.BreakerHalfOpen {
		t.Fatalf("after the TTL: %+v", r)
	}
	local.SetModels("nimble", "fresh")
	res, e = evaluate(t, c, "fresh")
	if e != nil || res.Provider != "ollama" || local.CallsFor("fresh") != 2 || routeOf(c, "ollama", "fresh").State != chain.BreakerClosed {
		t.Fatalf("re-probe: %v from %s, %d calls, route %+v", e, res.Provider, local.CallsFor("fresh"), routeOf(c, "ollama", "fresh"))
	}

	// a re-probe that finds it missing again remembers it again
	local.SetModels("nimble")
	_, _ = evaluate(t, c, "fresh")
	clock.Advance(20 * time.Second)
	_, _ = evaluate(t, c, "fresh")
	if r := routeOf(c, "ollama", "fresh"); r.State != chain.BreakerAbsent || local.CallsFor("fresh") != 4 {
		t.Fatalf("missing again: %+v, %d calls", r, local.CallsFor("fresh"))
	}

	// many missing models, many times: the provider stays closed and nimble is served by it
	for i := range 4 * chain.DefaultBreakerFailures {
		_, _ = evaluate(t, c, fmt.Sprint("missing-", i%7))
	}
	if p := c.Health().Providers[0]; p.Breaker != chain.BreakerClosed || p.Failures != 0 || p.Routes.Counts.Absent != 8 || p.Routes.Counts.Open != 0 {
		t.Fatalf("after many 404s: %+v", p)
	}
	if res, e := evaluate(t, c, "nimble"); e != nil || res.Provider != "ollama" {
		t.Fatalf("nimble: %v from %s", e, res.Provider)
	}
}

// With no other provider, a remembered absence fails the request SYS1_MODEL_UNAVAILABLE
// (transient: a redelivery after the TTL asks again), with the provider's own words.
func TestARememberedAbsenceKeepsItsCode(t *testing.T) {
	local := ollamatest.New(t)
	clock := newClock()
	c := newChain(t, chain.Config{Clock: clock}, chain.Link{Provider: ollamaAt(t, local.URL(), "2000")})
	if _, e := evaluate(t, c, "ghost"); e == nil || e.Message != `[SYS1_MODEL_UNAVAILABLE] model "ghost" is not available on ollama (HTTP 404)` {
		t.Fatalf("first: %v", e)
	}
	clock.Advance(5 * time.Second)
	res, e := evaluate(t, c, "ghost")
	want := `[SYS1_MODEL_UNAVAILABLE] model "ghost" is not available on ollama (HTTP 404); remembered, asked again in 25s`
	if e == nil || e.Message != want || e.RetryAfter != 25*time.Second || !e.Transient() || outcomes(res.Attempts) != "ollama/ghost:skipped" {
		t.Fatalf("remembered: %v (retry after %v), %s; want %s", e, e.RetryAfter, outcomes(res.Attempts), want)
	}
	if local.CallsFor("ghost") != 1 {
		t.Fatalf("%d calls", local.CallsFor("ghost"))
	}
}

// Failures of the provider itself — connection refused, a reset, timeouts, 429/503 — open
// the provider's circuit after BreakerFailures of them, whatever models they were for, and
// then every route to it is skipped: SYS1_PROVIDER_UNAVAILABLE, as before routes.
func TestProviderFailuresOpenTheProviderQuickly(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fault *ollamatest.Fault // nil: nothing listens (connection refused)
		code  contract.Code
	}{
		{"connection refused", nil, contract.CodeProviderUnavailable},
		{"connection reset", &ollamatest.Fault{Drop: true}, contract.CodeProviderUnavailable},
		{"timeout", &ollamatest.Fault{Hang: true}, contract.CodeTimeout},
		{"busy", &ollamatest.Fault{Status: 503}, contract.CodeProviderBusy},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url := closedURL(t)
			if tc.fault != nil {
				local := ollamatest.New(t)
				local.FailAlways(*tc.fault)
				url = local.URL()
			}
			c := newChain(t, chain.Config{Clock: newClock()}, chain.Link{Provider: ollamaAt(t, url, "50")})
			models := []string{"nimble", "fast", "other"}
			for i := range chain.DefaultBreakerFailures {
				if _, e := evaluate(t, c, models[i%3]); e == nil || e.Code != tc.code {
					t.Fatalf("call %d: %v, want %s", i, e, tc.code)
				}
			}
			p := c.Health().Providers[0]
			if p.Breaker != chain.BreakerOpen || p.OK || p.Routes.Counts.Open != 0 {
				t.Fatalf("after %d provider failures: %+v", chain.DefaultBreakerFailures, p)
			}
			for _, m := range append(models, "never-asked") {
				if r := c.Routes(m); !r[0].CircuitOpen {
					t.Errorf("route of %s is not open: %+v", m, r)
				}
				res, e := evaluate(t, c, m)
				if e == nil || e.Code != contract.CodeProviderUnavailable || e.RetryAfter != chain.DefaultBreakerCooldown ||
					!strings.Contains(e.Message, "has its circuit open after repeated failures") || res.Attempts[0].Detail != "circuit open" {
					t.Errorf("%s with the provider open: %v, %+v", m, e, res.Attempts)
				}
			}
		})
	}
}

// Failures of several distinct models with no good answer in between are the provider's: at
// ProviderModels of them its circuit opens. A success in between starts the count again.
func TestFailuresAcrossModelsOpenTheProvider(t *testing.T) {
	local := ollamatest.New(t, ollamatest.WithModels("nimble", "a", "b", "c"))
	for _, m := range []string{"a", "b", "c"} {
		local.FailModel(m, ollamatest.Status(500))
	}
	c := newChain(t, chain.Config{Clock: newClock()}, chain.Link{Provider: ollamaAt(t, local.URL(), "2000")})
	provider := func() chain.BreakerState { return c.Health().Providers[0].Breaker }
	for _, step := range []struct {
		model string
		code  contract.Code
		then  chain.BreakerState
	}{
		{"a", contract.CodeUpstreamError, chain.BreakerClosed},
		{"a", contract.CodeUpstreamError, chain.BreakerClosed}, // the same model again: still one
		{"b", contract.CodeUpstreamError, chain.BreakerClosed},
		{"nimble", "", chain.BreakerClosed}, // an answer: the count starts again
		{"c", contract.CodeUpstreamError, chain.BreakerClosed},
		{"a", contract.CodeUpstreamError, chain.BreakerClosed},
		{"ghost", contract.CodeModelUnavailable, chain.BreakerClosed}, // a 404 is nobody's failure
		{"b", contract.CodeUpstreamError, chain.BreakerOpen},
		{"nimble", contract.CodeProviderUnavailable, chain.BreakerOpen},
	} {
		_, e := evaluate(t, c, step.model)
		var got contract.Code
		if e != nil {
			got = e.Code
		}
		if got != step.code || provider() != step.then {
			t.Fatalf("%s: %v, provider %s; want %q and %s", step.model, e, provider(), step.code, step.then)
		}
	}
	if local.CallsFor("nimble") != 1 {
		t.Fatalf("nimble called %d times; the open provider must not be called", local.CallsFor("nimble"))
	}
}

// Every request keeps its own code: with one model broken, one missing and the provider
// fine, each fails (or succeeds) as itself, not as the others.
func TestEachRequestKeepsItsOwnCode(t *testing.T) {
	local := ollamatest.New(t, ollamatest.WithModels("nimble", "broken"))
	local.FailModel("broken", ollamatest.Malformed(ollamatest.MalformedNotJSON))
	c := newChain(t, chain.Config{Clock: newClock(), BreakerFailures: 2}, chain.Link{Provider: ollamaAt(t, local.URL(), "2000")})
	var wg sync.WaitGroup
	codes := make([][]contract.Code, 3)
	for i, model := range []string{"broken", "ghost", "nimble"} {
		wg.Go(func() {
			for range 30 {
				_, err := c.Evaluate(context.Background(), requestFor(t, model), 1)
				codes[i] = append(codes[i], code(err))
			}
		})
	}
	wg.Wait()
	for i, want := range []contract.Code{contract.CodeUpstreamError, contract.CodeModelUnavailable, ""} {
		for j, got := range codes[i] {
			if got != want {
				t.Fatalf("request %d of model %d: %q, want %q (all: %v)", j, i, got, want, codes[i])
			}
		}
	}
	if p := c.Health().Providers[0]; p.Breaker != chain.BreakerClosed || !(p.Routes.Counts == chain.RouteCounts{Closed: 1, Open: 1, Absent: 1}) {
		t.Fatalf("health %+v", p)
	}
	// a malformed answer counts against its route like a 5xx: 2 calls opened it
	if b, g := local.CallsFor("broken"), local.CallsFor("ghost"); b != 2 || g != 1 {
		t.Fatalf("calls: broken %d, ghost %d", b, g)
	}
}

// A request whose route is refused gives back the provider's half-open trial it took: the
// next request, for a healthy model, is the trial and closes the provider's circuit.
func TestARefusedRouteGivesTheProviderTrialBack(t *testing.T) {
	local := ollamatest.New(t, ollamatest.WithModels("nimble", "broken"))
	clock := newClock()
	c := newChain(t, chain.Config{Clock: clock, BreakerFailures: 1, BreakerCooldown: 10 * time.Second, AbsenceTTL: time.Hour},
		chain.Link{Provider: ollamaAt(t, local.URL(), "2000")})
	_, _ = evaluate(t, c, "ghost") // absent for an hour
	local.Fail(1, ollamatest.Drop())
	_, _ = evaluate(t, c, "nimble") // the provider opens
	if c.Health().Providers[0].Breaker != chain.BreakerOpen {
		t.Fatal("the provider did not open")
	}
	clock.Advance(10 * time.Second)
	if _, e := evaluate(t, c, "ghost"); e == nil || e.Code != contract.CodeModelUnavailable {
		t.Fatalf("ghost: %v", e)
	}
	if res, e := evaluate(t, c, "nimble"); e != nil || res.Provider != "ollama" || c.Health().Providers[0].Breaker != chain.BreakerClosed {
		t.Fatalf("the trial: %v, provider %s", e, c.Health().Providers[0].Breaker)
	}
}

// The route table is bounded: requests naming ever new models keep at most MaxRoutes routes
// per provider, and the ones forgotten first are closed, so an open route outlives a flood
// of other models.
func TestTheRouteTableIsBounded(t *testing.T) {
	p := &scripted{name: "p", fn: func(ctx context.Context, req *contract.Request) (*contract.Response, error) {
		if strings.HasPrefix(req.Model, "broken") {
			return nil, contract.Errorf(contract.CodeUpstreamError, "p failed (HTTP 500)")
		}
		return answer(ctx, req)
	}}
	clock := newClock()
	c := newChain(t, chain.Config{Clock: clock, MaxRoutes: 16, BreakerFailures: 1, ProviderModels: 1000}, chain.Link{Provider: p})
	for i := range 3 {
		_, _ = evaluate(t, c, fmt.Sprint("broken-", i))
	}
	for i := range 2000 {
		if _, e := evaluate(t, c, fmt.Sprint("model-", i)); e != nil {
			t.Fatal(e)
		}
	}
	h := c.Health().Providers[0].Routes
	if total := h.Counts.Closed + h.Counts.Open + h.Counts.HalfOpen + h.Counts.Absent; total != 16 || h.Counts.Open != 3 {
		t.Fatalf("%d routes kept (%+v), want 16 with the 3 open ones", total, h.Counts)
	}
	calls := p.calls.Load()
	if _, e := evaluate(t, c, "broken-0"); e == nil || !strings.Contains(e.Message, "circuit open") || p.calls.Load() != calls {
		t.Fatalf("the open route was forgotten: %v", e)
	}
	// Only when every route is open is an open one forgotten: the table never grows past it.
	for i := range 40 {
		_, _ = evaluate(t, c, fmt.Sprint("broken-more-", i))
	}
	h = c.Health().Providers[0].Routes
	if total := h.Counts.Closed + h.Counts.Open + h.Counts.HalfOpen + h.Counts.Absent; total != 16 || h.Counts.Open != 16 {
		t.Fatalf("all open: %+v", h.Counts)
	}
}

// Health lists the routes that are not closed, most recently used first, at most
// MaxListedRoutes, with the counts by state covering every route; an open route whose
// cool-down passed reads half-open, without a reopening time.
func TestHealthListsRoutes(t *testing.T) {
	p := &scripted{name: "p", fn: func(ctx context.Context, req *contract.Request) (*contract.Response, error) {
		switch {
		case strings.HasPrefix(req.Model, "gone"):
			return nil, contract.Errorf(contract.CodeModelUnavailable, "model %q is not available on p (HTTP 404)", req.Model)
		case strings.HasPrefix(req.Model, "bad"):
			return nil, contract.Errorf(contract.CodeNotConfigured, "p refused access to model %q (HTTP 403)", req.Model)
		}
		return answer(ctx, req)
	}}
	clock := newClock()
	c := newChain(t, chain.Config{Clock: clock, BreakerFailures: 1, BreakerCooldown: time.Minute, ProviderModels: 1000},
		chain.Link{Provider: p}, chain.Link{Provider: simulator.New(0), Models: models(t, "ok=ok")})
	_, _ = evaluate(t, c, "bad-early")
	clock.Advance(time.Minute) // bad-early's cool-down passes: half-open
	for i := range 55 {
		_, _ = evaluate(t, c, fmt.Sprint("bad-", i))
	}
	_, _ = evaluate(t, c, "gone")
	_, _ = evaluate(t, c, "ok")
	h := c.Health()
	r := h.Providers[0].Routes
	if !(r.Counts == chain.RouteCounts{Closed: 1, Open: 55, HalfOpen: 1, Absent: 1}) || len(r.Listed) != chain.MaxListedRoutes || r.Unlisted != 7 {
		t.Fatalf("counts %+v, %d listed, %d unlisted", r.Counts, len(r.Listed), r.Unlisted)
	}
	reopens := clock.Now().Add(time.Minute)
	first, second := r.Listed[0], r.Listed[1]
	if first.Model != "gone" || first.State != chain.BreakerAbsent || first.LastErrorCode != contract.CodeModelUnavailable || first.ReopensAt == nil ||
		!first.ReopensAt.Equal(clock.Now().Add(chain.DefaultAbsenceTTL)) {
		t.Fatalf("most recent first: %+v", first)
	}
	if second.Model != "bad-54" || second.State != chain.BreakerOpen || second.Failures != 1 || second.LastErrorCode != contract.CodeNotConfigured || !second.ReopensAt.Equal(reopens) {
		t.Fatalf("second: %+v", second)
	}
	if h.Providers[1].Routes.Counts != (chain.RouteCounts{}) || h.Providers[1].Routes.Listed == nil {
		t.Fatalf("the simulator's routes: %+v", h.Providers[1].Routes)
	}
	// the oldest, bad-early, is past its cool-down: half-open, and left out of the list
	clock.Advance(time.Minute)
	r = c.Health().Providers[0].Routes
	if r.Counts.HalfOpen != 57 || r.Counts.Open != 0 || r.Listed[1].State != chain.BreakerHalfOpen || r.Listed[1].ReopensAt != nil {
		t.Fatalf("after the cool-down: %+v, %+v", r.Counts, r.Listed[1])
	}
	if d := c.Describe(); d.Providers[0].Routes.Counts != r.Counts || d.Breaker.AbsenceTTLMS != 30000 || d.Breaker.ProviderModels != 1000 || d.Breaker.MaxRoutes != chain.DefaultMaxRoutes {
		t.Fatalf("describe %+v", d)
	}
}

// A request whose first provider is skipped for its open route and whose second fails for
// good (its configuration) gets the route's transient code, not the permanent one: a
// redelivery can reach the first provider once the route's trial is due. Of two routes
// skipped, the transient one's code wins too.
func TestASkippedRouteKeepsTheRequestRetriable(t *testing.T) {
	first := &scripted{name: "first", fn: func(context.Context, *contract.Request) (*contract.Response, error) {
		return nil, contract.Errorf(contract.CodeUpstreamError, "first failed (HTTP 500)")
	}}
	second := &scripted{name: "second"}
	second.fn = func(ctx context.Context, req *contract.Request) (*contract.Response, error) {
		if second.calls.Load() == 1 {
			return answer(ctx, req)
		}
		return nil, contract.Errorf(contract.CodeNotConfigured, "second refused the API key (HTTP 401)")
	}
	c := newChain(t, chain.Config{Clock: newClock(), BreakerFailures: 1}, chain.Link{Provider: first}, chain.Link{Provider: second})
	if res, e := evaluate(t, c, "nimble"); e != nil || res.Provider != "second" {
		t.Fatalf("first fails, second answers: %v", e)
	}
	for _, want := range []string{"first/nimble:skipped second/nimble:unavailable", "first/nimble:skipped second/nimble:skipped"} {
		res, e := evaluate(t, c, "nimble")
		if e == nil || e.Code != contract.CodeUpstreamError || !e.Transient() || !strings.Contains(e.Message, `circuit open for model "nimble" on first`) ||
			outcomes(res.Attempts) != want {
			t.Fatalf("first skipped: %v, %s; want %s", e, outcomes(res.Attempts), want)
		}
	}
}
