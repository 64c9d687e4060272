package auth

import (
	"context"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
)

// FuzzJWTAuthenticate feeds arbitrary Authorization values to the jwt authenticator: it must
// never panic, and nothing but the one genuinely signed seed token may be accepted.
func FuzzJWTAuthenticate(f *testing.F) {
	secret := []byte("fuzz-secret-fuzz-secret-fuzz-secret!")
	c := claims()
	c["roles"] = []string{"administrator"}
	valid := signHS256(f, secret, "", c)
	for _, seed := range []string{
		"Bearer " + valid, "Bearer " + valid + "x", "Bearer " + unsignedToken(f, "", c), "Basic abc",
		"Bearer a.b.c", "Bearer ..", "bearer    x.y.z", "Bearer eyJhbGciOiJIUzI1NiJ9.e30.", "",
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
		// Only spelling variants of "Bearer <the valid token>" may pass.
		fields := strings.Fields(value)
		if len(fields) != 2 || !strings.EqualFold(fields[0], "Bearer") || fields[1] != valid {
			t.Fatalf("accepted %q as %+v", value, id)
		}
	})
}
