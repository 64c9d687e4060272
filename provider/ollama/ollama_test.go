package ollama_test

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
	"github.com/sys1hq/sys1/provider/ollama"
	"github.com/sys1hq/sys1/provider/ollamatest"
)

// ordered puts questions and options out of alphabetical order, so any map on the way would
// reorder them.
const ordered = `{"model":"nimble","state":{"zeta":1,"alpha":[2,1],"html":"<b>&amp;</b> \u00e9"},"keep_alive":"10m","questions":{
 "zulu":{"type":"choice","instructions":{"b":1,"a":2},"criteria":{"yak":"Y","apple":"A","mango":null}},
 "alpha":{"type":"score","instructions":"How much?","criteria":["none","some","lots"]},
 "mike":{"type":"noul","instructions":"Is it?","criteria":{"true":"yes","false":"no"}}}}`

// resolved decodes and resolves a request as the worker does.
func resolved(t testing.TB, body, keepAlive string) *contract.Request {
	t.Helper()
	req, err := contract.DecodeRequest([]byte(body))
	if err != nil {
		t.Fatalf("DecodeRequest: %v", err)
	}
	out, err := contract.Policy{DefaultModel: "nimble", KeepAlive: keepAlive}.Resolve(req)
	if err != nil {
		t.Fatalf("Resolve: %v", err)
	}
	return out
}

