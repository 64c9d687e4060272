// Package backend chooses and builds the System One providers from the environment: the
// ordered chain (SYS1_PROVIDERS, or SYS1_PROVIDER for one provider) and each provider's own
// settings, named after it (SYS1_OLLAMA_*, SYS1_SYSTEMONE_*, SYS1_SIMULATOR_*), plus the
// circuit breakers' (SYS1_BREAKER_*). It sits apart from package provider so that provider
// stays free of its implementations' imports.
package backend

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/provider"
	"github.com/sys1hq/sys1/provider/chain"
	"github.com/sys1hq/sys1/provider/internal/upstream"
	"github.com/sys1hq/sys1/provider/limit"
	"github.com/sys1hq/sys1/provider/ollama"
	"github.com/sys1hq/sys1/provider/simulator"
	"github.com/sys1hq/sys1/provider/systemone"
)

// Provider kinds accepted by SYS1_PROVIDERS and SYS1_PROVIDER.
const (
	KindOllama    = "ollama"
	KindSimulator = "simulator"
	KindSystemOne = "systemone"
)

// kinds in the order messages list them.
var kinds = []string{KindOllama, KindSimulator, KindSystemOne}

// Config is the provider selection and every provider's settings. A provider's settings are
// read always but validated only when it is in the chain, so a simulator deployment needs no
// Ollama URL and an Ollama one no hosted key.
type Config struct {
	// Provider is the one-provider form (SYS1_PROVIDER); empty means ollama unless
	// SYS1_PROVIDERS is set.
	Provider string `env:"SYS1_PROVIDER"`
	// Providers is the ordered chain, comma-separated (SYS1_PROVIDERS=ollama,systemone).
	Providers string `env:"SYS1_PROVIDERS"`

	Ollama ollama.Config
	// OllamaModels maps requested models to Ollama's (nimble=nimble:7b,…); empty passes
	// them through.
	OllamaModels string `env:"SYS1_OLLAMA_MODELS"`

	SystemOne SystemOneConfig

	// SimulatorLatency is a Go duration ("250ms") or a whole number of milliseconds.
	SimulatorLatency string `env:"SYS1_SIMULATOR_LATENCY" envDefault:"0"`
	SimulatorModels  string `env:"SYS1_SIMULATOR_MODELS"`

	// BreakerFailures is how many consecutive failures open a provider's circuit.
	BreakerFailures string `env:"SYS1_BREAKER_FAILURES" envDefault:"5"`
	// BreakerCooldown is how long an open circuit skips its provider before a trial call: a
	// Go duration ("30s") or whole milliseconds.
	BreakerCooldown string `env:"SYS1_BREAKER_COOLDOWN" envDefault:"30s"`
}

// SystemOneConfig is the hosted System One provider's environment.
type SystemOneConfig struct {
	BaseURL string          `env:"SYS1_SYSTEMONE_BASE_URL"`
	APIKey  contract.Secret `env:"SYS1_SYSTEMONE_API_KEY"`
	// TimeoutMS bounds one call; empty means SYS1_TIMEOUT_MS's value.
	TimeoutMS string `env:"SYS1_SYSTEMONE_TIMEOUT_MS"`
	// Models maps requested models to the server's (nimble=jev-1.13.0,fast=jev-lite).
	Models string `env:"SYS1_SYSTEMONE_MODELS"`
	// ProbePath replaces GET /v1/models as the probe, for servers without it.
	ProbePath string `env:"SYS1_SYSTEMONE_PROBE_PATH"`
}

// Chain is the configured chain's provider kinds in order, normalised; nil when the lists
// cannot be read (Validate says why).
func (c *Config) Chain() []string {
	names, errs := c.chain()
	if len(errs) > 0 {
		return nil
	}
	return names
}

// Kind is the first provider of the chain (the one-provider form's provider).
func (c *Config) Kind() string {
	if names := c.Chain(); len(names) > 0 {
		return names[0]
	}
	return strings.ToLower(strings.TrimSpace(c.Provider))
}

