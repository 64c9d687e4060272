package ollamatest_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/provider/ollamatest"
)

const ticket = `{"model":"nimble","state":{"ticket":"checkout fails"},"questions":{
 "urgency":{"type":"score","instructions":"How urgent?","criteria":["calm","annoyed","blocked"]},
 "label":{"type":"choice","instructions":"Which team?","criteria":{"bug":"Software","billing":"Money","account":null}},
 "refund":{"type":"noul","instructions":"Refund asked?","criteria":{"true":"yes","false":"no"}}}}`

func post(t *testing.T, srv *ollamatest.Server, body string) (int, http.Header, []byte) {
	t.Helper()
	return postCtx(t, context.Background(), srv, body)
}

func postCtx(t *testing.T, ctx context.Context, srv *ollamatest.Server, body string) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL()+"/v1/systemone", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, b
}

// awaitInFlight waits (5 s at most) until n calls are in flight at srv.
func awaitInFlight(t *testing.T, srv *ollamatest.Server, n int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.AwaitInFlight(ctx, n); err != nil {
		t.Fatal(err)
	}
}

func TestAnswersInRequestOrderAndPassesTheContract(t *testing.T) {
	srv := ollamatest.New(t)
	status, _, body := post(t, srv, ticket)
	if status != http.StatusOK {
		t.Fatalf("status %d: %s", status, body)
	}
	req, derr := contract.DecodeRequest([]byte(ticket))
	if derr != nil {
		t.Fatal(derr)
	}
	resp, derr := contract.DecodeResponse(req, body)
	if derr != nil {
		t.Fatalf("the fake's answer breaks the contract: %v\n%s", derr, body)
	}
	if resp.Model != "nimble" {
		t.Errorf("model = %q", resp.Model)
	}
	// answers object keys arrive in request order
	iu, il, ir := strings.Index(string(body), `"urgency"`), strings.Index(string(body), `"label"`), strings.Index(string(body), `"refund"`)
	if !(iu < il && il < ir) {
		t.Errorf("answers not in request order: %s", body)
	}
	if want := int64(len(ticket) / 4); resp.Usage.InputTokens != want || resp.Usage.OutputTokens != 1 {
		t.Errorf("usage = %+v, want input %d output 1", resp.Usage, want)
	}
	// deterministic: the same request gets the same bytes
	_, _, again := post(t, srv, ticket)
	if string(again) != string(body) {
		t.Errorf("answers differ between identical calls:\n%s\n%s", body, again)
	}

	recs := srv.SystemOneRequests()
	if len(recs) != 2 || srv.Calls() != 2 {
		t.Fatalf("recorded %d, calls %d", len(recs), srv.Calls())
	}
	qs, err := recs[0].Questions()
	if err != nil {
		t.Fatal(err)
	}
	got := fmt.Sprint(qs)
	want := "[{urgency score [calm annoyed blocked]} {label choice [bug billing account]} {refund noul []}]"
	if got != want {
		t.Errorf("decoded order = %s, want %s", got, want)
	}
}

