package auth

import (
	"context"
	"testing"

	"github.com/rs/zerolog"
)

// BenchmarkAuthenticate measures the per-request cost of each mode (a JWT is fully verified
// on every request: signature, claims and policy).
func BenchmarkAuthenticate(b *testing.B) {
	c := claims()
	c["roles"] = []string{"administrator"}
	rs, ec, ed := rsaSigner(b, 0, "rs"), ecSigner(b, "ec"), edSigner(b, "ed")
	srv := newJWKSServer(b, rs.public(b), ec.public(b), ed.public(b))
	jwks := jwtConfig()
	jwks.JWKSURL = srv.URL
	hs := jwtConfig()
	secret := "benchmark-secret-benchmark-secret-0123"
	hs.HS256Secret = Secret(secret)
	subject := DefaultConfig()
	subject.Mode = ModeSubject

	cases := []struct {
		name  string
		cfg   Config
		token string
	}{
		{"subject", subject, ""},
		{"jwt-RS256", jwks, rs.sign(b, c)},
		{"jwt-ES256", jwks, ec.sign(b, c)},
		{"jwt-EdDSA", jwks, ed.sign(b, c)},
		{"jwt-HS256", hs, signHS256(b, []byte(secret), "", c)},
	}
	for _, bc := range cases {
		b.Run(bc.name, func(b *testing.B) {
			a := mustNew(b, bc.cfg, zerolog.Nop())
			h := bearer(bc.token)
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := a.Authenticate(ctx, "sys1.decide.svc-a.x", h); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
