package worker_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/contract/wire"
	"github.com/sys1hq/sys1/provider"
	"github.com/sys1hq/sys1/provider/ollamatest"
	"github.com/sys1hq/sys1/worker"
	"github.com/sys1hq/sys1/worker/auth"
	"github.com/sys1hq/sys1/worker/client"
)

const ticket = `{"model":"nimble","state":{"subject":"Checkout broken","body":"500 errors since 9am","n":1.50},
"questions":{
 "label":{"type":"choice","instructions":"Which team owns this?","criteria":{"zeta":"last alphabetically","billing":"Payments","bug":null}},
 "urgent":{"type":"noul","instructions":"Is it urgent?"},
 "anger":{"type":"score","instructions":"How angry?","criteria":["calm","annoyed","furious"]}},
"keep_alive":"99h"}`

// answerNames returns the question names of the reply's answers in the order of the bytes.
func answerNames(t *testing.T, raw []byte) []string {
	t.Helper()
	at := bytes.Index(raw, []byte(`"answers":`))
	if at < 0 {
		t.Fatalf("no answers in %s", raw)
	}
	type pos struct {
		name string
		at   int
	}
	var found []pos
	for _, n := range []string{"label", "urgent", "anger"} {
		if i := bytes.Index(raw[at:], []byte(`"`+n+`":{`)); i >= 0 {
			found = append(found, pos{n, i})
		}
	}
	sort.Slice(found, func(i, j int) bool { return found[i].at < found[j].at })
	names := make([]string, len(found))
	for i, f := range found {
		names[i] = f.name
	}
	return names
}

func TestDecisionEndToEndAllTypes(t *testing.T) {
	h := newHarness(t)
	h.start()
	rep := h.decide("svc-a", []byte(ticket), func(r *client.Request) { r.RunID = "ticket-1" })

	if rep.Status != contract.StatusSuccess || rep.Error != nil {
		t.Fatalf("status %s, error %+v; reply %s", rep.Status, rep.Error, rep.Raw)
	}
	if got := rep.Header.Get(wire.HeaderRunID); got != "ticket-1" {
		t.Errorf("reply Sys1-Run-Id = %q", got)
	}
	if got := rep.Header.Get(wire.HeaderStatus); got != "success" {
		t.Errorf("reply Sys1-Status = %q", got)
	}
	if got := answerNames(t, rep.Raw); strings.Join(got, ",") != "label,urgent,anger" {
		t.Errorf("answers in reply not in request order: %v\n%s", got, rep.Raw)
	}
	res := rep.Result
	if res.Provider != "ollama" || len(res.Answers) != 3 {
		t.Fatalf("result %+v", res)
	}
	types := []contract.QuestionType{res.Answers[0].Type, res.Answers[1].Type, res.Answers[2].Type}
	if types[0] != contract.TypeChoice || types[1] != contract.TypeNoul || types[2] != contract.TypeScore {
		t.Errorf("answer types %v", types)
	}
	if len(rep.Attempts) != 1 || rep.Attempts[0].Outcome != contract.OutcomeOK {
		t.Errorf("attempts %+v", rep.Attempts)
	}

	// On the wire to Ollama: questions and options in request order, the caller's keep_alive gone.
	sent := h.fake.SystemOneRequests()
	if len(sent) != 1 {
		t.Fatalf("fake saw %d calls", len(sent))
	}
	qs, err := sent[0].Questions()
	if err != nil {
		t.Fatal(err)
	}
	if len(qs) != 3 || qs[0].Name != "label" || qs[1].Name != "urgent" || qs[2].Name != "anger" {
		t.Fatalf("questions on the wire: %+v", qs)
	}
	if strings.Join(qs[0].Keys, ",") != "zeta,billing,bug" {
		t.Errorf("options on the wire: %v", qs[0].Keys)
	}
	if _, ok := sent[0].Field("keep_alive"); ok {
		t.Errorf("caller's keep_alive reached Ollama: %s", sent[0].Body)
	}
	if !bytes.Contains(sent[0].Body, []byte(`"n":1.50`)) {
		t.Errorf("state number spelling changed on the wire: %s", sent[0].Body)
	}

	waitFor(t, "record", 5*time.Second, func() bool { return len(h.records()) == 1 })
	rec := h.recordByRun("ticket-1")
	// Mode none: the caller is the subject's token, recorded as unverified.
	if rec.Status != contract.StatusSuccess || rec.Caller != "svc-a" || rec.CallerKind != contract.CallerKindAnonymous || rec.Subject != "sys1.decide.svc-a" {
		t.Errorf("record identity/status: %+v", rec)
	}
	if rec.Model != "nimble" || rec.RequestedModel != "nimble" || rec.Provider != "ollama" || rec.Worker != "test-worker" || rec.Version != "test" {
		t.Errorf("record provenance: model %q requested %q provider %q worker %q version %q", rec.Model, rec.RequestedModel, rec.Provider, rec.Worker, rec.Version)
	}
	if rec.Subject != "sys1.decide.svc-a" || rec.StreamSeq == 0 || rec.Deliveries != 1 || rec.PublishedAt.IsZero() || rec.FinishedAt.Before(rec.StartedAt) {
		t.Errorf("record delivery fields: %+v", rec)
	}
	if rec.Request == nil || len(rec.Request.Questions) != 3 || rec.Result == nil || len(rec.Result.Answers) != 3 {
		t.Fatalf("record request/result missing: %+v", rec)
	}
	if len(rec.Attempts) != 1 || rec.SchemaVersion != contract.RecordSchemaVersion {
		t.Errorf("record attempts %+v schema %d", rec.Attempts, rec.SchemaVersion)
	}
	waitFor(t, "request removed from the work queue", 5*time.Second, func() bool { return h.pending() == 0 })
	// Every log line about the run carries its run_id, the provider's own lines included.
	var providerLines int
	for _, line := range strings.Split(strings.TrimSpace(h.logs.String()), "\n") {
		var entry map[string]any
		if err := json.Unmarshal([]byte(line), &entry); err != nil {
			t.Fatalf("log line is not JSON: %q", line)
		}
		if entry["message"] == "ollama call" {
			providerLines++
			if entry["run_id"] != "ticket-1" {
				t.Errorf("provider log line without the run id: %s", line)
			}
		}
	}
	if providerLines != 1 {
		t.Errorf("want 1 provider log line, got %d", providerLines)
	}
}

