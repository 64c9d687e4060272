package worker_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lestrrat-go/jwx/v3/jwa"
	"github.com/lestrrat-go/jwx/v3/jwk"
	"github.com/lestrrat-go/jwx/v3/jwt"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/contract/wire"
	"github.com/sys1hq/sys1/provider/ollamatest"
	"github.com/sys1hq/sys1/worker/auth"
	"github.com/sys1hq/sys1/worker/client"
)

const (
	hsSecret     = "hs256-secret-that-is-long-enough-0123456789"
	apiKey       = "sk-ollama-api-key-DO-NOT-LEAK-4242"
	natsPassword = "nats-password-DO-NOT-LEAK-9191"
	stateMarker  = "STATE-CONTENT-MARKER-7c1f"
	instrMarker  = "INSTRUCTIONS-MARKER-e2b9"
)

func mint(t *testing.T, sub string, claims map[string]any, exp time.Time) string {
	t.Helper()
	b := jwt.NewBuilder().Subject(sub).Issuer("https://idp.test").Audience([]string{"sys1"}).
		IssuedAt(time.Now()).Expiration(exp)
	for k, v := range claims {
		b = b.Claim(k, v)
	}
	tok, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	signed, err := jwt.Sign(tok, jwt.WithKey(jwa.HS256(), []byte(hsSecret)))
	if err != nil {
		t.Fatal(err)
	}
	return string(signed)
}

