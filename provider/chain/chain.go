// Package chain is the ordered provider chain: within one delivery and within the request's
// deadline it tries its providers in order, falls back only on transient failures, skips a
// provider that does not serve the requested model or whose circuit is open, and returns the
// answer with who answered with which model and every attempt.
//
// The chain never retries a provider and never waits between providers: when every provider
// failed, the worker's one retry loop redelivers the message (issue 11: one retry loop only).
//
// Errors from providers are sorted three ways:
//
//   - transient (SYS1_PROVIDER_UNAVAILABLE, _BUSY, _TIMEOUT, _MODEL_UNAVAILABLE,
//     SYS1_UPSTREAM_ERROR incl. malformed answers): the next provider is tried;
//   - the provider's own configuration fault (SYS1_NOT_CONFIGURED: a refused API key, a
//     redirecting base URL): the next provider is tried too (another provider can answer the
//     same request), but no redelivery will fix it;
//   - anything else (SYS1_INVALID_REQUEST, SYS1_REQUEST_TOO_LARGE, …: the request itself) stops
//     the chain: every provider would refuse it.
//
// Circuit breakers work at two levels (issue 21), so that one caller's broken model cannot
// take the provider from everyone else. A route is a provider × the model sent to it:
//
//   - a model's own failures (SYS1_UPSTREAM_ERROR: a 5xx for it, a malformed answer; and
//     SYS1_NOT_CONFIGURED answers) open its route only; requests for it then fail at once
//     with the code of the failures that opened it;
//   - a 404 (SYS1_MODEL_UNAVAILABLE) means the provider does not have the model: the next
//     provider is tried, and the absence is remembered for Config.AbsenceTTL, then asked
//     again. It never counts against anything;
//   - the provider's own failures (SYS1_PROVIDER_UNAVAILABLE: refused, reset, DNS, TLS;
//     SYS1_TIMEOUT; SYS1_PROVIDER_BUSY) open the provider's circuit, every route with it, as
//     does the failing of Config.ProviderModels distinct models with no good answer between.
//
// When no provider answered, Evaluate returns the last transient error of a call (so the
// worker redelivers), else the reason a provider was skipped when that is transient (it may
// answer a redelivery), else the last error. The reason for a skip is the most specific
// one: an open route's own code, a remembered absence (SYS1_MODEL_UNAVAILABLE), or an open
// provider (SYS1_PROVIDER_UNAVAILABLE).
package chain

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/provider"
	"github.com/sys1hq/sys1/provider/internal/upstream"
	"github.com/sys1hq/sys1/provider/limit"
)

// Role is a link's place in the chain, as health and capabilities report it.
type Role string

// Roles.
const (
	RolePrimary  Role = "primary"
	RoleFallback Role = "fallback"
)

// Defaults of Config.
const (
	DefaultBreakerFailures = 5
	DefaultBreakerCooldown = 30 * time.Second
	DefaultAbsenceTTL      = 30 * time.Second
	DefaultProviderModels  = 3
	DefaultMaxRoutes       = 1024
	// DefaultLimit is a link's concurrency when it has no Limiter.
	DefaultLimit = 16
)

// Link is one provider of the chain.
type Link struct {
	// Name goes into attempts, replies and health; empty means Provider.Name(). Unique.
	Name string
	// Role: empty means primary for the first link, fallback for the others.
	Role Role
	// Provider answers the calls.
	Provider provider.Provider
	// Models maps requested models to the models this provider runs; the zero map passes
	// them through, a non-empty one serves only what it names.
	Models ModelMap
	// Limiter bounds this provider's calls in flight; nil means limit.NewFixed(DefaultLimit).
	Limiter limit.Limiter
	// Settings are non-secret settings Describe shows (a timeout, a probe path). Never put a
	// key or a URL with credentials here.
	Settings map[string]string
}

// Clock tells the time; tests inject one to move breakers through their cool-down.
type Clock interface{ Now() time.Time }

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