func TestImagesAreHashedNeverStored(t *testing.T) {
	h := newHarness(t)
	h.start()
	body := example(t, "image.json")
	var probe struct {
		Images []string `json:"images"`
	}
	if err := json.Unmarshal(body, &probe); err != nil || len(probe.Images) == 0 {
		t.Fatalf("image example has no images: %v", err)
	}
	rep := h.decide("svc-a", body, func(r *client.Request) { r.RunID = "img-1" })
	if rep.Status != contract.StatusSuccess {
		t.Fatalf("reply %s", rep.Raw)
	}
	waitFor(t, "record", 5*time.Second, func() bool { return len(h.records()) == 1 })
	raw := h.rawRecords()[0]
	if bytes.Contains(raw, []byte(probe.Images[0][:40])) {
		t.Fatalf("record contains base64 image data")
	}
	rec := h.recordByRun("img-1")
	if len(rec.Images) != 1 || len(rec.Images[0].SHA256) != 64 || rec.Images[0].Bytes <= 0 {
		t.Errorf("record images: %+v", rec.Images)
	}
	if !strings.Contains(h.logs.String(), "img-1") || strings.Contains(h.logs.String(), probe.Images[0][:40]) {
		t.Errorf("logs must name the run and never carry image data")
	}
}

func TestPermanentErrorsAnswerAtOnce(t *testing.T) {
	h := newHarness(t)
	h.start()
	tooManyOptions := `{"state":"x","questions":{"label":{"type":"choice","instructions":"pick","criteria":{` +
		func() string {
			var b strings.Builder
			for i := range 27 {
				if i > 0 {
					b.WriteString(",")
				}
				fmt.Fprintf(&b, `"o%d":null`, i)
			}
			return b.String()
		}() + `}}}}`
	big := `{"state":"` + strings.Repeat("a", 70_000) + `","questions":{"q":{"type":"noul","instructions":"x"}}}`
	cases := []struct {
		name, body, code string
		status           int
		msg              string
	}{
		{"not json", `{"state":`, "SYS1_INVALID_INPUT", 400, ""},
		{"too many options", tooManyOptions, "SYS1_INVALID_INPUT", 400, "questions.label.criteria"},
		{"model not allowed", `{"model":"gpt-9","state":"x","questions":{"q":{"type":"noul","instructions":"x"}}}`, "SYS1_MODEL_NOT_ALLOWED", 400, "nimble"},
		{"too large", big, "SYS1_REQUEST_TOO_LARGE", 413, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			runID := "perm-" + strings.ReplaceAll(c.name, " ", "-")
			rep := h.decide("svc-a", []byte(c.body), func(r *client.Request) { r.RunID = runID })
			if rep.Status != contract.StatusFailed || rep.Error == nil || string(rep.Error.Code) != c.code || rep.Error.Status != c.status {
				t.Fatalf("reply %s", rep.Raw)
			}
			if rep.Header.Get(wire.HeaderErrorCode) != c.code || rep.Header.Get(wire.HeaderStatus) != "failed" {
				t.Errorf("reply headers %v", rep.Header)
			}
			if !strings.HasPrefix(rep.Error.Message, "["+c.code+"] ") || !strings.Contains(rep.Error.Message, c.msg) {
				t.Errorf("message %q", rep.Error.Message)
			}
			if rep.Result != nil || len(rep.Attempts) != 0 {
				t.Errorf("no provider attempt expected: %s", rep.Raw)
			}
			waitFor(t, "record", 5*time.Second, func() bool {
				for _, r := range h.records() {
					if r.RunID == runID {
						return true
					}
				}
				return false
			})
			rec := h.recordByRun(runID)
			if string(rec.ErrorCode) != c.code || rec.ErrorStatus != c.status || rec.Status != contract.StatusFailed || rec.Deliveries != 1 {
				t.Errorf("record %+v", rec)
			}
		})
	}
	if h.fake.Calls() != 0 {
		t.Errorf("the provider was called %d times for invalid requests", h.fake.Calls())
	}
	waitFor(t, "work queue empty", 5*time.Second, func() bool { return h.pending() == 0 })
}

func TestUpstreamErrorsMapAndRetry(t *testing.T) {
	t.Parallel() // waits out failovers and retries, not the CPU: runs beside the others
	cases := []struct {
		name      string
		fault     ollamatest.Fault
		code      string
		transient bool
		outcome   string
	}{
		{"upstream 400", ollamatest.Fault{Status: 400, Body: `{"error":"context window exceeded"}`}, "SYS1_INVALID_REQUEST", false, contract.OutcomeError},
		{"model missing", ollamatest.Fault{Status: 404}, "SYS1_MODEL_UNAVAILABLE", true, contract.OutcomeUnavailable},
		{"busy", ollamatest.Fault{Status: 503}, "SYS1_PROVIDER_BUSY", true, contract.OutcomeBusy},
		{"upstream 500", ollamatest.Fault{Status: 500}, "SYS1_UPSTREAM_ERROR", true, contract.OutcomeError},
		{"malformed", ollamatest.Fault{Malformed: ollamatest.MalformedMissingAnswer}, "SYS1_UPSTREAM_ERROR", true, contract.OutcomeMalformed},
		{"timeout", ollamatest.Fault{Hang: true}, "SYS1_TIMEOUT", true, contract.OutcomeTimeout},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t)
			h.fake.FailAlways(c.fault)
			h.start(func(o *replicaOpts) { o.provider = h.ollama(300 * time.Millisecond) })
			rep := h.decide("svc-a", []byte(ticket), func(r *client.Request) { r.RunID = "up-1" })
			if rep.Status != contract.StatusFailed || string(rep.Error.Code) != c.code {
				t.Fatalf("reply %s", rep.Raw)
			}
			wantAttempts := 1
			if c.transient {
				wantAttempts = 3 // SYS1_MAX_DELIVER in these tests
			}
			if len(rep.Attempts) != wantAttempts {
				t.Fatalf("attempts: want %d, got %d: %s", wantAttempts, len(rep.Attempts), rep.Raw)
			}
			wantCalls := wantAttempts
			if c.code == "SYS1_MODEL_UNAVAILABLE" {
				wantCalls = 1 // the 404 is remembered: the later deliveries skip the provider
			}
			for i, a := range rep.Attempts {
				skip := i >= wantCalls && a.Outcome == contract.OutcomeSkipped && a.Detail == "model not found here (a 404, remembered)" && a.ErrorCode == ""
				if a.Delivery != i+1 || !skip && (i >= wantCalls || a.Outcome != c.outcome || string(a.ErrorCode) != c.code) {
					t.Errorf("attempt %d: %+v", i, a)
				}
			}
			if got := h.fake.Calls(); got != int64(wantCalls) {
				t.Errorf("provider calls %d, want %d", got, wantCalls)
			}
			waitFor(t, "record", 5*time.Second, func() bool { return len(h.records()) == 1 })
			rec := h.recordByRun("up-1")
			if len(rec.Attempts) != wantAttempts || rec.Deliveries != wantAttempts || string(rec.ErrorCode) != c.code {
				t.Errorf("record attempts %d deliveries %d code %s", len(rec.Attempts), rec.Deliveries, rec.ErrorCode)
			}
			// The upstream's own words go to the operator's log only, never to the producer.
			if c.code == "SYS1_INVALID_REQUEST" && (strings.Contains(rep.Error.Message, "context window exceeded") || !strings.Contains(h.logs.String(), "context window exceeded")) {
				t.Errorf("upstream text in the reply (%q), or not in the log", rep.Error.Message)
			}
		})
	}
}

