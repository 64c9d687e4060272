package auth

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caarlos0/env/v11"
	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/worker/natsconn/natstest"
)

func TestNoneModeIsAnonymousAndWarns(t *testing.T) {
	var logs natstest.Buffer
	a := mustNew(t, DefaultConfig(), testLogger(&logs))
	if a.Mode() != ModeNone {
		t.Fatalf("mode %q", a.Mode())
	}
	id, err := a.Authenticate(context.Background(), "sys1.decide.whoever", nats.Header{"X-Caller": {"administrator"}})
	if err != nil {
		t.Fatal(err)
	}
	// The caller is the subject's token, as in mode subject, but recorded as unverified.
	want := Identity{Caller: "whoever", Kind: contract.CallerKindAnonymous, Subject: "sys1.decide.whoever"}
	if fmt.Sprint(id) != fmt.Sprint(want) {
		t.Fatalf("identity %+v, want %+v", id, want)
	}
	for subject, caller := range map[string]string{"sys1.decide.billing-eu.tickets": "billing-eu", "sys1.batch.analytics.b-1": "analytics", "sys1.labels.svc-a": "svc-a"} {
		if id, err := a.Authenticate(context.Background(), subject, nil); err != nil || id.Caller != caller || id.Kind != contract.CallerKindAnonymous {
			t.Errorf("%s: identity %+v, %v; want caller %s, kind anonymous", subject, id, err, caller)
		}
	}
	if _, err := a.Authenticate(context.Background(), "sys1.elsewhere.x", nil); err == nil || err.Code != contract.CodeUnauthenticated {
		t.Errorf("a subject without a caller token: %v, want %s", err, contract.CodeUnauthenticated)
	}
	if !strings.Contains(logs.String(), `"level":"warn"`) || !strings.Contains(logs.String(), "development only") {
		t.Fatalf("mode none must warn at start, logs: %s", logs.String())
	}
}

func TestSubjectMode(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Mode = ModeSubject
	a := mustNew(t, cfg, zerolog.Nop())
	spoof := nats.Header{"X-Caller": {"svc-b"}, "Sys1-Caller": {"administrator"}, "Authorization": {"Bearer x.y.z"}}
	tests := []struct {
		subject, caller string
	}{
		{"sys1.decide.svc-a", "svc-a"},
		{"sys1.decide.svc-a.more", "svc-a"},
		{"sys1.decide.svc-a.more.tokens", "svc-a"},
	}
	for _, tt := range tests {
		id, err := a.Authenticate(context.Background(), tt.subject, spoof)
		if err != nil {
			t.Fatalf("%s: %v", tt.subject, err)
		}
		if id.Caller != tt.caller || id.Kind != contract.CallerKindSubject || id.Subject != tt.subject || id.Roles != nil || id.Scopes != nil {
			t.Fatalf("%s: identity %+v", tt.subject, id)
		}
	}
	for _, bad := range []string{"sys1.decide.", "sys1.decide", "sys1.decide..x", "sys1.other.svc-a", "", "sys1.decide.*", "sys1.decide.>"} {
		_, err := a.Authenticate(context.Background(), bad, nil)
		if err == nil || err.Code != contract.CodeUnauthenticated || err.Status != 401 {
			t.Fatalf("subject %q: want SYS1_UNAUTHENTICATED, got %v", bad, err)
		}
	}
}

// jwtCase is one token presented to a JWKS-configured authenticator.
type jwtCase struct {
	name    string
	header  nats.Header
	code    contract.Code // "" = accepted
	message string        // substring of the error message
	caller  string
}

func runJWTCases(t *testing.T, a Authenticator, logs *natstest.Buffer, cases []jwtCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			id, err := a.Authenticate(context.Background(), "sys1.decide.svc-a", tc.header)
			if tc.code == "" {
				if err != nil {
					t.Fatalf("want accepted, got %v", err)
				}
				if id.Caller != tc.caller || id.Kind != contract.CallerKindJWT || id.Subject != "sys1.decide.svc-a" {
					t.Fatalf("identity %+v", id)
				}
				return
			}
			if err == nil {
				t.Fatalf("want %s, accepted as %+v", tc.code, id)
			}
			if err.Code != tc.code || err.Status != tc.code.Status() {
				t.Fatalf("want %s, got %v (status %d)", tc.code, err, err.Status)
			}
			if !strings.Contains(err.Message, tc.message) {
				t.Fatalf("message %q does not say %q", err.Message, tc.message)
			}
			// A forbidden caller is still verified: its identity comes back with the refusal so
			// the record can say who was refused. An unauthenticated one has no identity at all.
			switch tc.code {
			case contract.CodeForbidden:
				if id.Caller != "svc-a" || id.Kind != contract.CallerKindJWT || id.Subject != "sys1.decide.svc-a" {
					t.Fatalf("forbidden caller's identity %+v, want the verified svc-a", id)
				}
			default:
				if id.Caller != "" || id.Kind != "" || id.Roles != nil || id.Scopes != nil {
					t.Fatalf("unauthenticated request came back with an identity %+v", id)
				}
			}
			// No part of the presented token may appear in the error or the logs.
			for name, v := range tc.header {
				if !strings.EqualFold(name, "Authorization") {
					continue
				}
				for _, h := range v {
					tok := strings.TrimPrefix(h, "Bearer ")
					for _, part := range tokenParts(tok) {
						if len(part) < 8 {
							continue
						}
						if strings.Contains(err.Error(), part) || strings.Contains(fmt.Sprintf("%+v %#v", err, err), part) {
							t.Fatalf("error leaks the token: %v", err)
						}
						if strings.Contains(logs.String(), part) {
							t.Fatalf("logs leak the token")
						}
					}
				}
			}
		})
	}
}