func TestValidatesByOllamaRules(t *testing.T) {
	q := func(body string) string {
		return `{"model":"nimble","state":"s","questions":{` + body + `}}`
	}
	choice := func(n int) string {
		var opts []string
		for i := 0; i < n; i++ {
			opts = append(opts, fmt.Sprintf(`"o%d":"d"`, i))
		}
		return `"c":{"type":"choice","instructions":"i","criteria":{` + strings.Join(opts, ",") + `}}`
	}
	var many []string
	for i := 0; i < 65; i++ {
		many = append(many, fmt.Sprintf(`"q%d":{"type":"noul","instructions":"i"}`, i))
	}
	cases := []struct{ name, body, wantErr string }{
		{"not json", `{`, "invalid JSON"},
		{"not an object", `[]`, "must be an object"},
		{"unknown field", `{"model":"nimble","state":"s","questions":{"n":{"type":"noul","instructions":"i"}},"stream":true}`, `unknown field "stream"`},
		{"missing model", `{"state":"s","questions":{"n":{"type":"noul","instructions":"i"}}}`, "model is required"},
		{"missing state", `{"model":"nimble","questions":{"n":{"type":"noul","instructions":"i"}}}`, "state is required"},
		{"state a number", `{"model":"nimble","state":3,"questions":{"n":{"type":"noul","instructions":"i"}}}`, "state: must be"},
		{"missing questions", `{"model":"nimble","state":"s"}`, "questions is required"},
		{"no questions", q(``), "must have 1 to 64 questions, got 0"},
		{"65 questions", q(strings.Join(many, ",")), "got 65"},
		{"bad type", q(`"x":{"type":"rank","instructions":"i"}`), `"rank" is not one of`},
		{"missing type", q(`"x":{"instructions":"i"}`), "type: required"},
		{"missing instructions", q(`"x":{"type":"noul"}`), "instructions"},
		{"unknown question field", q(`"x":{"type":"noul","instructions":"i","weight":2}`), `unknown field "weight"`},
		{"one option", q(choice(1)), "need 2 to 26 options, got 1"},
		{"27 options", q(choice(27)), "got 27"},
		{"option not a string", q(`"c":{"type":"choice","instructions":"i","criteria":{"a":1,"b":"x"}}`), "must be a string or null"},
		{"duplicate option", q(`"c":{"type":"choice","instructions":"i","criteria":{"a":"x","a":"y"}}`), "duplicate option"},
		{"duplicate question", q(`"n":{"type":"noul","instructions":"i"},"n":{"type":"noul","instructions":"i"}`), "duplicate question"},
		{"score one level", q(`"s":{"type":"score","instructions":"i","criteria":["only"]}`), "2 to 26 levels, got 1"},
		{"score levels not strings", q(`"s":{"type":"score","instructions":"i","criteria":[1,2]}`), "array of strings"},
		{"noul criteria other key", q(`"n":{"type":"noul","instructions":"i","criteria":{"maybe":"x"}}`), `"maybe"`},
		{"images not base64", `{"model":"nimble","state":"s","questions":{"n":{"type":"noul","instructions":"i"}},"images":["%%%"]}`, "illegal base64"},
		{"images not strings", `{"model":"nimble","state":"s","questions":{"n":{"type":"noul","instructions":"i"}},"images":[1]}`, "images"},
		{"keep_alive bad duration", `{"model":"nimble","state":"s","questions":{"n":{"type":"noul","instructions":"i"}},"keep_alive":"300"}`, "keep_alive"},
		{"trailing data", q(`"n":{"type":"noul","instructions":"i"}`) + `{}`, "after the end"},
	}
	srv := ollamatest.New(t)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			status, hdr, body := post(t, srv, tc.body)
			if status != http.StatusBadRequest {
				t.Fatalf("status %d, want 400: %s", status, body)
			}
			if !strings.HasPrefix(hdr.Get("Content-Type"), "application/json") {
				t.Errorf("content type %q", hdr.Get("Content-Type"))
			}
			var e struct {
				Error string `json:"error"`
			}
			if err := json.Unmarshal(body, &e); err != nil || !strings.Contains(e.Error, tc.wantErr) {
				t.Fatalf("body %s, want {\"error\"} containing %q", body, tc.wantErr)
			}
		})
	}
	// the accepted forms of keep_alive
	for _, ka := range []string{`300`, `"5m"`, `-1`, `"-1s"`, `0`} {
		body := `{"model":"nimble","state":"s","questions":{"n":{"type":"noul","instructions":"i"}},"keep_alive":` + ka + `}`
		if status, _, b := post(t, srv, body); status != http.StatusOK {
			t.Errorf("keep_alive %s: status %d %s", ka, status, b)
		}
	}
}