func newClient(t testing.TB, base string, cfg ollama.Config, deps ...ollama.Deps) *ollama.Client {
	t.Helper()
	cfg.BaseURL = base
	if cfg.TimeoutMS == "" {
		cfg.TimeoutMS = "5000"
	}
	var d ollama.Deps
	if len(deps) > 0 {
		d = deps[0]
	}
	c, err := ollama.New(cfg, d)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

func TestEvaluateSendsTheOrderedRequestAndReturnsTheValidatedAnswer(t *testing.T) {
	srv := ollamatest.New(t)
	c := newClient(t, srv.URL(), ollama.Config{})
	req := resolved(t, ordered, "")
	resp, err := c.Evaluate(context.Background(), req)
	if err != nil {
		t.Fatalf("Evaluate: %v", err)
	}
	recs := srv.SystemOneRequests()
	if len(recs) != 1 {
		t.Fatalf("fake got %d calls", len(recs))
	}
	want := req.AppendJSON(nil)
	if !bytes.Equal(recs[0].Body, want) {
		t.Fatalf("wire bytes differ from the ordered encoding:\n got %s\nwant %s", recs[0].Body, want)
	}
	// the caller's state goes out byte for byte: no HTML escaping, no re-encoding
	if !bytes.Contains(recs[0].Body, []byte(`"html":"<b>&amp;</b> \u00e9"`)) {
		t.Fatalf("state altered on the wire: %s", recs[0].Body)
	}
	if !json.Valid(recs[0].Body) {
		t.Fatal("wire body is not JSON")
	}
	// byte-level order: questions, options and nested state keys as the caller sent them
	body := string(recs[0].Body)
	for _, seq := range [][]string{
		{`"zeta"`, `"alpha":[2,1]`},
		{`"zulu"`, `"alpha":{`, `"mike"`},
		{`"yak"`, `"apple"`, `"mango"`},
		{`"b":1`, `"a":2`},
		{`"none"`, `"some"`, `"lots"`},
	} {
		at := -1
		for _, s := range seq {
			i := strings.Index(body, s)
			if i <= at {
				t.Fatalf("%v out of order on the wire: %s", seq, body)
			}
			at = i
		}
	}
	qs, err := recs[0].Questions()
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(qs); got != "[{zulu choice [yak apple mango]} {alpha score [none some lots]} {mike noul []}]" {
		t.Errorf("the fake decoded %s", got)
	}
	if h := recs[0].Header; h.Get("Content-Type") != "application/json" || h.Get("Authorization") != "" {
		t.Errorf("headers: %v", h)
	}
	if resp.Model != "nimble" || len(resp.Answers) != 3 || resp.Answers[0].Name != "zulu" || resp.Answers[2].Name != "mike" {
		t.Fatalf("answers = %+v", resp.Answers)
	}
	if resp.Usage.InputTokens != int64(len(want)/4) {
		t.Errorf("usage = %+v", resp.Usage)
	}
	if provider.Outcome(err) != contract.OutcomeOK {
		t.Error("outcome of success is not ok")
	}
}

func TestKeepAliveIsThePolicysNeverTheCallers(t *testing.T) {
	srv := ollamatest.New(t)
	c := newClient(t, srv.URL(), ollama.Config{})
	for _, tc := range []struct{ policy, want string }{
		{"", ""}, {"300", "300"}, {"5m", `"5m"`}, {"0", "0"},
	} {
		srv.ResetStats()
		if _, err := c.Evaluate(context.Background(), resolved(t, ordered, tc.policy)); err != nil {
			t.Fatalf("policy %q: %v", tc.policy, err)
		}
		got, present := srv.SystemOneRequests()[0].Field("keep_alive")
		if tc.want == "" {
			if present {
				t.Errorf("policy unset: keep_alive %s sent (the caller's 10m must never go upstream)", got)
			}
			continue
		}
		if string(got) != tc.want {
			t.Errorf("policy %q: keep_alive on the wire = %s, want %s", tc.policy, got, tc.want)
		}
	}
}

func TestErrorTable(t *testing.T) {
	past := time.Now().Add(-time.Hour).UTC().Format(http.TimeFormat)
	cases := []struct {
		name       string
		fault      ollamatest.Fault
		code       contract.Code
		outcome    string
		inMessage  string
		retryAfter time.Duration
	}{
		{"400 with upstream text", ollamatest.Body(400, "application/json", `{"error":"input length exceeds the context length"}`),
			contract.CodeInvalidRequest, contract.OutcomeError, "rejected the request (HTTP 400)", 0},
		{"404", ollamatest.Status(404), contract.CodeModelUnavailable, contract.OutcomeUnavailable, `model "nimble" is not available`, 0},
		{"413", ollamatest.Status(413), contract.CodeRequestTooLarge, contract.OutcomeError, "too large", 0},
		{"429 with seconds", ollamatest.Busy(429, "3"), contract.CodeProviderBusy, contract.OutcomeBusy, "retry after 3s", 3 * time.Second},
		{"429 without hint", ollamatest.Busy(429, ""), contract.CodeProviderBusy, contract.OutcomeBusy, "busy (HTTP 429)", 0},
		{"503 with a past date", ollamatest.Busy(503, past), contract.CodeProviderBusy, contract.OutcomeBusy, "HTTP 503", 0},
		{"500", ollamatest.Status(500), contract.CodeUpstreamError, contract.OutcomeError, "HTTP 500", 0},
		{"502", ollamatest.Status(502), contract.CodeUpstreamError, contract.OutcomeError, "HTTP 502", 0},
		{"504", ollamatest.Status(504), contract.CodeUpstreamError, contract.OutcomeError, "HTTP 504", 0},
		{"llama-server body", ollamatest.Body(500, "application/json", `{"error":{"code":500,"message":"slot unavailable","type":"server_error"}}`),
			contract.CodeUpstreamError, contract.OutcomeError, "ollama failed (HTTP 500)", 0},
		{"fastapi detail", ollamatest.Body(400, "application/json", `{"detail":[{"loc":["body","state"],"msg":"field required","type":"missing"}]}`),
			contract.CodeInvalidRequest, contract.OutcomeError, "rejected the request (HTTP 400)", 0},
		{"plain text 502", ollamatest.Body(502, "text/html", "<html>Bad Gateway</html>"), contract.CodeUpstreamError, contract.OutcomeError, "ollama failed (HTTP 502)", 0},
		{"redirect", ollamatest.Redirect(307, "/v1/systemone"), contract.CodeUpstreamError, contract.OutcomeError, "redirect (HTTP 307), which is not followed", 0},
		{"wrong type", ollamatest.Malformed(ollamatest.MalformedWrongType), contract.CodeUpstreamError, contract.OutcomeMalformed, "breaks the response contract", 0},
		{"missing answer", ollamatest.Malformed(ollamatest.MalformedMissingAnswer), contract.CodeUpstreamError, contract.OutcomeMalformed, "breaks the response contract", 0},
		{"bad sum", ollamatest.Malformed(ollamatest.MalformedBadSum), contract.CodeUpstreamError, contract.OutcomeMalformed, "breaks the response contract", 0},
		{"NaN", ollamatest.Malformed(ollamatest.MalformedNaN), contract.CodeUpstreamError, contract.OutcomeMalformed, "breaks the response contract", 0},
		{"extra answer", ollamatest.Malformed(ollamatest.MalformedExtraAnswer), contract.CodeUpstreamError, contract.OutcomeMalformed, "breaks the response contract", 0},
		{"not JSON", ollamatest.Malformed(ollamatest.MalformedNotJSON), contract.CodeUpstreamError, contract.OutcomeMalformed, "breaks the response contract", 0},
		{"truncated", ollamatest.Malformed(ollamatest.MalformedTruncated), contract.CodeUpstreamError, contract.OutcomeMalformed, "breaks the response contract", 0},
		{"too large", ollamatest.Body(200, "application/json", strings.Repeat(" ", ollama.MaxResponseBytes+1)),
			contract.CodeUpstreamError, contract.OutcomeError, "more than 16 MiB", 0},
		{"connection dropped", ollamatest.Drop(), contract.CodeProviderUnavailable, contract.OutcomeUnavailable, "closed before an answer", 0},
	}
	srv := ollamatest.New(t, ollamatest.WithRecordLimit(0))
	c := newClient(t, srv.URL(), ollama.Config{})
	req := resolved(t, ordered, "")
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv.ResetStats()
			srv.Fail(1, tc.fault)
			_, err := c.Evaluate(context.Background(), req)
			e, ok := contract.AsError(err)
			if !ok {
				t.Fatalf("error %v is not a *contract.Error", err)
			}
			if e.Code != tc.code || e.Status != tc.code.Status() || !strings.HasPrefix(e.Message, "["+string(tc.code)+"] ") {
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
			if srv.Calls() != 1 {
				t.Errorf("the fake saw %d calls: the adapter must neither retry nor follow redirects", srv.Calls())
			}
		})
	}
}

