package systemone_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/provider"
	"github.com/sys1hq/sys1/provider/ollamatest"
	"github.com/sys1hq/sys1/provider/systemone"
	"github.com/sys1hq/sys1/provider/systemonetest"
)

const ordered = `{"model":"jev-1.13.0","state":{"zeta":1,"alpha":[2,1],"html":"<b>&amp;</b>"},"questions":{
 "zulu":{"type":"choice","instructions":{"b":1,"a":2},"criteria":{"yak":"Y","apple":"A","mango":null}},
 "alpha":{"type":"score","instructions":"How much?","criteria":["none","some","lots"]},
 "mike":{"type":"noul","instructions":"Is it?"}}}`

func resolved(t testing.TB, body string) *contract.Request {
	t.Helper()
	req, err := contract.DecodeRequest([]byte(body))
	if err != nil {
		t.Fatalf("DecodeRequest: %v", err)
	}
	out, err := contract.Policy{DefaultModel: "jev-1.13.0", AllowedModels: []string{"jev-lite", "unknown-model"}}.Resolve(req)
	if err != nil {
		t.Fatalf("Resolve: %v", err)
	}
	return out
}

func newClient(t testing.TB, srv *systemonetest.Server, cfg systemone.Config, deps ...systemone.Deps) *systemone.Client {
	t.Helper()
	if cfg.BaseURL == "" {
		cfg.BaseURL = srv.URL()
	}
	if cfg.APIKey == "" {
		cfg.APIKey = contract.Secret(srv.Key())
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 5 * time.Second
	}
	var d systemone.Deps
	if len(deps) > 0 {
		d = deps[0]
	}
	c, err := systemone.New(cfg, d)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

func TestEvaluateSendsTheOrderedRequestWithTheKey(t *testing.T) {
	srv := systemonetest.New(t)
	c := newClient(t, srv, systemone.Config{})
	req := resolved(t, ordered)
	resp, err := c.Evaluate(context.Background(), req)
	if err != nil {
		t.Fatalf("Evaluate: %v", err)
	}
	recs := srv.Requests()
	if len(recs) != 1 || recs[0].Path != "/v1/systemone" {
		t.Fatalf("requests: %+v", recs)
	}
	if !bytes.Equal(recs[0].Body, req.AppendJSON(nil)) {
		t.Fatalf("wire bytes differ from the ordered encoding:\n got %s", recs[0].Body)
	}
	if got := recs[0].Header.Get("Authorization"); got != "Bearer "+srv.Key() {
		t.Fatalf("Authorization = %q", got)
	}
	// the wrapped fake decoded the same ordered questions
	inner := srv.Inner().SystemOneRequests()
	qs, err := inner[0].Questions()
	if err != nil || fmt.Sprint(qs) != "[{zulu choice [yak apple mango]} {alpha score [none some lots]} {mike noul []}]" {
		t.Fatalf("questions %v, %v", qs, err)
	}
	if resp.Model != "jev-1.13.0" || len(resp.Answers) != 3 || resp.Answers[0].Name != "zulu" {
		t.Fatalf("answer: %+v", resp)
	}
	if c.Name() != "systemone" {
		t.Fatal(c.Name())
	}
}

func TestErrorTable(t *testing.T) {
	past := time.Now().Add(-time.Hour).UTC().Format(http.TimeFormat)
	cases := []struct {
		name       string
		fault      systemonetest.Fault
		code       contract.Code
		outcome    string
		inMessage  string
		retryAfter time.Duration
	}{
		{"400", systemonetest.Status(400), contract.CodeInvalidRequest, contract.OutcomeError, "rejected the request (HTTP 400)", 0},
		{"422", systemonetest.Status(422), contract.CodeInvalidRequest, contract.OutcomeError, "rejected the request (HTTP 422)", 0},
		{"401", systemonetest.Unauthorized(), contract.CodeNotConfigured, contract.OutcomeUnavailable, "refused the API key (HTTP 401); check SYS1_SYSTEMONE_API_KEY", 0},
		{"403", systemonetest.Forbidden(), contract.CodeNotConfigured, contract.OutcomeUnavailable, `refused access to model "jev-1.13.0" with this API key (HTTP 403); check SYS1_SYSTEMONE_API_KEY and SYS1_SYSTEMONE_MODELS`, 0},
		{"404", systemonetest.Status(404), contract.CodeModelUnavailable, contract.OutcomeUnavailable, `model "jev-1.13.0" is not available on systemone (HTTP 404)`, 0},
		{"408", systemonetest.Status(408), contract.CodeTimeout, contract.OutcomeTimeout, "gave up on the request (HTTP 408)", 0},
		{"413", systemonetest.Status(413), contract.CodeRequestTooLarge, contract.OutcomeError, "too large (HTTP 413)", 0},
		{"429 with seconds", systemonetest.Busy(429, "3"), contract.CodeProviderBusy, contract.OutcomeBusy, "busy (HTTP 429); retry after 3s", 3 * time.Second},
		{"429 with retry-after-ms", systemonetest.BusyMS(429, "1500", "2"), contract.CodeProviderBusy, contract.OutcomeBusy, "retry after 1.5s", 1500 * time.Millisecond},
		{"429 without hint", systemonetest.Busy(429, ""), contract.CodeProviderBusy, contract.OutcomeBusy, "busy (HTTP 429)", 0},
		{"503 with a past date", systemonetest.Fault{Status: 503, RetryAfter: past, Body: hostedLeak}, contract.CodeProviderBusy, contract.OutcomeBusy, "busy (HTTP 503)", 0},
		{"529 overloaded", systemonetest.Fault{Status: 529, RetryAfter: "7", Body: hostedLeak}, contract.CodeProviderBusy, contract.OutcomeBusy, "busy (HTTP 529); retry after 7s", 7 * time.Second},
		{"500", systemonetest.Body(500, "application/json", hostedLeak), contract.CodeUpstreamError, contract.OutcomeError, "failed (HTTP 500)", 0},
		{"502 html", systemonetest.Body(502, "text/html", "<html>Bad Gateway: "+leak+"</html>"), contract.CodeUpstreamError, contract.OutcomeError, "failed (HTTP 502)", 0},
		{"504", systemonetest.Body(504, "text/plain", leak), contract.CodeUpstreamError, contract.OutcomeError, "HTTP 504", 0},
		{"another 4xx", systemonetest.Status(418), contract.CodeUpstreamError, contract.OutcomeError, "HTTP 418", 0},
		{"redirect 307", systemonetest.Redirect(307, "/v1/systemone"), contract.CodeNotConfigured, contract.OutcomeUnavailable, "redirect (HTTP 307), which is not followed; check SYS1_SYSTEMONE_BASE_URL", 0},
		{"redirect 301 elsewhere", systemonetest.Redirect(301, "https://attacker.example/v1/systemone"), contract.CodeNotConfigured, contract.OutcomeUnavailable, "redirect (HTTP 301)", 0},
		{"wrong type", systemonetest.Malformed(ollamatest.MalformedWrongType), contract.CodeUpstreamError, contract.OutcomeMalformed, "breaks the response contract", 0},
		{"missing answer", systemonetest.Malformed(ollamatest.MalformedMissingAnswer), contract.CodeUpstreamError, contract.OutcomeMalformed, "breaks the response contract", 0},
		{"bad sum", systemonetest.Malformed(ollamatest.MalformedBadSum), contract.CodeUpstreamError, contract.OutcomeMalformed, "breaks the response contract", 0},
		{"NaN", systemonetest.Malformed(ollamatest.MalformedNaN), contract.CodeUpstreamError, contract.OutcomeMalformed, "breaks the response contract", 0},
		{"not JSON", systemonetest.Malformed(ollamatest.MalformedNotJSON), contract.CodeUpstreamError, contract.OutcomeMalformed, "breaks the response contract", 0},
		{"truncated", systemonetest.Malformed(ollamatest.MalformedTruncated), contract.CodeUpstreamError, contract.OutcomeMalformed, "breaks the response contract", 0},
		{"too large", systemonetest.Body(200, "application/json", strings.Repeat(" ", systemone.MaxResponseBytes+1)), contract.CodeUpstreamError, contract.OutcomeError, "more than 16 MiB", 0},
		{"connection dropped", systemonetest.Drop(), contract.CodeProviderUnavailable, contract.OutcomeUnavailable, "systemone is unavailable: the connection was closed before an answer", 0},
		{"timeout", systemonetest.Hang(), contract.CodeTimeout, contract.OutcomeTimeout, "did not answer within 150ms (SYS1_SYSTEMONE_TIMEOUT_MS)", 0},
	}
	srv := systemonetest.New(t)
	c := newClient(t, srv, systemone.Config{Timeout: 150 * time.Millisecond})
	host := strings.TrimPrefix(srv.URL(), "http://")
	req := resolved(t, ordered)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv.ResetStats()
			srv.Fail(1, tc.fault)
			_, err := c.Evaluate(context.Background(), req)
			e, ok := contract.AsError(err)
			if !ok {
				t.Fatalf("error %v is not a *contract.Error", err)
			}
			if e.Code != tc.code || e.Status != tc.code.Status() || !strings.HasPrefix(e.Message, "["+string(tc.code)+"] systemone") && !strings.HasPrefix(e.Message, "["+string(tc.code)+"] model") {
				t.Fatalf("got %s (%d) %q, want %s", e.Code, e.Status, e.Message, tc.code)
			}
			if !strings.Contains(e.Message, tc.inMessage) {
				t.Errorf("message %q lacks %q", e.Message, tc.inMessage)
			}
			if e.RetryAfter != tc.retryAfter {
				t.Errorf("RetryAfter = %v, want %v", e.RetryAfter, tc.retryAfter)
			}
			if got := provider.Outcome(err); got != tc.outcome {
				t.Errorf("Outcome = %q, want %q", got, tc.outcome)
			}
			if strings.Contains(e.Message, host) {
				t.Errorf("the message names the host: %q", e.Message)
			}
			// Upstream error bodies (a gateway's internals) reach the operator's log only.
			if leaked(err) {
				t.Errorf("the upstream's body reached the error: %q", err)
			}
			if srv.Calls() != 1 || srv.CountPath("/v1/systemone") != 1 {
				t.Errorf("the fake saw %d calls: the adapter must neither retry nor follow redirects", srv.Calls())
			}
		})
	}
}

