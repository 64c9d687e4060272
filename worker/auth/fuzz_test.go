package auth

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
)

// FuzzJWTAuthenticate feeds arbitrary Authorization values to the jwt authenticator: it must
// never panic, and nothing but the one genuinely signed seed token may be accepted.
func FuzzJWTAuthenticate(f *testing.F) {
	secret := []byte("fuzz-secret-fuzz-secret-fuzz-secret!")
	// Fixed times, so the valid token is the same in every run (the fuzzer's corpus outlives
	// a run) and never expires under the fuzzer.
	c := claims()
	c["iat"] = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).Unix()
	c["exp"] = time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC).Unix()
	c["roles"] = []string{"administrator"}
	valid := signHS256(f, secret, "", c)
	for _, seed := range []string{
		"Bearer " + valid, "Bearer " + valid + "x", "Bearer " + unsignedToken(f, "", c), "Basic abc",
		"Bearer a.b.c", "Bearer ..", "bearer    x.y.z", "Bearer eyJhbGciOiJIUzI1NiJ9.e30.", "",
		// Found by the fuzzer in CI: the signed bytes with a CR inside, which base64 skips.
		"BeArer " + valid[:len(valid)-10] + "\r" + valid[len(valid)-10:], "Bearer " + valid + "=",
	} {
		f.Add(seed)
	}
	cfg := jwtConfig()
	cfg.HS256Secret = Secret(secret)
	a := mustNew(f, cfg, zerolog.Nop())
	f.Fuzz(func(t *testing.T, value string) {
		id, err := a.Authenticate(context.Background(), "sys1.decide.x", nats.Header{"Authorization": {value}})
		if err != nil {
			return
		}
		// Only the genuinely signed claims may pass: "Bearer" in any case, one token of the
		// base64url alphabet, and the identity of the valid token. (The token's bytes may still
		// differ in unused trailing bits of the last base64 character, which is not a forgery:
		// the key signed exactly these claims.)
		fields := strings.Fields(value)
		if len(fields) != 2 || !strings.EqualFold(fields[0], "Bearer") || strings.IndexFunc(fields[1], notCompactJWS) >= 0 ||
			id.Caller != "svc-a" || id.Kind != "jwt" || strings.Join(id.Roles, ",") != "administrator" || len(id.Scopes) != 0 {
			t.Fatalf("accepted %q as %+v", value, id)
		}
	})
}