func TestRedirectsAreNotFollowedEvenWithACustomHTTPClient(t *testing.T) {
	srv := ollamatest.New(t)
	c := newClient(t, srv.URL(), ollama.Config{}, ollama.Deps{HTTPClient: &http.Client{}})
	srv.Fail(1, ollamatest.Redirect(http.StatusMovedPermanently, srv.URL()+"/v1/systemone"))
	_, err := c.Evaluate(context.Background(), resolved(t, ordered, ""))
	if e, ok := contract.AsError(err); !ok || e.Code != contract.CodeUpstreamError || srv.Calls() != 1 {
		t.Fatalf("got %v after %d calls", err, srv.Calls())
	}
}

func TestHugeErrorBodyIsBounded(t *testing.T) {
	srv := ollamatest.New(t)
	var logs bytes.Buffer
	c := newClient(t, srv.URL(), ollama.Config{}, ollama.Deps{Log: zerolog.New(&logs)})
	srv.Fail(1, ollamatest.Body(400, "text/plain", strings.Repeat("context overflow ", 1<<16)))
	_, err := c.Evaluate(context.Background(), resolved(t, ordered, ""))
	e, ok := contract.AsError(err)
	if !ok || e.Code != contract.CodeInvalidRequest || strings.Contains(e.Message, "context overflow") {
		t.Fatalf("got %d bytes: %.200v", len(err.Error()), err)
	}
	if !strings.Contains(logs.String(), "context overflow") || logs.Len() > 2000 {
		t.Errorf("the log line (%d bytes) does not carry the bounded upstream text", logs.Len())
	}
}

