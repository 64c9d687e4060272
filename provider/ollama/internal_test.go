package ollama

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sys1hq/sys1/provider/internal/upstream"
	"github.com/sys1hq/sys1/provider/ollamatest"
)

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

// TestUpstreamTextRedactsAKeyCutByTheBound: a key that straddles the upstream.MaxText cut
// must not survive as its first bytes (which no longer match the whole key).
func TestUpstreamTextRedactsAKeyCutByTheBound(t *testing.T) {
	const key = "sk-sys1-0123456789abcdefghijklmnopqrstuvwxyz"
	c := &Client{apiKey: Secret(key)}
	filler := strings.Repeat("x", upstream.MaxText-30) + " "
	for _, body := range []string{
		filler + "Bearer " + key,
		`{"error":"` + filler + "invalid api key " + key + `"}`,
	} {
		got := c.upstreamText([]byte(body))
		if len(got) > upstream.MaxText+len("…") {
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
		c, err := New(tc.cfg, Deps{})
		if err != nil {
			t.Fatal(err)
		}
		if c.endpoint != tc.want+"/v1/systemone" {
			t.Errorf("%+v: endpoint %s, want %s/v1/systemone", tc.cfg, c.endpoint, tc.want)
		}
	}
}

// Upstream text producers see loses the base URL and host as well as the key: a proxy's
// error page often names the backend it could not reach.
func TestUpstreamTextRedactsTheHost(t *testing.T) {
	c, err := New(Config{BaseURL: "http://ollama.internal:11434/"}, Deps{})
	if err != nil {
		t.Fatal(err)
	}
	got := c.upstreamText([]byte(`<html>502: upstream http://ollama.internal:11434 (ollama.internal:11434) down</html>`))
	if strings.Contains(got, "ollama.internal") || !strings.Contains(got, "[REDACTED]") {
		t.Fatalf("upstreamText = %q", got)
	}
}

// A digest is trusted for DigestTTL: a model replaced under the same name gets its new digest
// once the TTL has passed, and concurrent lookups share one read.
func TestModelDigestFollowsAReplacedModel(t *testing.T) {
	srv := ollamatest.New(t, ollamatest.WithModels("nimble:latest"))
	c, err := New(Config{BaseURL: srv.URL()}, Deps{})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	now := time.Unix(1_800_000_000, 0)
	c.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }

	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if d, err := c.ModelDigest(context.Background(), "nimble"); err != nil || d != fmt.Sprintf("%064x", 1) {
				t.Errorf("digest %q, %v", d, err)
			}
		})
	}
	wg.Wait()
	if n := countPath(srv, "/api/tags"); n != 1 {
		t.Fatalf("%d tag reads for 8 concurrent lookups", n)
	}
	srv.SetModels("other", "nimble:latest") // nimble now has another digest (the fake's is by position)
	advance(DigestTTL - time.Millisecond)
	if d, _ := c.ModelDigest(context.Background(), "nimble"); d != fmt.Sprintf("%064x", 1) {
		t.Fatalf("within the TTL: %q", d)
	}
	advance(time.Millisecond)
	if d, _ := c.ModelDigest(context.Background(), "nimble"); d != fmt.Sprintf("%064x", 2) {
		t.Fatalf("after the TTL the new digest must show: %q", d)
	}
	// a probe refreshes the digests too
	srv.SetModels("nimble:latest")
	if !c.Probe(context.Background()).Healthy() {
		t.Fatal("unhealthy")
	}
	if d, _ := c.ModelDigest(context.Background(), "nimble"); d != fmt.Sprintf("%064x", 1) {
		t.Fatalf("after a probe: %q", d)
	}
}

func countPath(srv *ollamatest.Server, path string) int {
	n := 0
	for _, r := range srv.Requests() {
		if r.Path == path {
			n++
		}
	}
	return n
}