// leak is an upstream error body's text that must not reach a producer: a gateway's
// internals (addresses, host names).
const leak = "db at 10.1.2.3:5432 secret-host.internal.corp failed"

// hostedLeak is leak in the hosted APIs' error shape.
var hostedLeak = `{"type":"error","error":{"type":"api_error","message":"` + leak + `"}}`

// leaked reports whether any error in err's chain carries leak or a part of it.
func leaked(err error) bool {
	for e := err; e != nil; e = errors.Unwrap(e) {
		for _, part := range []string{leak, "10.1.2.3", "secret-host"} {
			if strings.Contains(e.Error(), part) {
				return true
			}
		}
	}
	return false
}

// TestUpstreamErrorBodiesGoToTheLogOnly: whatever 5xx status a hosted API answers with, its
// body's text (JSON in the hosted shape or plain text) is in the operator's log line and in no
// error returned to the producer, which gets a generic message with the status.
func TestUpstreamErrorBodiesGoToTheLogOnly(t *testing.T) {
	srv := systemonetest.New(t)
	var logs bytes.Buffer
	c := newClient(t, srv, systemone.Config{}, systemone.Deps{Log: zerolog.New(&logs)})
	req := resolved(t, ordered)
	for status := 500; status <= 599; status++ {
		for _, f := range []systemonetest.Fault{systemonetest.Body(status, "application/json", hostedLeak), systemonetest.Body(status, "text/plain", leak)} {
			logs.Reset()
			srv.Fail(1, f)
			_, err := c.Evaluate(context.Background(), req)
			e, ok := contract.AsError(err)
			if !ok || (e.Code != contract.CodeUpstreamError && e.Code != contract.CodeProviderBusy) || !strings.Contains(e.Message, fmt.Sprintf("(HTTP %d)", status)) {
				t.Fatalf("HTTP %d (%s): error %v", status, f.ContentType, err)
			}
			if leaked(err) {
				t.Errorf("HTTP %d (%s): the upstream's body reached the error: %q", status, f.ContentType, err)
			}
			if !strings.Contains(logs.String(), leak) || !strings.Contains(logs.String(), fmt.Sprintf(`"http_status":%d`, status)) {
				t.Errorf("HTTP %d (%s): the log lacks the upstream's text: %s", status, f.ContentType, logs.String())
			}
		}
	}
}