// Config is the chain's behaviour.
type Config struct {
	// BreakerFailures is how many consecutive failures open a circuit: a provider's (its own
	// failures) or a route's (one model's failures on it); 0 means DefaultBreakerFailures.
	BreakerFailures int
	// BreakerCooldown is how long an open circuit skips its provider or route before one
	// trial call; 0 means DefaultBreakerCooldown.
	BreakerCooldown time.Duration
	// AbsenceTTL is how long a provider's "model not found" (404) is remembered: requests
	// for the model skip that provider meanwhile, then one call asks again; 0 means
	// DefaultAbsenceTTL.
	AbsenceTTL time.Duration
	// ProviderModels is how many distinct models failing on one provider with no good
	// answer in between open the provider's circuit; 0 means DefaultProviderModels.
	ProviderModels int
	// MaxRoutes bounds each provider's route breakers (requests name arbitrary models); past
	// it the least recently used closed route is forgotten; 0 means DefaultMaxRoutes.
	MaxRoutes int
	// ProbeTimeout bounds one probe of one link; 0 means 10 s.
	ProbeTimeout time.Duration
	// Clock drives the breakers; nil is the wall clock.
	Clock Clock
	// Logger is for breaker transitions and probes; calls log through the context's logger
	// when it has one.
	Logger zerolog.Logger
}

// Chain is the ordered provider chain. It is safe for concurrent use.
type Chain struct {
	links          []*link
	failures       int
	cooldown       time.Duration
	absenceTTL     time.Duration
	providerModels int
	maxRoutes      int
	probeTimeout   time.Duration
	clock          Clock
	log            zerolog.Logger
}

type link struct {
	name     string
	role     Role
	provider provider.Provider
	models   ModelMap
	limiter  limit.Limiter
	settings map[string]string
	// breaker is the provider's own circuit; routes the circuit of each model sent to it;
	// spread the models failing on it since its last good answer.
	breaker *breaker
	routes  *routeTable
	spread  *spread
	health  healthCell
}

// New builds a chain of at least one link.
func New(cfg Config, links ...Link) (*Chain, error) {
	c := &Chain{
		failures:       cfg.BreakerFailures,
		cooldown:       cfg.BreakerCooldown,
		absenceTTL:     cfg.AbsenceTTL,
		providerModels: cfg.ProviderModels,
		maxRoutes:      cfg.MaxRoutes,
		probeTimeout:   cfg.ProbeTimeout,
		clock:          cfg.Clock,
		log:            cfg.Logger.With().Str("subsystem", "provider-chain").Logger(),
	}
	if c.failures <= 0 {
		c.failures = DefaultBreakerFailures
	}
	if c.cooldown <= 0 {
		c.cooldown = DefaultBreakerCooldown
	}
	if c.absenceTTL <= 0 {
		c.absenceTTL = DefaultAbsenceTTL
	}
	if c.providerModels <= 0 {
		c.providerModels = DefaultProviderModels
	}
	if c.maxRoutes <= 0 {
		c.maxRoutes = DefaultMaxRoutes
	}
	if c.probeTimeout <= 0 {
		c.probeTimeout = 10 * time.Second
	}
	if c.clock == nil {
		c.clock = realClock{}
	}
	if len(links) == 0 {
		return nil, errors.New("provider chain: no providers")
	}
	seen := map[string]bool{}
	var problems []string
	for i, l := range links {
		if l.Provider == nil {
			problems = append(problems, fmt.Sprintf("link %d has no provider", i+1))
			continue
		}
		name := strings.TrimSpace(l.Name)
		if name == "" {
			name = l.Provider.Name()
		}
		if seen[name] {
			problems = append(problems, fmt.Sprintf("provider %q is in the chain twice", name))
		}
		seen[name] = true
		role := l.Role
		switch {
		case role == "" && i == 0:
			role = RolePrimary
		case role == "":
			role = RoleFallback
		case role != RolePrimary && role != RoleFallback:
			problems = append(problems, fmt.Sprintf("provider %q: role %q is not primary or fallback", name, role))
		}
		lim := l.Limiter
		if lim == nil {
			lim = limit.NewFixed(DefaultLimit)
		}
		settings := make(map[string]string, len(l.Settings))
		for k, v := range l.Settings {
			settings[k] = v
		}
		nl := &link{name: name, role: role, provider: l.Provider, models: l.Models, limiter: lim, settings: settings,
			breaker: newBreaker(c.failures, c.cooldown, 0),
			routes:  newRouteTable(c.maxRoutes, func() *breaker { return newBreaker(c.failures, c.cooldown, c.absenceTTL) }),
			spread:  newSpread(c.providerModels)}
		nl.health.init(nl.name, nl.role)
		c.links = append(c.links, nl)
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("provider chain: %s", strings.Join(problems, "; "))
	}
	return c, nil
}

