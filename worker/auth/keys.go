package auth

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lestrrat-go/jwx/v3/jwa"
	"github.com/lestrrat-go/jwx/v3/jwk"
	"github.com/rs/zerolog"
)

// keySet holds the verification keys of a JWKS (file or URL), refreshed in the background and,
// rate-limited, on demand when a token names a kid it does not know (a rotation that happened
// since the last refresh).
type keySet struct {
	source   string // file path or redacted URL, for logs and errors
	load     func(ctx context.Context) (jwk.Set, error)
	minGap   time.Duration
	log      zerolog.Logger
	current  atomic.Pointer[jwk.Set]
	fetches  atomic.Int64 // how many loads were attempted (observability and tests)
	mu       sync.Mutex   // serialises loads so concurrent unknown kids cause one fetch
	lastLoad time.Time    // guarded by mu
}

// jwksFetchTimeout bounds one JWKS download; a hung IdP must not hold a delivery forever.
const jwksFetchTimeout = 10 * time.Second

// maxJWKSBytes bounds one JWKS document. Real ones hold a handful of keys (a few KiB); a
// misconfigured URL serving something huge must fail the load, not exhaust the worker's memory.
const maxJWKSBytes = 1 << 20

// boundedBody fails a response whose body passes maxJWKSBytes.
type boundedBody struct{ next http.RoundTripper }

func (b boundedBody) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := b.next.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	resp.Body = &limitedBody{ReadCloser: resp.Body, left: maxJWKSBytes}
	return resp, nil
}

type limitedBody struct {
	io.ReadCloser
	left int64
}

func (l *limitedBody) Read(p []byte) (int, error) {
	if l.left <= 0 {
		// One more byte would pass the bound: is there one?
		var probe [1]byte
		if n, _ := l.ReadCloser.Read(probe[:]); n > 0 {
			return 0, fmt.Errorf("JWKS document is larger than %d bytes", maxJWKSBytes)
		}
		return 0, io.EOF
	}
	if int64(len(p)) > l.left {
		p = p[:l.left]
	}
	n, err := l.ReadCloser.Read(p)
	l.left -= int64(n)
	return n, err
}

func newURLKeySet(rawURL string, minGap time.Duration, log zerolog.Logger) *keySet {
	u, _ := url.Parse(rawURL) // validated by Config.Validate
	client := &http.Client{
		Timeout:   jwksFetchTimeout,
		Transport: boundedBody{next: http.DefaultTransport},
		// The configured URL is the key source; a redirect elsewhere is not followed.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	return &keySet{
		source: redactURL(u), minGap: minGap, log: log,
		load: func(ctx context.Context) (jwk.Set, error) {
			set, err := jwk.Fetch(ctx, rawURL, jwk.WithHTTPClient(client))
			if err != nil {
				// The library quotes the URL, whose query or userinfo may hold a credential.
				msg := err.Error()
				for _, form := range []string{rawURL, u.String(), u.Redacted()} {
					msg = strings.ReplaceAll(msg, form, redactURL(u))
				}
				return nil, errors.New(msg)
			}
			return set, nil
		},
	}
}

func newFileKeySet(path string, minGap time.Duration, log zerolog.Logger) *keySet {
	return &keySet{
		source: path, minGap: minGap, log: log,
		load: func(context.Context) (jwk.Set, error) { return jwk.ReadFile(path) },
	}
}

// start loads the set once (an error here stops start-up: a worker that cannot verify any
// token must say so at once) and then refreshes it every interval until ctx ends.
func (k *keySet) start(ctx context.Context, interval time.Duration) error {
	if err := k.refresh(ctx); err != nil {
		return err
	}
	go func() {
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				// A failed periodic refresh keeps the previous keys: an IdP blip must not lock
				// every caller out.
				if err := k.refresh(ctx); err != nil && ctx.Err() == nil {
					k.log.Warn().Err(err).Str("jwks", k.source).Msg("JWKS refresh failed; keeping the previous keys")
				}
			}
		}
	}()
	return nil
}

// refresh loads the set and swaps it in. Keys unusable for verification are dropped here, once.
func (k *keySet) refresh(ctx context.Context) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.refreshLocked(ctx)
}

func (k *keySet) refreshLocked(ctx context.Context) error {
	k.lastLoad = time.Now()
	k.fetches.Add(1)
	ctx, cancel := context.WithTimeout(ctx, jwksFetchTimeout)
	defer cancel()
	raw, err := k.load(ctx)
	if err != nil {
		return fmt.Errorf("JWKS %s: cannot load: %w", k.source, err)
	}
	set := jwk.NewSet()
	for i := range raw.Len() {
		key, _ := raw.Key(i)
		kid, _ := key.KeyID()
		if reason := unusableKey(key); reason != "" {
			k.log.Warn().Str("jwks", k.source).Str("kid", kid).Str("reason", reason).Msg("JWKS key ignored")
			continue
		}
		pub, err := key.PublicKey()
		if err != nil {
			k.log.Warn().Str("jwks", k.source).Str("kid", kid).Msg("JWKS key ignored: no public key")
			continue
		}
		if err := set.AddKey(pub); err != nil {
			k.log.Warn().Str("jwks", k.source).Str("kid", kid).Err(err).Msg("JWKS key ignored")
		}
	}
	if set.Len() == 0 {
		return fmt.Errorf("JWKS %s: holds no usable signature verification key", k.source)
	}
	k.current.Store(&set)
	k.log.Debug().Str("jwks", k.source).Int("keys", set.Len()).Msg("JWKS loaded")
	return nil
}