// A model the server does not serve is answered 404 by the contract-enforcing fake itself
// (not a scripted fault), and a body it refuses is its 400.
func TestTheServersOwnRefusals(t *testing.T) {
	srv := systemonetest.New(t)
	c := newClient(t, srv, systemone.Config{})
	req := resolved(t, ordered)
	req.Model = "unknown-model"
	_, err := c.Evaluate(context.Background(), req)
	if e, ok := contract.AsError(err); !ok || e.Code != contract.CodeModelUnavailable || !strings.Contains(e.Message, `model "unknown-model" is not available`) || strings.Contains(e.Message, "not found") {
		t.Fatalf("unknown model: %v (the upstream's own text stays in the log)", err)
	}
	bad := resolved(t, ordered)
	bad.Questions[1].Levels = bad.Questions[1].Levels[:1] // a score with one level
	_, err = c.Evaluate(context.Background(), bad)
	if e, ok := contract.AsError(err); !ok || e.Code != contract.CodeInvalidRequest {
		t.Fatalf("invalid body: %v", err)
	}
	wrong := newClient(t, srv, systemone.Config{APIKey: "sk-wrong"})
	_, err = wrong.Evaluate(context.Background(), resolved(t, ordered))
	if e, ok := contract.AsError(err); !ok || e.Code != contract.CodeNotConfigured || e.Transient() {
		t.Fatalf("wrong key: %v", err)
	}
}