// Result is the outcome of one Evaluate.
type Result struct {
	// Response is the validated answer; nil when no provider answered.
	Response *contract.Response
	// Provider and Model name who answered with what: the link's name and the model sent to
	// it (after its model map). The reply's result.provider and result.model come from here
	// (Response.Model, when set, is what the provider reports it ran, e.g. an alias resolved).
	Provider string
	Model    string
	// Attempts are this delivery's attempts, in order: calls and skips.
	Attempts []contract.Attempt
}

// Evaluate runs one resolved request through the chain within one delivery (1-based, for the
// attempts). ctx's deadline is the request's deadline: once it has passed no provider is
// called (SYS1_EXPIRED "… passed before the provider was called"), and a call it cuts short
// is SYS1_EXPIRED with outcome timeout. Any other end of ctx (shutdown) is returned as the
// context's error, wrapped, never as a provider verdict. The Result carries the attempts in
// every case.
func (c *Chain) Evaluate(ctx context.Context, req *contract.Request, delivery int) (Result, error) {
	res := Result{Attempts: make([]contract.Attempt, 0, len(c.links))}
	if req == nil {
		return res, contract.Errorf(contract.CodeInternal, "provider chain: Evaluate called without a request")
	}
	var lastTransient, last error
	var refused refusal
	for i, l := range c.links {
		sent, serves := l.models.Route(req.Model)
		if !serves {
			res.Attempts = append(res.Attempts, skipped(l.name, "", delivery,
				fmt.Sprintf("model %q is not in the model map of %s", req.Model, l.name)))
			continue
		}
		padm := l.breaker.allow(c.clock)
		if !padm.ok {
			refused.providerOpen(req.Model, padm)
			res.Attempts = append(res.Attempts, skipped(l.name, sent, delivery, "circuit open"))
			continue
		}
		route := l.routes.get(sent)
		radm := route.allow(c.clock)
		if !radm.ok {
			l.breaker.record(padm, neutral, nil, c.clock) // give a provider trial back unused
			res.Attempts = append(res.Attempts, skipped(l.name, sent, delivery, refused.routeClosed(l.name, sent, radm)))
			continue
		}
		resp, attempt, err := c.call(ctx, l, req, sent, delivery, callAdmission{provider: padm, route: radm, breaker: route})
		if attempt != nil {
			res.Attempts = append(res.Attempts, *attempt)
		}
		if err == nil {
			res.Response, res.Provider, res.Model = resp, l.name, sent
			return res, nil
		}
		if !fallsBack(err) {
			return res, err
		}
		last = err
		if e, _ := contract.AsError(err); e.Transient() {
			lastTransient = err
		}
		if next := c.nextCandidate(i+1, req.Model); next != "" {
			e, _ := contract.AsError(err)
			upstream.Logger(ctx, &c.log).Info().Str("provider", l.name).Str("error_code", string(e.Code)).
				Str("next_provider", next).Msg("provider failed; falling back to the next one")
		}
	}
	refusedErr := refused.err()
	switch {
	case lastTransient != nil:
		return res, lastTransient
	case refusedErr != nil && refusedErr.Transient():
		return res, refusedErr // a provider skipped now may answer a redelivery
	case last != nil:
		return res, last
	case refusedErr != nil:
		return res, refusedErr
	}
	return res, contract.Errorf(contract.CodeNotConfigured, "no provider of the chain serves model %q: each has a model map without it", req.Model)
}

// nextCandidate is the name of the first link from i on that serves model (for the log).
func (c *Chain) nextCandidate(i int, model string) string {
	for ; i < len(c.links); i++ {
		if _, ok := c.links[i].models.Route(model); ok {
			return c.links[i].name
		}
	}
	return ""
}

// fallsBack reports whether the next provider may answer after err.
func fallsBack(err error) bool {
	e, ok := contract.AsError(err)
	if !ok {
		return false // a cancellation or a bug: never a provider verdict
	}
	return e.Transient() || e.Code == contract.CodeNotConfigured
}