// unusableKey says why a key must never verify a token, or "" when it may.
func unusableKey(key jwk.Key) string {
	if use, ok := key.KeyUsage(); ok && use != "" && use != jwk.ForSignature.String() {
		return "use is " + use + ", not sig"
	}
	// A symmetric key published in a JWKS is either a mistake or an invitation to forge tokens.
	if key.KeyType() == jwa.OctetSeq() {
		return "symmetric (oct) keys are not accepted from a JWKS"
	}
	if _, err := candidateAlgs(key); err != nil {
		return err.Error()
	}
	return ""
}

var errUnknownKid = errors.New("unknown key id")

// lookup returns the key a token's kid names. An unknown kid triggers one refresh unless one
// happened within minGap; a token without kid is accepted only when the set has one key.
func (k *keySet) lookup(ctx context.Context, kid string) (jwk.Key, error) {
	if key, ok := k.find(kid); ok {
		return key, nil
	}
	if kid == "" {
		return nil, fmt.Errorf("token has no kid and the key set holds %d keys", (*k.current.Load()).Len())
	}
	k.mu.Lock()
	// Another goroutine may have refreshed while this one waited for the lock.
	if key, ok := k.find(kid); ok {
		k.mu.Unlock()
		return key, nil
	}
	if time.Since(k.lastLoad) < k.minGap {
		k.mu.Unlock()
		return nil, errUnknownKid
	}
	err := k.refreshLocked(ctx)
	k.mu.Unlock()
	// A request's token caused this refresh: its lines go to the request's logger when ctx
	// carries one (the worker's, with the run_id), so they can be tied to the run.
	log := &k.log
	if l := zerolog.Ctx(ctx); l != zerolog.DefaultContextLogger && l.GetLevel() != zerolog.Disabled {
		log = l
	}
	if err != nil {
		log.Warn().Err(err).Str("jwks", k.source).Msg("JWKS refresh for an unknown kid failed")
		return nil, errUnknownKid
	}
	if key, ok := k.find(kid); ok {
		log.Info().Str("jwks", k.source).Str("kid", kid).Msg("JWKS refreshed: new signing key picked up")
		return key, nil
	}
	return nil, errUnknownKid
}

func (k *keySet) find(kid string) (jwk.Key, bool) {
	set := *k.current.Load()
	if kid == "" {
		if set.Len() == 1 {
			return set.Key(0)
		}
		return nil, false
	}
	return set.LookupKeyID(kid)
}

// candidateAlgs is the set of signature algorithms a key may verify. It comes from the key
// (its alg member if present, else its type and curve), never from the token: that is what
// defeats algorithm confusion (an HS256 token "signed" with the RSA public key as secret, or
// alg none).
func candidateAlgs(key jwk.Key) ([]jwa.SignatureAlgorithm, error) {
	var family []jwa.SignatureAlgorithm
	switch key.KeyType() {
	case jwa.RSA():
		family = []jwa.SignatureAlgorithm{jwa.RS256(), jwa.RS384(), jwa.RS512(), jwa.PS256(), jwa.PS384(), jwa.PS512()}
	case jwa.EC():
		crv, _ := curveOf(key)
		switch crv {
		case jwa.P256():
			family = []jwa.SignatureAlgorithm{jwa.ES256()}
		case jwa.P384():
			family = []jwa.SignatureAlgorithm{jwa.ES384()}
		case jwa.P521():
			family = []jwa.SignatureAlgorithm{jwa.ES512()}
		default:
			return nil, fmt.Errorf("EC curve %s is not supported", crv)
		}
	case jwa.OKP():
		crv, _ := curveOf(key)
		if crv != jwa.Ed25519() {
			return nil, fmt.Errorf("OKP curve %s is not supported", crv)
		}
		family = []jwa.SignatureAlgorithm{jwa.EdDSA(), jwa.EdDSAEd25519()}
	default:
		return nil, fmt.Errorf("key type %s is not supported", key.KeyType())
	}
	alg, ok := key.Algorithm()
	if !ok || alg.String() == "" {
		return family, nil
	}
	for _, a := range family {
		if a.String() == alg.String() {
			return []jwa.SignatureAlgorithm{a}, nil
		}
	}
	return nil, fmt.Errorf("key alg %s does not fit key type %s", alg, key.KeyType())
}

func curveOf(key jwk.Key) (jwa.EllipticCurveAlgorithm, bool) {
	// EC and OKP keys, public or private, all expose their curve this way.
	if k, ok := key.(interface {
		Crv() (jwa.EllipticCurveAlgorithm, bool)
	}); ok {
		return k.Crv()
	}
	return jwa.InvalidEllipticCurve(), false
}