func TestRedirectsAreNotFollowedEvenWithACustomHTTPClient(t *testing.T) {
	srv := systemonetest.New(t)
	c := newClient(t, srv, systemone.Config{}, systemone.Deps{HTTPClient: &http.Client{}})
	srv.Fail(1, systemonetest.Redirect(http.StatusFound, srv.URL()+"/v1/systemone"))
	_, err := c.Evaluate(context.Background(), resolved(t, ordered))
	if e, ok := contract.AsError(err); !ok || e.Code != contract.CodeNotConfigured || srv.Calls() != 1 {
		t.Fatalf("got %v after %d calls", err, srv.Calls())
	}
}

func TestUnreachable(t *testing.T) {
	srv := systemonetest.NewServer()
	closed := srv.URL()
	srv.Close()
	for name, base := range map[string]string{"refused": closed, "dns": "https://sys1-nowhere.invalid"} {
		c, err := systemone.New(systemone.Config{BaseURL: base, APIKey: "k"}, systemone.Deps{})
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.Evaluate(context.Background(), resolved(t, ordered))
		if e, ok := contract.AsError(err); !ok || e.Code != contract.CodeProviderUnavailable || strings.Contains(e.Message, "127.0.0.1") || strings.Contains(e.Message, "invalid") {
			t.Fatalf("%s: %v", name, err)
		}
	}
}

func TestTimeoutVersusCancel(t *testing.T) {
	srv := systemonetest.New(t)
	srv.FailAlways(systemonetest.Hang())
	req := resolved(t, ordered)
	t.Run("the caller's cancel is a cancel", func(t *testing.T) {
		c := newClient(t, srv, systemone.Config{Timeout: time.Minute})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			_, err := c.Evaluate(ctx, req)
			done <- err
		}()
		wctx, wcancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer wcancel()
		if err := srv.AwaitInFlight(wctx, 1); err != nil {
			t.Fatal(err)
		}
		cancel()
		err := <-done
		if _, isContract := contract.AsError(err); !errors.Is(err, context.Canceled) || isContract {
			t.Fatalf("got %v, want a plain context.Canceled", err)
		}
	})
	t.Run("the caller's deadline is the caller's", func(t *testing.T) {
		c := newClient(t, srv, systemone.Config{Timeout: time.Minute})
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		_, err := c.Evaluate(ctx, req)
		if _, isContract := contract.AsError(err); !errors.Is(err, context.DeadlineExceeded) || isContract {
			t.Fatalf("got %v, want the caller's context.DeadlineExceeded", err)
		}
	})
	t.Run("an already cancelled context sends nothing", func(t *testing.T) {
		srv.ResetStats()
		c := newClient(t, srv, systemone.Config{})
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := c.Evaluate(ctx, req); !errors.Is(err, context.Canceled) || srv.Calls() != 0 {
			t.Fatalf("got %v after %d calls", err, srv.Calls())
		}
	})
}