// TestUpstreamErrorBodiesGoToTheLogOnly: what an upstream says in a 5xx body (its database's
// address, its hosts) never reaches the producer: the error names the status, and the
// operator's log has the text, redacted and bounded — unless it quotes the request, whose
// content never goes to a log.
func TestUpstreamErrorBodiesGoToTheLogOnly(t *testing.T) {
	srv := ollamatest.New(t)
	var logs bytes.Buffer
	c := newClient(t, srv.URL(), ollama.Config{}, ollama.Deps{Log: zerolog.New(&logs)})
	leak := "db at 10.1.2.3:5432 secret-host.internal.corp failed"
	srv.Fail(1, ollamatest.Body(500, "application/json", `{"error":"`+leak+`"}`))
	_, err := c.Evaluate(context.Background(), resolved(t, ordered, ""))
	e, ok := contract.AsError(err)
	if !ok || e.Code != contract.CodeUpstreamError || e.Message != "[SYS1_UPSTREAM_ERROR] ollama failed (HTTP 500)" {
		t.Fatalf("error %v", err)
	}
	if !strings.Contains(logs.String(), `"upstream_error":"`+leak+`"`) || !strings.Contains(logs.String(), `"http_status":500`) {
		t.Errorf("the log lacks the upstream's text: %s", logs.String())
	}
	// A gateway echoing the request body: the text stays out of the log too.
	logs.Reset()
	req := resolved(t, ordered, "")
	echo := string(req.AppendJSON(nil))
	srv.Fail(1, ollamatest.Body(502, "text/plain", "could not forward "+echo))
	if _, err := c.Evaluate(context.Background(), req); err == nil || strings.Contains(err.Error(), "forward") {
		t.Fatalf("error %v", err)
	}
	if strings.Contains(logs.String(), string(req.State)[:12]) || !strings.Contains(logs.String(), "could not forward") {
		t.Errorf("the log carries the echoed request, or not the upstream's own words: %s", logs.String())
	}
}

func TestRetryAfterHTTPDate(t *testing.T) {
	srv := ollamatest.New(t)
	c := newClient(t, srv.URL(), ollama.Config{})
	at := time.Now().Add(2 * time.Minute).UTC().Format(http.TimeFormat)
	srv.Fail(1, ollamatest.Busy(503, at))
	_, err := c.Evaluate(context.Background(), resolved(t, ordered, ""))
	e, _ := contract.AsError(err)
	if e == nil || e.Code != contract.CodeProviderBusy || e.RetryAfter < 110*time.Second || e.RetryAfter > 121*time.Second {
		t.Fatalf("got %v (RetryAfter %v), want busy with about 2m", err, e.RetryAfter)
	}
}

func TestUnreachableProvider(t *testing.T) {
	srv := ollamatest.NewServer()
	closedURL := srv.URL()
	srv.Close() // nothing listens there now: connection refused
	req := resolved(t, ordered, "")
	for name, base := range map[string]string{
		"refused": closedURL,
		"dns":     "http://sys1-nowhere.invalid:11434",
	} {
		c := newClient(t, base, ollama.Config{})
		_, err := c.Evaluate(context.Background(), req)
		e, ok := contract.AsError(err)
		if !ok || e.Code != contract.CodeProviderUnavailable {
			t.Fatalf("%s: got %v, want SYS1_PROVIDER_UNAVAILABLE", name, err)
		}
		if provider.Outcome(err) != contract.OutcomeUnavailable {
			t.Errorf("%s: outcome %q", name, provider.Outcome(err))
		}
	}
}

func TestTimeoutVersusCancel(t *testing.T) {
	srv := ollamatest.New(t)
	srv.FailAlways(ollamatest.Hang())
	req := resolved(t, ordered, "")

	t.Run("our timeout is SYS1_TIMEOUT", func(t *testing.T) {
		c := newClient(t, srv.URL(), ollama.Config{TimeoutMS: "50"})
		_, err := c.Evaluate(context.Background(), req)
		e, ok := contract.AsError(err)
		if !ok || e.Code != contract.CodeTimeout || !strings.Contains(e.Message, "within 50ms") {
			t.Fatalf("got %v, want SYS1_TIMEOUT", err)
		}
		if provider.Outcome(err) != contract.OutcomeTimeout {
			t.Errorf("outcome %q", provider.Outcome(err))
		}
	})
	t.Run("the caller's cancel is a cancel", func(t *testing.T) {
		c := newClient(t, srv.URL(), ollama.Config{TimeoutMS: "60000"})
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
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("got %v, want context.Canceled", err)
		}
		if _, isContract := contract.AsError(err); isContract {
			t.Fatalf("a caller's cancel must not be a *contract.Error: %v", err)
		}
	})
	t.Run("the caller's own deadline is the caller's", func(t *testing.T) {
		c := newClient(t, srv.URL(), ollama.Config{TimeoutMS: "60000"})
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		_, err := c.Evaluate(ctx, req)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("got %v, want the caller's context.DeadlineExceeded", err)
		}
		if e, ok := contract.AsError(err); ok {
			t.Fatalf("the caller's deadline became %s", e.Code)
		}
	})
	t.Run("an already cancelled context sends nothing", func(t *testing.T) {
		srv.ResetStats()
		c := newClient(t, srv.URL(), ollama.Config{})
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := c.Evaluate(ctx, req); !errors.Is(err, context.Canceled) {
			t.Fatalf("got %v", err)
		}
		if srv.Calls() != 0 {
			t.Fatalf("sent %d calls", srv.Calls())
		}
	})
}

