package upstream

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/rs/zerolog"
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
		{"999999999", MaxRetryAfter},
		{now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second},
		{now.Add(-time.Minute).Format(http.TimeFormat), 0},
		{"Sunday, 29-Nov-26 12:00:30 GMT", 30 * time.Second}, // RFC 850
		{"Sun Nov 29 12:00:10 2026", 10 * time.Second},       // asctime
		{now.Add(48 * time.Hour).Format(http.TimeFormat), MaxRetryAfter},
	}
	for _, tc := range cases {
		if got := ParseRetryAfter(tc.in, now); got != tc.want {
			t.Errorf("ParseRetryAfter(%q) = %v, want %v", tc.in, got, tc.want)
		}
	}
	// an HTTP date has whole seconds: the hint rounds up, never early
	if got := ParseRetryAfter(now.Add(5*time.Second).Format(http.TimeFormat), now.Add(-300*time.Millisecond)); got != 6*time.Second {
		t.Errorf("sub-second rounding: %v, want 6s", got)
	}
}

func TestRetryAfterPrefersMilliseconds(t *testing.T) {
	now := time.Now()
	for _, tc := range []struct {
		ms, secs string
		want     time.Duration
	}{
		{"1500", "2", 1500 * time.Millisecond},
		{"250.5", "", 250500 * time.Microsecond},
		{"", "2", 2 * time.Second},
		{"junk", "2", 2 * time.Second},
		{"-1", "2", 2 * time.Second},
		{"NaN", "4", 4 * time.Second},
		{"1e12", "", MaxRetryAfter},
		{"", "", 0},
	} {
		h := http.Header{}
		if tc.ms != "" {
			h.Set("retry-after-ms", tc.ms)
		}
		if tc.secs != "" {
			h.Set("Retry-After", tc.secs)
		}
		if got := RetryAfter(h, now); got != tc.want {
			t.Errorf("retry-after-ms %q, Retry-After %q: %v, want %v", tc.ms, tc.secs, got, tc.want)
		}
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
		if got := ErrorMessage([]byte(tc.body)); got != tc.want {
			t.Errorf("%s: ErrorMessage = %q, want %q", tc.name, got, tc.want)
		}
	}
	long := ErrorMessage(bytes.Repeat([]byte("é"), 5000))
	if len(long) > MaxText+len("…") || !strings.HasSuffix(long, "…") || !strings.HasPrefix(long, "éé") {
		t.Errorf("long text not bounded on a rune boundary: %d bytes", len(long))
	}
}

// A secret that straddles the MaxText cut must not survive as its first bytes, and every
// redacted string goes, in any body shape.
func TestTextRedactsBeforeBounding(t *testing.T) {
	const key = "sk-sys1-0123456789abcdefghijklmnopqrstuvwxyz"
	filler := strings.Repeat("x", MaxText-30) + " "
	for _, body := range []string{
		filler + "Bearer " + key,
		`{"error":"` + filler + "invalid api key " + key + `"}`,
	} {
		got := Text([]byte(body), key)
		if len(got) > MaxText+len("…") {
			t.Fatalf("not bounded: %d bytes", len(got))
		}
		if strings.Contains(got, key[:8]) {
			t.Fatalf("the start of the API key survived: …%s", got[len(got)-40:])
		}
	}
	got := Text([]byte(`{"error":{"message":"upstream ollama.internal:11434 refused `+key+`","type":"x"}}`), key, "ollama.internal:11434", "")
	if strings.Contains(got, key) || strings.Contains(got, "ollama.internal") || !strings.Contains(got, "upstream [REDACTED] refused [REDACTED] (x)") {
		t.Fatalf("Text = %q", got)
	}
}

func TestReadBounded(t *testing.T) {
	body := bytes.Repeat([]byte("x"), 100)
	for _, announced := range []int64{-1, 100} {
		got, err := ReadBounded(bytes.NewReader(body), announced, 100)
		if err != nil || len(got) != 100 {
			t.Errorf("announced %d: %d bytes, %v", announced, len(got), err)
		}
		got, err = ReadBounded(iotest.HalfReader(bytes.NewReader(body)), announced, 99)
		if !errors.Is(err, ErrTooLarge) || len(got) != 99 {
			t.Errorf("announced %d over the limit: %d bytes, %v", announced, len(got), err)
		}
	}
	if _, err := ReadBounded(iotest.ErrReader(io.ErrUnexpectedEOF), -1, 10); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("read error lost: %v", err)
	}
}