func TestEnforcesBodyLimits(t *testing.T) {
	srv := ollamatest.New(t, ollamatest.WithRecordLimit(0))
	pad := func(n int) string { return `"` + strings.Repeat("x", n) + `"` }
	small := `{"model":"nimble","state":%s,"questions":{"n":{"type":"noul","instructions":"i"}}%s}`
	base := len(fmt.Sprintf(small, pad(0), ""))

	atLimit := fmt.Sprintf(small, pad(ollamatest.MaxBodyNoImages-base), "")
	if status, _, b := post(t, srv, atLimit); status != http.StatusOK {
		t.Fatalf("exactly 64 KiB: status %d %s", status, b)
	}
	over := fmt.Sprintf(small, pad(ollamatest.MaxBodyNoImages-base+1), "")
	if status, _, b := post(t, srv, over); status != http.StatusRequestEntityTooLarge || !strings.Contains(string(b), `"error"`) {
		t.Fatalf("64 KiB + 1 without images: status %d %s", status, b)
	}
	image := base64.StdEncoding.EncodeToString(make([]byte, 1<<20))
	withImage := fmt.Sprintf(small, pad(100<<10), `,"images":["`+image+`"]`)
	if status, _, b := post(t, srv, withImage); status != http.StatusOK {
		t.Fatalf("1 MiB with an image: status %d %s", status, b)
	}
	huge := fmt.Sprintf(small, pad(0), `,"images":["`+strings.Repeat("A", ollamatest.MaxBodyWithImages)+`"]`)
	if status, _, _ := post(t, srv, huge); status != http.StatusRequestEntityTooLarge {
		t.Fatalf("over 32 MiB: status %d", status)
	}
}

func TestUnknownModelIs404(t *testing.T) {
	srv := ollamatest.New(t, ollamatest.WithModels("nimble:latest", "clef"))
	for _, model := range []string{"nimble", "nimble:latest", "clef", "clef:latest"} {
		body := strings.Replace(ticket, `"nimble"`, `"`+model+`"`, 1)
		if status, _, b := post(t, srv, body); status != http.StatusOK {
			t.Errorf("model %s: status %d %s", model, status, b)
		}
	}
	status, _, body := post(t, srv, strings.Replace(ticket, `"nimble"`, `"x"`, 1))
	if status != http.StatusNotFound || string(body) != `{"error":"model 'x' not found"}` {
		t.Fatalf("status %d body %s", status, body)
	}
}

func TestVersionAndTags(t *testing.T) {
	srv := ollamatest.New(t, ollamatest.WithVersion("0.36.1"), ollamatest.WithModels("nimble:latest", "clef:cloud"))
	get := func(path string) string {
		resp, err := http.Get(srv.URL() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	if got := get("/api/version"); got != `{"version":"0.36.1"}` {
		t.Errorf("version = %s", got)
	}
	var tags struct {
		Models []struct{ Name, Model string } `json:"models"`
	}
	if err := json.Unmarshal([]byte(get("/api/tags")), &tags); err != nil || len(tags.Models) != 2 || tags.Models[1].Name != "clef:cloud" {
		t.Fatalf("tags = %+v (%v)", tags, err)
	}
	srv.SetVersion("0.30.0")
	srv.SetModels()
	if got := get("/api/version"); got != `{"version":"0.30.0"}` {
		t.Errorf("version after SetVersion = %s", got)
	}
	if got := get("/api/tags"); got != `{"models":[]}` {
		t.Errorf("tags after SetModels() = %s", got)
	}
}

func TestStatusFaultsForTheNextNCalls(t *testing.T) {
	srv := ollamatest.New(t)
	for _, code := range []int{400, 404, 413, 429, 500, 502, 503} {
		srv.Fail(1, ollamatest.Status(code))
	}
	srv.Fail(2, ollamatest.Busy(429, "7"))
	srv.Fail(1, ollamatest.Body(500, "application/json", `{"detail":"boom"}`))
	for _, want := range []int{400, 404, 413, 429, 500, 502, 503} {
		status, _, body := post(t, srv, ticket)
		var e struct{ Error string }
		if status != want || json.Unmarshal(body, &e) != nil || e.Error == "" {
			t.Fatalf("status %d body %s, want %d with {\"error\"}", status, body, want)
		}
	}
	for i := 0; i < 2; i++ {
		status, hdr, _ := post(t, srv, ticket)
		if status != 429 || hdr.Get("Retry-After") != "7" {
			t.Fatalf("busy call %d: status %d Retry-After %q", i, status, hdr.Get("Retry-After"))
		}
	}
	if status, _, body := post(t, srv, ticket); status != 500 || string(body) != `{"detail":"boom"}` {
		t.Fatalf("verbatim body fault: %d %s", status, body)
	}
	if status, _, _ := post(t, srv, ticket); status != 200 {
		t.Fatalf("after the queued faults: status %d", status)
	}
	srv.FailAlways(ollamatest.Status(502))
	for i := 0; i < 3; i++ {
		if status, _, _ := post(t, srv, ticket); status != 502 {
			t.Fatalf("FailAlways call %d: status %d", i, status)
		}
	}
	srv.Heal()
	if status, _, _ := post(t, srv, ticket); status != 200 {
		t.Fatalf("after Heal: status %d", status)
	}
}

func TestMalformedAnswersBreakTheContract(t *testing.T) {
	srv := ollamatest.New(t)
	req, derr := contract.DecodeRequest([]byte(ticket))
	if derr != nil {
		t.Fatal(derr)
	}
	for _, m := range []ollamatest.Malformation{
		ollamatest.MalformedWrongType, ollamatest.MalformedMissingAnswer, ollamatest.MalformedBadSum,
		ollamatest.MalformedNaN, ollamatest.MalformedExtraAnswer, ollamatest.MalformedNotJSON, ollamatest.MalformedTruncated,
	} {
		srv.Fail(1, ollamatest.Malformed(m))
		status, _, body := post(t, srv, ticket)
		if status != http.StatusOK {
			t.Fatalf("malformation %d: status %d", m, status)
		}
		if _, err := contract.DecodeResponse(req, body); err == nil {
			t.Errorf("malformation %d passed the response contract: %s", m, body)
		}
	}
}

func TestHangEndsWithTheClientAndDropResets(t *testing.T) {
	srv := ollamatest.New(t)
	srv.Fail(1, ollamatest.Hang())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL()+"/v1/systemone", strings.NewReader(ticket))
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	awaitInFlight(t, srv, 1)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("hung call ended with %v, want context.Canceled", err)
	}
	awaitInFlight(t, srv, 0)

	srv.Fail(1, ollamatest.Drop())
	req, _ := http.NewRequest(http.MethodPost, srv.URL()+"/v1/systemone", strings.NewReader(ticket))
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("dropped call answered %d", resp.StatusCode)
	}
}