func TestAPIKeyIsSentAndNeverLeaks(t *testing.T) {
	const key = "sk-sys1-very-secret-4242"
	srv := ollamatest.New(t, ollamatest.WithAPIKey(key))
	var logs bytes.Buffer
	log := zerolog.New(&logs).Level(zerolog.TraceLevel)
	c := newClient(t, srv.URL(), ollama.Config{APIKey: ollama.Secret(key), TimeoutMS: "200"}, ollama.Deps{Log: log})
	req := resolved(t, ordered, "")

	var seen []string
	evaluate := func() {
		_, err := c.Evaluate(context.Background(), req)
		if err != nil {
			seen = append(seen, err.Error(), fmt.Sprintf("%+v", err))
			if e, ok := contract.AsError(err); ok {
				b, _ := json.Marshal(e)
				seen = append(seen, string(b))
			}
		}
	}
	evaluate() // success
	if got := srv.SystemOneRequests()[0].Header.Get("Authorization"); got != "Bearer "+key {
		t.Fatalf("Authorization = %q", got)
	}
	for _, f := range []ollamatest.Fault{
		ollamatest.Status(400), ollamatest.Status(404), ollamatest.Busy(429, "1"), ollamatest.Status(500),
		// a proxy that echoes the credentials back in its error text
		ollamatest.Body(401, "application/json", `{"error":"invalid api key `+key+`"}`),
		ollamatest.Body(400, "text/plain", "Authorization: Bearer "+key),
		// a proxy that echoes the request body in its error text: content, not for the logs
		ollamatest.Body(502, "text/plain", `bad gateway for {"state":"zeta yak","instructions":"How much?"}`),
		ollamatest.Malformed(ollamatest.MalformedBadSum), ollamatest.Drop(), ollamatest.Hang(),
	} {
		srv.Fail(1, f)
		evaluate()
	}
	if len(seen) < 10 {
		t.Fatalf("expected an error per fault, got %d", len(seen))
	}
	probe := c.Probe(context.Background())
	seen = append(seen, probe.Problems...)
	srv.SetModels()
	seen = append(seen, c.Probe(context.Background()).Problems...)
	cfg := ollama.Config{BaseURL: srv.URL(), APIKey: ollama.Secret(key)}
	cfgJSON, _ := json.Marshal(cfg)
	seen = append(seen, fmt.Sprintf("%v %+v %#v %s", cfg, cfg, cfg, cfg.APIKey), string(cfgJSON))
	log.Info().Interface("config", cfg).Msg("config")

	if !strings.Contains(strings.Join(seen, "\n"), "check SYS1_OLLAMA_API_KEY") {
		t.Error("a 401 should point at SYS1_OLLAMA_API_KEY")
	}
	for _, s := range append(seen, logs.String()) {
		if strings.Contains(s, key) {
			t.Fatalf("the API key leaked: %s", s)
		}
	}
	if logs.Len() == 0 {
		t.Fatal("no log lines captured: the leak check proves nothing")
	}
	// logs never carry state or instructions either
	for _, content := range []string{"zeta", "How much?", "yak"} {
		if strings.Contains(logs.String(), content) {
			t.Fatalf("request content %q in the logs", content)
		}
	}
}

