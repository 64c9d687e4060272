package chain

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/sys1hq/sys1/provider/internal/upstream"
)

// Health statuses (issue 11 §3; "paused" is the worker's, not the chain's).
const (
	StatusOK       = "ok"       // the first provider is up
	StatusDegraded = "degraded" // the first provider is down and a later one is up
	StatusDown     = "down"     // no provider is up
)

// Health is the chain's last known state, from the background prober and the breakers. It
// never calls a provider.
type Health struct {
	Status    string       `json:"status"`
	Providers []LinkHealth `json:"providers"`
}

// LinkHealth is one provider's last probe, its breaker's state and its routes'. A provider
// is up when its last probe was healthy and its own circuit is not open (an open route is
// one model's problem, not the provider's).
type LinkHealth struct {
	Name string `json:"name"`
	Role Role   `json:"role"`
	// OK is the last probe's verdict (and the circuit not open).
	OK bool `json:"ok"`
	// LatencyMS is how long the last probe took.
	LatencyMS int64 `json:"latency_ms"`
	// Detail is what the probe found, empty when healthy; never a secret or a host.
	Detail string `json:"detail"`
	// Version is what the provider reported, when it does.
	Version string `json:"version,omitempty"`
	// Breaker is the provider's own circuit: closed, open or half-open; Failures the
	// consecutive provider-level failures counted.
	Breaker  BreakerState `json:"breaker"`
	Failures int          `json:"consecutive_failures"`
	// Routes are the circuits of the models sent to it.
	Routes RouteSummary `json:"routes"`
	// InFlight and Limit are the calls running now and the link's concurrency.
	InFlight int `json:"in_flight"`
	Limit    int `json:"limit"`
	// CheckedAt is when the last probe finished; zero before the first.
	CheckedAt time.Time `json:"checked_at"`
}

// healthCell holds one link's last probe.
type healthCell struct {
	mu   sync.Mutex
	last LinkHealth
}

func (h *healthCell) init(name string, role Role) {
	h.last = LinkHealth{Name: name, Role: role, Detail: "not probed yet"}
}

func (h *healthCell) get() LinkHealth {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.last
}

// Health is the last probes and the breakers' states now.
func (c *Chain) Health() Health {
	now := c.clock.Now()
	h := Health{Providers: make([]LinkHealth, len(c.links))}
	anyUp := false
	for i, l := range c.links {
		lh := l.health.get()
		snap := l.breaker.snapshot(now)
		lh.Breaker, lh.Failures = snap.state, snap.failures
		lh.Routes = l.routeSummary(now)
		lh.InFlight, lh.Limit = l.limiter.InFlight(), l.limiter.Limit()
		if lh.Breaker == BreakerOpen {
			lh.OK = false
			if lh.Detail == "" {
				lh.Detail = "circuit open"
			}
		}
		h.Providers[i] = lh
		anyUp = anyUp || lh.OK
	}
	switch {
	case h.Providers[0].OK:
		h.Status = StatusOK
	case anyUp:
		h.Status = StatusDegraded
	default:
		h.Status = StatusDown
	}
	return h
}

// ProbeNow probes every link once, concurrently, each bounded by the probe timeout, keeps
// the results for Health and returns it. A change of a link's verdict is logged, with where
// it probed (which Health never says).
func (c *Chain) ProbeNow(ctx context.Context) Health {
	var wg sync.WaitGroup
	for _, l := range c.links {
		wg.Go(func() { c.probe(ctx, l) })
	}
	wg.Wait()
	return c.Health()
}