func TestCloseReleasesHangingCalls(t *testing.T) {
	srv := ollamatest.NewServer()
	srv.FailAlways(ollamatest.Hang())
	done := make(chan error, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, srv.URL()+"/v1/systemone", strings.NewReader(ticket))
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			err = fmt.Errorf("answered %d", resp.StatusCode)
		}
		done <- err
	}()
	awaitInFlight(t, srv, 1)
	srv.Close()
	if err := <-done; err == nil || strings.Contains(err.Error(), "answered") {
		t.Fatalf("a call hanging at Close must fail at the transport, got %v", err)
	}
	srv.Close() // idempotent
}

func TestCountsMaxConcurrency(t *testing.T) {
	srv := ollamatest.New(t)
	const n = 5
	srv.Fail(n, ollamatest.Hang())
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL()+"/v1/systemone", strings.NewReader(ticket))
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
			}
		}()
	}
	awaitInFlight(t, srv, n)
	cancel()
	wg.Wait()
	awaitInFlight(t, srv, 0)
	if srv.MaxConcurrent() != n || srv.Calls() != n {
		t.Fatalf("max concurrent %d calls %d, want %d", srv.MaxConcurrent(), srv.Calls(), n)
	}
	srv.ResetStats()
	if srv.Calls() != 0 || srv.MaxConcurrent() != 0 || len(srv.Requests()) != 0 {
		t.Fatal("ResetStats left state behind")
	}
}

func TestLatencyHonoursTheClientContext(t *testing.T) {
	srv := ollamatest.New(t, ollamatest.WithLatency(time.Hour))
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL()+"/v1/systemone", strings.NewReader(ticket))
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
		t.Fatal("a call delayed by an hour answered")
	}
	awaitInFlight(t, srv, 0)
	srv.SetLatency(0)
	if status, _, _ := post(t, srv, ticket); status != 200 {
		t.Fatalf("status %d", status)
	}
}