func TestJWTWithJWKS(t *testing.T) {
	rs := rsaSigner(t, 0, "rsa-1")
	ec := ecSigner(t, "ec-1")
	ed := edSigner(t, "ed-1")
	other := rsaSigner(t, 1, "rsa-1") // same kid, different key: a forgery
	srv := newJWKSServer(t, rs.public(t), ec.public(t), ed.public(t))

	cfg := jwtConfig()
	cfg.JWKSURL = srv.URL
	cfg.JWKSMinRefresh = time.Hour // no refetch storm from the unknown-kid cases below
	var logs natstest.Buffer
	a := mustNew(t, cfg, testLogger(&logs))
	if a.Mode() != ModeJWT {
		t.Fatalf("mode %q", a.Mode())
	}

	with := func(edit func(map[string]any)) map[string]any {
		c := claims()
		edit(c)
		return c
	}
	roles := func(r ...any) func(map[string]any) { return func(c map[string]any) { c["roles"] = r } }
	now := time.Now()

	// The RSA public key as an HMAC secret: the classic confusion attack, in the encodings an
	// attacker would try.
	pubDER, _ := x509.MarshalPKIXPublicKey(&rsaKey(t, 0).PublicKey)
	pubPEM := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER})
	pubJWK, _ := json.Marshal(rs.public(t))

	runJWTCases(t, a, &logs, []jwtCase{
		{name: "RS256 with role", header: bearer(rs.sign(t, with(roles("administrator")))), caller: "svc-a"},
		{name: "ES256 with role", header: bearer(ec.sign(t, with(roles("reader", "administrator")))), caller: "svc-a"},
		{name: "EdDSA with role", header: bearer(ed.sign(t, with(roles("administrator")))), caller: "svc-a"},
		{name: "role as a string", header: bearer(rs.sign(t, with(func(c map[string]any) { c["roles"] = "administrator" }))), caller: "svc-a"},
		{name: "scope string", header: bearer(rs.sign(t, with(func(c map[string]any) { c["scope"] = "openid sys1:use profile" }))), caller: "svc-a"},
		{name: "scp array", header: bearer(rs.sign(t, with(func(c map[string]any) { c["scp"] = []string{"other", "sys1:use"} }))), caller: "svc-a"},
		{name: "scp string", header: bearer(rs.sign(t, with(func(c map[string]any) { c["scp"] = "sys1:use" }))), caller: "svc-a"},
		{name: "audience array containing ours", header: bearer(rs.sign(t, with(func(c map[string]any) {
			c["aud"] = []string{"other", testAudience}
			c["roles"] = []string{"administrator"}
		}))), caller: "svc-a"},
		{name: "nbf within leeway", header: bearer(rs.sign(t, with(func(c map[string]any) {
			c["nbf"] = now.Add(10 * time.Second).Unix()
			c["roles"] = []string{"administrator"}
		}))), caller: "svc-a"},
		{name: "exp within leeway", header: bearer(rs.sign(t, with(func(c map[string]any) {
			c["exp"] = now.Add(-10 * time.Second).Unix()
			c["roles"] = []string{"administrator"}
		}))), caller: "svc-a"},
		{name: "lowercase bearer scheme and header name", header: nats.Header{"authorization": {"bearer " + rs.sign(t, with(roles("administrator")))}}, caller: "svc-a"},

		{name: "missing header", header: nil, code: contract.CodeUnauthenticated, message: "missing Authorization"},
		{name: "basic scheme", header: nats.Header{"Authorization": {"Basic dXNlcjpwYXNz"}}, code: contract.CodeUnauthenticated, message: "Bearer"},
		{name: "two authorization headers", header: nats.Header{"Authorization": {"Bearer a.b.c", "Bearer d.e.f"}}, code: contract.CodeUnauthenticated, message: "more than one"},
		{name: "not a JWT", header: bearer("not-a-jwt-at-all"), code: contract.CodeUnauthenticated, message: "compact JWS"},
		{name: "garbage segments", header: bearer("bm90.anNvbg.c2ln"), code: contract.CodeUnauthenticated, message: "malformed token"},
		{name: "expired", header: bearer(rs.sign(t, with(func(c map[string]any) { c["exp"] = now.Add(-time.Hour).Unix(); c["roles"] = []string{"administrator"} }))), code: contract.CodeUnauthenticated, message: "token expired"},
		{name: "not yet valid", header: bearer(rs.sign(t, with(func(c map[string]any) {
			c["nbf"] = now.Add(10 * time.Minute).Unix()
			c["roles"] = []string{"administrator"}
		}))), code: contract.CodeUnauthenticated, message: "not yet valid"},
		{name: "no exp", header: bearer(rs.sign(t, with(func(c map[string]any) { delete(c, "exp"); c["roles"] = []string{"administrator"} }))), code: contract.CodeUnauthenticated, message: "no exp"},
		{name: "wrong audience", header: bearer(rs.sign(t, with(func(c map[string]any) { c["aud"] = "another-service"; c["roles"] = []string{"administrator"} }))), code: contract.CodeUnauthenticated, message: "audience mismatch"},
		{name: "wrong issuer", header: bearer(rs.sign(t, with(func(c map[string]any) { c["iss"] = "https://evil.example.com/"; c["roles"] = []string{"administrator"} }))), code: contract.CodeUnauthenticated, message: "issuer mismatch"},
		{name: "bad signature (other key, same kid)", header: bearer(other.sign(t, with(roles("administrator")))), code: contract.CodeUnauthenticated, message: "signature verification failed"},
		{name: "tampered payload", header: bearer(tamper(t, rs.sign(t, with(roles("reader"))))), code: contract.CodeUnauthenticated, message: "signature verification failed"},
		{name: "alg none", header: bearer(unsignedToken(t, "rsa-1", with(roles("administrator")))), code: contract.CodeUnauthenticated, message: "alg none"},
		{name: "HS256 with the RSA public key (PEM) as secret", header: bearer(signHS256(t, pubPEM, "rsa-1", with(roles("administrator")))), code: contract.CodeUnauthenticated, message: "HS256 is not accepted"},
		{name: "HS256 with the RSA public key (DER) as secret", header: bearer(signHS256(t, pubDER, "rsa-1", with(roles("administrator")))), code: contract.CodeUnauthenticated, message: "HS256 is not accepted"},
		{name: "HS256 with the RSA JWK as secret", header: bearer(signHS256(t, pubJWK, "rsa-1", with(roles("administrator")))), code: contract.CodeUnauthenticated, message: "HS256 is not accepted"},
		{name: "ES256 header on the RSA key", header: bearer(signer{priv: ecSigner(t, "rsa-1").priv, alg: ec.alg}.sign(t, with(roles("administrator")))), code: contract.CodeUnauthenticated, message: "ES256 is not accepted"},
		{name: "unknown kid", header: bearer(rsaSigner(t, 2, "rsa-unknown").sign(t, with(roles("administrator")))), code: contract.CodeUnauthenticated, message: "not in the JWKS"},
		{name: "no kid with several keys", header: bearer(signNoKid(t, rs, with(roles("administrator")))), code: contract.CodeUnauthenticated, message: "no kid"},
		{name: "missing sub", header: bearer(rs.sign(t, with(func(c map[string]any) { delete(c, "sub"); c["roles"] = []string{"administrator"} }))), code: contract.CodeUnauthenticated, message: "no sub"},
		{name: "control characters in sub", header: bearer(rs.sign(t, with(func(c map[string]any) { c["sub"] = "svc-a\nadmin"; c["roles"] = []string{"administrator"} }))), code: contract.CodeUnauthenticated, message: "not a usable caller id"},

		{name: "no role nor scope", header: bearer(rs.sign(t, claims())), code: contract.CodeForbidden, message: `caller "svc-a" has none of the allowed roles`},
		{name: "other role and scope", header: bearer(rs.sign(t, with(func(c map[string]any) { c["roles"] = []string{"reader"}; c["scope"] = "sys1:read" }))), code: contract.CodeForbidden, message: "none of the allowed roles"},
		{name: "scope as substring does not count", header: bearer(rs.sign(t, with(func(c map[string]any) { c["scope"] = "sys1:user" }))), code: contract.CodeForbidden, message: "none of the allowed"},
		{name: "role in the scope claim does not count", header: bearer(rs.sign(t, with(func(c map[string]any) { c["scope"] = "administrator" }))), code: contract.CodeForbidden, message: "none of the allowed"},
		{name: "spoofed headers grant nothing", header: spoofHeaders(rs.sign(t, claims())), code: contract.CodeForbidden, message: "none of the allowed"},
	})

	// The verified identity carries the verified roles and scopes, and only those.
	id, err := a.Authenticate(context.Background(), "sys1.decide.svc-a.x", spoofHeaders(rs.sign(t, with(func(c map[string]any) {
		c["sub"] = "svc-z"
		c["roles"] = []string{"administrator", "reader", "administrator"}
		c["scope"] = "openid sys1:use"
		c["scp"] = []string{"sys1:use", "extra"}
	}))))
	if err != nil {
		t.Fatal(err)
	}
	if id.Caller != "svc-z" || !slices.Equal(id.Roles, []string{"administrator", "reader"}) || !slices.Equal(id.Scopes, []string{"openid", "sys1:use", "extra"}) {
		t.Fatalf("identity %+v", id)
	}

	// A forbidden caller comes back with its verified roles and scopes (for the record), and
	// only those: spoofed headers add nothing.
	id, err = a.Authenticate(context.Background(), "sys1.decide.svc-a.x", spoofHeaders(rs.sign(t, with(func(c map[string]any) {
		c["sub"] = "svc-y"
		c["roles"] = []string{"reader"}
		c["scp"] = []string{"sys1:read", "openid"}
	}))))
	if err == nil || err.Code != contract.CodeForbidden {
		t.Fatalf("want %s, got %v", contract.CodeForbidden, err)
	}
	if id.Caller != "svc-y" || id.Kind != contract.CallerKindJWT || id.Subject != "sys1.decide.svc-a.x" ||
		!slices.Equal(id.Roles, []string{"reader"}) || !slices.Equal(id.Scopes, []string{"sys1:read", "openid"}) {
		t.Fatalf("forbidden identity %+v", id)
	}
}