func (c *Config) chain() ([]string, []error) {
	single := strings.ToLower(strings.TrimSpace(c.Provider))
	list := strings.TrimSpace(c.Providers)
	switch {
	case list == "" && single == "":
		return []string{KindOllama}, nil
	case list == "":
		if strings.Contains(single, ",") {
			return nil, []error{fmt.Errorf("SYS1_PROVIDER: %q names more than one provider; put a chain in SYS1_PROVIDERS", c.Provider)}
		}
		if !known(single) {
			return nil, []error{fmt.Errorf("SYS1_PROVIDER: %q is not one of %s", c.Provider, strings.Join(kinds, ", "))}
		}
		return []string{single}, nil
	}
	var problems []string
	var names []string
	seen := map[string]bool{}
	for i, raw := range strings.Split(list, ",") {
		name := strings.ToLower(strings.TrimSpace(raw))
		switch {
		case name == "":
			problems = append(problems, fmt.Sprintf("entry %d is empty", i+1))
		case !known(name):
			problems = append(problems, fmt.Sprintf("%q is not one of %s", upstream.Clean(raw), strings.Join(kinds, ", ")))
		case seen[name]:
			problems = append(problems, fmt.Sprintf("%s is listed twice", name))
		default:
			seen[name] = true
			names = append(names, name)
		}
	}
	var errs []error
	if len(problems) > 0 {
		errs = append(errs, fmt.Errorf("SYS1_PROVIDERS: %s", strings.Join(problems, "; ")))
	}
	if single != "" && (len(names) != 1 || names[0] != single) {
		errs = append(errs, fmt.Errorf("SYS1_PROVIDER: set either SYS1_PROVIDER (one provider) or SYS1_PROVIDERS (the chain), not both"))
	}
	if len(errs) > 0 {
		return nil, errs
	}
	return names, nil
}

func known(name string) bool {
	for _, k := range kinds {
		if k == name {
			return true
		}
	}
	return false
}

