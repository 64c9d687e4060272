package ollama

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"testing/iotest"
	"time"
)

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	cases := []struct {
		in   string
		want time.Duration
	}{
		{"", 0},
		{"3", 3 * time.Second},
		{" 120 ", 2 * time.Minute},
		{"0", 0},
		{"-5", 0},
		{"1.5", 0},
		{"soon", 0},
		{"999999999", maxRetryAfter},
		{now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second},
		{now.Add(-time.Minute).Format(http.TimeFormat), 0},
		{"Sunday, 29-Nov-26 12:00:30 GMT", 30 * time.Second}, // RFC 850
		{"Sun Nov 29 12:00:10 2026", 10 * time.Second},       // asctime
		{now.Add(48 * time.Hour).Format(http.TimeFormat), maxRetryAfter},
	}
	for _, tc := range cases {
		if got := parseRetryAfter(tc.in, now); got != tc.want {
			t.Errorf("parseRetryAfter(%q) = %v, want %v", tc.in, got, tc.want)
		}
	}
	// an HTTP date has whole seconds: the hint rounds up, never early
	if got := parseRetryAfter(now.Add(5*time.Second).Format(http.TimeFormat), now.Add(-300*time.Millisecond)); got != 6*time.Second {
		t.Errorf("sub-second rounding: %v, want 6s", got)
	}
}

func TestErrorMessageShapes(t *testing.T) {
	cases := []struct{ name, body, want string }{
		{"ollama", `{"error":"model 'x' not found"}`, "model 'x' not found"},
		{"llama-server", `{"error":{"code":400,"message":"the request exceeds the available context size","type":"exceed_context_size_error"}}`,
			"the request exceeds the available context size (exceed_context_size_error, 400)"},
		{"openai string code", `{"error":{"message":"Rate limit","type":"requests","code":"rate_limit_exceeded"}}`, "Rate limit (requests, rate_limit_exceeded)"},
		{"fastapi string", `{"detail":"Not authenticated"}`, "Not authenticated"},
		{"fastapi validation", `{"detail":[{"loc":["body","questions"],"msg":"field required","type":"value_error.missing"},{"loc":["body","state"],"msg":"bad","type":"x"}]}`,
			"body.questions: field required (value_error.missing); body.state: bad (x)"},
		{"detail object", `{"detail":{"reason":"quota"}}`, `{"reason":"quota"}`},
		{"message only", `{"message":"upstream down"}`, "upstream down"},
		{"plain text", "502 Bad Gateway\r\n<html>\n</html>", "502 Bad Gateway <html> </html>"},
		{"empty", "  ", ""},
		{"json without known fields", `{"status":"x"}`, `{"status":"x"}`},
	}
	for _, tc := range cases {
		if got := errorMessage([]byte(tc.body)); got != tc.want {
			t.Errorf("%s: errorMessage = %q, want %q", tc.name, got, tc.want)
		}
	}
	long := errorMessage(bytes.Repeat([]byte("é"), 5000))
	if len(long) > maxUpstreamText+len("…") || !strings.HasSuffix(long, "…") || !strings.HasPrefix(long, "éé") {
		t.Errorf("long text not bounded on a rune boundary: %d bytes", len(long))
	}
}

func TestSemverPrecedence(t *testing.T) {
	ordered := []string{"0.0.0", "0.34.9", "0.35.0-alpha", "0.35.0-alpha.1", "0.35.0-alpha.beta", "0.35.0-beta.2", "0.35.0-beta.11", "0.35.0-rc1", "0.35.0", "0.35.1", "0.40.12", "1.0.0"}
	for i := range ordered {
		for j := range ordered {
			a, err := parseSemver(ordered[i])
			if err != nil {
				t.Fatal(err)
			}
			b, _ := parseSemver(ordered[j])
			want := 0
			if i < j {
				want = -1
			} else if i > j {
				want = 1
			}
			if got := a.compare(b); got != want {
				t.Errorf("compare(%s, %s) = %d, want %d", ordered[i], ordered[j], got, want)
			}
		}
	}
	for _, v := range []string{"v0.35.0", "0.35.0+build.7", "0.35", "0.36"} {
		if ok, err := versionAtLeast(v, MinVersion); !ok || err != nil {
			t.Errorf("versionAtLeast(%q) = %v, %v", v, ok, err)
		}
	}
	for _, v := range []string{"", "dev", "0.35.x", "1.2.3.4", "0.35.0-", "0.35.0-a..b"} {
		if _, err := versionAtLeast(v, MinVersion); err == nil {
			t.Errorf("versionAtLeast(%q) parsed", v)
		}
	}
}