// callAdmission is what let a call through: the provider's breaker and the route's.
type callAdmission struct {
	provider, route admission
	breaker         *breaker // the route's
}

// call makes one attempt at one link: take a slot of its limiter (within the deadline), call,
// and report to the limiter and the breakers (the route's and the provider's, each what the
// result says about it: see judge). The attempt is nil when the provider was not called.
// Slots and trials are given back even if the provider panics.
func (c *Chain) call(ctx context.Context, l *link, req *contract.Request, sent string, delivery int, adm callAdmission) (resp *contract.Response, attempt *contract.Attempt, err error) {
	f := saysNothing
	defer func() { c.recordCall(l, sent, adm, f, err) }()
	tok, aerr := l.limiter.Acquire(ctx)
	if aerr != nil {
		return nil, nil, notCalled(ctx, aerr)
	}
	lres := limit.Result{Ignore: true}
	defer func() { tok.Release(lres) }()
	if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
		return nil, nil, expiredBefore(dl)
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, notCalled(ctx, err)
	}
	r := req
	if sent != req.Model {
		copied := *req
		copied.Model = sent
		r = &copied
	}
	started := time.Now()
	resp, err = l.provider.Evaluate(ctx, r)
	took := time.Since(started)
	a := contract.Attempt{
		Provider:  l.name,
		Model:     sent,
		Outcome:   provider.Outcome(err),
		LatencyMS: took.Milliseconds(),
		Delivery:  delivery,
		StartedAt: started.UTC(),
	}
	lres = limit.Result{Latency: took, Size: size(r)}
	f = judge(err)
	switch e, isContract := contract.AsError(err); {
	case err == nil:
	case !isContract:
		if errors.Is(err, context.Canceled) {
			a.Detail = "cancelled"
		} else {
			a.Detail = "unexpected provider error"
		}
		if dl, ok := ctx.Deadline(); ok && errors.Is(err, context.DeadlineExceeded) && errors.Is(ctx.Err(), context.DeadlineExceeded) {
			// The request's deadline, not the provider's own timeout, cut the call short.
			err = contract.Errorf(contract.CodeExpired, "deadline %s passed while the provider was running", dl.UTC().Format(time.RFC3339Nano))
			a.ErrorCode, a.Detail, a.Outcome = contract.CodeExpired, err.Error(), contract.OutcomeTimeout
		}
		lres.Ignore = true
	default:
		a.ErrorCode, a.Detail = e.Code, e.Message
		switch {
		case fallsBack(err):
			lres.Dropped = e.Code == contract.CodeProviderBusy || e.Code == contract.CodeTimeout
		default:
			lres.Ignore = true // a refused request, or a bug: says nothing of the provider's speed
		}
	}
	return resp, &a, err
}

// recordCall reports a call's result to the route's breaker and the provider's, and logs
// what changed. A model's failure is the provider's only when models keep failing on it
// (spread); otherwise the provider answered, which is all its breaker asks.
func (c *Chain) recordCall(l *link, sent string, adm callAdmission, f fault, err error) {
	var cause *contract.Error
	if err != nil { // AsError costs an allocation; a success needs no cause
		cause, _ = contract.AsError(err)
	}
	routeV, providerV := neutral, neutral
	switch f {
	case answered:
		routeV, providerV = healthy, healthy
		l.spread.answered()
	case providerFault:
		providerV = failed
	case modelFault:
		routeV, providerV = failed, healthy
		if l.spread.fail(sent) {
			providerV = tripped
		}
	case modelMissing:
		routeV = missing
	}
	if to := adm.breaker.record(adm.route, routeV, cause, c.clock); to != "" {
		c.logRouteTransition(l, sent, to, cause)
	}
	if to := l.breaker.record(adm.provider, providerV, cause, c.clock); to != "" {
		c.logTransition(l, to, providerV == tripped)
	}
}

// notCalled is the error of a call that never reached the provider because ctx ended: the
// request's deadline (SYS1_EXPIRED) or the caller's cancellation (returned as is).
func notCalled(ctx context.Context, err error) error {
	if dl, ok := ctx.Deadline(); ok && errors.Is(err, context.DeadlineExceeded) {
		return expiredBefore(dl)
	}
	return fmt.Errorf("provider chain: abandoned by the caller: %w", err)
}

