package systemone

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/provider/systemonetest"
)

func TestParseModelList(t *testing.T) {
	for _, tc := range []struct{ body, want string }{
		{`{"object":"list","data":[{"id":"jev-1.13.0","object":"model","created":1,"owned_by":"t","version":"1.13.0"},{"id":"jev-latest","created":1}]}`,
			"[{jev-1.13.0 1.13.0} {jev-latest }]"},
		{`{"models":[{"name":"nimble:latest","digest":"sha256:ab"},{"model":"m","revision":"r7"},{"id":" "}]}`, "[{nimble:latest sha256:ab} {m r7}]"},
		{`[{"id":"a","version":3},{"id":"b","version":"","digest":"d"}]`, "[{a } {b d}]"}, // a non-string version is no version
		{`{"data":[]}`, "[]"},
	} {
		got, err := parseModelList([]byte(tc.body))
		if err != nil || fmt.Sprint(got) != tc.want {
			t.Errorf("%s: %v %v, want %s", tc.body, got, err, tc.want)
		}
	}
	for _, bad := range []string{``, `null`, `"x"`, `{"object":"list"}`, `{"data":{}}`, `<html>`, `[1,2]`, `{"data":[1]}`} {
		if got, err := parseModelList([]byte(bad)); err == nil {
			t.Errorf("%q: accepted as %v", bad, got)
		}
	}
}

func FuzzParseModelList(f *testing.F) {
	for _, s := range []string{`{"data":[{"id":"a","version":"1"}]}`, `{"models":[{"name":"x"}]}`, `[{"id":"b"}]`, `{"data":null}`, `[`, "{\"data\":[{\"id\":\"\xff\"}]}"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		models, err := parseModelList(body)
		if err != nil {
			return
		}
		for _, m := range models {
			if m.ID == "" {
				t.Fatalf("an entry without an id: %+v", m)
			}
		}
	})
}

// A new build behind a pinned name (a new version in the list) gives a new digest once the
// TTL has passed; concurrent lookups share one list read.
func TestModelDigestFollowsANewVersion(t *testing.T) {
	srv := systemonetest.New(t)
	c, err := New(Config{BaseURL: srv.URL(), APIKey: contract.Secret(srv.Key())}, Deps{})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	now := time.Unix(1_800_000_000, 0)
	c.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if d, err := c.ModelDigest(context.Background(), "jev-lite"); err != nil || d != "jev-lite@2026-09-15.2" {
				t.Errorf("digest %q, %v", d, err)
			}
		})
	}
	wg.Wait()
	if n := srv.CountPath(ModelsPath); n != 1 {
		t.Fatalf("%d list reads for 8 concurrent lookups", n)
	}
	srv.SetModels(systemonetest.Model{ID: "jev-lite", Version: "2026-10-01.1"})
	mu.Lock()
	now = now.Add(DigestTTL)
	mu.Unlock()
	if d, err := c.ModelDigest(context.Background(), "jev-lite"); err != nil || d != "jev-lite@2026-10-01.1" {
		t.Fatalf("after the TTL: %q, %v", d, err)
	}
}