func TestTransientErrorThenSuccessKeepsEveryAttempt(t *testing.T) {
	h := newHarness(t)
	h.fake.Fail(2, ollamatest.Fault{Status: 429, RetryAfter: "0"})
	h.start()
	rep := h.decide("svc-a", []byte(ticket), func(r *client.Request) { r.RunID = "flaky-1" })
	if rep.Status != contract.StatusSuccess {
		t.Fatalf("reply %s", rep.Raw)
	}
	outcomes := []string{}
	for _, a := range rep.Attempts {
		outcomes = append(outcomes, fmt.Sprintf("%d:%s", a.Delivery, a.Outcome))
	}
	if strings.Join(outcomes, ",") != "1:busy,2:busy,3:ok" {
		t.Errorf("attempts %v", outcomes)
	}
	waitFor(t, "record", 5*time.Second, func() bool { return len(h.records()) == 1 })
	if rec := h.recordByRun("flaky-1"); len(rec.Attempts) != 3 || rec.Deliveries != 3 {
		t.Errorf("record attempts %d deliveries %d", len(rec.Attempts), rec.Deliveries)
	}
}

func TestProviderUnavailable(t *testing.T) {
	h := newHarness(t)
	url := h.fake.URL()
	h.fake.Close() // nothing listens there any more: connection refused
	p := h.ollamaAt(url, time.Second)
	h.start(func(o *replicaOpts) { o.provider = p })
	rep := h.decide("svc-a", []byte(ticket))
	if rep.Status != contract.StatusFailed || rep.Error.Code != contract.CodeProviderUnavailable || len(rep.Attempts) != 3 {
		t.Fatalf("reply %s", rep.Raw)
	}
	if rep.Attempts[0].Outcome != contract.OutcomeUnavailable {
		t.Errorf("outcome %q", rep.Attempts[0].Outcome)
	}
}

func TestExpiredDeadlineNeverCallsProvider(t *testing.T) {
	h := newHarness(t)
	h.start()
	rep := h.decide("svc-a", []byte(ticket), func(r *client.Request) { r.Deadline = time.Now().Add(-time.Second) })
	if rep.Status != contract.StatusFailed || rep.Error.Code != contract.CodeExpired || rep.Error.Status != 408 {
		t.Fatalf("reply %s", rep.Raw)
	}
	if h.fake.Calls() != 0 {
		t.Errorf("provider called %d times after the deadline", h.fake.Calls())
	}
	// A deadline in the future is honoured, not rejected.
	rep = h.decide("svc-a", []byte(ticket), func(r *client.Request) { r.Deadline = time.Now().Add(time.Minute) })
	if rep.Status != contract.StatusSuccess {
		t.Fatalf("future deadline: %s", rep.Raw)
	}
}

func TestRunIDConflictAcrossCallersLeavesFirstRunUntouched(t *testing.T) {
	h := newHarness(t)
	subjectAuth, err := auth.New(context.Background(), auth.Config{Mode: auth.ModeSubject}, h.logger())
	if err != nil {
		t.Fatal(err)
	}
	h.start(func(o *replicaOpts) { o.auth = subjectAuth })
	first := h.decide("svc-a", []byte(ticket), func(r *client.Request) { r.RunID = "shared-id" })
	if first.Status != contract.StatusSuccess {
		t.Fatalf("first: %s", first.Raw)
	}
	// Another caller reusing the id (after JetStream's de-duplication window, or with its own
	// Nats-Msg-Id) reaches the worker's gate.
	second := h.decide("svc-b", []byte(`{"state":"other","questions":{"q":{"type":"noul","instructions":"x"}}}`), func(r *client.Request) { r.RunID, r.MsgID = "shared-id", "b-1" })
	if second.Status != contract.StatusFailed || second.Error.Code != contract.CodeRunIDConflict || second.Error.Status != 409 {
		t.Fatalf("second: %s", second.Raw)
	}
	if second.Result != nil {
		t.Fatalf("conflict reply leaked the first run's result")
	}
	// Same caller again: answered from the stored outcome, provider not called again.
	again := h.decide("svc-a", []byte(ticket), func(r *client.Request) { r.RunID, r.MsgID = "shared-id", "a-2" })
	if !bytes.Equal(again.Raw, first.Raw) {
		t.Errorf("replayed reply differs:\n%s\n%s", first.Raw, again.Raw)
	}
	if h.fake.Calls() != 1 {
		t.Errorf("provider calls %d, want 1", h.fake.Calls())
	}
	waitFor(t, "records", 5*time.Second, func() bool { return len(h.records()) >= 2 })
	rec := h.recordByRun("shared-id")
	if rec.Caller != "svc-a" || rec.Status != contract.StatusSuccess {
		t.Errorf("first run's record was touched: %+v", rec)
	}
	var conflict *contract.RunRecord
	for _, r := range h.records() {
		if r.ErrorCode == contract.CodeRunIDConflict {
			conflict = &r
		}
	}
	if conflict == nil || conflict.Caller != "svc-b" || conflict.RunID == "shared-id" || conflict.Request != nil {
		t.Fatalf("conflict record: %+v", conflict)
	}
	// The logs say the run id the caller sent; the line that ends the run also names the id
	// its record is stored under, so an analyst's record leads to its log lines.
	if want := `"record_id":"` + conflict.RunID + `"`; !strings.Contains(h.logs.String(), want) {
		t.Errorf("no log line carries %s", want)
	}
}