// TestSecretsAndContentNeverLeak runs a full set of runs under jwt auth, an Ollama API key and
// a password-protected NATS, then scans every log line, reply and record.
func TestSecretsAndContentNeverLeak(t *testing.T) {
	h := newHarnessWith(t, func(o *server.Options) { o.Username, o.Password = "sys1", natsPassword }, ollamatest.WithAPIKey(apiKey))
	h.apiKey = apiKey
	jwtAuth := h.hsJWTAuth("sys1:use")
	h.start(func(o *replicaOpts) { o.auth = jwtAuth })

	admin := mint(t, "alice", map[string]any{"roles": []string{"administrator"}}, time.Now().Add(time.Hour))
	scoped := mint(t, "bob", map[string]any{"scope": "openid sys1:use"}, time.Now().Add(time.Hour))
	plain := mint(t, "mallory", map[string]any{"roles": []string{"viewer"}}, time.Now().Add(time.Hour))
	expired := mint(t, "alice", map[string]any{"roles": []string{"administrator"}}, time.Now().Add(-time.Hour))

	var probe struct {
		Images []string `json:"images"`
	}
	imageBody := example(t, "image.json")
	_ = json.Unmarshal(imageBody, &probe)
	content := []byte(`{"state":{"note":"` + stateMarker + `"},"questions":{"q":{"type":"noul","instructions":"` + instrMarker + `"}}}`)
	// Invalid (an unknown question type), with content that must not reach the logs either.
	invalid := []byte(`{"state":{"note":"` + stateMarker + `"},"questions":{"q":{"type":"nope","instructions":"` + instrMarker + `"}}}`)
	// A body and headers that claim to be an administrator: identity comes only from the token.
	spoofed := []byte(`{"state":{"caller":"administrator","roles":["administrator"],"sub":"alice"},"questions":{"q":{"type":"noul","instructions":"am I admin?"}}}`)

	type run struct {
		name, token string
		body        []byte
		status      contract.Status
		code        contract.Code
		caller      string
		flaky       bool // the provider fails its first call with a 503: a transient retry
	}
	runs := []run{
		{"admin role", admin, content, contract.StatusSuccess, "", "alice", false},
		{"invalid input", admin, invalid, contract.StatusFailed, contract.CodeInvalidInput, "alice", false},
		{"transient retry", admin, content, contract.StatusSuccess, "", "alice", true},
		{"scope", scoped, imageBody, contract.StatusSuccess, "", "bob", false},
		{"no role or scope", plain, content, contract.StatusFailed, contract.CodeForbidden, "mallory", false},
		{"spoofed body", plain, spoofed, contract.StatusFailed, contract.CodeForbidden, "mallory", false},
		{"expired", expired, content, contract.StatusFailed, contract.CodeUnauthenticated, "", false},
		{"no token", "", content, contract.StatusFailed, contract.CodeUnauthenticated, "", false},
		{"garbage token", "not.a.jwt", content, contract.StatusFailed, contract.CodeUnauthenticated, "", false},
	}
	var replies [][]byte
	var runIDs []string
	var noReply []func()
	for _, r := range runs {
		if r.flaky {
			h.fake.Fail(1, ollamatest.Status(503))
		}
		runIDs = append(runIDs, "sec-"+strings.ReplaceAll(r.name, " ", "-"))
		if r.code == contract.CodeUnauthenticated {
			// Nobody verified sent it: recorded, never answered.
			noReply = append(noReply, h.publishRefused("svc-a", r.body, func(req *client.Request) {
				req.Token = r.token
				req.RunID = "sec-" + strings.ReplaceAll(r.name, " ", "-")
			}))
			replies = append(replies, nil)
			continue
		}
		rep := h.decide("svc-a", r.body, func(req *client.Request) {
			req.Token = r.token
			req.RunID = "sec-" + strings.ReplaceAll(r.name, " ", "-")
		})
		replies = append(replies, rep.Raw)
		if rep.Status != r.status || (r.code != "" && (rep.Error == nil || rep.Error.Code != r.code)) {
			t.Errorf("%s: %s", r.name, rep.Raw)
		}
	}
	// Only the three allowed valid runs reached the provider, the flaky one twice.
	if got := h.fake.Calls(); got != 4 {
		t.Errorf("provider calls = %d, want 4", got)
	}
	waitFor(t, "records", 10*time.Second, func() bool { return len(h.records()) == len(runs) })
	for _, check := range noReply {
		check()
	}
	for _, rec := range h.records() {
		if rec.Status == contract.StatusFailed && (rec.ErrorCode == contract.CodeForbidden || rec.ErrorCode == contract.CodeUnauthenticated) {
			if rec.Request != nil || rec.Result != nil {
				t.Errorf("a refused run's record stores request content: %+v", rec)
			}
			if strings.HasPrefix(rec.RunID, "sec-") {
				t.Errorf("a refused run was recorded under the id it claimed (%s); it could overwrite a real run", rec.RunID)
			}
		}
		if rec.Status == contract.StatusSuccess && rec.CallerKind != contract.CallerKindJWT {
			t.Errorf("caller kind %q", rec.CallerKind)
		}
		if rec.Caller == "administrator" {
			t.Errorf("the spoofed body set the caller")
		}
	}

	secrets := map[string]string{
		"admin JWT": admin, "scoped JWT": scoped, "plain JWT": plain, "expired JWT": expired,
		"HS256 secret": hsSecret, "Ollama API key": apiKey, "NATS password": natsPassword,
		"image base64": probe.Images[0][:48],
	}
	scan := func(where string, data []byte, extra map[string]string) {
		for name, s := range secrets {
			if bytes.Contains(data, []byte(s)) {
				t.Errorf("%s contains the %s", where, name)
			}
		}
		for name, s := range extra {
			if bytes.Contains(data, []byte(s)) {
				t.Errorf("%s contains the %s", where, name)
			}
		}
	}
	// The "run finished" line comes after the reply: wait for every run's.
	waitFor(t, "every run's last log line", 10*time.Second, func() bool {
		return strings.Count(h.logs.String(), `"message":"run finished"`) == len(runs)
	})
	logs := h.logs.String()
	if !strings.Contains(logs, "sec-admin-role") {
		t.Fatalf("expected run logs; got %d bytes", len(logs))
	}
	for _, want := range []string{"ollama call", "transient provider error; redelivering", `"error_code":"SYS1_INVALID_INPUT"`} {
		if !strings.Contains(logs, want) {
			t.Errorf("the logs lack %q (the run_id check below needs these lines):\n%s", want, logs)
		}
	}
	checkRunLogLines(t, logs, runIDs)
	scan("the logs", []byte(logs), map[string]string{"state": stateMarker, "instructions": instrMarker})
	for i, r := range replies {
		scan("reply "+runs[i].name, r, nil)
	}
	for _, r := range h.rawRecords() {
		scan("a record", r, nil)
	}
}