// spoofHeaders adds every identity-looking header an attacker might try next to the token.
func spoofHeaders(tok string) nats.Header {
	h := bearer(tok)
	h.Set("X-Caller", "administrator")
	h.Set("Sys1-Caller", "svc-b")
	h.Set("X-Roles", "administrator")
	h.Set("Sys1-Roles", "administrator")
	h.Set("X-Scopes", "sys1:use")
	return h
}

// tamper swaps the payload for one granting administrator, keeping the original signature.
func tamper(t *testing.T, tok string) string {
	t.Helper()
	parts := strings.Split(tok, ".")
	c := claims()
	c["roles"] = []string{"administrator"}
	b, _ := json.Marshal(c)
	parts[1] = base64.RawURLEncoding.EncodeToString(b)
	return strings.Join(parts, ".")
}

func signNoKid(t *testing.T, s signer, c map[string]any) string {
	t.Helper()
	k, err := s.priv.Clone()
	if err != nil {
		t.Fatal(err)
	}
	_ = k.Remove("kid")
	return signer{priv: k, alg: s.alg}.sign(t, c)
}

func TestJWTNamespacedRolesClaim(t *testing.T) {
	rs := rsaSigner(t, 0, "rsa-1")
	srv := newJWKSServer(t, rs.public(t))
	cfg := jwtConfig()
	cfg.JWKSURL = srv.URL
	cfg.RolesClaim = "https://sys1.example.com/roles"
	cfg.AllowedRoles = []string{"administrator", "sys1-user"}
	var logs natstest.Buffer
	a := mustNew(t, cfg, testLogger(&logs))

	ns := claims()
	ns["https://sys1.example.com/roles"] = []string{"sys1-user"}
	plain := claims()
	plain["roles"] = []string{"administrator"} // the un-namespaced claim is not the configured one

	runJWTCases(t, a, &logs, []jwtCase{
		{name: "namespaced claim", header: bearer(rs.sign(t, ns)), caller: "svc-a"},
		{name: "plain roles claim ignored", header: bearer(rs.sign(t, plain)), code: contract.CodeForbidden, message: `claim "https://sys1.example.com/roles"`},
	})
	id, _ := a.Authenticate(context.Background(), "sys1.decide.svc-a", bearer(rs.sign(t, ns)))
	if !slices.Equal(id.Roles, []string{"sys1-user"}) {
		t.Fatalf("roles %v", id.Roles)
	}
}