// TestModeNoneNamesCallersLikeProduction: in auth mode none (the default) each caller is its
// subject token, recorded as unverified, so the run-id ownership rule holds between callers
// as in production; a run stored before mode none named callers (caller "anonymous") still
// answers any mode-none caller from its stored outcome.
func TestModeNoneNamesCallersLikeProduction(t *testing.T) {
	h := newHarness(t)
	h.start()
	first := h.decide("svc-a", []byte(ticket), func(r *client.Request) { r.RunID = "none-shared" })
	if first.Status != contract.StatusSuccess {
		t.Fatalf("first: %s", first.Raw)
	}
	second := h.decide("svc-b", []byte(ticket), func(r *client.Request) { r.RunID, r.MsgID = "none-shared", "b-1" })
	if second.Status != contract.StatusFailed || second.Error.Code != contract.CodeRunIDConflict {
		t.Fatalf("another caller reusing the id: %s", second.Raw)
	}
	waitFor(t, "records", 5*time.Second, func() bool { return len(h.records()) == 2 })
	if rec := h.recordByRun("none-shared"); rec.Caller != "svc-a" || rec.CallerKind != contract.CallerKindAnonymous {
		t.Errorf("record identity: caller %q kind %q", rec.Caller, rec.CallerKind)
	}

	// A finished run stored as the legacy caller: any mode-none caller gets its stored reply.
	kv, err := h.js.KeyValue(context.Background(), h.topo.RunsBucket)
	if err != nil {
		t.Fatal(err)
	}
	entry, err := kv.Get(context.Background(), worker.GateKey("none-shared"))
	if err != nil {
		t.Fatal(err)
	}
	legacy := bytes.Replace(entry.Value(), []byte(`"caller":"svc-a"`), []byte(`"caller":"anonymous"`), 1)
	if bytes.Equal(legacy, entry.Value()) {
		t.Fatalf("gate entry without the caller: %s", entry.Value())
	}
	if _, err := kv.Put(context.Background(), worker.GateKey("none-shared"), legacy); err != nil {
		t.Fatal(err)
	}
	again := h.decide("svc-c", []byte(ticket), func(r *client.Request) { r.RunID, r.MsgID = "none-shared", "c-1" })
	if !bytes.Equal(again.Raw, first.Raw) || h.fake.Calls() != 1 {
		t.Errorf("legacy run replayed as %s (%d provider calls), want the stored reply %s", again.Raw, h.fake.Calls(), first.Raw)
	}
}

func TestPoisonInputNeverStopsThePool(t *testing.T) {
	h := newHarness(t)
	h.start()
	deep := strings.Repeat("[", 10_000) + strings.Repeat("]", 10_000)
	// At the payload limit less the client's headers (run id, msg id, reply subject and the
	// 70-byte traceparent line).
	atLimit := append([]byte(`{"state":"`), bytes.Repeat([]byte("a"), 8<<20-300)...)
	atLimit = append(atLimit, []byte(`","questions":{}}`)...)
	poison := map[string][]byte{
		"non-json":     []byte("hello, world"),
		"invalid-utf8": []byte("{\"state\":\"\xff\xfe\",\"questions\":{\"q\":{\"type\":\"noul\",\"instructions\":\"x\"}}}"),
		"deep":         []byte(`{"state":` + deep + `,"questions":{}}`),
		"at-limit":     atLimit,
		"empty":        {},
		"duplicate":    []byte(`{"state":"a","state":"b","questions":{"q":{"type":"noul","instructions":"x"}}}`),
	}
	for name, body := range poison {
		rep := h.decide("svc-a", body, func(r *client.Request) { r.RunID = "poison-" + name })
		if rep.Status != contract.StatusFailed || rep.Error == nil {
			t.Fatalf("%s: %s", name, rep.Raw)
		}
		if c := rep.Error.Code; c != contract.CodeInvalidInput && c != contract.CodeRequestTooLarge {
			t.Errorf("%s: code %s", name, c)
		}
	}
	// The pool is still working.
	if rep := h.decide("svc-a", []byte(ticket)); rep.Status != contract.StatusSuccess {
		t.Fatalf("after poison: %s", rep.Raw)
	}
	waitFor(t, "records", 10*time.Second, func() bool { return len(h.records()) == len(poison)+1 })
	waitFor(t, "work queue empty", 5*time.Second, func() bool { return h.pending() == 0 })
}

// panicky is a provider that panics, standing in for a bug in the worker path.
type panicky struct{ provider.Provider }

func (panicky) Evaluate(context.Context, *contract.Request) (*contract.Response, error) {
	panic("boom")
}

func TestPanicBecomesInternalError(t *testing.T) {
	h := newHarness(t)
	h.start(func(o *replicaOpts) { o.provider = panicky{h.ollama(time.Second)} })
	rep := h.decide("svc-a", []byte(ticket))
	if rep.Status != contract.StatusFailed || rep.Error.Code != contract.CodeInternal || rep.Error.Status != 500 {
		t.Fatalf("reply %s", rep.Raw)
	}
	if strings.Contains(rep.Error.Message, "boom") {
		t.Errorf("panic value leaked to the caller: %q", rep.Error.Message)
	}
	rep2 := h.decide("svc-a", []byte(ticket))
	if rep2.Status != contract.StatusFailed || rep2.Error.Code != contract.CodeInternal {
		t.Fatalf("second panic: %s", rep2.Raw)
	}
	waitFor(t, "records", 5*time.Second, func() bool { return len(h.records()) == 2 })
}