func TestReadBounded(t *testing.T) {
	body := bytes.Repeat([]byte("x"), 100)
	for _, announced := range []int64{-1, 100} {
		got, err := readBounded(bytes.NewReader(body), announced, 100)
		if err != nil || len(got) != 100 {
			t.Errorf("announced %d: %d bytes, %v", announced, len(got), err)
		}
		got, err = readBounded(iotest.HalfReader(bytes.NewReader(body)), announced, 99)
		if !errors.Is(err, errTooLarge) || len(got) != 99 {
			t.Errorf("announced %d over the limit: %d bytes, %v", announced, len(got), err)
		}
	}
	if _, err := readBounded(iotest.ErrReader(io.ErrUnexpectedEOF), -1, 10); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("read error lost: %v", err)
	}
}

func TestTransportPoolSizedToConcurrency(t *testing.T) {
	tr := newTransport(64)
	if tr.MaxIdleConnsPerHost < 64 || tr.MaxIdleConns < 64 || tr.MaxConnsPerHost != 0 {
		t.Fatalf("pool: idle/host %d idle %d max/host %d", tr.MaxIdleConnsPerHost, tr.MaxIdleConns, tr.MaxConnsPerHost)
	}
}

func TestTrimCode(t *testing.T) {
	for in, want := range map[string]string{
		"[SYS1_UPSTREAM_ERROR] answers.x: missing": "answers.x: missing",
		"plain":          "plain",
		"[not closed":    "[not closed",
		"[SYS1_TIMEOUT]": "",
	} {
		if got := trimCode(in); got != want {
			t.Errorf("trimCode(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestUpstreamTextRedactsAKeyCutByTheBound: a key that straddles the maxUpstreamText cut
// must not survive as its first bytes (which no longer match the whole key).
func TestUpstreamTextRedactsAKeyCutByTheBound(t *testing.T) {
	const key = "sk-sys1-0123456789abcdefghijklmnopqrstuvwxyz"
	c := &Client{apiKey: Secret(key)}
	filler := strings.Repeat("x", maxUpstreamText-30) + " "
	for _, body := range []string{
		filler + "Bearer " + key,
		`{"error":"` + filler + "invalid api key " + key + `"}`,
	} {
		got := c.upstreamText([]byte(body))
		if len(got) > maxUpstreamText+len("…") {
			t.Fatalf("not bounded: %d bytes", len(got))
		}
		if strings.Contains(got, key[:8]) {
			t.Fatalf("the start of the API key survived: …%s", got[len(got)-40:])
		}
	}
}

// With neither SYS1_OLLAMA_BASE_URL nor OLLAMA_API_URL set, the adapter talks to Ollama where it
// listens out of the box; each set variable wins over what follows it.
func TestBaseURLDefaultsToLocalOllama(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{}, DefaultBaseURL},
		{Config{BaseURL: "  "}, DefaultBaseURL},
		{Config{APIURL: "http://gpu-box:11434/"}, "http://gpu-box:11434"},
		{Config{BaseURL: "https://ollama.internal", APIURL: "http://gpu-box:11434"}, "https://ollama.internal"},
	} {
		if errs := tc.cfg.Validate(); len(errs) != 0 {
			t.Errorf("%+v: %v", tc.cfg, errs)
			continue
		}
		c, err := New(tc.cfg)
		if err != nil {
			t.Fatal(err)
		}
		if c.endpoint != tc.want+"/v1/systemone" {
			t.Errorf("%+v: endpoint %s, want %s/v1/systemone", tc.cfg, c.endpoint, tc.want)
		}
	}
}
