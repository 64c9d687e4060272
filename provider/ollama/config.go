package ollama

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/provider/internal/upstream"
)

// DefaultTimeout is SYS1_TIMEOUT_MS's default.
const DefaultTimeout = 30 * time.Second

// DefaultBaseURL is where Ollama listens out of the box, used when neither
// SYS1_OLLAMA_BASE_URL nor OLLAMA_API_URL is set. The worker's start-up probe names the URL it
// tried, and /readyz fails while nothing answers there, so a missing setting is never silent.
const DefaultBaseURL = "http://127.0.0.1:11434"

// Config is the adapter's environment. Numbers are kept as strings so that a bad value is
// reported by Validate with the variable's name (the env library names struct fields).
type Config struct {
	// BaseURL is Ollama's base URL; empty means OLLAMA_API_URL, then DefaultBaseURL.
	BaseURL string `env:"SYS1_OLLAMA_BASE_URL"`
	// APIURL is the fallback used when BaseURL is empty (the seed's variable name).
	APIURL string `env:"OLLAMA_API_URL"`
	// APIKey is an optional bearer token for Ollama behind a proxy or ollama.com. Its type
	// redacts it whenever it is printed.
	APIKey Secret `env:"SYS1_OLLAMA_API_KEY"`
	// TimeoutMS bounds one provider call, in milliseconds; empty means 30000.
	TimeoutMS string `env:"SYS1_TIMEOUT_MS" envDefault:"30000"`
	// Model is the default model (SYS1_MODEL) Probe looks for; empty: DefaultModel.
	Model string
	// MaxConns sizes the keep-alive pool: the worker's concurrency, so every call in flight
	// can reuse a warm connection; zero: DefaultMaxConns.
	MaxConns int
}

// DefaultMaxConns is the keep-alive pool's size when Config.MaxConns is not set.
const DefaultMaxConns = 16

// Secret is the one secret type of sys1's configuration: it never prints (see
// contract.Secret).
type Secret = contract.Secret

// baseURL returns the configured base URL and the variable it came from.
func (c *Config) baseURL() (raw, variable string) {
	if v := strings.TrimSpace(c.BaseURL); v != "" {
		return v, "SYS1_OLLAMA_BASE_URL"
	}
	if v := strings.TrimSpace(c.APIURL); v != "" {
		return v, "OLLAMA_API_URL"
	}
	return DefaultBaseURL, "SYS1_OLLAMA_BASE_URL"
}

// Validate returns one error per bad variable, each naming it.
func (c *Config) Validate() []error {
	var errs []error
	if _, err := c.parseBaseURL(); err != nil {
		errs = append(errs, err)
	}
	if _, err := c.timeout(); err != nil {
		errs = append(errs, err)
	}
	return errs
}

// parseBaseURL checks the base URL (http or https, a host, no query, no credentials).
// Messages never echo credentials embedded in the URL.
func (c *Config) parseBaseURL() (*url.URL, error) {
	raw, variable := c.baseURL()
	return upstream.ParseBaseURL(raw, variable)
}

// timeout parses SYS1_TIMEOUT_MS.
func (c *Config) timeout() (time.Duration, error) {
	v := strings.TrimSpace(c.TimeoutMS)
	if v == "" {
		return DefaultTimeout, nil
	}
	ms, err := strconv.ParseInt(v, 10, 64)
	if err != nil || ms <= 0 || ms > int64(24*time.Hour/time.Millisecond) {
		return 0, fmt.Errorf("SYS1_TIMEOUT_MS: %q is not a whole number of milliseconds between 1 and 86400000", v)
	}
	return time.Duration(ms) * time.Millisecond, nil
}