func TestProbe(t *testing.T) {
	t.Run("healthy", func(t *testing.T) {
		srv := ollamatest.New(t, ollamatest.WithModels("nimble:latest", "clef:cloud"))
		c := newClient(t, srv.URL(), ollama.Config{Model: "nimble"})
		res := c.Probe(context.Background())
		if !res.Healthy() || res.Version != ollamatest.DefaultVersion || len(res.Problems) != 0 {
			t.Fatalf("probe = %+v", res)
		}
		if got := c.Capabilities(); fmt.Sprint(got.Models) != "[nimble:latest clef:cloud]" || got.MaxOptions != 26 || got.MaxLevels != 26 || !got.Images {
			t.Errorf("capabilities = %+v", got)
		}
	})
	versions := []struct {
		version string
		ok      bool
	}{
		{"0.35.0", true}, {"0.40.12", true}, {"1.0.0", true},
		{"0.34.9", false}, {"0.35.0-rc1", false}, {"0.0.0", false}, {"garbage", false},
	}
	for _, v := range versions {
		t.Run("version "+v.version, func(t *testing.T) {
			srv := ollamatest.New(t, ollamatest.WithVersion(v.version))
			res := newClient(t, srv.URL(), ollama.Config{}).Probe(context.Background())
			if !res.Reachable || res.VersionOK != v.ok || res.Healthy() != v.ok {
				t.Fatalf("probe = %+v, want VersionOK %v", res, v.ok)
			}
			if !v.ok && (len(res.Problems) != 1 || !strings.Contains(res.Problems[0], "needs 0.35.0 or later")) {
				t.Errorf("problems = %q", res.Problems)
			}
		})
	}
	for _, m := range []struct {
		pulled, want string
		present      bool
	}{
		{"nimble:latest", "nimble", true}, {"nimble", "nimble:latest", true}, {"nimble:7b", "nimble", false},
		{"other", "nimble", false}, {"library/nimble", "library/nimble:latest", true},
	} {
		t.Run("model "+m.want+" among "+m.pulled, func(t *testing.T) {
			srv := ollamatest.New(t, ollamatest.WithModels(m.pulled))
			res := newClient(t, srv.URL(), ollama.Config{Model: m.want}).Probe(context.Background())
			if res.ModelPresent != m.present || !res.Reachable || !res.VersionOK {
				t.Fatalf("probe = %+v, want ModelPresent %v", res, m.present)
			}
			if !m.present && !strings.Contains(strings.Join(res.Problems, ";"), "ollama pull "+m.want) {
				t.Errorf("problems = %q", res.Problems)
			}
		})
	}
	t.Run("unreachable", func(t *testing.T) {
		srv := ollamatest.NewServer()
		base := srv.URL()
		srv.Close()
		res := newClient(t, base, ollama.Config{}).Probe(context.Background())
		if res.Reachable || res.Healthy() || len(res.Problems) != 1 || !strings.Contains(res.Problems[0], "unreachable: the connection was refused") {
			t.Fatalf("probe = %+v", res)
		}
	})
	t.Run("unauthorised", func(t *testing.T) {
		srv := ollamatest.New(t, ollamatest.WithAPIKey("right"))
		res := newClient(t, srv.URL(), ollama.Config{APIKey: "wrong"}).Probe(context.Background())
		if !res.Reachable || res.VersionOK || res.ModelPresent || len(res.Problems) != 2 || !strings.Contains(res.Problems[0], "HTTP 401") {
			t.Fatalf("probe = %+v", res)
		}
	})
}

func TestConfigValidation(t *testing.T) {
	cases := []struct {
		name string
		cfg  ollama.Config
		want []string
	}{
		{"bad scheme", ollama.Config{BaseURL: "ftp://h"}, []string{"SYS1_OLLAMA_BASE_URL", "scheme must be http or https"}},
		{"fallback named", ollama.Config{APIURL: "localhost:11434"}, []string{"OLLAMA_API_URL"}},
		{"no host", ollama.Config{BaseURL: "http://"}, []string{"host is missing"}},
		{"query", ollama.Config{BaseURL: "http://h/?token=abc"}, []string{"query"}},
		{"bad timeout", ollama.Config{BaseURL: "http://h", TimeoutMS: "soon"}, []string{"SYS1_TIMEOUT_MS", `"soon"`}},
		{"zero timeout", ollama.Config{BaseURL: "http://h", TimeoutMS: "0"}, []string{"SYS1_TIMEOUT_MS"}},
	}
	for _, tc := range cases {
		errs := tc.cfg.Validate()
		if len(errs) == 0 {
			t.Errorf("%s: no error", tc.name)
			continue
		}
		msg := errors.Join(errs...).Error()
		for _, w := range tc.want {
			if !strings.Contains(msg, w) {
				t.Errorf("%s: %q lacks %q", tc.name, msg, w)
			}
		}
		if _, err := ollama.New(tc.cfg, ollama.Deps{}); err == nil {
			t.Errorf("%s: New accepted it", tc.name)
		}
	}
	// both bad: one message per variable
	errs := (&ollama.Config{BaseURL: "ftp://h", TimeoutMS: "x"}).Validate()
	if len(errs) != 2 {
		t.Errorf("want one error per bad variable, got %v", errs)
	}
	// credentials in the URL are never echoed
	msg := errors.Join((&ollama.Config{BaseURL: "gopher://user:hunter2@h"}).Validate()...).Error()
	if strings.Contains(msg, "hunter2") || strings.Contains(msg, "user") {
		t.Errorf("credentials echoed: %s", msg)
	}
	for _, good := range []ollama.Config{{BaseURL: "http://localhost:11434"}, {APIURL: "https://ollama.com/"}, {BaseURL: "http://h/prefix/", TimeoutMS: "1"}} {
		if errs := good.Validate(); len(errs) != 0 {
			t.Errorf("%+v: %v", good, errs)
		}
	}
}