func expiredBefore(deadline time.Time) error {
	return contract.Errorf(contract.CodeExpired, "deadline %s passed before the provider was called", deadline.UTC().Format(time.RFC3339Nano))
}

// size is a call's work for an adaptive limiter (limit.CallSize: questions × state KiB).
func size(r *contract.Request) float64 {
	return limit.CallSize(len(r.Questions), len(r.State))
}

func skipped(name, model string, delivery int, detail string) contract.Attempt {
	return contract.Attempt{Provider: name, Model: model, Outcome: contract.OutcomeSkipped, Detail: detail,
		Delivery: delivery, StartedAt: time.Now().UTC()}
}

func (c *Chain) logTransition(l *link, to BreakerState, acrossModels bool) {
	switch {
	case to == BreakerOpen && acrossModels:
		c.log.Warn().Str("provider", l.name).Int("models", c.providerModels).Dur("cooldown", c.cooldown).
			Msg("circuit opened: calls for several models failed with no good answer between; the provider is skipped until the cool-down has passed, then one trial call decides")
	case to == BreakerOpen:
		c.log.Warn().Str("provider", l.name).Int("failures", c.failures).Dur("cooldown", c.cooldown).
			Msg("circuit opened: the provider is skipped until the cool-down has passed, then one trial call decides")
	case to == BreakerClosed:
		c.log.Info().Str("provider", l.name).Msg("circuit closed: the provider answered again")
	}
}

func (c *Chain) logRouteTransition(l *link, model string, to BreakerState, cause *contract.Error) {
	switch to {
	case BreakerOpen:
		ev := c.log.Warn().Str("provider", l.name).Str("model", model).Int("failures", c.failures).Dur("cooldown", c.cooldown)
		if cause != nil {
			ev = ev.Str("error_code", string(cause.Code))
		}
		ev.Msg("route circuit opened: this model is skipped on this provider until the cool-down has passed; other models are unaffected")
	case BreakerAbsent:
		c.log.Info().Str("provider", l.name).Str("model", model).Dur("remembered", c.absenceTTL).
			Msg("model not found on this provider: it is skipped for this model until asked again")
	case BreakerClosed:
		c.log.Info().Str("provider", l.name).Str("model", model).Msg("route circuit closed: the model answered again")
	}
}

// Routes are the providers that would be tried for model, in order, with the model each
// would be sent and whether it would be skipped now. The cache stage keys on them. It never
// adds a route to a provider's table.
func (c *Chain) Routes(model string) []Route {
	var out []Route
	now := c.clock.Now()
	for _, l := range c.links {
		if sent, ok := l.models.Route(model); ok {
			open := l.breaker.isOpen(now)
			if r := l.routes.peek(sent); r != nil && !open {
				open = r.isOpen(now)
			}
			out = append(out, Route{Provider: l.name, Role: l.role, Model: sent, CircuitOpen: open})
		}
	}
	return out
}

// Route is one provider a model would go to.
type Route struct {
	Provider string
	Role     Role
	Model    string
	// CircuitOpen: a call would skip it now (the provider's circuit or this route's open,
	// or the model remembered absent).
	CircuitOpen bool
}

// ModelDigest is the digest of model (as sent, after the map) on the named provider, for the
// exact cache's key. A provider that cannot tell one gives provider.ErrNoModelDigest.
func (c *Chain) ModelDigest(ctx context.Context, providerName, model string) (string, error) {
	for _, l := range c.links {
		if l.name != providerName {
			continue
		}
		if d, ok := l.provider.(provider.ModelDigester); ok {
			return d.ModelDigest(ctx, model)
		}
		return "", fmt.Errorf("%s reports no model versions: %w", l.name, provider.ErrNoModelDigest)
	}
	return "", fmt.Errorf("provider chain: no provider %q", providerName)
}

// Names are the links' names in order.
func (c *Chain) Names() []string {
	out := make([]string, len(c.links))
	for i, l := range c.links {
		out[i] = l.name
	}
	return out
}

// InFlight is the number of provider calls running now, over all links.
func (c *Chain) InFlight() int {
	n := 0
	for _, l := range c.links {
		n += l.limiter.InFlight()
	}
	return n
}