func TestRecordsHeadersAndBoundsRecording(t *testing.T) {
	srv := ollamatest.New(t, ollamatest.WithRecordLimit(3), ollamatest.WithAPIKey("k3y"))
	send := func(auth string) int {
		req, _ := http.NewRequest(http.MethodPost, srv.URL()+"/v1/systemone", strings.NewReader(ticket))
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := send(""); got != http.StatusUnauthorized {
		t.Fatalf("no bearer: %d", got)
	}
	if got := send("Bearer wrong"); got != http.StatusUnauthorized {
		t.Fatalf("wrong bearer: %d", got)
	}
	for i := 0; i < 5; i++ {
		if got := send("Bearer k3y"); got != http.StatusOK {
			t.Fatalf("good bearer: %d", got)
		}
	}
	recs := srv.Requests()
	if len(recs) != 3 {
		t.Fatalf("kept %d requests, want the last 3", len(recs))
	}
	for _, r := range recs {
		if r.Header.Get("Authorization") != "Bearer k3y" || string(r.Body) != ticket {
			t.Fatalf("recorded %q %q", r.Header.Get("Authorization"), r.Body)
		}
	}
	if _, ok := recs[0].Field("keep_alive"); ok {
		t.Error("keep_alive reported present")
	}
	if m, ok := recs[0].Field("model"); !ok || string(m) != `"nimble"` {
		t.Errorf("model field = %s %v", m, ok)
	}
}

func TestFailIfTargetsMatchingRequestsAndRecordingIsARing(t *testing.T) {
	srv := ollamatest.New(t, ollamatest.WithRecordLimit(4))
	srv.FailIf(func(body []byte) bool { return strings.Contains(string(body), `"poison"`) }, ollamatest.Status(502))
	srv.Fail(1, ollamatest.Status(500)) // queued faults wait behind matching rules
	poison := strings.Replace(ticket, `"checkout fails"`, `"poison"`, 1)
	for i := 0; i < 3; i++ {
		if status, _, _ := post(t, srv, poison); status != 502 {
			t.Fatalf("matching call %d: status %d", i, status)
		}
	}
	if status, _, _ := post(t, srv, ticket); status != 500 {
		t.Fatalf("the queued fault should hit the first non-matching call, got %d", status)
	}
	for i := 0; i < 3; i++ {
		body := strings.Replace(ticket, `"checkout fails"`, fmt.Sprintf(`"n%d"`, i), 1)
		if status, _, _ := post(t, srv, body); status != 200 {
			t.Fatalf("status %d", status)
		}
	}
	recs := srv.Requests()
	if len(recs) != 4 {
		t.Fatalf("kept %d, want 4", len(recs))
	}
	// the last four, oldest first: the plain ticket, then n0, n1, n2
	if !strings.Contains(string(recs[0].Body), "checkout fails") {
		t.Errorf("oldest kept = %s", recs[0].Body)
	}
	for i := 1; i < 4; i++ {
		if !strings.Contains(string(recs[i].Body), fmt.Sprintf(`"n%d"`, i-1)) {
			t.Errorf("record %d = %s", i, recs[i].Body)
		}
	}
	srv.Heal()
	if status, _, _ := post(t, srv, poison); status != 200 {
		t.Fatalf("after Heal: %d", status)
	}
}

func TestRecordingOff(t *testing.T) {
	srv := ollamatest.New(t, ollamatest.WithRecording(false))
	if status, _, _ := post(t, srv, ticket); status != 200 {
		t.Fatalf("status %d", status)
	}
	if n := len(srv.Requests()); n != 0 || srv.Calls() != 1 {
		t.Fatalf("recording off kept %d requests (calls %d)", n, srv.Calls())
	}
}

func TestBusyTimeSumsCallTime(t *testing.T) {
	srv := ollamatest.New(t, ollamatest.WithLatency(15*time.Millisecond))
	for range 3 {
		if status, _, body := post(t, srv, ticket); status != http.StatusOK {
			t.Fatalf("status %d: %s", status, body)
		}
	}
	// Three calls of at least the latency each: exact sums, no whole-millisecond rounding.
	if got := srv.BusyTime(); got < 45*time.Millisecond || got > 10*time.Second {
		t.Errorf("BusyTime %s for three 15ms calls", got)
	}
	srv.ResetStats()
	if got := srv.BusyTime(); got != 0 {
		t.Errorf("after ResetStats: %s", got)
	}
}

// TestCallLogSaysWhatEachCallCameTo: every call is reported when it ends — an answer the
// client read, a programmed failure, a hang the client gave up on, a client that left while
// the answer was still being prepared — with its body, so a soak can count how often each
// request was scored.
func TestCallLogSaysWhatEachCallCameTo(t *testing.T) {
	logged := make(chan ollamatest.Call, 16)
	srv := ollamatest.New(t, ollamatest.WithCallLog(func(c ollamatest.Call) {
		c.Body = append([]byte(nil), c.Body...)
		logged <- c
	}))

	if status, _, _ := post(t, srv, ticket); status != http.StatusOK {
		t.Fatalf("status %d", status)
	}
	srv.Fail(1, ollamatest.Busy(503, "1"))
	if status, _, _ := post(t, srv, ticket); status != 503 {
		t.Fatalf("status %d", status)
	}
	srv.Fail(1, ollamatest.Hang())
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL()+"/v1/systemone", strings.NewReader(ticket))
	if _, err := http.DefaultClient.Do(req); err == nil {
		t.Fatal("a hung call answered")
	}
	cancel()
	srv.SetLatency(time.Second)
	ctx, cancel = context.WithTimeout(context.Background(), 100*time.Millisecond)
	req, _ = http.NewRequestWithContext(ctx, http.MethodPost, srv.URL()+"/v1/systemone", strings.NewReader(ticket))
	if _, err := http.DefaultClient.Do(req); err == nil {
		t.Fatal("a slow call answered within the client's timeout")
	}
	cancel()

	// The handler reports after the client has its answer (or has left): wait for each.
	var got []ollamatest.Call
	for len(got) < 4 {
		select {
		case c := <-logged:
			got = append(got, c)
		case <-time.After(5 * time.Second):
			t.Fatalf("%d calls logged, want 4", len(got))
		}
	}
	want := []struct {
		status   int
		answered bool
		fault    string
	}{{200, true, ""}, {503, false, "status 503"}, {0, false, "hang"}, {0, false, "client gone"}}
	for i, w := range want {
		c := got[i]
		if c.Status != w.status || c.Answered != w.answered || c.Fault != w.fault || string(c.Body) != ticket || !c.Ended.After(c.Started) {
			t.Errorf("call %d: status %d answered %v fault %q (body %d bytes), want %d %v %q", i+1, c.Status, c.Answered, c.Fault, len(c.Body), w.status, w.answered, w.fault)
		}
	}
}

