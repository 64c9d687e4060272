// Package backend chooses and builds the System One provider from the environment
// (SYS1_PROVIDER). It sits apart from package provider so that provider stays free of its
// implementations' imports.
package backend

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/sys1hq/sys1/provider"
	"github.com/sys1hq/sys1/provider/ollama"
	"github.com/sys1hq/sys1/provider/simulator"
)

// Provider kinds accepted by SYS1_PROVIDER.
const (
	KindOllama    = "ollama"
	KindSimulator = "simulator"
)

// Config is the provider selection. The Ollama part is read too but only validated when
// Ollama is chosen, so a simulator deployment needs no Ollama URL.
type Config struct {
	Provider string `env:"SYS1_PROVIDER" envDefault:"ollama"`
	// SimulatorLatency is a Go duration ("250ms") or a whole number of milliseconds.
	SimulatorLatency string `env:"SYS1_SIMULATOR_LATENCY" envDefault:"0"`
	Ollama           ollama.Config
}

// Kind is the chosen provider kind, normalised.
func (c *Config) Kind() string { return strings.ToLower(strings.TrimSpace(c.Provider)) }

// Validate returns one error per bad variable, each naming it.
func (c *Config) Validate() []error {
	var errs []error
	switch c.Kind() {
	case KindOllama, "":
		errs = append(errs, c.Ollama.Validate()...)
	case KindSimulator:
	default:
		errs = append(errs, fmt.Errorf("SYS1_PROVIDER: %q is not one of ollama, simulator", c.Provider))
	}
	if _, err := c.simulatorLatency(); err != nil {
		errs = append(errs, err)
	}
	return errs
}

func (c *Config) simulatorLatency() (time.Duration, error) {
	v := strings.TrimSpace(c.SimulatorLatency)
	if v == "" {
		return 0, nil
	}
	if ms, err := strconv.ParseInt(v, 10, 64); err == nil && ms >= 0 {
		return time.Duration(ms) * time.Millisecond, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("SYS1_SIMULATOR_LATENCY: %q is not a non-negative duration (e.g. 250ms) or whole milliseconds", v)
	}
	return d, nil
}

// Deps are what the provider needs from the process rather than from its own variables.
type Deps struct {
	// DefaultModel is SYS1_MODEL, which Probe looks for.
	DefaultModel string
	// Concurrency is SYS1_CONCURRENCY: the HTTP keep-alive pool is sized to it.
	Concurrency int
	Logger      zerolog.Logger
	// HTTPClient replaces Ollama's HTTP client (tests); nil builds one.
	HTTPClient *http.Client
}

// New builds the chosen provider. A bad configuration returns one error naming every bad
// variable.
func New(cfg Config, deps Deps) (provider.Provider, error) {
	if errs := cfg.Validate(); len(errs) > 0 {
		return nil, fmt.Errorf("provider configuration: %w", errors.Join(errs...))
	}
	switch cfg.Kind() {
	case KindSimulator:
		latency, _ := cfg.simulatorLatency()
		return simulator.New(latency), nil
	default:
		opts := []ollama.Option{ollama.WithLogger(deps.Logger)}
		if deps.DefaultModel != "" {
			opts = append(opts, ollama.WithModel(deps.DefaultModel))
		}
		if deps.Concurrency > 0 {
			opts = append(opts, ollama.WithMaxConns(deps.Concurrency))
		}
		if deps.HTTPClient != nil {
			opts = append(opts, ollama.WithHTTPClient(deps.HTTPClient))
		}
		return ollama.New(cfg.Ollama, opts...)
	}
}
