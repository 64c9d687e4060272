package backend_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/caarlos0/env/v11"

	"github.com/sys1hq/sys1/provider/backend"
	"github.com/sys1hq/sys1/provider/ollama"
	"github.com/sys1hq/sys1/provider/ollamatest"
	"github.com/sys1hq/sys1/provider/simulator"
)

func parse(t *testing.T, vars map[string]string) backend.Config {
	t.Helper()
	var cfg backend.Config
	if err := env.ParseWithOptions(&cfg, env.Options{Environment: vars}); err != nil {
		t.Fatalf("env: %v", err)
	}
	return cfg
}

func TestSelectsTheProvider(t *testing.T) {
	srv := ollamatest.New(t)
	cases := []struct {
		vars map[string]string
		name string
	}{
		{map[string]string{"SYS1_OLLAMA_BASE_URL": srv.URL()}, "ollama"},
		{map[string]string{"OLLAMA_API_URL": srv.URL(), "SYS1_PROVIDER": "ollama"}, "ollama"},
		{map[string]string{"SYS1_PROVIDER": "simulator"}, "simulator"},
		{map[string]string{"SYS1_PROVIDER": " Simulator ", "SYS1_SIMULATOR_LATENCY": "250ms"}, "simulator"},
		{map[string]string{"SYS1_PROVIDER": "simulator", "SYS1_SIMULATOR_LATENCY": "15"}, "simulator"},
	}
	for _, tc := range cases {
		cfg := parse(t, tc.vars)
		p, err := backend.New(cfg, backend.Deps{DefaultModel: "nimble", Concurrency: 8})
		if err != nil {
			t.Fatalf("%v: %v", tc.vars, err)
		}
		if p.Name() != tc.name {
			t.Errorf("%v: provider %q, want %q", tc.vars, p.Name(), tc.name)
		}
		if !p.Probe(context.Background()).Healthy() {
			t.Errorf("%v: unhealthy", tc.vars)
		}
	}
	cfg := parse(t, map[string]string{"SYS1_PROVIDER": "simulator"})
	p, _ := backend.New(cfg, backend.Deps{})
	if _, ok := p.(*simulator.Simulator); !ok {
		t.Errorf("simulator config built %T", p)
	}
	cfg = parse(t, map[string]string{"SYS1_OLLAMA_BASE_URL": srv.URL(), "SYS1_TIMEOUT_MS": "1234"})
	p, _ = backend.New(cfg, backend.Deps{})
	if _, ok := p.(*ollama.Client); !ok {
		t.Errorf("ollama config built %T", p)
	}
}

func TestValidationNamesEveryBadVariable(t *testing.T) {
	cases := []struct {
		vars  map[string]string
		wantN int // one error per bad variable
		want  []string
	}{
		{map[string]string{"SYS1_PROVIDER": "foo"}, 1, []string{`SYS1_PROVIDER: "foo" is not one of ollama, simulator`}},
		{map[string]string{"OLLAMA_API_URL": "http://"}, 1, []string{"OLLAMA_API_URL", "host is missing"}},
		{map[string]string{"SYS1_OLLAMA_BASE_URL": "nope://x", "SYS1_TIMEOUT_MS": "-1", "SYS1_SIMULATOR_LATENCY": "fast"}, 3,
			[]string{"SYS1_OLLAMA_BASE_URL", "SYS1_TIMEOUT_MS", "SYS1_SIMULATOR_LATENCY"}},
		{map[string]string{"SYS1_PROVIDER": "simulator", "SYS1_SIMULATOR_LATENCY": "-5ms"}, 1, []string{"SYS1_SIMULATOR_LATENCY"}},
	}
	for _, tc := range cases {
		cfg := parse(t, tc.vars)
		errs := cfg.Validate()
		if len(errs) != tc.wantN {
			t.Errorf("%v: %d errors %v, want %d", tc.vars, len(errs), errs, tc.wantN)
		}
		msg := errors.Join(errs...).Error()
		for _, w := range tc.want {
			if !strings.Contains(msg, w) {
				t.Errorf("%v: %q lacks %q", tc.vars, msg, w)
			}
		}
		if _, err := backend.New(cfg, backend.Deps{}); err == nil {
			t.Errorf("%v: New accepted a bad configuration", tc.vars)
		}
	}
	// the simulator needs no Ollama URL
	sim := parse(t, map[string]string{"SYS1_PROVIDER": "simulator"})
	if errs := sim.Validate(); len(errs) != 0 {
		t.Errorf("simulator without Ollama URL: %v", errs)
	}
}

func TestAPIKeyFromTheEnvironmentReachesOllama(t *testing.T) {
	srv := ollamatest.New(t, ollamatest.WithAPIKey("env-key"))
	cfg := parse(t, map[string]string{"SYS1_OLLAMA_BASE_URL": srv.URL(), "SYS1_OLLAMA_API_KEY": "env-key"})
	p, err := backend.New(cfg, backend.Deps{DefaultModel: "nimble"})
	if err != nil {
		t.Fatal(err)
	}
	if res := p.Probe(context.Background()); !res.Healthy() {
		t.Fatalf("probe with the key from SYS1_OLLAMA_API_KEY: %+v", res)
	}
	if got := srv.Requests()[0].Header.Get("Authorization"); got != "Bearer env-key" {
		t.Fatalf("Authorization = %q", got)
	}
}