func TestConcurrencyIsBoundedAndUsed(t *testing.T) {
	h := newHarness(t, ollamatest.WithLatency(50*time.Millisecond), ollamatest.WithRecordLimit(0))
	const n = 500
	ctx := context.Background()
	// Queue everything first, then start the replica, so the queue is never the bottleneck.
	if _, err := h.js.CreateOrUpdateStream(ctx, h.topo.RequestsStreamConfig()); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if _, err := h.cl.Publish(ctx, client.Request{Caller: "svc-a", Body: []byte(ticket), RunID: fmt.Sprintf("c-%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	r := h.start(func(o *replicaOpts) { o.cfg.Concurrency = 4; o.cfg.FetchBatch = 4 })
	// Sample the fake's in-flight count through the steady state (not the ramp-up or the
	// drain of the last few runs): with a queue this deep, 4 calls should be running nearly
	// always. The bound is generous because the race detector and a shared 2-core machine
	// slow the worker's own steps between calls.
	var samples, atFour int
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	deadline := time.After(90 * time.Second)
	for done := false; !done; {
		select {
		case <-tick.C:
			s := r.w.Stats().Succeeded
			if s >= n {
				done = true
			} else if s >= 8 && s < n-8 {
				samples++
				if h.fake.InFlight() == 4 {
					atFour++
				}
			}
		case <-deadline:
			t.Fatalf("only %d of %d runs finished", r.w.Stats().Succeeded, n)
		}
	}
	if got := h.fake.MaxConcurrent(); got != 4 {
		t.Errorf("max concurrent provider calls = %d, want exactly 4", got)
	}
	if s := r.w.Stats(); s.ProviderPeak != 4 || s.ProviderCalls != n {
		t.Errorf("worker stats %+v", s)
	}
	if ratio := float64(atFour) / float64(max(samples, 1)); ratio < 0.5 {
		t.Errorf("the fake saw 4 concurrent calls in only %.0f%% of %d samples", ratio*100, samples)
	}
	t.Logf("4 calls in flight in %d of %d samples", atFour, samples)
}

func TestGracefulShutdownFinishesInFlightRuns(t *testing.T) {
	h := newHarness(t, ollamatest.WithLatency(400*time.Millisecond))
	r := h.start()
	ctx := context.Background()
	subs := make([]*nats.Subscription, 4)
	for i := range 4 {
		inbox := nats.NewInbox()
		sub, err := h.nc.SubscribeSync(inbox)
		if err != nil {
			t.Fatal(err)
		}
		subs[i] = sub
		if _, err := h.cl.Publish(ctx, client.Request{Caller: "svc-a", Body: []byte(ticket), RunID: fmt.Sprintf("g-%d", i), ReplyTo: inbox}); err != nil {
			t.Fatal(err)
		}
	}
	h.awaitInFlight(4)
	if err := r.stop(t); err != nil {
		t.Fatalf("Run returned %v", err)
	}
	for i, sub := range subs {
		m, err := sub.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatalf("run %d: no reply after shutdown: %v", i, err)
		}
		rep, _ := client.ParseReply(m)
		if rep.Status != contract.StatusSuccess {
			t.Errorf("run %d: %s", i, rep.Raw)
		}
	}
	// The acks went out before Run returned; the stream applies them asynchronously.
	waitFor(t, "every finished run acknowledged", 5*time.Second, func() bool { return h.pending() == 0 })
}

func TestShutdownPastGraceNaksAndAnotherReplicaFinishes(t *testing.T) {
	h := newHarness(t)
	h.fake.FailAlways(ollamatest.Fault{Hang: true})
	r := h.start(func(o *replicaOpts) { o.cfg.ShutdownGrace = 100 * time.Millisecond })
	ctx := context.Background()
	inbox := nats.NewInbox()
	sub, _ := h.nc.SubscribeSync(inbox)
	if _, err := h.cl.Publish(ctx, client.Request{Caller: "svc-a", Body: []byte(ticket), RunID: "late-1", ReplyTo: inbox}); err != nil {
		t.Fatal(err)
	}
	h.awaitInFlight(1)
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	if h.pending() != 1 {
		t.Fatalf("the unfinished run must stay queued, pending=%d", h.pending())
	}
	if _, err := sub.NextMsg(50 * time.Millisecond); err == nil {
		t.Fatal("an unfinished run was answered")
	}
	h.fake.Heal()
	h.start()
	m, err := sub.NextMsg(15 * time.Second)
	if err != nil {
		t.Fatalf("no reply from the second replica: %v", err)
	}
	rep, _ := client.ParseReply(m)
	if rep.Status != contract.StatusSuccess {
		t.Fatalf("reply %s", rep.Raw)
	}
	waitFor(t, "record", 5*time.Second, func() bool { return len(h.records()) == 1 })
}

// blocking never answers until the test ends: a replica that hangs and then dies.
type blocking struct {
	provider.Provider
	started atomic.Int64
	release chan struct{}
}

func (b *blocking) Evaluate(ctx context.Context, _ *contract.Request) (*contract.Response, error) {
	b.started.Add(1)
	select {
	case <-b.release:
	case <-ctx.Done():
	}
	return nil, context.Canceled
}

func TestKilledReplicaRunsFinishElsewhereOnce(t *testing.T) {
	t.Parallel() // waits out failovers and retries, not the CPU: runs beside the others
	h := newHarness(t)
	h.topo.AckWait = time.Second
	// Replica A hangs in every provider call and then "dies" (its connection is cut: no acks,
	// no naks, no shutdown).
	stuck := &blocking{Provider: h.ollama(time.Second), release: make(chan struct{})}
	t.Cleanup(func() { close(stuck.release) })
	a := h.start(func(o *replicaOpts) { o.provider = stuck; o.cfg.ID = "replica-a" })
	ctx := context.Background()
	const n = 6
	inbox := nats.NewInbox()
	sub, _ := h.nc.SubscribeSync(inbox)
	// A takes 4 (its concurrency) and hangs; B must finish those 4 and the other 2.
	for i := range n {
		if _, err := h.cl.Publish(ctx, client.Request{Caller: "svc-a", Body: []byte(ticket), RunID: fmt.Sprintf("k-%d", i), ReplyTo: inbox}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "A holds 4 runs", 10*time.Second, func() bool { return stuck.started.Load() == 4 })
	a.nc.Close()
	b := h.start(func(o *replicaOpts) { o.cfg.ID = "replica-b" })
	got := map[string]int{}
	for len(got) < n {
		m, err := sub.NextMsg(20 * time.Second)
		if err != nil {
			t.Fatalf("only %d of %d replies: %v", len(got), n, err)
		}
		rep, _ := client.ParseReply(m)
		if rep.Status != contract.StatusSuccess {
			t.Fatalf("reply %s", rep.Raw)
		}
		got[rep.RunID]++
	}
	if calls := h.fake.Calls(); calls != n {
		t.Errorf("fake scored %d times for %d runs", calls, n)
	}
	waitFor(t, "records", 5*time.Second, func() bool { return len(h.records()) == n })
	for i := range n {
		rec := h.recordByRun(fmt.Sprintf("k-%d", i))
		if rec.Worker != "replica-b" {
			t.Errorf("run %d finished by %s", i, rec.Worker)
		}
	}
	if b.w.Stats().Succeeded != n {
		t.Errorf("B stats %+v", b.w.Stats())
	}
	// A finished run delivered again is answered from its stored outcome, never scored again.
	before := h.fake.Calls()
	rep := h.decide("svc-a", []byte(ticket), func(r *client.Request) { r.RunID, r.MsgID = "k-0", "k-0-again" })
	if rep.Status != contract.StatusSuccess || h.fake.Calls() != before {
		t.Errorf("re-sent finished run was scored again (calls %d → %d)", before, h.fake.Calls())
	}
}

func TestFireAndForgetAndDurableReplies(t *testing.T) {
	h := newHarness(t)
	h.start()
	ctx := context.Background()
	if _, err := h.cl.Publish(ctx, client.Request{Caller: "svc-a", Body: []byte(ticket), RunID: "ff-1"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "record", 10*time.Second, func() bool { return len(h.records()) == 1 })
	if rec := h.recordByRun("ff-1"); rec.ReplyTo != "" || rec.Status != contract.StatusSuccess {
		t.Errorf("record %+v", rec)
	}
	if _, err := h.cl.Publish(ctx, client.Request{Caller: "svc-a", Body: []byte(ticket), RunID: "dur-1", ReplyTo: "sys1.replies.svc-a.inbox"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "durable reply", 10*time.Second, func() bool {
		s, err := h.js.Stream(ctx, h.topo.RepliesStream)
		if err != nil {
			return false
		}
		m, err := s.GetLastMsgForSubject(ctx, "sys1.replies.svc-a.inbox")
		return err == nil && m.Header.Get(wire.HeaderRunID) == "dur-1"
	})
	// Reply subjects that would loop or forge records are refused, never written to.
	rep := func(subject string) {
		if _, err := h.cl.Publish(ctx, client.Request{Caller: "svc-a", Body: []byte(ticket), RunID: "bad-reply", ReplyTo: subject}); err != nil {
			t.Fatal(err)
		}
	}
	rep("sys1.runs.success")
	waitFor(t, "refusal record", 10*time.Second, func() bool {
		for _, r := range h.records() {
			if r.ErrorCode == contract.CodeInvalidInput && strings.Contains(r.ErrorMessage, "Sys1-Reply-To") {
				return true
			}
		}
		return false
	})
	for _, r := range h.records() {
		if r.RunID == "bad-reply" {
			t.Errorf("a record was forged onto the runs stream through Sys1-Reply-To")
		}
	}
}

func TestInvalidHeaders(t *testing.T) {
	h := newHarness(t)
	h.start()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	inbox := nats.NewInbox()
	sub, _ := h.nc.SubscribeSync(inbox)
	send := func(hdr map[string]string) *client.Reply {
		m := nats.NewMsg("sys1.decide.svc-a")
		m.Data = []byte(ticket)
		m.Header.Set("Sys1-Reply-To", inbox)
		for k, v := range hdr {
			m.Header.Set(k, v)
		}
		if _, err := h.js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
		msg, err := sub.NextMsg(10 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		rep, err := client.ParseReply(msg)
		if err != nil {
			t.Fatal(err)
		}
		return rep
	}
	rep := send(map[string]string{"Sys1-Run-Id": "has space"})
	if rep.Error == nil || rep.Error.Code != contract.CodeInvalidInput || !strings.Contains(rep.RunID, "~") {
		t.Errorf("invalid run id: %s", rep.Raw)
	}
	rep = send(map[string]string{"Sys1-Deadline": "tomorrow"})
	if rep.Error == nil || rep.Error.Code != contract.CodeInvalidInput || !strings.Contains(rep.Error.Message, "Sys1-Deadline") {
		t.Errorf("invalid deadline: %s", rep.Raw)
	}
	// The zero time is a deadline long past, not "no deadline": the model is not called.
	calls := h.fake.Calls()
	rep = send(map[string]string{"Sys1-Deadline": "0001-01-01T00:00:00Z"})
	if rep.Error == nil || rep.Error.Code != contract.CodeExpired || h.fake.Calls() != calls {
		t.Errorf("zero-time deadline: %s (provider calls %d → %d)", rep.Raw, calls, h.fake.Calls())
	}
	// A huge header value is quoted back clipped, not whole (the reply, the record and the gate
	// all repeat the message).
	huge := strings.Repeat("\x01", 20000) + strings.Repeat("9", 40000)
	rep = send(map[string]string{"Sys1-Deadline": huge})
	if rep.Error == nil || rep.Error.Code != contract.CodeInvalidInput || len(rep.Raw) > 2048 {
		t.Errorf("a 60 KB deadline header: %d-byte reply: %.300s", len(rep.Raw), rep.Raw)
	}
	// No run id: derived from the stream sequence, and stable.
	rep = send(nil)
	if rep.Status != contract.StatusSuccess || !strings.HasPrefix(rep.RunID, "SYS1_REQUESTS~") {
		t.Errorf("derived run id: %s", rep.Raw)
	}
	for _, rec := range h.records() {
		if len(rec.ErrorMessage) > 512 {
			t.Errorf("record %s keeps a %d-byte error message", rec.RunID, len(rec.ErrorMessage))
		}
	}
}

// TestMalformedReplySubjectsAreRefused: a reply subject with control bytes or invalid UTF-8 is
// never delivered to (the record would name a different subject than the one used); the run
// is recorded with the refusal.
func TestMalformedReplySubjectsAreRefused(t *testing.T) {
	h := newHarness(t)
	h.start()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Only a wildcard can match the malformed subjects; it also sees the worker's own pull
	// traffic on _INBOX.<nuid>. A NUID is 22 base-62 characters, so the "bad-" prefix (with
	// its hyphen) tells the malformed subjects apart; a bare "_INBOX.a" prefix did not (CI
	// drew a NUID starting with "a").
	all, err := h.nc.SubscribeSync("_INBOX.*")
	if err != nil {
		t.Fatal(err)
	}
	for _, replyTo := range []string{"_INBOX.bad-\x00b", "_INBOX.bad-\x1b[2Jb", "_INBOX.bad-\xffb", "_INBOX.bad-\u2028b"} {
		m := nats.NewMsg("sys1.decide.svc-a")
		m.Data = []byte(ticket)
		m.Header.Set("Sys1-Reply-To", replyTo)
		if _, err := h.js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "four records", 10*time.Second, func() bool { return len(h.records()) == 4 })
	for _, rec := range h.records() {
		if rec.ErrorCode != contract.CodeInvalidInput || rec.ReplyTo != "" || !strings.Contains(rec.ErrorMessage, "Sys1-Reply-To") {
			t.Errorf("record %s: %s %q reply_to %q", rec.RunID, rec.ErrorCode, rec.ErrorMessage, rec.ReplyTo)
		}
	}
	if h.fake.Calls() != 0 {
		t.Errorf("provider called %d times", h.fake.Calls())
	}
	for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); {
		m, err := all.NextMsg(100 * time.Millisecond)
		if err == nil && strings.HasPrefix(m.Subject, "_INBOX.bad-") {
			t.Errorf("a reply was delivered to %q", m.Subject)
		}
	}
}

func TestClientReportsDeduplicatedPublish(t *testing.T) {
	h := newHarness(t)
	h.start()
	if rep := h.decide("svc-a", []byte(ticket), func(r *client.Request) { r.RunID = "dup-1" }); rep.Status != contract.StatusSuccess {
		t.Fatalf("first: %s", rep.Raw)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := h.cl.Decide(ctx, client.Request{Caller: "svc-a", Body: []byte(ticket), RunID: "dup-1"})
	if !errors.Is(err, client.ErrDuplicate) {
		t.Fatalf("want ErrDuplicate, got %v", err)
	}
}

func TestSlowProviderCallIsHeartbeatedNotRedelivered(t *testing.T) {
	h := newHarness(t, ollamatest.WithLatency(2500*time.Millisecond))
	h.topo.AckWait = time.Second
	h.start()
	rep := h.decide("svc-a", []byte(ticket), func(r *client.Request) { r.RunID = "slow-1" })
	if rep.Status != contract.StatusSuccess {
		t.Fatalf("reply %s", rep.Raw)
	}
	// Without InProgress the message would have been redelivered (AckWait 1s < 2.5s) and
	// scored again, or the reply would show a second delivery.
	if h.fake.Calls() != 1 || len(rep.Attempts) != 1 || rep.Attempts[0].Delivery != 1 {
		t.Errorf("calls %d attempts %+v", h.fake.Calls(), rep.Attempts)
	}
}

func TestRunWhoseOwningMessageVanishedIsTakenOver(t *testing.T) {
	h := newHarness(t)
	h.start()
	ctx := context.Background()
	// A gate entry still "running" for a message that is no longer in the stream (it aged out
	// unfinished): a new message with the same run id must not wait for it forever.
	kv, err := h.js.KeyValue(ctx, h.topo.RunsBucket)
	if err != nil {
		t.Fatal(err)
	}
	stale := `{"caller":"svc-a","status":"running","stream_seq":987654,"started_at":"2026-01-01T00:00:00Z",` +
		`"attempts":[{"provider":"ollama","outcome":"busy","latency_ms":3,"detail":"[SYS1_PROVIDER_BUSY] busy","delivery":1,"error_code":"SYS1_PROVIDER_BUSY","started_at":"2026-01-01T00:00:00Z"}]}`
	if _, err := kv.Create(ctx, "r"+hex.EncodeToString([]byte("orphan-1")), []byte(stale)); err != nil {
		t.Fatal(err)
	}
	rep := h.decide("svc-a", []byte(ticket), func(r *client.Request) { r.RunID = "orphan-1" })
	if rep.Status != contract.StatusSuccess {
		t.Fatalf("reply %s", rep.Raw)
	}
	// The earlier attempt is kept: the record tells the whole story of the run id.
	if len(rep.Attempts) != 2 || rep.Attempts[0].Outcome != contract.OutcomeBusy || rep.Attempts[1].Outcome != contract.OutcomeOK {
		t.Errorf("attempts %+v", rep.Attempts)
	}
	if h.fake.Calls() != 1 {
		t.Errorf("provider calls %d", h.fake.Calls())
	}
}

// TestOwnerLookupFailureIsLoggedAndRetried: when the worker cannot tell whether the message
// owning a run id is still in the stream, it says so at warn level on the run's log line (not
// only "in flight") and naks the delivery for a retry, never taking the run over.
func TestOwnerLookupFailureIsLoggedAndRetried(t *testing.T) {
	h := newHarness(t)
	h.start()
	ctx := context.Background()
	kv, err := h.js.KeyValue(ctx, h.topo.RunsBucket)
	if err != nil {
		t.Fatal(err)
	}
	// A running gate entry whose owning message cannot be looked up: sequence 0 is a request
	// JetStream rejects (a bad request, not "no message found"), as NATS trouble would be.
	owner := `{"caller":"svc-a","status":"running","stream_seq":0,"started_at":"2026-01-01T00:00:00Z"}`
	if _, err := kv.Create(ctx, "r"+hex.EncodeToString([]byte("lookup-fails-1")), []byte(owner)); err != nil {
		t.Fatal(err)
	}
	if _, err := h.cl.Publish(ctx, client.Request{Caller: "svc-a", Body: []byte(ticket), RunID: "lookup-fails-1"}); err != nil {
		t.Fatal(err)
	}
	type line struct {
		Level   string `json:"level"`
		RunID   string `json:"run_id"`
		Error   string `json:"error"`
		Message string `json:"message"`
	}
	warned := func() (n int) {
		for _, l := range strings.Split(h.logs.String(), "\n") {
			var ln line
			if json.Unmarshal([]byte(l), &ln) == nil && ln.Level == "warn" && ln.RunID == "lookup-fails-1" &&
				ln.Error != "" && strings.Contains(ln.Message, "could not look up the message that owns this run id") {
				n++
			}
		}
		return n
	}
	// Two warnings: the delivery was nak'ed and came back, still not taken over.
	waitFor(t, "the lookup failure logged at warn on two deliveries", 10*time.Second, func() bool { return warned() >= 2 })
	if h.fake.Calls() != 0 {
		t.Errorf("provider called %d times for a run whose owner could not be looked up", h.fake.Calls())
	}
}

func TestDuplicateMessageWaitsForTheRunInFlight(t *testing.T) {
	h := newHarness(t, ollamatest.WithLatency(300*time.Millisecond))
	h.start()
	ctx := context.Background()
	inbox := nats.NewInbox()
	sub, _ := h.nc.SubscribeSync(inbox)
	for _, msgID := range []string{"dup-a", "dup-b"} {
		if _, err := h.cl.Publish(ctx, client.Request{Caller: "svc-a", Body: []byte(ticket), RunID: "twice-1", MsgID: msgID, ReplyTo: inbox}); err != nil {
			t.Fatal(err)
		}
	}
	var replies [][]byte
	for range 2 {
		m, err := sub.NextMsg(15 * time.Second)
		if err != nil {
			t.Fatalf("replies: %d of 2: %v", len(replies), err)
		}
		replies = append(replies, m.Data)
	}
	if !bytes.Equal(replies[0], replies[1]) {
		t.Errorf("the two messages got different answers:\n%s\n%s", replies[0], replies[1])
	}
	if h.fake.Calls() != 1 {
		t.Errorf("one run id was scored %d times", h.fake.Calls())
	}
	waitFor(t, "both messages settled", 5*time.Second, func() bool { return h.pending() == 0 })
}

func TestNothingIsLostWhenNATSRestarts(t *testing.T) {
	t.Parallel() // waits out failovers and retries, not the CPU: runs beside the others
	h := newHarness(t, ollamatest.WithLatency(30*time.Millisecond), ollamatest.WithRecordLimit(0))
	h.topo.AckWait = 2 * time.Second
	r := h.start()
	ctx := context.Background()
	const n = 40
	for i := range n {
		if _, err := h.cl.Publish(ctx, client.Request{Caller: "svc-a", Body: []byte(ticket), RunID: fmt.Sprintf("nr-%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	// Restart NATS with runs in flight, queued and finished.
	waitFor(t, "some runs finished", 10*time.Second, func() bool { return r.w.Stats().Succeeded >= 5 })
	h.restartNATS()
	waitFor(t, "every run recorded after the restart", 60*time.Second, func() bool {
		seen := map[string]bool{}
		for _, rec := range h.records() {
			seen[rec.RunID] = true
		}
		return len(seen) == n
	})
	waitFor(t, "work queue empty", 30*time.Second, func() bool { return h.pending() == 0 })
	for i := range n {
		rec := h.recordByRun(fmt.Sprintf("nr-%d", i)) // exactly one record per run id
		if rec.Status != contract.StatusSuccess {
			t.Errorf("run %d: %s %s", i, rec.ErrorCode, rec.ErrorMessage)
		}
	}
}

func TestOperationalEndpoints(t *testing.T) {
	h := newHarness(t, ollamatest.WithVersion("0.35.1"), ollamatest.WithModels("nimble"))
	r := h.start(func(o *replicaOpts) { o.cfg.ProbeInterval = 100 * time.Millisecond })
	if rep := h.decide("svc-a", []byte(ticket)); rep.Status != contract.StatusSuccess {
		t.Fatalf("reply %s", rep.Raw)
	}
	srv := httptest.NewServer(r.w.Handler())
	defer srv.Close()
	get := func(path string) (int, string) {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, _ := get("/healthz"); code != http.StatusOK {
		t.Errorf("/healthz %d", code)
	}
	if code, body := get("/readyz"); code != http.StatusOK {
		t.Errorf("/readyz %d: %s", code, body)
	}
	code, body := get("/metrics")
	if code != http.StatusOK || !strings.Contains(body, `sys1_worker_runs_total{error_code="",model="nimble",provider="ollama",status="success",worker="test-worker"} 1`) ||
		!strings.Contains(body, `sys1_worker_provider_calls_total{provider="ollama",worker="test-worker"} 1`) {
		t.Errorf("/metrics %d:\n%s", code, body)
	}
	// /readyz serves the last probe: a storm of hits costs the model server nothing.
	probes := func() (n int) {
		for _, rec := range h.fake.Requests() {
			if rec.Path != "/v1/systemone" {
				n++
			}
		}
		return n
	}
	before := probes()
	for range 200 {
		if code, _ := get("/readyz"); code != http.StatusOK {
			t.Fatalf("/readyz %d", code)
		}
	}
	if extra := probes() - before; extra > 20 {
		t.Errorf("200 hits of /readyz made %d probe requests to the provider", extra)
	}
	// An Ollama too old for System One makes the replica unready at the next probe, saying why.
	h.fake.SetVersion("0.34.0")
	waitFor(t, "/readyz to say 503 with the old version", 10*time.Second, func() bool {
		code, body := get("/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, "0.34.0")
	})
}

func TestRunThatNoDeliveryFinishesEndsAfterMaxDeliver(t *testing.T) {
	t.Parallel() // waits out failovers and retries, not the CPU: runs beside the others
	h := newHarness(t)
	h.topo.AckWait = time.Second
	// Replica A takes the run and dies in the provider call without recording anything.
	stuck := &blocking{Provider: h.ollama(time.Second), release: make(chan struct{})}
	t.Cleanup(func() { close(stuck.release) })
	a := h.start(func(o *replicaOpts) {
		o.provider = stuck
		o.cfg.ID = "replica-a"
		o.cfg.Concurrency = 1
		o.cfg.FetchBatch = 1
	})
	inbox := nats.NewInbox()
	sub, _ := h.nc.SubscribeSync(inbox)
	if _, err := h.cl.Publish(context.Background(), client.Request{Caller: "svc-a", Body: []byte(ticket), RunID: "doomed-1", ReplyTo: inbox}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "A holds the run", 10*time.Second, func() bool { return stuck.started.Load() == 1 })
	a.nc.Close()
	// Replica B allows a single delivery: the redelivery is past it, so B answers instead of
	// scoring, with why, rather than trying forever.
	h.start(func(o *replicaOpts) { o.cfg.ID = "replica-b"; o.cfg.MaxDeliver = 1 })
	m, err := sub.NextMsg(20 * time.Second)
	if err != nil {
		t.Fatalf("no reply: %v", err)
	}
	rep, _ := client.ParseReply(m)
	if rep.Status != contract.StatusFailed || rep.Error.Code != contract.CodeInternal || !strings.Contains(rep.Error.Message, "no delivery finished the run in 2 deliveries") {
		t.Fatalf("reply %s", rep.Raw)
	}
	if h.fake.Calls() != 0 {
		t.Errorf("B scored a run past its deliveries: %d calls", h.fake.Calls())
	}
	waitFor(t, "record", 5*time.Second, func() bool { return len(h.records()) == 1 })
}

// counting blocks every call until released and counts them: how often the model was asked.
type counting struct {
	provider.Provider
	calls   atomic.Int64
	release chan struct{}
}

func (c *counting) Evaluate(ctx context.Context, req *contract.Request) (*contract.Response, error) {
	c.calls.Add(1)
	select {
	case <-c.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return c.Provider.Evaluate(ctx, req)
}

// TestASecondDeliveryOfARunningMessageWaits is the soak's double scoring (issue 24): JetStream
// handed a message to a second replica while the first was still running it (the consumer's
// leader died before the first delivery was replicated, and the new leader delivered it again
// at once), and both called the model. Here the consumer's ack wait is cut under a call in
// flight, so JetStream redelivers the message while its first delivery still waits for the
// model: the second delivery finds the first one's lease in the gate and waits, and the model
// is asked once.
func TestASecondDeliveryOfARunningMessageWaits(t *testing.T) {
	t.Parallel() // waits out failovers and retries, not the CPU: runs beside the others
	h := newHarness(t)
	h.topo.AckWait = 15 * time.Second // the replica heartbeats every 5 s, its lease lasts 30 s
	model := &counting{Provider: h.ollama(5 * time.Second), release: make(chan struct{})}
	h.start(func(o *replicaOpts) { o.provider = model })
	ctx := context.Background()
	inbox := nats.NewInbox()
	sub, _ := h.nc.SubscribeSync(inbox)
	if _, err := h.cl.Publish(ctx, client.Request{Caller: "svc-a", Body: []byte(ticket), RunID: "lease-1", ReplyTo: inbox}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the model asked", 10*time.Second, func() bool { return model.calls.Load() == 1 })
	// JetStream now thinks the delivery dead after a second: it delivers the message again.
	s, err := h.js.Stream(ctx, h.topo.RequestsStream)
	if err != nil {
		t.Fatal(err)
	}
	for info := range s.ListConsumers(ctx).Info() {
		cfg := info.Config
		cfg.AckWait = time.Second
		if _, err := h.js.UpdateConsumer(ctx, h.topo.RequestsStream, cfg); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the second delivery waiting for the first one's lease", 20*time.Second, func() bool {
		return strings.Contains(h.logs.String(), "another delivery of this message is running the run")
	})
	close(model.release)
	m, err := sub.NextMsg(20 * time.Second)
	if err != nil {
		t.Fatalf("no reply: %v", err)
	}
	if rep, _ := client.ParseReply(m); rep.Status != contract.StatusSuccess || rep.RunID != "lease-1" {
		t.Fatalf("reply %s", rep.Raw)
	}
	waitFor(t, "the request acknowledged", 20*time.Second, func() bool { return h.pending() == 0 })
	if n := model.calls.Load(); n != 1 {
		t.Fatalf("the model was asked %d times for one run", n)
	}
	if recs := h.records(); len(recs) != 1 {
		t.Errorf("%d records", len(recs))
	}
}