func TestBaseURLPrefixAndFallback(t *testing.T) {
	srv := ollamatest.New(t)
	c, err := ollama.New(ollama.Config{APIURL: srv.URL() + "/", TimeoutMS: "5000"}, ollama.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Evaluate(context.Background(), resolved(t, ordered, "")); err != nil {
		t.Fatalf("via OLLAMA_API_URL with a trailing slash: %v", err)
	}
	if recs := srv.SystemOneRequests(); len(recs) != 1 || recs[0].Path != "/v1/systemone" {
		t.Fatalf("requests: %+v", recs)
	}
}

func TestZeroClientIsNotConfigured(t *testing.T) {
	var c ollama.Client
	_, err := c.Evaluate(context.Background(), resolved(t, ordered, ""))
	if e, ok := contract.AsError(err); !ok || e.Code != contract.CodeNotConfigured {
		t.Fatalf("got %v", err)
	}
	if res := c.Probe(context.Background()); res.Healthy() || len(res.Problems) == 0 {
		t.Fatalf("probe = %+v", res)
	}
	if c.Name() != "ollama" {
		t.Fatal(c.Name())
	}
}

func BenchmarkEvaluate(b *testing.B) {
	srv := ollamatest.New(b, ollamatest.WithRecordLimit(0))
	c := newClient(b, srv.URL(), ollama.Config{MaxConns: 4})
	req := resolved(b, ordered, "5m")
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.Evaluate(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
}

// The keep-alive pool is sized to the worker's concurrency: rounds of concurrent calls reuse
// the same connections instead of opening new ones (Go's default keeps only 2 idle per host).
func TestKeepAlivePoolReusesConnections(t *testing.T) {
	const concurrency = 8
	srv := ollamatest.New(t, ollamatest.WithRecordLimit(0), ollamatest.WithLatency(20*time.Millisecond))
	c := newClient(t, srv.URL(), ollama.Config{MaxConns: concurrency})
	req := resolved(t, ordered, "")
	const rounds = 4
	for r := 0; r < rounds; r++ {
		done := make(chan error, concurrency)
		for i := 0; i < concurrency; i++ {
			go func() {
				_, err := c.Evaluate(context.Background(), req)
				done <- err
			}()
		}
		for i := 0; i < concurrency; i++ {
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		}
	}
	if opened := srv.Connections(); opened > concurrency {
		t.Fatalf("%d connections opened for %d×%d calls: the idle pool does not hold the concurrency", opened, rounds, concurrency)
	}
	if srv.Calls() != rounds*concurrency || srv.MaxConcurrent() > concurrency {
		t.Fatalf("calls %d, max concurrent %d", srv.Calls(), srv.MaxConcurrent())
	}
}

// Issue 17 §6: what producers see (the error in the reply and the record, the attempt's
// detail) names the provider and the kind of failure, never its host; the host is in the
// adapter's log line, where operators look.
func TestErrorsNameNoHostButTheLogDoes(t *testing.T) {
	srv := ollamatest.New(t)
	var logs bytes.Buffer
	log := zerolog.New(&logs).Level(zerolog.InfoLevel)
	c := newClient(t, srv.URL(), ollama.Config{TimeoutMS: "100"}, ollama.Deps{Log: log})
	host := strings.TrimPrefix(srv.URL(), "http://")
	req := resolved(t, ordered, "")
	faults := []ollamatest.Fault{
		ollamatest.Status(400), ollamatest.Status(404), ollamatest.Status(413), ollamatest.Busy(503, "2"),
		ollamatest.Status(500), ollamatest.Status(401), ollamatest.Redirect(307, srv.URL()+"/v1/systemone"),
		ollamatest.Malformed(ollamatest.MalformedBadSum), ollamatest.Drop(), ollamatest.Hang(),
		// a proxy whose error page names the backend
		ollamatest.Body(502, "text/html", "<html>cannot reach "+srv.URL()+" ("+host+")</html>"),
	}
	for _, f := range faults {
		srv.Fail(1, f)
		_, err := c.Evaluate(context.Background(), req)
		if err == nil {
			t.Fatalf("%+v: no error", f)
		}
		if strings.Contains(err.Error(), host) || strings.Contains(err.Error(), "127.0.0.1") {
			t.Errorf("the error producers see names the host: %v", err)
		}
	}
	closed := ollamatest.NewServer()
	closedHost := strings.TrimPrefix(closed.URL(), "http://")
	closed.Close()
	down := newClient(t, closed.URL(), ollama.Config{}, ollama.Deps{Log: log})
	_, err := down.Evaluate(context.Background(), req)
	if e, ok := contract.AsError(err); !ok || e.Code != contract.CodeProviderUnavailable || e.Message != "[SYS1_PROVIDER_UNAVAILABLE] ollama is unavailable: the connection was refused" {
		t.Fatalf("got %v", err)
	}
	probe := down.Probe(context.Background())
	if strings.Contains(strings.Join(probe.Problems, " "), closedHost) || probe.Endpoint != closed.URL() {
		t.Errorf("probe: problems %q, endpoint %q", probe.Problems, probe.Endpoint)
	}
	// every failure left a warning that names the host it happened at
	var warned int
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var ev struct {
			Level, Upstream, ErrorCode string
		}
		var raw map[string]any
		if err := json.Unmarshal([]byte(line), &raw); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		ev.Level, _ = raw["level"].(string)
		ev.Upstream, _ = raw["upstream"].(string)
		ev.ErrorCode, _ = raw["error_code"].(string)
		if ev.Level == "warn" && ev.ErrorCode != "" && (ev.Upstream == srv.URL() || ev.Upstream == closed.URL()) {
			warned++
		}
	}
	if warned != len(faults)+1 {
		t.Fatalf("%d warnings naming the host for %d failures:\n%s", warned, len(faults)+1, logs.String())
	}
	if !strings.Contains(logs.String(), `"error":"[SYS1_PROVIDER_UNAVAILABLE] ollama is unavailable: the connection was refused"`) {
		t.Errorf("a transport failure's reason is missing from its log line:\n%s", logs.String())
	}
}

func TestModelDigest(t *testing.T) {
	srv := ollamatest.New(t, ollamatest.WithModels("other:7b", "nimble:latest"))
	c := newClient(t, srv.URL(), ollama.Config{})
	var digester provider.ModelDigester = c // Ollama implements the optional interface
	d, err := digester.ModelDigest(context.Background(), "nimble")
	if err != nil || d != fmt.Sprintf("%064x", 2) {
		t.Fatalf("digest of nimble = %q, %v", d, err)
	}
	if d2, _ := c.ModelDigest(context.Background(), "other:7b"); d2 != fmt.Sprintf("%064x", 1) {
		t.Fatalf("digest of other:7b = %q", d2)
	}
	_, err = c.ModelDigest(context.Background(), "missing")
	if e, ok := contract.AsError(err); !ok || e.Code != contract.CodeModelUnavailable {
		t.Fatalf("unknown model: %v", err)
	}
	tags := 0
	for _, r := range srv.Requests() {
		if r.Path == "/api/tags" {
			tags++
		}
	}
	if tags != 1 {
		t.Fatalf("%d reads of /api/tags for three digests within the TTL, want 1", tags)
	}
	// unreachable: a provider error, never a made-up digest
	closed := ollamatest.NewServer()
	closed.Close()
	_, err = newClient(t, closed.URL(), ollama.Config{}).ModelDigest(context.Background(), "nimble")
	if e, ok := contract.AsError(err); !ok || e.Code != contract.CodeProviderUnavailable {
		t.Fatalf("unreachable: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := newClient(t, srv.URL(), ollama.Config{}).ModelDigest(ctx, "nimble"); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
}
