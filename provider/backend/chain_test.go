package backend_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/rs/zerolog"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/provider/backend"
	"github.com/sys1hq/sys1/provider/chain"
	"github.com/sys1hq/sys1/provider/ollamatest"
	"github.com/sys1hq/sys1/provider/systemonetest"
)

func request(t *testing.T, model string) *contract.Request {
	t.Helper()
	req, err := contract.DecodeRequest(fmt.Appendf(nil, `{"model":%q,"state":"s","questions":{"q":{"type":"noul","instructions":"?"}}}`, model))
	if err != nil {
		t.Fatal(err)
	}
	out, err := contract.Policy{DefaultModel: "nimble", AllowedModels: []string{"fast"}}.Resolve(req)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestSYS1ProvidersBuildsTheChain(t *testing.T) {
	local := ollamatest.New(t)
	hosted := systemonetest.New(t)
	cfg := parse(t, map[string]string{
		"SYS1_PROVIDERS":            " Ollama , systemone,simulator",
		"SYS1_OLLAMA_BASE_URL":      local.URL(),
		"SYS1_OLLAMA_MODELS":        "nimble=nimble:latest",
		"SYS1_SYSTEMONE_BASE_URL":   hosted.URL(),
		"SYS1_SYSTEMONE_API_KEY":    hosted.Key(),
		"SYS1_SYSTEMONE_MODELS":     "nimble=jev-1.13.0,fast=jev-lite",
		"SYS1_SYSTEMONE_TIMEOUT_MS": "4000",
		"SYS1_SIMULATOR_MODELS":     "fast=fast",
		"SYS1_BREAKER_FAILURES":     "2",
		"SYS1_BREAKER_COOLDOWN":     "1m",
	})
	if fmt.Sprint(cfg.Chain()) != "[ollama systemone simulator]" {
		t.Fatalf("chain %v", cfg.Chain())
	}
	c, err := backend.NewChain(cfg, backend.Deps{DefaultModel: "nimble", AllowedModels: []string{"fast"}, Concurrency: 4})
	if err != nil {
		t.Fatal(err)
	}
	if h := c.ProbeNow(context.Background()); h.Status != chain.StatusOK || !h.Providers[1].OK || !h.Providers[2].OK || h.Providers[0].Limit != 4 {
		t.Fatalf("health %+v", h)
	}
	d := c.Describe()
	if d.Breaker.Failures != 2 || d.Breaker.CooldownMS != 60000 || d.Providers[1].Settings["timeout_ms"] != "4000" || d.Providers[1].Settings["probe_path"] != "/v1/models" ||
		fmt.Sprint(d.Providers[1].Models) != "[{nimble jev-1.13.0} {fast jev-lite}]" || d.Providers[0].Settings["timeout_ms"] != "30000" {
		t.Fatalf("describe %+v", d)
	}
	res, err := c.Evaluate(context.Background(), request(t, "fast"), 1)
	if err != nil || res.Provider != "systemone" || res.Model != "jev-lite" {
		t.Fatalf("fast: %v from %s/%s", err, res.Provider, res.Model)
	}
	local.FailAlways(ollamatest.Status(500))
	res, err = c.Evaluate(context.Background(), request(t, "nimble"), 1)
	if err != nil || res.Provider != "systemone" || res.Model != "jev-1.13.0" || len(res.Attempts) != 2 {
		t.Fatalf("primary down: %v from %s (%+v)", err, res.Provider, res.Attempts)
	}
}

func TestTheOneProviderForms(t *testing.T) {
	srv := ollamatest.New(t)
	for _, tc := range []struct {
		vars  map[string]string
		chain string
	}{
		{map[string]string{"SYS1_OLLAMA_BASE_URL": srv.URL()}, "[ollama]"},
		{map[string]string{"SYS1_PROVIDER": "simulator"}, "[simulator]"},
		{map[string]string{"SYS1_PROVIDERS": "simulator"}, "[simulator]"},
		{map[string]string{"SYS1_PROVIDERS": "simulator", "SYS1_PROVIDER": "Simulator"}, "[simulator]"},
	} {
		cfg := parse(t, tc.vars)
		c, err := backend.NewChain(cfg, backend.Deps{DefaultModel: "nimble"})
		if err != nil {
			t.Fatalf("%v: %v", tc.vars, err)
		}
		if got := fmt.Sprint(c.Names()); got != tc.chain {
			t.Errorf("%v: chain %s, want %s", tc.vars, got, tc.chain)
		}
		if _, err := backend.New(cfg, backend.Deps{}); err != nil {
			t.Errorf("%v: New: %v", tc.vars, err)
		}
	}
	// New builds one provider: a longer chain or a model map needs the chain
	for _, vars := range []map[string]string{
		{"SYS1_PROVIDERS": "ollama,simulator", "SYS1_OLLAMA_BASE_URL": srv.URL()},
		{"SYS1_PROVIDER": "simulator", "SYS1_SIMULATOR_MODELS": "nimble=x"},
	} {
		if _, err := backend.New(parse(t, vars), backend.Deps{}); err == nil || !strings.Contains(err.Error(), "use backend.NewChain") {
			t.Errorf("%v: New gave %v", vars, err)
		}
	}
}

func TestChainValidationNamesEveryBadVariable(t *testing.T) {
	cases := []struct {
		name string
		vars map[string]string
		want []string // one error per variable, in any order
	}{
		{"the list", map[string]string{"SYS1_PROVIDERS": "ollama,gpt,OLLAMA,,systemone"}, []string{
			`SYS1_PROVIDERS: "gpt" is not one of ollama, simulator, systemone; ollama is listed twice; entry 4 is empty`,
		}},
		{"both forms", map[string]string{"SYS1_PROVIDERS": "ollama,systemone", "SYS1_PROVIDER": "ollama", "SYS1_SYSTEMONE_BASE_URL": "https://h", "SYS1_SYSTEMONE_API_KEY": "k"}, []string{
			"SYS1_PROVIDER: set either SYS1_PROVIDER (one provider) or SYS1_PROVIDERS (the chain), not both",
		}},
		{"a comma in the one-provider form", map[string]string{"SYS1_PROVIDER": "ollama,systemone"}, []string{"SYS1_PROVIDER: \"ollama,systemone\" names more than one provider; put a chain in SYS1_PROVIDERS"}},
		{"everything else at once", map[string]string{
			"SYS1_PROVIDERS":            "ollama,systemone,simulator",
			"SYS1_OLLAMA_BASE_URL":      "http://admin:hunter2@ollama.internal:11434",
			"SYS1_OLLAMA_MODELS":        "nimble",
			"SYS1_SYSTEMONE_TIMEOUT_MS": "soon",
			"SYS1_SYSTEMONE_MODELS":     "nimble=jev=1,fast=",
			"SYS1_SYSTEMONE_PROBE_PATH": "health",
			"SYS1_SIMULATOR_MODELS":     "a=b,a=c",
			"SYS1_SIMULATOR_LATENCY":    "-1s",
			"SYS1_BREAKER_FAILURES":     "0",
			"SYS1_BREAKER_COOLDOWN":     "soon",
		}, []string{
			"SYS1_OLLAMA_BASE_URL: http://ollama.internal:11434: must not carry credentials",
			`SYS1_OLLAMA_MODELS: entry 1 "nimble" is not requested=model`,
			`SYS1_SYSTEMONE_TIMEOUT_MS: "soon" is not a whole number of milliseconds`,
			"SYS1_SYSTEMONE_BASE_URL: required for provider systemone",
			"SYS1_SYSTEMONE_API_KEY: required for provider systemone",
			"SYS1_SYSTEMONE_PROBE_PATH",
			`SYS1_SYSTEMONE_MODELS: entry 1 "nimble=jev=1" has more than one =; "fast"="": the model is empty`,
			`SYS1_SIMULATOR_MODELS: "a" is mapped twice`,
			"SYS1_SIMULATOR_LATENCY",
			`SYS1_BREAKER_FAILURES: "0" is not a whole number between 1 and 10000`,
			`SYS1_BREAKER_COOLDOWN: "soon" is not a positive duration`,
		}},
		{"a hosted base URL with credentials or another scheme", map[string]string{
			"SYS1_PROVIDERS": "systemone", "SYS1_SYSTEMONE_BASE_URL": "ftp://user:pw@api.typesafe.ai", "SYS1_SYSTEMONE_API_KEY": "k",
		}, []string{"SYS1_SYSTEMONE_BASE_URL: ftp://api.typesafe.ai: scheme must be http or https"}},
		{"an inherited bad SYS1_TIMEOUT_MS", map[string]string{
			"SYS1_PROVIDERS": "systemone", "SYS1_SYSTEMONE_BASE_URL": "https://api.typesafe.ai", "SYS1_SYSTEMONE_API_KEY": "k", "SYS1_TIMEOUT_MS": "0",
		}, []string{"SYS1_TIMEOUT_MS"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := parse(t, tc.vars)
			errs := cfg.Validate()
			if len(errs) != len(tc.want) {
				t.Errorf("%d errors, want %d:\n%v", len(errs), len(tc.want), errors.Join(errs...))
			}
			msg := errors.Join(errs...).Error()
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("lacks %q:\n%s", w, msg)
				}
			}
			if strings.Contains(msg, "hunter2") || strings.Contains(msg, "admin") || strings.Contains(msg, ":pw@") {
				t.Errorf("credentials echoed: %s", msg)
			}
			if _, err := backend.NewChain(cfg, backend.Deps{DefaultModel: "nimble"}); err == nil {
				t.Error("NewChain accepted it")
			}
		})
	}
}