func TestJWKSRotationPickedUpWithoutRestart(t *testing.T) {
	old := rsaSigner(t, 0, "2026-01")
	rotated := ecSigner(t, "2026-02")
	srv := newJWKSServer(t, old.public(t))
	cfg := jwtConfig()
	cfg.JWKSURL = srv.URL
	cfg.JWKSMinRefresh = 0
	cfg.JWKSRefresh = time.Hour // only the unknown kid may cause the refetch
	var logs natstest.Buffer
	a := mustNew(t, cfg, testLogger(&logs))

	c := claims()
	c["roles"] = []string{"administrator"}
	if _, err := a.Authenticate(context.Background(), "sys1.decide.svc-a", bearer(old.sign(t, c))); err != nil {
		t.Fatal(err)
	}
	// The IdP rotates: the new key is published and the old one retired.
	srv.serve(t, rotated.public(t))
	before := srv.hits.Load()
	if _, err := a.Authenticate(context.Background(), "sys1.decide.svc-a", bearer(rotated.sign(t, c))); err != nil {
		t.Fatalf("rotated key not picked up: %v", err)
	}
	if got := srv.hits.Load() - before; got != 1 {
		t.Fatalf("want exactly one refetch for the new kid, got %d", got)
	}
	// Now-known kid: no further fetch. The retired key's kid is unknown and stays refused.
	if _, err := a.Authenticate(context.Background(), "sys1.decide.svc-a", bearer(rotated.sign(t, c))); err != nil {
		t.Fatal(err)
	}
	if srv.hits.Load()-before != 1 {
		t.Fatalf("a known kid must not refetch")
	}
	if _, err := a.Authenticate(context.Background(), "sys1.decide.svc-a", bearer(old.sign(t, c))); err == nil || err.Code != contract.CodeUnauthenticated {
		t.Fatalf("retired key still accepted: %v", err)
	}
	if !strings.Contains(logs.String(), "new signing key picked up") {
		t.Fatalf("rotation not logged: %s", logs.String())
	}
}

func TestJWKSUnknownKidRefreshIsRateLimited(t *testing.T) {
	known := rsaSigner(t, 0, "k1")
	srv := newJWKSServer(t, known.public(t))
	cfg := jwtConfig()
	cfg.JWKSURL = srv.URL
	cfg.JWKSMinRefresh = time.Hour
	a := mustNew(t, cfg, zerolog.Nop())
	if srv.hits.Load() != 1 {
		t.Fatalf("want the initial fetch only, got %d", srv.hits.Load())
	}
	c := claims()
	c["roles"] = []string{"administrator"}
	for i := range 20 {
		forged := rsaSigner(t, 1, fmt.Sprintf("forged-%d", i)).sign(t, c)
		if _, err := a.Authenticate(context.Background(), "sys1.decide.svc-a", bearer(forged)); err == nil || err.Code != contract.CodeUnauthenticated {
			t.Fatalf("forged kid accepted: %v", err)
		}
	}
	if got := srv.hits.Load(); got != 1 {
		t.Fatalf("unknown kids within SYS1_JWKS_MIN_REFRESH must not refetch; fetches %d", got)
	}
}