func TestExchangeBoundsBothKindsOfBody(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/big-ok":
			_, _ = w.Write(bytes.Repeat([]byte("a"), 2000))
		case "/big-error":
			w.WriteHeader(http.StatusBadGateway)
			_, _ = w.Write(bytes.Repeat([]byte("e"), MaxErrorBodyBytes+10))
		case "/redirect":
			http.Redirect(w, r, "/big-ok", http.StatusFound)
		default:
			_, _ = w.Write([]byte("ok"))
		}
	}))
	defer srv.Close()
	hc := NewHTTPClient(nil, 2)
	get := func(path string) (*http.Response, []byte, error) {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+path, nil)
		return Exchange(hc, req, 1000)
	}
	if _, body, err := get("/small"); err != nil || string(body) != "ok" {
		t.Fatalf("small: %q %v", body, err)
	}
	if _, _, err := get("/big-ok"); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("big 2xx: %v", err)
	}
	if resp, body, err := get("/big-error"); err != nil || resp.StatusCode != 502 || len(body) != MaxErrorBodyBytes {
		t.Fatalf("big error body: %d bytes, %v", len(body), err)
	}
	if resp, _, err := get("/redirect"); err != nil || resp.StatusCode != http.StatusFound {
		t.Fatalf("a redirect must not be followed: %v %v", resp, err)
	}
	// a caller's own client keeps its settings but loses its redirect policy
	own := NewHTTPClient(&http.Client{Timeout: time.Minute}, 1)
	if own.Timeout != time.Minute || own.CheckRedirect == nil {
		t.Fatalf("own client: %+v", own)
	}
}

func TestTransportPoolSizedToConcurrency(t *testing.T) {
	tr := NewTransport(64)
	if tr.MaxIdleConnsPerHost < 64 || tr.MaxIdleConns < 64 || tr.MaxConnsPerHost != 0 {
		t.Fatalf("pool: idle/host %d idle %d max/host %d", tr.MaxIdleConnsPerHost, tr.MaxIdleConns, tr.MaxConnsPerHost)
	}
}

func TestTransportFailure(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	_, err = http.Get("http://" + addr)
	if reason, timeout := TransportFailure(err); reason != "the connection was refused" || timeout {
		t.Errorf("refused: %q %v (%v)", reason, timeout, err)
	}
	_, err = http.Get("http://sys1-nowhere.invalid")
	if reason, _ := TransportFailure(err); reason != "its host name does not resolve" {
		t.Errorf("dns: %q (%v)", reason, err)
	}
	if reason, _ := TransportFailure(io.ErrUnexpectedEOF); reason != "the connection was closed before an answer" {
		t.Errorf("eof: %q", reason)
	}
	if _, timeout := TransportFailure(&net.OpError{Op: "read", Err: timeoutErr{}}); !timeout {
		t.Error("a network timeout is not reported as one")
	}
	if reason, _ := TransportFailure(errors.New("http://user:pw@host/ exploded")); strings.Contains(reason, "pw") {
		t.Errorf("reason echoes the error: %q", reason)
	}
}

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

func TestParseBaseURL(t *testing.T) {
	for _, tc := range []struct{ raw, want string }{
		{"ftp://h", "scheme must be http or https"},
		{"localhost:11434", "scheme must be http or https"},
		{"http://", "host is missing"},
		{"https://user:hunter2@api.example.com", "must not carry credentials"},
		{"https://token@api.example.com", "must not carry credentials"},
		{"http://h/?token=abc", "query or fragment"},
		{"http://h/#x", "query or fragment"},
		{"http://h/?", "query or fragment"},
		{"http://[::1", "not a valid URL"},
	} {
		_, err := ParseBaseURL(tc.raw, "SYS1_X_BASE_URL")
		if err == nil || !strings.HasPrefix(err.Error(), "SYS1_X_BASE_URL: ") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.raw, err, tc.want)
			continue
		}
		if strings.Contains(err.Error(), "hunter2") || strings.Contains(err.Error(), "token") {
			t.Errorf("%q: credentials echoed: %v", tc.raw, err)
		}
	}
	u, err := ParseBaseURL(" https://api.typesafe.ai/prefix/// ", "V")
	if err != nil || u.String() != "https://api.typesafe.ai/prefix" {
		t.Fatalf("%v %v", u, err)
	}
}

func TestRequestIDAndTrimCode(t *testing.T) {
	h := http.Header{}
	h.Set("X-Typesafe-Request-Id", "req_1\n2")
	if got := RequestID(h); got != "req_1 2" {
		t.Errorf("RequestID = %q", got)
	}
	h.Set("X-Request-Id", strings.Repeat("r", 300))
	if got := RequestID(h); len(got) != 128 {
		t.Errorf("RequestID not bounded: %d", len(got))
	}
	for in, want := range map[string]string{
		"[SYS1_UPSTREAM_ERROR] answers.x: missing": "answers.x: missing",
		"plain":          "plain",
		"[not closed":    "[not closed",
		"[SYS1_TIMEOUT]": "",
	} {
		if got := TrimCode(in); got != want {
			t.Errorf("TrimCode(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestLoggerPrefersTheContexts(t *testing.T) {
	var a, b bytes.Buffer
	fallback := zerolog.New(&a)
	ctxLog := zerolog.New(&b)
	Logger(context.Background(), &fallback).Info().Msg("x")
	Logger(ctxLog.WithContext(context.Background()), &fallback).Info().Msg("y")
	disabled := zerolog.Nop()
	Logger(disabled.WithContext(context.Background()), &fallback).Info().Msg("z")
	if a.String() == "" || !strings.Contains(a.String(), `"x"`) || !strings.Contains(a.String(), `"z"`) || !strings.Contains(b.String(), `"y"`) {
		t.Fatalf("fallback %q, ctx %q", a.String(), b.String())
	}
}
