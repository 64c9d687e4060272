package systemonetest_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/sys1hq/sys1/provider/ollamatest"
	"github.com/sys1hq/sys1/provider/systemonetest"
)

const body = `{"model":"jev-lite","state":"s","questions":{"q":{"type":"noul","instructions":"?"}}}`

func do(t *testing.T, method, url, key, payload string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(payload))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	if err != nil {
		return nil, nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

func TestEveryRouteRequiresTheKey(t *testing.T) {
	srv := systemonetest.New(t)
	for _, route := range []struct{ method, path string }{{"POST", "/v1/systemone"}, {"GET", "/v1/models"}, {"GET", "/health"}} {
		for _, key := range []string{"", "wrong"} {
			resp, b := do(t, route.method, srv.URL()+route.path, key, body)
			if resp.StatusCode != 401 || !strings.Contains(string(b), `"type":"authentication_error"`) {
				t.Errorf("%s %s with key %q: %d %s", route.method, route.path, key, resp.StatusCode, b)
			}
		}
		if resp, _ := do(t, route.method, srv.URL()+route.path, srv.Key(), body); resp.StatusCode != 200 {
			t.Errorf("%s %s with the key: %d", route.method, route.path, resp.StatusCode)
		}
	}
	if srv.Calls() != 3 || srv.Inner().Calls() != 1 {
		t.Fatalf("calls %d (inner %d): refused calls count, only the valid one is forwarded", srv.Calls(), srv.Inner().Calls())
	}
}

func TestModelsListAndForwarding(t *testing.T) {
	srv := systemonetest.New(t, systemonetest.WithModels(systemonetest.Model{ID: "jev-lite", Version: "7"}, systemonetest.Model{ID: "plain"}))
	_, b := do(t, "GET", srv.URL()+"/v1/models", srv.Key(), "")
	if string(b) != `{"object":"list","data":[{"id":"jev-lite","object":"model","created":1767225600,"owned_by":"typesafe","version":"7"},{"id":"plain","object":"model","created":1767225600,"owned_by":"typesafe"}]}` {
		t.Fatalf("list: %s", b)
	}
	resp, b := do(t, "POST", srv.URL()+"/v1/systemone", srv.Key(), body)
	var answer struct {
		Model   string                     `json:"model"`
		Answers map[string]json.RawMessage `json:"answers"`
	}
	if resp.StatusCode != 200 || json.Unmarshal(b, &answer) != nil || answer.Model != "jev-lite" || len(answer.Answers) != 1 {
		t.Fatalf("answer %d %s", resp.StatusCode, b)
	}
	// the wrapped fake enforces the contract and the served models
	if resp, _ := do(t, "POST", srv.URL()+"/v1/systemone", srv.Key(), `{"model":"jev-lite"}`); resp.StatusCode != 400 {
		t.Errorf("invalid body: %d", resp.StatusCode)
	}
	if resp, _ := do(t, "POST", srv.URL()+"/v1/systemone", srv.Key(), strings.Replace(body, "jev-lite", "gone", 1)); resp.StatusCode != 404 {
		t.Errorf("unknown model: %d", resp.StatusCode)
	}
	srv.SetModelsList(false)
	if resp, _ := do(t, "GET", srv.URL()+"/v1/models", srv.Key(), ""); resp.StatusCode != 404 {
		t.Errorf("list turned off: %d", resp.StatusCode)
	}
	if got := srv.Requests()[1].Header.Get("Authorization"); got != "Bearer "+srv.Key() {
		t.Errorf("recorded header %q", got)
	}
	if got := srv.Inner().SystemOneRequests()[0].Header.Get("Authorization"); got != "" {
		t.Errorf("the key reached the wrapped fake: %q", got)
	}
}

func TestFaults(t *testing.T) {
	srv := systemonetest.New(t)
	srv.Fail(1, systemonetest.BusyMS(529, "250", "1"))
	srv.Fail(1, systemonetest.Redirect(307, "https://elsewhere.example/"))
	srv.Fail(1, systemonetest.Forbidden())
	resp, b := do(t, "POST", srv.URL()+"/v1/systemone", srv.Key(), body)
	if resp.StatusCode != 529 || resp.Header.Get("Retry-After-Ms") != "250" || resp.Header.Get("Retry-After") != "1" || !strings.Contains(string(b), "overloaded_error") {
		t.Fatalf("529: %d %v %s", resp.StatusCode, resp.Header, b)
	}
	if resp, _ = do(t, "POST", srv.URL()+"/v1/systemone", srv.Key(), body); resp.StatusCode != 307 || resp.Header.Get("Location") != "https://elsewhere.example/" {
		t.Fatalf("redirect: %d", resp.StatusCode)
	}
	if resp, _ = do(t, "POST", srv.URL()+"/v1/systemone", srv.Key(), body); resp.StatusCode != 403 {
		t.Fatalf("403: %d", resp.StatusCode)
	}
	srv.Fail(1, systemonetest.Drop())
	if resp, _ = do(t, "POST", srv.URL()+"/v1/systemone", srv.Key(), body); resp != nil {
		t.Fatalf("drop answered %d", resp.StatusCode)
	}
	if resp, _ = do(t, "POST", srv.URL()+"/v1/systemone", srv.Key(), body); resp.StatusCode != 200 {
		t.Fatalf("after the queue: %d", resp.StatusCode)
	}
}

// A malformed answer reaches the call it was queued for even with concurrent good calls.
func TestMalformedGoesToItsOwnCall(t *testing.T) {
	srv := systemonetest.New(t)
	for round := 0; round < 5; round++ {
		srv.Fail(1, systemonetest.Malformed(ollamatest.MalformedNotJSON))
		var wg sync.WaitGroup
		bodies := make([][]byte, 8)
		for i := range bodies {
			wg.Go(func() { _, bodies[i] = do(t, "POST", srv.URL()+"/v1/systemone", srv.Key(), body) })
		}
		wg.Wait()
		bad := 0
		for _, b := range bodies {
			if bytes.HasPrefix(b, []byte("<html>")) {
				bad++
			} else if !json.Valid(b) {
				t.Fatalf("a good call got %s", b)
			}
		}
		if bad != 1 {
			t.Fatalf("round %d: %d malformed answers for one queued", round, bad)
		}
	}
}