// FailModel fails one model the way Ollama does (a model it has but cannot run): after the
// request's checks, so an invalid request is still 400 and an unknown model still 404; the
// other models answer. CallsFor counts each model's checked calls, 404s included.
func TestFailModelFailsOneModelAfterOllamasChecks(t *testing.T) {
	srv := ollamatest.New(t, ollamatest.WithModels("nimble:latest", "broken:latest"))
	srv.FailModel("broken", ollamatest.Status(500))
	srv.FailModel("slow:latest", ollamatest.Status(500)) // not pulled: 404 wins
	withModel := func(m string) string { return strings.Replace(ticket, `"nimble"`, `"`+m+`"`, 1) }
	for _, tc := range []struct {
		body   string
		status int
	}{
		{withModel("broken"), 500},
		{withModel("broken:latest"), 500},
		{withModel("nimble"), 200},
		{withModel("slow"), 404},
		{strings.Replace(withModel("broken"), `"questions"`, `"questionz"`, 1), 400},
	} {
		if status, _, b := post(t, srv, tc.body); status != tc.status {
			t.Errorf("%.40s…: status %d %s, want %d", tc.body, status, b, tc.status)
		}
	}
	if b, n, s := srv.CallsFor("broken"), srv.CallsFor("nimble:latest"), srv.CallsFor("slow"); b != 2 || n != 1 || s != 1 {
		t.Errorf("calls for broken %d, nimble %d, slow %d; want 2, 1, 1 (the 400 is not counted)", b, n, s)
	}
	// queued faults come first; Heal ends the model's fault
	srv.Fail(1, ollamatest.Busy(503, "1"))
	if status, _, _ := post(t, srv, withModel("broken")); status != 503 {
		t.Errorf("queued fault: %d", status)
	}
	srv.Heal()
	if status, _, _ := post(t, srv, withModel("broken")); status != 200 {
		t.Errorf("after Heal: %d", status)
	}
	srv.ResetStats()
	if srv.CallsFor("broken") != 0 {
		t.Error("ResetStats kept the per-model counts")
	}
}