// TestRefusedCallerCannotPlantRepliesInAnotherNamespace: a request that fails authentication
// chooses its own Sys1-Run-Id and Sys1-Reply-To. Its refusal must not be published into another
// caller's durable replies (where it would read as that caller's run failing), only into the
// namespace of the subject it was published on.
func TestRefusedCallerCannotPlantRepliesInAnotherNamespace(t *testing.T) {
	h := newHarness(t)
	jwtAuth := h.hsJWTAuth()
	h.start(func(o *replicaOpts) { o.auth = jwtAuth })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	viewer := mint(t, "mallory", map[string]any{"roles": []string{"viewer"}}, time.Now().Add(time.Hour))
	publish := func(token, runID, replyTo string) {
		if _, err := h.cl.Publish(ctx, client.Request{Caller: "attacker", Body: []byte(`{"state":"x","questions":{"q":{"type":"noul","instructions":"x"}}}`),
			RunID: runID, ReplyTo: replyTo, Token: token}); err != nil {
			t.Fatal(err)
		}
	}
	publish("", "victim-run-1", "sys1.replies.victim.inbox")     // unauthenticated
	publish(viewer, "victim-run-2", "sys1.replies.victim.inbox") // verified but forbidden
	// Verified but forbidden, with the victim's name as its sub: a forbidden caller keeps its
	// identity in the record, but its replies stay in its subject's namespace all the same.
	publish(mint(t, "victim", map[string]any{"roles": []string{"viewer"}}, time.Now().Add(time.Hour)), "victim-run-3", "sys1.replies.victim.inbox")
	publish("", "attacker-run-1", "sys1.replies.attacker.inbox") // its own namespace: answered
	waitFor(t, "four records", 10*time.Second, func() bool { return len(h.records()) == 4 })

	s, err := h.js.Stream(ctx, h.topo.RepliesStream)
	if err != nil {
		t.Fatal(err)
	}
	if m, err := s.GetLastMsgForSubject(ctx, "sys1.replies.victim.inbox"); err == nil {
		t.Errorf("a refused request planted a reply in another caller's namespace: run %s %s", m.Header.Get(wire.HeaderRunID), m.Data)
	}
	// The verified but forbidden caller is answered in its own namespace only; the
	// unauthenticated one, whom nobody verified, is not answered anywhere.
	if m, err := s.GetLastMsgForSubject(ctx, "sys1.replies.attacker.inbox"); err == nil {
		t.Errorf("an unauthenticated request was answered: run %s %s", m.Header.Get(wire.HeaderRunID), m.Data)
	}
	for _, rec := range h.records() {
		if rec.Status != contract.StatusFailed || strings.HasPrefix(rec.RunID, "victim") {
			t.Errorf("record %s: %s %s", rec.RunID, rec.Status, rec.ErrorCode)
		}
	}
}

// TestRefusedRunsRecordsMatchTheSchema: the records of refused runs (no verified caller) are
// valid run records of `sys1 schema record`, like every other record.
func TestRefusedRunsRecordsMatchTheSchema(t *testing.T) {
	h := newHarness(t)
	jwtAuth := h.hsJWTAuth()
	h.start(func(o *replicaOpts) { o.auth = jwtAuth })
	schema, replySchema := compileSchema(t, "record"), compileSchema(t, "reply")
	body := []byte(`{"state":"x","questions":{"q":{"type":"noul","instructions":"x"}}}`)
	admin := mint(t, "alice", map[string]any{"roles": []string{"administrator"}}, time.Now().Add(time.Hour))
	viewer := mint(t, "mallory", map[string]any{"roles": []string{"viewer"}, "scope": "openid sys1:read"}, time.Now().Add(time.Hour))
	for _, tok := range []string{admin, viewer, "", "not.a.jwt"} {
		if tok == "" || tok == "not.a.jwt" {
			// Unverified: recorded (checked below), never answered.
			defer h.publishRefused("svc-a", body, func(r *client.Request) { r.Token = tok })()
			continue
		}
		rep := h.decide("svc-a", body, func(r *client.Request) { r.Token = tok })
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(rep.Raw))
		if err != nil {
			t.Fatal(err)
		}
		if err := replySchema.Validate(doc); err != nil {
			t.Errorf("reply does not match the reply schema: %v\n%s", err, rep.Raw)
		}
	}
	waitFor(t, "four records", 10*time.Second, func() bool { return len(h.rawRecords()) == 4 })
	for _, raw := range h.rawRecords() {
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
		if err != nil {
			t.Fatal(err)
		}
		if err := schema.Validate(doc); err != nil {
			t.Errorf("record does not match the record schema: %v\n%s", err, raw)
		}
	}
	// Who was refused: a verified but forbidden caller is recorded as itself (caller, jwt, its
	// verified roles and scopes) under the derived id; unauthenticated requests stay anonymous.
	var forbidden, unauthenticated int
	for _, rec := range h.records() {
		switch rec.ErrorCode {
		case contract.CodeForbidden:
			forbidden++
			if rec.Caller != "mallory" || rec.CallerKind != contract.CallerKindJWT ||
				!slices.Equal(rec.Roles, []string{"viewer"}) || !slices.Equal(rec.Scopes, []string{"openid", "sys1:read"}) {
				t.Errorf("forbidden run recorded as %q (%s) roles %v scopes %v, want mallory (jwt) [viewer] [openid sys1:read]", rec.Caller, rec.CallerKind, rec.Roles, rec.Scopes)
			}
			if want := fmt.Sprintf("%s~%d~", h.topo.RequestsStream, rec.StreamSeq); !strings.HasPrefix(rec.RunID, want) {
				t.Errorf("forbidden run recorded under %s, want the derived %s", rec.RunID, want)
			}
		case contract.CodeUnauthenticated:
			unauthenticated++
			if rec.Caller != "" || rec.CallerKind != contract.CallerKindAnonymous || len(rec.Roles) != 0 || len(rec.Scopes) != 0 {
				t.Errorf("unauthenticated run recorded as %q (%s) roles %v scopes %v", rec.Caller, rec.CallerKind, rec.Roles, rec.Scopes)
			}
		}
	}
	if forbidden != 1 || unauthenticated != 2 {
		t.Errorf("%d forbidden and %d unauthenticated records, want 1 and 2", forbidden, unauthenticated)
	}
}