// The API key never appears in an error, its JSON, a probe finding, a log line (at trace
// level, through the adapter's logger and the context's), or a printed configuration — even
// when the server echoes it back.
func TestAPIKeyNeverLeaks(t *testing.T) {
	const key = "sk-ts-live-very-secret-7c1e55"
	srv := systemonetest.New(t, systemonetest.WithAPIKey(key))
	var logs bytes.Buffer
	log := zerolog.New(&logs).Level(zerolog.TraceLevel)
	c := newClient(t, srv, systemone.Config{APIKey: key, Timeout: 200 * time.Millisecond, Model: "jev-1.13.0"}, systemone.Deps{Log: log})
	req := resolved(t, ordered)
	var seen []string
	evaluate := func(ctx context.Context) {
		_, err := c.Evaluate(ctx, req)
		if err != nil {
			seen = append(seen, err.Error(), fmt.Sprintf("%+v %#v", err, err))
			if e, ok := contract.AsError(err); ok {
				b, _ := json.Marshal(e)
				seen = append(seen, string(b))
			}
		}
	}
	evaluate(context.Background())
	ctxLog := log.With().Str("run_id", "r1").Logger()
	for _, f := range []systemonetest.Fault{
		systemonetest.Status(400), systemonetest.Unauthorized(), systemonetest.Forbidden(), systemonetest.Busy(429, "1"),
		systemonetest.Status(500), systemonetest.Redirect(307, "/x"),
		systemonetest.Body(401, "application/json", `{"error":{"type":"authentication_error","message":"invalid api key `+key+`"}}`),
		systemonetest.Body(400, "text/plain", "Authorization: Bearer "+key),
		systemonetest.Body(502, "text/plain", `bad gateway for {"state":"zeta","instructions":"How much?"}`),
		systemonetest.Malformed(ollamatest.MalformedBadSum), systemonetest.Drop(), systemonetest.Hang(),
	} {
		srv.Fail(1, f)
		evaluate(ctxLog.WithContext(context.Background()))
	}
	if len(seen) < 30 {
		t.Fatalf("expected an error per fault, got %d strings", len(seen))
	}
	probe := c.Probe(context.Background())
	seen = append(seen, probe.Problems...)
	seen = append(seen, probe.Endpoint)
	wrong := newClient(t, srv, systemone.Config{APIKey: key + "-old"}, systemone.Deps{Log: log})
	seen = append(seen, wrong.Probe(context.Background()).Problems...)
	_, derr := wrong.ModelDigest(context.Background(), "jev-1.13.0")
	seen = append(seen, fmt.Sprint(derr))
	cfg := systemone.Config{BaseURL: srv.URL(), APIKey: key}
	cfgJSON, _ := json.Marshal(cfg)
	seen = append(seen, fmt.Sprintf("%v %+v %#v %s", cfg, cfg, cfg, cfg.APIKey), string(cfgJSON), fmt.Sprintf("%+v", c))
	log.Info().Interface("config", cfg).Msg("config")
	if !strings.Contains(strings.Join(seen, "\n"), "check SYS1_SYSTEMONE_API_KEY") {
		t.Error("a 401 should point at SYS1_SYSTEMONE_API_KEY")
	}
	for _, s := range append(seen, logs.String()) {
		if strings.Contains(s, key) {
			t.Fatalf("the API key leaked: %s", s)
		}
	}
	if !strings.Contains(logs.String(), `"run_id":"r1"`) || !strings.Contains(logs.String(), `"upstream":"`+srv.URL()+`"`) {
		t.Fatalf("calls did not log through the context's logger with the host:\n%s", logs.String())
	}
	for _, content := range []string{"zeta", "How much?", "yak"} {
		if strings.Contains(logs.String(), content) {
			t.Fatalf("request content %q in the logs", content)
		}
	}
}