func TestJWKSFile(t *testing.T) {
	ec := ecSigner(t, "ec-file")
	ed := edSigner(t, "ed-file")
	dir := t.TempDir()
	path := filepath.Join(dir, "jwks.json")
	if err := os.WriteFile(path, jwksJSON(t, ec.public(t)), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := jwtConfig()
	cfg.JWKSFile = path
	var logs natstest.Buffer
	a := mustNew(t, cfg, testLogger(&logs))
	c := claims()
	c["scp"] = []string{"sys1:use"}
	if _, err := a.Authenticate(context.Background(), "sys1.decide.svc-a", bearer(ec.sign(t, c))); err != nil {
		t.Fatal(err)
	}
	// A key added to the file (rotation by the operator) is read on its first use.
	if err := os.WriteFile(path, jwksJSON(t, ec.public(t), ed.public(t)), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Authenticate(context.Background(), "sys1.decide.svc-a", bearer(ed.sign(t, c))); err != nil {
		t.Fatalf("key added to the JWKS file not picked up: %v", err)
	}
}

func TestJWKSRejectsSymmetricAndEncryptionKeys(t *testing.T) {
	rs := rsaSigner(t, 0, "sig")
	secret := []byte("0123456789abcdef0123456789abcdef")
	oct := mustImport(t, secret, "oct")
	enc := mustImport(t, &rsaKey(t, 1).PublicKey, "enc")
	_ = enc.Set("use", "enc")
	srv := newJWKSServer(t, rs.public(t), oct, enc)
	cfg := jwtConfig()
	cfg.JWKSURL = srv.URL
	cfg.JWKSMinRefresh = time.Hour
	var logs natstest.Buffer
	a := mustNew(t, cfg, testLogger(&logs))
	c := claims()
	c["roles"] = []string{"administrator"}
	// A symmetric key published in the JWKS must not let anyone who read the JWKS mint tokens.
	if _, err := a.Authenticate(context.Background(), "sys1.decide.svc-a", bearer(signHS256(t, secret, "oct", c))); err == nil {
		t.Fatal("HS256 token verified with a JWKS oct key")
	}
	encSigned := signer{priv: mustImport(t, rsaKey(t, 1), "enc"), alg: rs.alg}.sign(t, c)
	if _, err := a.Authenticate(context.Background(), "sys1.decide.svc-a", bearer(encSigned)); err == nil {
		t.Fatal("token verified with a use=enc key")
	}
	if _, err := a.Authenticate(context.Background(), "sys1.decide.svc-a", bearer(rs.sign(t, c))); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), "symmetric (oct) keys are not accepted") || !strings.Contains(logs.String(), "use is enc") {
		t.Fatalf("ignored keys not logged: %s", logs.String())
	}
}

func TestHS256Secret(t *testing.T) {
	secret := "a-long-enough-shared-secret-for-hs256!!"
	rs := rsaSigner(t, 0, "rsa-1")
	cfg := jwtConfig()
	cfg.HS256Secret = Secret(secret)
	var logs natstest.Buffer
	a := mustNew(t, cfg, testLogger(&logs))
	c := claims()
	c["roles"] = []string{"administrator"}
	expired := claims()
	expired["exp"] = time.Now().Add(-time.Hour).Unix()
	valid := signHS256(t, []byte(secret), "", c)
	respell := func(tok string, at int, insert string) string { return tok[:at] + insert + tok[at:] }
	runJWTCases(t, a, &logs, []jwtCase{
		{name: "valid", header: bearer(valid), caller: "svc-a"},
		{name: "wrong secret", header: bearer(signHS256(t, []byte(secret+"x"), "", c)), code: contract.CodeUnauthenticated, message: "signature verification failed"},
		{name: "expired", header: bearer(signHS256(t, []byte(secret), "", expired)), code: contract.CodeUnauthenticated, message: "token expired"},
		{name: "RS256 token", header: bearer(rs.sign(t, c)), code: contract.CodeUnauthenticated, message: "RS256 is not accepted"},
		{name: "alg none", header: bearer(unsignedToken(t, "", c)), code: contract.CodeUnauthenticated, message: "alg none"},
		{name: "forbidden", header: bearer(signHS256(t, []byte(secret), "", claims())), code: contract.CodeForbidden, message: "none of the allowed"},
		// The same signed bytes, spelled in ways Go's base64 decoders would let through: a CR or
		// LF inside a segment (skipped by the decoder), the standard alphabet, padding.
		{name: "CR inside the signature", header: bearer(respell(valid, len(valid)-5, "\r")), code: contract.CodeUnauthenticated, message: "outside base64url"},
		{name: "LF inside the payload", header: bearer(respell(valid, strings.Index(valid, ".")+3, "\n")), code: contract.CodeUnauthenticated, message: "outside base64url"},
		{name: "padding", header: bearer(valid + "="), code: contract.CodeUnauthenticated, message: "outside base64url"},
		{name: "standard alphabet", header: bearer(strings.NewReplacer("-", "+", "_", "/").Replace(valid) + "+/"), code: contract.CodeUnauthenticated, message: "outside base64url"},
	})
	if strings.Contains(logs.String(), secret) {
		t.Fatal("logs leak the HS256 secret")
	}
}

func TestJWKSUnreachableAtStartIsAnError(t *testing.T) {
	srv := newJWKSServer(t, rsaSigner(t, 0, "k").public(t))
	srv.Close()
	cfg := jwtConfig()
	cfg.JWKSURL = srv.URL + "/jwks?api_key=hunter2"
	_, err := New(context.Background(), cfg, zerolog.Nop())
	if err == nil || !strings.Contains(err.Error(), "SYS1_JWT_JWKS_URL") {
		t.Fatalf("want a start-up error naming SYS1_JWT_JWKS_URL, got %v", err)
	}
	if strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("error leaks the URL's query: %v", err)
	}
}