// Every model the policy allows must be served by some provider of the chain.
func TestModelsNoProviderServesAreNamed(t *testing.T) {
	cfg := parse(t, map[string]string{
		"SYS1_PROVIDERS": "systemone,simulator", "SYS1_SYSTEMONE_BASE_URL": "https://api.typesafe.ai", "SYS1_SYSTEMONE_API_KEY": "k",
		"SYS1_SYSTEMONE_MODELS": "fast=jev-lite", "SYS1_SIMULATOR_MODELS": "fast=fast,demo=demo",
	})
	errs := cfg.CheckModels("nimble", []string{"fast", "other", "nimble", "third"})
	msg := errors.Join(errs...).Error()
	if len(errs) != 2 ||
		!strings.Contains(msg, `SYS1_MODEL: model "nimble" is served by no provider of the chain (systemone serves fast; simulator serves fast, demo)`) ||
		!strings.Contains(msg, `SYS1_ALLOWED_MODELS: "other", "third" are served by no provider of the chain`) {
		t.Fatalf("%d errors: %s", len(errs), msg)
	}
	if _, err := backend.NewChain(cfg, backend.Deps{DefaultModel: "nimble", AllowedModels: []string{"other"}}); err == nil || !strings.Contains(err.Error(), "SYS1_ALLOWED_MODELS") {
		t.Fatalf("NewChain: %v", err)
	}
	// a pass-through provider serves anything
	cfg.SimulatorModels = ""
	if errs := cfg.CheckModels("nimble", []string{"other"}); len(errs) != 0 {
		t.Fatalf("with a pass-through provider: %v", errs)
	}
}