func TestProbe(t *testing.T) {
	t.Run("healthy", func(t *testing.T) {
		srv := systemonetest.New(t)
		c := newClient(t, srv, systemone.Config{Model: "jev-lite"})
		res := c.Probe(context.Background())
		if !res.Healthy() || len(res.Problems) != 0 || res.Endpoint != srv.URL() {
			t.Fatalf("probe = %+v", res)
		}
		if got := c.Capabilities(); fmt.Sprint(got.Models) != "[jev-1.13.0 jev-lite]" {
			t.Errorf("capabilities = %+v", got)
		}
		if srv.CountPath("/v1/models") != 1 || srv.Calls() != 0 {
			t.Errorf("the probe must read the model list only, never call the model")
		}
	})
	for _, tc := range []struct {
		name      string
		opts      []systemonetest.Option
		cfg       systemone.Config
		model     string
		reachable bool
		healthy   bool
		problem   string
	}{
		{"model not listed", nil, systemone.Config{}, "jev-9", true, false, `model "jev-9" is not in systemone's model list; check SYS1_SYSTEMONE_MODELS`},
		{"wrong key", nil, systemone.Config{APIKey: "sk-old"}, "jev-lite", true, false, "refused the API key on GET /v1/models (HTTP 401); check SYS1_SYSTEMONE_API_KEY"},
		{"list not offered", []systemonetest.Option{systemonetest.WithoutModelsList()}, systemone.Config{}, "jev-lite", true, false,
			"does not offer GET /v1/models (HTTP 404); set SYS1_SYSTEMONE_PROBE_PATH"},
		{"custom probe path", []systemonetest.Option{systemonetest.WithoutModelsList()}, systemone.Config{ProbePath: "/health"}, "jev-lite", true, true, ""},
		{"custom probe path missing", nil, systemone.Config{ProbePath: "/nope"}, "jev-lite", true, false, "GET /nope on systemone answered HTTP 404"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := systemonetest.New(t, tc.opts...)
			cfg := tc.cfg
			cfg.Model = tc.model
			res := newClient(t, srv, cfg).Probe(context.Background())
			if res.Reachable != tc.reachable || res.Healthy() != tc.healthy {
				t.Fatalf("probe = %+v", res)
			}
			if got := strings.Join(res.Problems, "; "); tc.problem == "" && got != "" || !strings.Contains(got, tc.problem) {
				t.Fatalf("problems %q, want %q", got, tc.problem)
			}
		})
	}
	t.Run("unreachable", func(t *testing.T) {
		srv := systemonetest.NewServer()
		base := srv.URL()
		srv.Close()
		c, _ := systemone.New(systemone.Config{BaseURL: base, APIKey: "k"}, systemone.Deps{})
		res := c.Probe(context.Background())
		if res.Reachable || len(res.Problems) != 1 || res.Problems[0] != "systemone is unreachable: the connection was refused" {
			t.Fatalf("probe = %+v", res)
		}
	})
}

func TestModelDigest(t *testing.T) {
	srv := systemonetest.New(t, systemonetest.WithModels(
		systemonetest.Model{ID: "jev-1.13.0", Version: "1.13.0"},
		systemonetest.Model{ID: "jev-latest"}, // an alias without a version
	))
	c := newClient(t, srv, systemone.Config{})
	var d provider.ModelDigester = c
	got, err := d.ModelDigest(context.Background(), "jev-1.13.0")
	if err != nil || got != "jev-1.13.0@1.13.0" {
		t.Fatalf("digest %q, %v", got, err)
	}
	if _, err := c.ModelDigest(context.Background(), "jev-latest"); !errors.Is(err, provider.ErrNoModelDigest) {
		t.Fatalf("an alias without a version must not be cacheable: %v", err)
	}
	if _, err := c.ModelDigest(context.Background(), "jev-9"); func() bool { e, ok := contract.AsError(err); return !ok || e.Code != contract.CodeModelUnavailable }() {
		t.Fatalf("unlisted: %v", err)
	}
	if n := srv.CountPath("/v1/models"); n != 1 {
		t.Fatalf("%d list reads within the TTL", n)
	}
	noList := systemonetest.New(t, systemonetest.WithoutModelsList())
	if _, err := newClient(t, noList, systemone.Config{}).ModelDigest(context.Background(), "jev-1.13.0"); !errors.Is(err, provider.ErrNoModelDigest) {
		t.Fatalf("without a model list: %v", err)
	}
	wrong := newClient(t, srv, systemone.Config{APIKey: "nope"})
	if _, err := wrong.ModelDigest(context.Background(), "jev-1.13.0"); func() bool { e, ok := contract.AsError(err); return !ok || e.Code != contract.CodeNotConfigured }() {
		t.Fatalf("wrong key: %v", err)
	}
}