// A JWKS URL that serves something huge, or redirects elsewhere, fails the load (at start-up:
// a clear error) instead of exhausting memory or trusting another source.
func TestJWKSDownloadIsBoundedAndNotRedirected(t *testing.T) {
	huge := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"keys":[],"pad":"`))
		chunk := bytes.Repeat([]byte("a"), 64<<10)
		for range 2 * maxJWKSBytes / len(chunk) {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
		_, _ = w.Write([]byte(`"}`))
	}))
	defer huge.Close()
	cfg := jwtConfig()
	cfg.JWKSURL = huge.URL + "/jwks"
	if _, err := New(context.Background(), cfg, zerolog.Nop()); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Fatalf("a 2 MiB JWKS: want an error saying it is too large, got %v", err)
	}

	good := newJWKSServer(t, rsaSigner(t, 0, "k").public(t))
	redirect := httptest.NewServer(http.RedirectHandler(good.URL, http.StatusFound))
	defer redirect.Close()
	cfg.JWKSURL = redirect.URL + "/jwks"
	if _, err := New(context.Background(), cfg, zerolog.Nop()); err == nil {
		t.Fatal("a JWKS URL that redirects was followed")
	}
	if good.hits.Load() != 0 {
		t.Fatalf("the redirect target was fetched %d times", good.hits.Load())
	}
	cfg.JWKSURL = good.URL + "/jwks"
	if _, err := New(context.Background(), cfg, zerolog.Nop()); err != nil {
		t.Fatalf("a small JWKS served directly: %v", err)
	}
}