func (c *Chain) probe(ctx context.Context, l *link) {
	pctx, cancel := context.WithTimeout(ctx, c.probeTimeout)
	defer cancel()
	start := time.Now()
	res := l.provider.Probe(pctx)
	took := time.Since(start)
	if ctx.Err() != nil {
		return // shutting down: keep the last verdict
	}
	detail := upstream.Clean(strings.Join(res.Problems, "; "))
	if !res.Healthy() && detail == "" {
		detail = "unhealthy"
	}
	l.health.mu.Lock()
	was := l.health.last
	l.health.last.OK = res.Healthy()
	l.health.last.LatencyMS = took.Milliseconds()
	l.health.last.Detail = detail
	l.health.last.Version = upstream.Clean(res.Version)
	l.health.last.CheckedAt = time.Now().UTC()
	l.health.mu.Unlock()
	first := was.CheckedAt.IsZero()
	switch {
	case res.Healthy() && (first || !was.OK):
		c.log.Info().Str("provider", l.name).Str("upstream", res.Endpoint).Str("version", res.Version).Msg("provider is up")
	case !res.Healthy() && (first || was.OK || was.Detail != detail):
		c.log.Warn().Str("provider", l.name).Str("upstream", res.Endpoint).Strs("problems", res.Problems).Msg("provider is down")
	}
}

// Start probes every link now and then every interval until ctx ends, in the background,
// so health endpoints and /readyz serve Health without calling a provider per request. The
// returned channel is closed when the prober has stopped.
func (c *Chain) Start(ctx context.Context, interval time.Duration) <-chan struct{} {
	if interval <= 0 {
		interval = 10 * time.Second
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.ProbeNow(ctx)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				c.ProbeNow(ctx)
			}
		}
	}()
	return done
}

// Description is the chain for the capabilities endpoint: no secrets, no hosts.
type Description struct {
	Providers []LinkDescription `json:"providers"`
	Breaker   BreakerSettings   `json:"breaker"`
}

// BreakerSettings are the breakers' configuration (Config): the failures that open a
// provider's or a route's circuit and its cool-down, how long a model's absence is
// remembered, how many failing models open a provider, and the routes kept per provider.
type BreakerSettings struct {
	Failures       int   `json:"failures"`
	CooldownMS     int64 `json:"cooldown_ms"`
	AbsenceTTLMS   int64 `json:"absence_ttl_ms"`
	ProviderModels int   `json:"provider_models"`
	MaxRoutes      int   `json:"max_routes"`
}

// LinkDescription is one provider of the chain.
type LinkDescription struct {
	Name string `json:"name"`
	Role Role   `json:"role"`
	// PassThrough: no model map, every requested model is sent as is. Otherwise Models is
	// the map in configuration order and only those models are served.
	PassThrough bool         `json:"pass_through"`
	Models      []ModelRoute `json:"models"`
	// Limit is the link's concurrency.
	Limit int `json:"concurrency"`
	// What the provider accepts, and the models it last reported.
	MaxOptions  int      `json:"max_options"`
	MaxLevels   int      `json:"max_levels"`
	Images      bool     `json:"images"`
	KnownModels []string `json:"known_models"`
	// Settings are the link's non-secret defaults (timeout, probe path).
	Settings map[string]string `json:"settings"`
	// Routes are its routes' states now, as in health.
	Routes RouteSummary `json:"routes"`
}

// Describe is the chain with each provider's model map and defaults. It never calls a
// provider.
func (c *Chain) Describe() Description {
	d := Description{Breaker: BreakerSettings{Failures: c.failures, CooldownMS: c.cooldown.Milliseconds(),
		AbsenceTTLMS: c.absenceTTL.Milliseconds(), ProviderModels: c.providerModels, MaxRoutes: c.maxRoutes}}
	now := c.clock.Now()
	for _, l := range c.links {
		caps := l.provider.Capabilities()
		models := l.models.Routes()
		if models == nil {
			models = []ModelRoute{}
		}
		known := caps.Models
		if known == nil {
			known = []string{}
		}
		settings := make(map[string]string, len(l.settings))
		for k, v := range l.settings {
			settings[k] = v
		}
		d.Providers = append(d.Providers, LinkDescription{
			Name: l.name, Role: l.role, PassThrough: l.models.PassThrough(), Models: models,
			Limit: l.limiter.Limit(), MaxOptions: caps.MaxOptions, MaxLevels: caps.MaxLevels, Images: caps.Images,
			KnownModels: known, Settings: settings, Routes: l.routeSummary(now),
		})
	}
	return d
}