// compileSchema compiles one of the published JSON Schemas (draft 2020-12, formats asserted).
func compileSchema(t *testing.T, name string) *jsonschema.Schema {
	t.Helper()
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	for _, n := range contract.SchemaNames() {
		b, err := contract.Schema(n)
		if err != nil {
			t.Fatal(err)
		}
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		if err := c.AddResource(contract.SchemaID(n), doc); err != nil {
			t.Fatal(err)
		}
	}
	s, err := c.Compile(contract.SchemaID(name))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// checkRunLogLines checks the logging standard: every line is JSON, and every line about a run
// (it carries stream_seq, error_code, an Ollama call's http_status or a JWKS kid, or it names
// one of runIDs) carries a run_id.
func checkRunLogLines(t *testing.T, logs string, runIDs []string) {
	t.Helper()
	about := 0
	for line := range strings.Lines(logs) {
		var fields map[string]any
		if err := json.Unmarshal([]byte(line), &fields); err != nil {
			t.Errorf("log line is not JSON: %v: %s", err, line)
			continue
		}
		isAbout := false
		for _, k := range []string{"stream_seq", "error_code", "http_status", "kid", "owner_seq"} {
			if _, ok := fields[k]; ok {
				isAbout = true
			}
		}
		for _, id := range runIDs {
			isAbout = isAbout || strings.Contains(line, id)
		}
		if !isAbout {
			continue
		}
		about++
		if id, _ := fields["run_id"].(string); id == "" {
			t.Errorf("a log line about a run has no run_id: %s", line)
		}
	}
	if about == 0 {
		t.Errorf("no log line about a run among:\n%s", logs)
	}
}

// TestJWKSRefreshLogLinesCarryTheRunID: a token signed with a key the worker has not seen yet
// makes the authenticator re-read the JWKS. That refresh happens for a run, so its log line
// carries the run's run_id like every other line about the run.
func TestJWKSRefreshLogLinesCarryTheRunID(t *testing.T) {
	h := newHarness(t)
	file := filepath.Join(t.TempDir(), "jwks.json")
	first, rotated := ecKey(t, "k-1"), ecKey(t, "k-2")
	writeJWKS(t, file, first)
	a, err := auth.New(t.Context(), auth.Config{
		Mode: auth.ModeJWT, JWKSFile: file, Issuer: "https://idp.test", Audience: "sys1",
		RolesClaim: "roles", AllowedRoles: []string{"administrator"},
		Leeway: time.Second, JWKSRefresh: time.Hour, JWKSMinRefresh: 0,
	}, h.logger())
	if err != nil {
		t.Fatal(err)
	}
	h.start(func(o *replicaOpts) { o.auth = a })

	// The operator publishes the new key; the worker learns of it from the first token.
	writeJWKS(t, file, first, rotated)
	tok := signES256(t, rotated, "alice", []string{"administrator"})
	rep := h.decide("svc-a", []byte(ticket), func(r *client.Request) { r.Token, r.RunID = tok, "rotated-key-run" })
	if rep.Status != contract.StatusSuccess {
		t.Fatalf("reply %s", rep.Raw)
	}
	waitFor(t, "the run's last log line", 10*time.Second, func() bool {
		return strings.Contains(h.logs.String(), `"message":"run finished"`)
	})
	logs := h.logs.String()
	if !strings.Contains(logs, "new signing key picked up") {
		t.Fatalf("no refresh line:\n%s", logs)
	}
	checkRunLogLines(t, logs, []string{"rotated-key-run"})
	if strings.Contains(logs, tok) {
		t.Error("the logs contain the bearer token")
	}
}

func ecKey(t *testing.T, kid string) jwk.Key {
	t.Helper()
	raw, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	k, err := jwk.Import(raw)
	if err != nil {
		t.Fatal(err)
	}
	if err := k.Set(jwk.KeyIDKey, kid); err != nil {
		t.Fatal(err)
	}
	return k
}

func writeJWKS(t *testing.T, path string, keys ...jwk.Key) {
	t.Helper()
	set := jwk.NewSet()
	for _, k := range keys {
		pub, err := k.PublicKey()
		if err != nil {
			t.Fatal(err)
		}
		if err := set.AddKey(pub); err != nil {
			t.Fatal(err)
		}
	}
	b, err := json.Marshal(set)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func signES256(t *testing.T, key jwk.Key, sub string, roles []string) string {
	t.Helper()
	tok, err := jwt.NewBuilder().Subject(sub).Issuer("https://idp.test").Audience([]string{"sys1"}).
		IssuedAt(time.Now()).Expiration(time.Now().Add(time.Hour)).Claim("roles", roles).Build()
	if err != nil {
		t.Fatal(err)
	}
	signed, err := jwt.Sign(tok, jwt.WithKey(jwa.ES256(), key))
	if err != nil {
		t.Fatal(err)
	}
	return string(signed)
}

// hsJWTAuth is jwt auth with the HS256 test secret: role administrator, or any of scopes.
func (h *harness) hsJWTAuth(scopes ...string) auth.Authenticator {
	h.t.Helper()
	a, err := auth.New(context.Background(), auth.Config{
		Mode: auth.ModeJWT, HS256Secret: auth.Secret(hsSecret), Issuer: "https://idp.test", Audience: "sys1",
		RolesClaim: "roles", AllowedRoles: []string{"administrator"}, AllowedScopes: scopes,
		Leeway: time.Second, JWKSRefresh: time.Minute, JWKSMinRefresh: time.Second,
	}, h.logger())
	if err != nil {
		h.t.Fatal(err)
	}
	return a
}

// TestInboxRepliesAreBoundToTheCaller: in mode subject, a producer cannot make the worker
// answer, with a run id of its choosing, into another producer's inbox — only into its own
// _INBOX.<caller>.… — unless SYS1_ALLOW_ANY_INBOX says plain inboxes are fine.
func TestInboxRepliesAreBoundToTheCaller(t *testing.T) {
	for _, anyInbox := range []bool{false, true} {
		t.Run(fmt.Sprintf("allow any inbox %v", anyInbox), func(t *testing.T) {
			h := newHarness(t)
			subjectAuth, err := auth.New(context.Background(), auth.Config{Mode: auth.ModeSubject}, h.logger())
			if err != nil {
				t.Fatal(err)
			}
			h.start(func(o *replicaOpts) { o.auth = subjectAuth; o.cfg.AllowAnyInbox = anyInbox })
			victim, err := h.nc.SubscribeSync("_INBOX.svc-b.>")
			if err != nil {
				t.Fatal(err)
			}
			plain, err := h.nc.SubscribeSync("_INBOX.plain.>")
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			for _, replyTo := range []string{"_INBOX.svc-b.abc", "_INBOX.plain"} {
				if _, err := h.cl.Publish(ctx, client.Request{Caller: "svc-a", Body: []byte(ticket), ReplyTo: replyTo + ".x"}); err != nil {
					t.Fatal(err)
				}
			}
			// Its own inbox is answered either way.
			if rep := h.decide("svc-a", []byte(ticket)); rep.Status != contract.StatusSuccess {
				t.Fatalf("own inbox: %s", rep.Raw)
			}
			waitFor(t, "three records", 10*time.Second, func() bool { return len(h.records()) == 3 })
			m, err := victim.NextMsg(300 * time.Millisecond)
			switch {
			case !anyInbox && err == nil:
				t.Errorf("a reply was planted in another producer's inbox: %s", m.Data)
			case anyInbox && err != nil:
				t.Errorf("SYS1_ALLOW_ANY_INBOX: the plain inbox was not answered: %v", err)
			}
			if _, err := plain.NextMsg(300 * time.Millisecond); (err == nil) != anyInbox {
				t.Errorf("plain inbox answered = %v, want %v", err == nil, anyInbox)
			}
			if !anyInbox {
				var forbidden int
				for _, rec := range h.records() {
					if rec.ErrorCode == contract.CodeForbidden && rec.ReplyTo == "" {
						forbidden++
					}
				}
				if forbidden != 2 {
					t.Errorf("%d refused reply subjects recorded as SYS1_FORBIDDEN without a reply subject, want 2", forbidden)
				}
			}
		})
	}
}