// Validate returns one error per bad variable, each naming it: the chain's lists, the
// settings of every provider in the chain (missing required ones, malformed model maps, base
// URLs with credentials or another scheme, bad numbers) and the breakers'.
func (c *Config) Validate() []error {
	names, errs := c.chain()
	for _, name := range names {
		switch name {
		case KindOllama:
			errs = append(errs, c.Ollama.Validate()...)
			if _, err := modelMap("SYS1_OLLAMA_MODELS", c.OllamaModels); err != nil {
				errs = append(errs, err)
			}
		case KindSystemOne:
			// SYS1_TIMEOUT_MS, when inherited, is reported by the Ollama part if Ollama is
			// in the chain too.
			sc, serrs := c.systemOne(!contains(names, KindOllama))
			errs = append(errs, serrs...)
			errs = append(errs, sc.Validate()...)
			if _, err := modelMap(systemone.VarModels, c.SystemOne.Models); err != nil {
				errs = append(errs, err)
			}
		case KindSimulator:
			if _, err := modelMap("SYS1_SIMULATOR_MODELS", c.SimulatorModels); err != nil {
				errs = append(errs, err)
			}
		}
	}
	// Checked whatever the chain, as before SYS1_PROVIDERS: a typo here is never harmless.
	if _, err := c.simulatorLatency(); err != nil {
		errs = append(errs, err)
	}
	if _, err := c.breakerFailures(); err != nil {
		errs = append(errs, err)
	}
	if _, err := c.breakerCooldown(); err != nil {
		errs = append(errs, err)
	}
	return errs
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// systemOne is the hosted provider's plain configuration; errors name the variable of a
// timeout that cannot be read (its own, or SYS1_TIMEOUT_MS when inherited and
// reportInherited; systemone.Config.Validate reports the rest).
func (c *Config) systemOne(reportInherited bool) (systemone.Config, []error) {
	sc := systemone.Config{BaseURL: c.SystemOne.BaseURL, APIKey: c.SystemOne.APIKey, ProbePath: c.SystemOne.ProbePath}
	raw, variable := strings.TrimSpace(c.SystemOne.TimeoutMS), systemone.VarTimeout
	if raw == "" {
		raw, variable = strings.TrimSpace(c.Ollama.TimeoutMS), "SYS1_TIMEOUT_MS"
	}
	if raw == "" {
		return sc, nil
	}
	ms, err := strconv.ParseInt(raw, 10, 64)
	if err != nil || ms <= 0 || ms > int64(24*time.Hour/time.Millisecond) {
		if variable == "SYS1_TIMEOUT_MS" && !reportInherited {
			return sc, nil
		}
		return sc, []error{fmt.Errorf("%s: %q is not a whole number of milliseconds between 1 and 86400000", variable, upstream.Clean(raw))}
	}
	sc.Timeout = time.Duration(ms) * time.Millisecond
	return sc, nil
}

func modelMap(variable, raw string) (chain.ModelMap, error) {
	m, err := chain.ParseModelMap(raw)
	if err != nil {
		return chain.ModelMap{}, fmt.Errorf("%s: %v (want requested=model,requested=model)", variable, err)
	}
	return m, nil
}

func (c *Config) simulatorLatency() (time.Duration, error) {
	return durationOrMS("SYS1_SIMULATOR_LATENCY", c.SimulatorLatency, 0, true)
}

func (c *Config) breakerCooldown() (time.Duration, error) {
	return durationOrMS("SYS1_BREAKER_COOLDOWN", c.BreakerCooldown, chain.DefaultBreakerCooldown, false)
}

func (c *Config) breakerFailures() (int, error) {
	v := strings.TrimSpace(c.BreakerFailures)
	if v == "" {
		return chain.DefaultBreakerFailures, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > 10000 {
		return 0, fmt.Errorf("SYS1_BREAKER_FAILURES: %q is not a whole number between 1 and 10000", upstream.Clean(v))
	}
	return n, nil
}

// durationOrMS reads a Go duration ("250ms") or whole milliseconds; empty is def.
func durationOrMS(variable, raw string, def time.Duration, zeroOK bool) (time.Duration, error) {
	v := strings.TrimSpace(raw)
	if v == "" {
		return def, nil
	}
	d := time.Duration(-1)
	if ms, err := strconv.ParseInt(v, 10, 64); err == nil && ms >= 0 && ms <= int64(24*time.Hour/time.Millisecond) {
		d = time.Duration(ms) * time.Millisecond
	} else if pd, err := time.ParseDuration(v); err == nil {
		d = pd
	}
	if d < 0 || (!zeroOK && d == 0) || d > 24*time.Hour {
		what := "a non-negative duration (e.g. 250ms) or whole milliseconds"
		if !zeroOK {
			what = "a positive duration (e.g. 30s) or whole milliseconds"
		}
		return 0, fmt.Errorf("%s: %q is not %s, up to 24h", variable, upstream.Clean(v), what)
	}
	return d, nil
}

// Deps are what the providers need from the process rather than from their own variables.
type Deps struct {
	// DefaultModel is SYS1_MODEL: each provider's probe looks for what it maps to.
	DefaultModel string
	// AllowedModels are SYS1_ALLOWED_MODELS: NewChain refuses a chain in which one of them
	// (or the default model) is served by no provider.
	AllowedModels []string
	// Concurrency is SYS1_CONCURRENCY: each provider's limiter and keep-alive pool.
	Concurrency int
	Logger      zerolog.Logger
	// HTTPClient replaces the HTTP providers' client (tests); nil builds one each.
	HTTPClient *http.Client
	// Clock drives the breakers (tests); nil is the wall clock.
	Clock chain.Clock
}

// CheckModels returns one error per policy variable naming every model (the default, the
// allowed ones) that no provider of the chain serves, because every provider has a model map
// without it. The command layer reports it with the other configuration errors.
func (c *Config) CheckModels(defaultModel string, allowed []string) []error {
	names, errs := c.chain()
	if len(errs) > 0 {
		return nil // Validate reports the lists
	}
	maps := make([]chain.ModelMap, 0, len(names))
	for _, name := range names {
		m, err := modelMap("", c.rawModels(name))
		if err != nil {
			return nil // Validate reports the map
		}
		maps = append(maps, m)
	}
	served := func(model string) bool {
		for _, m := range maps {
			if _, ok := m.Route(model); ok {
				return true
			}
		}
		return false
	}
	var out []error
	if d := strings.TrimSpace(defaultModel); d != "" && !served(d) {
		out = append(out, fmt.Errorf("SYS1_MODEL: model %q is served by no provider of the chain (%s)", d, c.describeMaps(names)))
	}
	var missing []string
	for _, m := range allowed {
		if m = strings.TrimSpace(m); m != "" && m != strings.TrimSpace(defaultModel) && !served(m) {
			missing = append(missing, strconv.Quote(m))
		}
	}
	if len(missing) > 0 {
		out = append(out, fmt.Errorf("SYS1_ALLOWED_MODELS: %s served by no provider of the chain (%s)", strings.Join(missing, ", ")+pluralIs(len(missing)), c.describeMaps(names)))
	}
	return out
}

func pluralIs(n int) string {
	if n == 1 {
		return " is"
	}
	return " are"
}

func (c *Config) rawModels(kind string) string {
	switch kind {
	case KindOllama:
		return c.OllamaModels
	case KindSystemOne:
		return c.SystemOne.Models
	case KindSimulator:
		return c.SimulatorModels
	}
	return ""
}

func (c *Config) describeMaps(names []string) string {
	parts := make([]string, len(names))
	for i, name := range names {
		m, _ := chain.ParseModelMap(c.rawModels(name))
		var served []string
		for _, r := range m.Routes() {
			served = append(served, r.Requested)
		}
		parts[i] = fmt.Sprintf("%s serves %s", name, strings.Join(served, ", "))
		if m.PassThrough() {
			parts[i] = name + " serves any model"
		}
	}
	return strings.Join(parts, "; ")
}

// NewChain builds the configured chain. A bad configuration returns one error naming every
// bad variable.
func NewChain(cfg Config, deps Deps) (*chain.Chain, error) {
	links, ccfg, err := Links(cfg, deps)
	if err != nil {
		return nil, err
	}
	return chain.New(ccfg, links...)
}

// Links builds the configured chain's links (each with a fixed limiter of deps.Concurrency)
// and its behaviour, for a caller that assembles the chain itself (the worker, which owns
// concurrency: it replaces the limiters and observes the calls). A bad configuration returns
// one error naming every bad variable.
func Links(cfg Config, deps Deps) ([]chain.Link, chain.Config, error) {
	errs := cfg.Validate()
	errs = append(errs, cfg.CheckModels(deps.DefaultModel, deps.AllowedModels)...)
	if len(errs) > 0 {
		return nil, chain.Config{}, fmt.Errorf("provider configuration: %w", errors.Join(errs...))
	}
	names, _ := cfg.chain()
	failures, _ := cfg.breakerFailures()
	cooldown, _ := cfg.breakerCooldown()
	concurrency := max(deps.Concurrency, 1)
	links := make([]chain.Link, 0, len(names))
	for _, name := range names {
		models, _ := modelMap("", cfg.rawModels(name))
		p, settings, err := cfg.build(name, probeModel(models, deps.DefaultModel), deps)
		if err != nil {
			return nil, chain.Config{}, fmt.Errorf("provider configuration: %w", err)
		}
		links = append(links, chain.Link{Name: name, Provider: p, Models: models, Limiter: limit.NewFixed(concurrency), Settings: settings})
	}
	return links, chain.Config{BreakerFailures: failures, BreakerCooldown: cooldown, Clock: deps.Clock, Logger: deps.Logger}, nil
}

// probeModel is the model a provider's probe looks for: what the default model maps to, else
// the first mapped model (a provider that serves only other models).
func probeModel(m chain.ModelMap, defaultModel string) string {
	if sent, ok := m.Route(defaultModel); ok {
		return sent
	}
	if routes := m.Routes(); len(routes) > 0 {
		return routes[0].Sent
	}
	return defaultModel
}

// build makes one provider and the settings Describe shows for it (never a secret or a URL).
func (c *Config) build(kind, model string, deps Deps) (provider.Provider, map[string]string, error) {
	switch kind {
	case KindSimulator:
		latency, _ := c.simulatorLatency()
		return simulator.New(latency), map[string]string{"latency_ms": strconv.FormatInt(latency.Milliseconds(), 10)}, nil
	case KindSystemOne:
		sc, _ := c.systemOne(false)
		sc.Model, sc.MaxConns = model, deps.Concurrency
		p, err := systemone.New(sc, systemone.Deps{Log: deps.Logger, HTTPClient: deps.HTTPClient})
		if err != nil {
			return nil, nil, err
		}
		timeout := sc.Timeout
		if timeout == 0 {
			timeout = systemone.DefaultTimeout
		}
		settings := map[string]string{"timeout_ms": strconv.FormatInt(timeout.Milliseconds(), 10), "probe_path": systemone.ModelsPath}
		if pp := strings.TrimSpace(sc.ProbePath); pp != "" {
			settings["probe_path"] = pp
		}
		return p, settings, nil
	default:
		oc := c.Ollama
		oc.Model, oc.MaxConns = model, deps.Concurrency
		p, err := ollama.New(oc, ollama.Deps{Log: deps.Logger, HTTPClient: deps.HTTPClient})
		if err != nil {
			return nil, nil, err
		}
		timeout := ollama.DefaultTimeout
		if ms, err := strconv.ParseInt(strings.TrimSpace(c.Ollama.TimeoutMS), 10, 64); err == nil {
			timeout = time.Duration(ms) * time.Millisecond
		}
		return p, map[string]string{"timeout_ms": strconv.FormatInt(timeout.Milliseconds(), 10)}, nil
	}
}

// New builds the one provider of a one-provider configuration, for callers that predate the
// chain. A chain of more than one provider is refused (use NewChain): dropping the fallbacks
// silently would be worse than not starting. A model map is refused for the same reason: only
// the chain applies it.
func New(cfg Config, deps Deps) (provider.Provider, error) {
	if errs := cfg.Validate(); len(errs) > 0 {
		return nil, fmt.Errorf("provider configuration: %w", errors.Join(errs...))
	}
	names, _ := cfg.chain()
	if len(names) != 1 {
		return nil, fmt.Errorf("provider configuration: SYS1_PROVIDERS lists %d providers; this caller builds one (use backend.NewChain)", len(names))
	}
	models, _ := modelMap("", cfg.rawModels(names[0]))
	if !models.PassThrough() {
		return nil, fmt.Errorf("provider configuration: the %s model map is applied by the provider chain only (use backend.NewChain)", names[0])
	}
	p, _, err := cfg.build(names[0], deps.DefaultModel, deps)
	if err != nil {
		return nil, fmt.Errorf("provider configuration: %w", err)
	}
	return p, nil
}