// The hosted API key from the environment reaches the server and nothing else: not the
// configuration's printed forms, not a validation error, not Describe, Health, attempts or
// the log.
func TestTheSystemOneKeyStaysPut(t *testing.T) {
	const key = "sk-ts-live-from-the-environment-31"
	hosted := systemonetest.New(t, systemonetest.WithAPIKey(key))
	var logs syncBuffer
	cfg := parse(t, map[string]string{
		"SYS1_PROVIDERS": "systemone", "SYS1_SYSTEMONE_BASE_URL": hosted.URL(), "SYS1_SYSTEMONE_API_KEY": key,
		"SYS1_SYSTEMONE_MODELS": "nimble=jev-1.13.0",
	})
	c, err := backend.NewChain(cfg, backend.Deps{DefaultModel: "nimble", Logger: zerolog.New(&logs).Level(zerolog.TraceLevel)})
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.Evaluate(context.Background(), request(t, "nimble"), 1)
	if err != nil || hosted.Requests()[0].Header.Get("Authorization") != "Bearer "+key {
		t.Fatalf("%v; sent %q", err, hosted.Requests()[0].Header.Get("Authorization"))
	}
	hosted.Fail(1, systemonetest.Body(401, "application/json", `{"error":"key `+key+` revoked"}`))
	res2, err2 := c.Evaluate(context.Background(), request(t, "nimble"), 1)
	health := c.ProbeNow(context.Background())
	bad := cfg
	bad.SystemOne.BaseURL = "http://x:" + key + "@h"
	seen := []string{fmt.Sprintf("%v %+v %#v", cfg, cfg, cfg), fmt.Sprint(err2), errors.Join(bad.Validate()...).Error(), logs.String()}
	for _, v := range []any{cfg, c.Describe(), health, res.Attempts, res2.Attempts} {
		b, _ := json.Marshal(v)
		seen = append(seen, string(b))
	}
	for _, s := range seen {
		if strings.Contains(s, key) {
			t.Fatalf("the key leaked: %s", s)
		}
	}
	if !strings.Contains(fmt.Sprint(err2), "check SYS1_SYSTEMONE_API_KEY") {
		t.Fatalf("a revoked key: %v", err2)
	}
}

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
