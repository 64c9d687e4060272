package auth

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lestrrat-go/jwx/v3/jwa"
	"github.com/lestrrat-go/jwx/v3/jwk"
	"github.com/lestrrat-go/jwx/v3/jwt"
	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/sys1hq/sys1/worker/natsconn/natstest"
)

const (
	testIssuer   = "https://idp.example.com/"
	testAudience = "sys1"
)

// signer is a private key with its kid and algorithm.
type signer struct {
	priv jwk.Key
	alg  jwa.SignatureAlgorithm
}

func (s signer) public(t testing.TB) jwk.Key {
	t.Helper()
	pub, err := s.priv.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	return pub
}

func newSigner(t testing.TB, raw any, kid string, alg jwa.SignatureAlgorithm) signer {
	t.Helper()
	return signer{priv: mustImport(t, raw, kid), alg: alg}
}

// mustImport turns a raw key (crypto key or []byte secret) into a JWK with kid set.
func mustImport(t testing.TB, raw any, kid string) jwk.Key {
	t.Helper()
	k, err := jwk.Import(raw)
	if err != nil {
		t.Fatalf("import key: %v", err)
	}
	if kid != "" {
		if err := k.Set(jwk.KeyIDKey, kid); err != nil {
			t.Fatal(err)
		}
	}
	return k
}

// RSA key generation is slow under -race; share a few keys across the package's tests.
var (
	rsaOnce sync.Once
	rsaKeys [3]*rsa.PrivateKey
)

func rsaKey(t testing.TB, i int) *rsa.PrivateKey {
	t.Helper()
	rsaOnce.Do(func() {
		for j := range rsaKeys {
			k, err := rsa.GenerateKey(rand.Reader, 2048)
			if err != nil {
				panic(err)
			}
			rsaKeys[j] = k
		}
	})
	return rsaKeys[i]
}

func rsaSigner(t testing.TB, i int, kid string) signer {
	return newSigner(t, rsaKey(t, i), kid, jwa.RS256())
}

func ecSigner(t testing.TB, kid string) signer {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return newSigner(t, k, kid, jwa.ES256())
}

func edSigner(t testing.TB, kid string) signer {
	_, k, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return newSigner(t, k, kid, jwa.EdDSA())
}

// claims builds a valid claim set (issuer, audience, sub, an hour of validity); edit before use.
func claims() map[string]any {
	now := time.Now()
	return map[string]any{
		"iss": testIssuer, "aud": testAudience, "sub": "svc-a",
		"iat": now.Unix(), "exp": now.Add(time.Hour).Unix(),
	}
}

func (s signer) sign(t testing.TB, c map[string]any) string {
	t.Helper()
	tok := jwt.New()
	for k, v := range c {
		if err := tok.Set(k, v); err != nil {
			t.Fatalf("claim %s: %v", k, err)
		}
	}
	b, err := jwt.Sign(tok, jwt.WithKey(s.alg, s.priv))
	if err != nil {
		t.Fatalf("sign: %v", err)
	}
	return string(b)
}

// signHS256 signs c with secret, setting kid in the header when non-empty.
func signHS256(t testing.TB, secret []byte, kid string, c map[string]any) string {
	t.Helper()
	k, err := jwk.Import(secret)
	if err != nil {
		t.Fatal(err)
	}
	if kid != "" {
		_ = k.Set(jwk.KeyIDKey, kid)
	}
	return signer{priv: k, alg: jwa.HS256()}.sign(t, c)
}

// unsignedToken is an "alg": "none" token with the given claims and kid.
func unsignedToken(t testing.TB, kid string, c map[string]any) string {
	t.Helper()
	enc := base64.RawURLEncoding
	h, _ := json.Marshal(map[string]any{"alg": "none", "typ": "JWT", "kid": kid})
	p, _ := json.Marshal(c)
	return enc.EncodeToString(h) + "." + enc.EncodeToString(p) + "."
}

func jwksJSON(t testing.TB, keys ...jwk.Key) []byte {
	t.Helper()
	set := jwk.NewSet()
	for _, k := range keys {
		if err := set.AddKey(k); err != nil {
			t.Fatal(err)
		}
	}
	b, err := json.Marshal(set)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// jwksServer serves a swappable JWKS and counts requests.
type jwksServer struct {
	*httptest.Server
	body atomic.Pointer[[]byte]
	hits atomic.Int64
	fail atomic.Bool // answer 503, as an IdP outage would
}

func newJWKSServer(t testing.TB, keys ...jwk.Key) *jwksServer {
	t.Helper()
	s := &jwksServer{}
	s.serve(t, keys...)
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		s.hits.Add(1)
		if s.fail.Load() {
			http.Error(w, "unavailable", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(*s.body.Load())
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *jwksServer) serve(t testing.TB, keys ...jwk.Key) {
	b := jwksJSON(t, keys...)
	s.body.Store(&b)
}

func bearer(tok string) nats.Header {
	return nats.Header{"Authorization": []string{"Bearer " + tok}}
}

func testLogger(buf *natstest.Buffer) zerolog.Logger {
	return zerolog.New(buf).Level(zerolog.DebugLevel)
}

func jwtConfig() Config {
	c := DefaultConfig()
	c.Mode = ModeJWT
	c.Issuer, c.Audience = testIssuer, testAudience
	c.JWKSMinRefresh = 0
	return c
}

func mustNew(t testing.TB, cfg Config, log zerolog.Logger) Authenticator {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	a, err := New(ctx, cfg, log)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return a
}

// tokenParts returns the token and each of its segments, none of which may leak.
func tokenParts(tok string) []string {
	out := []string{tok}
	for _, p := range strings.Split(tok, ".") {
		if len(p) >= 8 {
			out = append(out, p)
		}
	}
	return out
}