func TestConfigFromEnvAndValidate(t *testing.T) {
	t.Setenv("SYS1_AUTH_MODE", "jwt")
	t.Setenv("SYS1_JWT_HS256_SECRET", "s3cret-s3cret-s3cret-s3cret-s3cret")
	t.Setenv("SYS1_JWT_ISSUER", testIssuer)
	t.Setenv("SYS1_JWT_AUDIENCE", testAudience)
	t.Setenv("SYS1_JWT_ROLES_CLAIM", "https://example.com/roles")
	t.Setenv("SYS1_ALLOWED_ROLES", "administrator, operator")
	var cfg Config
	if err := env.Parse(&cfg); err != nil {
		t.Fatal(err)
	}
	if errs := cfg.Validate(); len(errs) > 0 {
		t.Fatalf("valid config rejected: %v", errs)
	}
	if cfg.RolesClaim != "https://example.com/roles" || cfg.Leeway != 30*time.Second || cfg.JWKSRefresh != 5*time.Minute ||
		!slices.Equal(cleanList(cfg.AllowedRoles), []string{"administrator", "operator"}) || !slices.Equal(cfg.AllowedScopes, []string{"sys1:use"}) {
		t.Fatalf("parsed %+v", cfg)
	}
	// The secret never prints, whatever the format.
	for _, s := range []string{fmt.Sprint(cfg), fmt.Sprintf("%+v", cfg), fmt.Sprintf("%#v", cfg), mustJSON(t, cfg)} {
		if strings.Contains(s, "s3cret") {
			t.Fatalf("config rendering leaks the secret: %s", s)
		}
	}

	file := filepath.Join(t.TempDir(), "jwks.json")
	if err := os.WriteFile(file, []byte(`{"keys":[]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	base := jwtConfig
	tests := []struct {
		name string
		edit func(*Config)
		want []string // variables named, in order
	}{
		{"none is valid", func(c *Config) { *c = DefaultConfig() }, nil},
		{"subject is valid", func(c *Config) { *c = DefaultConfig(); c.Mode = ModeSubject }, nil},
		{"unknown mode", func(c *Config) { c.Mode = "oauth" }, []string{"SYS1_AUTH_MODE"}},
		{"jwt without key source", func(c *Config) {}, []string{"SYS1_JWT_JWKS_URL"}},
		{"jwt with two key sources", func(c *Config) { c.JWKSFile = file; c.HS256Secret = Secret(strings.Repeat("x", 40)) }, []string{"SYS1_JWT_JWKS_FILE"}},
		{"bad URL", func(c *Config) { c.JWKSURL = "://nope" }, []string{"SYS1_JWT_JWKS_URL"}},
		{"plain http off loopback", func(c *Config) { c.JWKSURL = "http://idp.example.com/jwks" }, []string{"SYS1_JWT_JWKS_URL"}},
		{"https URL ok", func(c *Config) { c.JWKSURL = "https://idp.example.com/.well-known/jwks.json" }, nil},
		{"missing file", func(c *Config) { c.JWKSFile = filepath.Join(t.TempDir(), "absent.json") }, []string{"SYS1_JWT_JWKS_FILE"}},
		{"short secret", func(c *Config) { c.HS256Secret = "short" }, []string{"SYS1_JWT_HS256_SECRET"}},
		{"issuer and audience required", func(c *Config) { c.JWKSFile = file; c.Issuer = ""; c.Audience = " " }, []string{"SYS1_JWT_ISSUER", "SYS1_JWT_AUDIENCE"}},
		{"nobody allowed", func(c *Config) { c.JWKSFile = file; c.AllowedRoles = []string{""}; c.AllowedScopes = nil }, []string{"SYS1_ALLOWED_ROLES"}},
		{"bad durations", func(c *Config) { c.JWKSFile = file; c.Leeway = time.Hour; c.JWKSRefresh = 0; c.JWKSMinRefresh = -1 }, []string{"SYS1_JWT_LEEWAY", "SYS1_JWKS_REFRESH", "SYS1_JWKS_MIN_REFRESH"}},
		{"empty roles claim", func(c *Config) { c.JWKSFile = file; c.RolesClaim = "" }, []string{"SYS1_JWT_ROLES_CLAIM"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := base()
			tt.edit(&c)
			errs := c.Validate()
			if len(errs) != len(tt.want) {
				t.Fatalf("want %d errors naming %v, got %v", len(tt.want), tt.want, errs)
			}
			for i, e := range errs {
				if !strings.HasPrefix(e.Error(), tt.want[i]+":") {
					t.Fatalf("error %q does not start with %s", e, tt.want[i])
				}
				if strings.Contains(e.Error(), strings.Repeat("x", 40)) {
					t.Fatalf("error leaks the secret: %v", e)
				}
			}
		})
	}
	if _, err := New(context.Background(), Config{Mode: "bogus"}, zerolog.Nop()); err == nil || !strings.Contains(err.Error(), "SYS1_AUTH_MODE") {
		t.Fatalf("New must validate: %v", err)
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestCheckReplyTo(t *testing.T) {
	subj := Identity{Caller: "svc-a", Kind: contract.CallerKindSubject, Subject: "sys1.decide.svc-a"}
	jwtID := Identity{Caller: "user@example.com", Kind: contract.CallerKindJWT, Subject: "sys1.decide.svc-a.batch"}
	anon := Identity{Caller: "dev", Kind: contract.CallerKindAnonymous, Subject: "sys1.decide.dev"}
	tests := []struct {
		id      Identity
		replyTo string
		code    contract.Code
	}{
		{subj, "", ""},
		{subj, "_INBOX.svc-a.abc", ""},
		// Inboxes are bound to the caller too: another producer's predictable inbox is refused.
		{subj, "_INBOX.abc", contract.CodeForbidden},
		{subj, "_INBOX.svc-b.abc", contract.CodeForbidden},
		{subj, "_INBOX.svc-a", contract.CodeForbidden},
		{jwtID, "_INBOX.svc-a.x", ""},
		{jwtID, "_INBOX.user@example.com.x", contract.CodeForbidden},
		{Identity{Caller: "svc-a", Kind: contract.CallerKindSubject, Subject: "sys1.batch.svc-a.b1"}, "_INBOX.svc-a.x", ""},
		// Control bytes, invalid UTF-8 and other non-printables are refused, not delivered.
		{anon, "_INBOX.a\x00b", contract.CodeInvalidInput},
		{anon, "_INBOX.a\x7fb", contract.CodeInvalidInput},
		{anon, "_INBOX.a\xffb", contract.CodeInvalidInput},
		{anon, "_INBOX.a\u0085b", contract.CodeInvalidInput},
		{anon, "_INBOX.a\u00a0b", contract.CodeInvalidInput},
		{subj, "sys1.replies.svc-a.\x1b[31m", contract.CodeInvalidInput},
		{subj, "sys1.replies.svc-a", ""},
		{subj, "sys1.replies.svc-a.run-1", ""},
		{subj, "sys1.replies.svc-b.run-1", contract.CodeForbidden},
		{subj, "sys1.replies.svc-ab.run-1", contract.CodeForbidden},
		{jwtID, "sys1.replies.svc-a.run-1", ""},
		{jwtID, "sys1.replies.anything.run-1", contract.CodeForbidden},
		{Identity{Caller: "u", Kind: contract.CallerKindJWT, Subject: "sys1.decide"}, "sys1.replies.u.run-1", contract.CodeInvalidInput},
		// Mode none keeps no namespaces: its callers are unverified, so they would protect
		// nobody. Only the prefixes and the form are checked.
		{anon, "_INBOX.dev.x", ""},
		{anon, "sys1.replies.dev.run-1", ""},
		{anon, "_INBOX.x", ""},
		{anon, "sys1.replies.anyone.run-1", ""},
		// Unverified requests (authentication failed) stay in their subject's namespace.
		{Identity{Subject: "sys1.decide.svc-a"}, "sys1.replies.svc-a.run-1", ""},
		{Identity{Subject: "sys1.decide.svc-a"}, "sys1.replies.victim.run-1", contract.CodeForbidden},
		{Identity{Subject: "sys1.decide.svc-a"}, "_INBOX.svc-a.x", ""},
		{Identity{Subject: "sys1.decide.svc-a"}, "_INBOX.victim.x", contract.CodeForbidden},
		{Identity{}, "sys1.replies.victim.run-1", contract.CodeInvalidInput},
		// A verified but forbidden jwt caller keeps its identity and the jwt rule: its subject's
		// namespace, not one named after its sub.
		{Identity{Caller: "victim", Kind: contract.CallerKindJWT, Roles: []string{"viewer"}, Subject: "sys1.decide.svc-a"}, "sys1.replies.svc-a.run-1", ""},
		{Identity{Caller: "victim", Kind: contract.CallerKindJWT, Roles: []string{"viewer"}, Subject: "sys1.decide.svc-a"}, "sys1.replies.victim.run-1", contract.CodeForbidden},
		{subj, "sys1.runs.success", contract.CodeInvalidInput},
		{jwtID, "sys1.decide.svc-b", contract.CodeInvalidInput},
		{anon, "$JS.API.STREAM.DELETE.SYS1_RUNS", contract.CodeInvalidInput},
		{anon, "$KV.sys1-runs.run-1", contract.CodeInvalidInput},
		{subj, "_INBOX.>", contract.CodeInvalidInput},
		{subj, "_INBOX.a b", contract.CodeInvalidInput},
		{subj, "sys1.replies.svc-a.", contract.CodeInvalidInput},
		{subj, "_INBOX..x", contract.CodeInvalidInput},
	}
	for _, tt := range tests {
		err := CheckReplyTo(tt.id, tt.replyTo, ReplyPolicy{})
		switch {
		case tt.code == "" && err != nil:
			t.Errorf("%s as %s: want accepted, got %v", tt.replyTo, tt.id.Kind, err)
		case tt.code != "" && (err == nil || err.Code != tt.code):
			t.Errorf("%s as %s: want %s, got %v", tt.replyTo, tt.id.Kind, tt.code, err)
		case err != nil && !strings.Contains(err.Message, "Sys1-Reply-To"):
			t.Errorf("error must name the header: %v", err)
		}
	}
}

func TestJWKSPeriodicRefreshSurvivesOutages(t *testing.T) {
	old := rsaSigner(t, 0, "old")
	next := edSigner(t, "next")
	srv := newJWKSServer(t, old.public(t))
	cfg := jwtConfig()
	cfg.JWKSURL = srv.URL
	cfg.JWKSRefresh = time.Second
	cfg.JWKSMinRefresh = time.Hour // only the periodic refresh may fetch
	var logs natstest.Buffer
	a := mustNew(t, cfg, testLogger(&logs))
	c := claims()
	c["roles"] = []string{"administrator"}

	// The IdP is down: a refresh fails, the keys already loaded keep working.
	srv.fail.Store(true)
	waitUntil(t, "a failed periodic refresh", func() bool { return strings.Contains(logs.String(), "keeping the previous keys") })
	if _, err := a.Authenticate(context.Background(), "sys1.decide.svc-a", bearer(old.sign(t, c))); err != nil {
		t.Fatalf("an IdP outage must not lock callers out: %v", err)
	}

	// The IdP is back with a rotated key: the periodic refresh picks it up.
	srv.serve(t, next.public(t))
	srv.fail.Store(false)
	tok := next.sign(t, c)
	waitUntil(t, "the rotated key via periodic refresh", func() bool {
		_, err := a.Authenticate(context.Background(), "sys1.decide.svc-a", bearer(tok))
		return err == nil
	})
}

// waitUntil polls cond until it holds or 10 s pass (natstest.WaitFor).
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	natstest.WaitFor(t, 10*time.Second, what, cond)
}

func TestCheckReplyToAnyInboxPolicy(t *testing.T) {
	subj := Identity{Caller: "svc-a", Kind: contract.CallerKindSubject, Subject: "sys1.decide.svc-a"}
	open := ReplyPolicy{AnyInbox: true}
	if err := CheckReplyTo(subj, "_INBOX.abc", open); err != nil {
		t.Fatalf("SYS1_ALLOW_ANY_INBOX: a plain inbox must be accepted: %v", err)
	}
	// Durable replies stay bound, and malformed subjects stay refused.
	if err := CheckReplyTo(subj, "sys1.replies.svc-b.x", open); err == nil || err.Code != contract.CodeForbidden {
		t.Fatalf("durable replies of another caller: %v", err)
	}
	if err := CheckReplyTo(subj, "_INBOX.a\x00b", open); err == nil || err.Code != contract.CodeInvalidInput {
		t.Fatalf("control bytes: %v", err)
	}
}

func TestCallerFromEveryProducerSubject(t *testing.T) {
	for subject, want := range map[string]string{
		"sys1.decide.svc-a": "svc-a", "sys1.decide.svc-a.more": "svc-a",
		"sys1.batch.svc-a.b1": "svc-a", "sys1.labels.svc-a": "svc-a",
	} {
		if got, err := CallerFromSubject(subject); err != nil || got != want {
			t.Errorf("%s: %q %v", subject, got, err)
		}
	}
	for _, subject := range []string{"sys1.runs.success", "sys1.decide.", "sys1.batch.*.x", "other.svc-a"} {
		if got, err := CallerFromSubject(subject); err == nil {
			t.Errorf("%s: caller %q, want an error", subject, got)
		}
	}
}

// TestSameOwner is the run-id ownership rule: a run belongs to the caller that first used its
// id; runs stored by mode none before it named callers (as "anonymous") stay reachable from
// mode none only.
func TestSameOwner(t *testing.T) {
	dev := Identity{Caller: "dev", Kind: contract.CallerKindAnonymous, Subject: "sys1.decide.dev"}
	svc := Identity{Caller: "svc-a", Kind: contract.CallerKindSubject, Subject: "sys1.decide.svc-a"}
	for _, tt := range []struct {
		owner string
		id    Identity
		want  bool
	}{
		{"dev", dev, true},
		{"other", dev, false},
		{LegacyAnonymousCaller, dev, true},
		{"svc-a", svc, true},
		{"svc-b", svc, false},
		{LegacyAnonymousCaller, svc, false},
		{"dev", svc, false},
	} {
		if got := SameOwner(tt.owner, tt.id); got != tt.want {
			t.Errorf("SameOwner(%q, %s/%s) = %v, want %v", tt.owner, tt.id.Kind, tt.id.Caller, got, tt.want)
		}
	}
}