func TestConfigValidation(t *testing.T) {
	cases := []struct {
		name string
		cfg  systemone.Config
		n    int
		want []string
	}{
		{"nothing set", systemone.Config{}, 2, []string{"SYS1_SYSTEMONE_BASE_URL: required", "SYS1_SYSTEMONE_API_KEY: required"}},
		{"credentials in the URL", systemone.Config{BaseURL: "https://user:hunter2@api.typesafe.ai", APIKey: "k"}, 1, []string{"SYS1_SYSTEMONE_BASE_URL", "must not carry credentials"}},
		{"scheme", systemone.Config{BaseURL: "ftp://api.typesafe.ai", APIKey: "k"}, 1, []string{"scheme must be http or https"}},
		{"key with a newline", systemone.Config{BaseURL: "https://h", APIKey: "sk-1\nX-Evil: 1"}, 1, []string{"SYS1_SYSTEMONE_API_KEY: must be one line"}},
		{"timeout", systemone.Config{BaseURL: "https://h", APIKey: "k", Timeout: -time.Second}, 1, []string{"SYS1_SYSTEMONE_TIMEOUT_MS"}},
		{"probe path", systemone.Config{BaseURL: "https://h", APIKey: "k", ProbePath: "health?x=1"}, 1, []string{"SYS1_SYSTEMONE_PROBE_PATH"}},
		{"all of it", systemone.Config{BaseURL: "gopher://h", APIKey: " ", Timeout: 48 * time.Hour, ProbePath: "x"}, 4, nil},
	}
	for _, tc := range cases {
		errs := tc.cfg.Validate()
		if len(errs) != tc.n {
			t.Errorf("%s: %d errors %v, want %d", tc.name, len(errs), errs, tc.n)
		}
		msg := errors.Join(errs...).Error()
		for _, w := range tc.want {
			if !strings.Contains(msg, w) {
				t.Errorf("%s: %q lacks %q", tc.name, msg, w)
			}
		}
		if strings.Contains(msg, "hunter2") || strings.Contains(msg, "X-Evil") {
			t.Errorf("%s: a secret echoed: %s", tc.name, msg)
		}
		if _, err := systemone.New(tc.cfg, systemone.Deps{}); err == nil {
			t.Errorf("%s: New accepted it", tc.name)
		}
	}
	if errs := (&systemone.Config{BaseURL: "https://api.typesafe.ai/", APIKey: "k", ProbePath: "/health"}).Validate(); len(errs) != 0 {
		t.Errorf("good config: %v", errs)
	}
}

func TestZeroClientIsNotConfigured(t *testing.T) {
	var c systemone.Client
	_, err := c.Evaluate(context.Background(), resolved(t, ordered))
	if e, ok := contract.AsError(err); !ok || e.Code != contract.CodeNotConfigured {
		t.Fatalf("got %v", err)
	}
	if res := c.Probe(context.Background()); res.Healthy() || len(res.Problems) == 0 {
		t.Fatalf("probe = %+v", res)
	}
}

func BenchmarkEvaluate(b *testing.B) {
	srv := systemonetest.New(b)
	c := newClient(b, srv, systemone.Config{MaxConns: 4})
	req := resolved(b, ordered)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.Evaluate(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
}
