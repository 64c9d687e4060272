package auth

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode"

	"github.com/lestrrat-go/jwx/v3/jwa"
	"github.com/lestrrat-go/jwx/v3/jws"
	"github.com/lestrrat-go/jwx/v3/jwt"
	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/sys1hq/sys1/contract"
)

// AuthorizationHeader carries "Bearer <JWT>" in jwt mode (SPEC §3).
const AuthorizationHeader = "Authorization"

// maxTokenBytes bounds the work an unauthenticated sender can make the worker do.
const maxTokenBytes = 16 << 10

// maxCallerBytes bounds the sub used as caller id (it is stored in records and the run-id gate).
const maxCallerBytes = 256

type jwtAuth struct {
	keys          *keySet // nil with an HS256 secret
	secret        []byte
	issuer        string
	audience      string
	rolesClaim    string
	allowedRoles  []string
	allowedScopes []string
	leeway        time.Duration
}

func newJWTAuth(ctx context.Context, cfg Config, log zerolog.Logger) (*jwtAuth, error) {
	a := &jwtAuth{
		issuer: cfg.Issuer, audience: cfg.Audience, rolesClaim: strings.TrimSpace(cfg.RolesClaim),
		allowedRoles: cleanList(cfg.AllowedRoles), allowedScopes: cleanList(cfg.AllowedScopes),
		leeway: cfg.Leeway,
	}
	ev := log.Info().Str("issuer", a.issuer).Str("audience", a.audience).Str("roles_claim", a.rolesClaim).
		Strs("allowed_roles", a.allowedRoles).Strs("allowed_scopes", a.allowedScopes).Dur("leeway", a.leeway)
	switch {
	case cfg.HS256Secret != "":
		a.secret = []byte(cfg.HS256Secret.Reveal())
		ev.Str("keys", "HS256 shared secret").Msg("JWT authentication enabled")
		return a, nil
	case cfg.JWKSURL != "":
		a.keys = newURLKeySet(cfg.JWKSURL, cfg.JWKSMinRefresh, log)
	default:
		a.keys = newFileKeySet(cfg.JWKSFile, cfg.JWKSMinRefresh, log)
	}
	if err := a.keys.start(ctx, cfg.JWKSRefresh); err != nil {
		name := "SYS1_JWT_JWKS_FILE"
		if cfg.JWKSURL != "" {
			name = "SYS1_JWT_JWKS_URL"
		}
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	ev.Str("keys", "JWKS "+a.keys.source).Dur("jwks_refresh", cfg.JWKSRefresh).Msg("JWT authentication enabled")
	return a, nil
}

func (a *jwtAuth) Mode() string { return ModeJWT }

func unauthenticated(format string, args ...any) *contract.Error {
	return contract.Errorf(contract.CodeUnauthenticated, format, args...)
}

func (a *jwtAuth) Authenticate(ctx context.Context, subject string, header nats.Header) (Identity, *contract.Error) {
	raw, cerr := bearerToken(header)
	if cerr != nil {
		return Identity{}, cerr
	}
	tok, cerr := a.verify(ctx, raw)
	if cerr != nil {
		return Identity{}, cerr
	}

	sub, _ := tok.Subject()
	if sub == "" {
		return Identity{}, unauthenticated("token has no sub claim")
	}
	if len(sub) > maxCallerBytes || strings.IndexFunc(sub, unicode.IsControl) >= 0 {
		return Identity{}, unauthenticated("token sub claim is not a usable caller id (over %d bytes or control characters)", maxCallerBytes)
	}
	id := Identity{
		Caller: sub, Kind: contract.CallerKindJWT, Subject: subject,
		Roles: claimStrings(tok, a.rolesClaim), Scopes: tokenScopes(tok),
	}
	if !hasAny(id.Roles, a.allowedRoles) && !hasAny(id.Scopes, a.allowedScopes) {
		// The token is genuine, so the caller is known: it comes back with the refusal so the
		// run record says who was refused (SPEC §6), though the run is not theirs.
		return id, contract.Errorf(contract.CodeForbidden,
			"caller %q has none of the allowed roles [%s] in claim %q nor the allowed scopes [%s]",
			sub, strings.Join(a.allowedRoles, ", "), a.rolesClaim, strings.Join(a.allowedScopes, ", "))
	}
	return id, nil
}

// bearerToken extracts the compact JWT of the Authorization header. NATS header names are
// case-sensitive on the wire, so the lookup is case-insensitive to accept any spelling; two
// Authorization values are refused rather than guessing which one counts.
func bearerToken(h nats.Header) (string, *contract.Error) {
	var values []string
	for name, v := range h {
		if strings.EqualFold(name, AuthorizationHeader) {
			values = append(values, v...)
		}
	}
	switch len(values) {
	case 0:
		return "", unauthenticated("missing Authorization header (Bearer token required)")
	case 1:
	default:
		return "", unauthenticated("more than one Authorization header")
	}
	scheme, tok, ok := strings.Cut(strings.TrimSpace(values[0]), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", unauthenticated("Authorization header is not of the form \"Bearer <JWT>\"")
	}
	tok = strings.TrimSpace(tok)
	if tok == "" {
		return "", unauthenticated("Authorization header has an empty bearer token")
	}
	if len(tok) > maxTokenBytes {
		return "", unauthenticated("bearer token is larger than %d bytes", maxTokenBytes)
	}
	if strings.Count(tok, ".") != 2 {
		return "", unauthenticated("bearer token is not a compact JWS (header.payload.signature)")
	}
	// RFC 7515 §7.1: a compact JWS is base64url without padding and two dots. Go's base64
	// decoders skip CR and LF and the library also takes the standard alphabet, so without this
	// check "sig\r..." or "a+b" would verify as a token nobody issued in that spelling.
	if i := strings.IndexFunc(tok, notCompactJWS); i >= 0 {
		return "", unauthenticated("bearer token has a character outside base64url at byte %d", i)
	}
	return tok, nil
}

func notCompactJWS(r rune) bool {
	switch {
	case r >= 'A' && r <= 'Z', r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '_', r == '.':
		return false
	}
	return true
}

// verify checks the signature with a key chosen by the worker, then exp, nbf, iat, iss and aud.
func (a *jwtAuth) verify(ctx context.Context, raw string) (jwt.Token, *contract.Error) {
	msg, err := jws.Parse([]byte(raw))
	if err != nil || len(msg.Signatures()) != 1 {
		return nil, unauthenticated("malformed token")
	}
	hdr := msg.Signatures()[0].ProtectedHeaders()
	hdrAlg, _ := hdr.Algorithm()
	if hdrAlg == jwa.NoSignature() || hdrAlg.String() == "" {
		return nil, unauthenticated("unsigned token (alg none) is not accepted")
	}

	var key any
	var alg jwa.SignatureAlgorithm
	if a.keys == nil {
		key, alg = a.secret, jwa.HS256()
		if hdrAlg != alg {
			return nil, unauthenticated("token algorithm %s is not accepted (only HS256 is configured)", hdrAlg)
		}
	} else {
		kid, _ := hdr.KeyID()
		k, err := a.keys.lookup(ctx, kid)
		if err != nil {
			if errors.Is(err, errUnknownKid) {
				return nil, unauthenticated("token signing key %q is not in the JWKS", kid)
			}
			return nil, unauthenticated("%v", err)
		}
		algs, err := candidateAlgs(k)
		if err != nil {
			return nil, unauthenticated("signing key cannot verify tokens: %v", err)
		}
		// The header only selects within what the key allows; an HS256 header against an RSA
		// key (algorithm confusion) ends here.
		i := slices.IndexFunc(algs, func(c jwa.SignatureAlgorithm) bool { return c == hdrAlg })
		if i < 0 {
			return nil, unauthenticated("token algorithm %s is not accepted for its signing key (%s)", hdrAlg, k.KeyType())
		}
		key, alg = k, algs[i]
	}

	tok, err := jwt.Parse([]byte(raw),
		jwt.WithKey(alg, key),
		jwt.WithValidate(true),
		jwt.WithAcceptableSkew(a.leeway),
		jwt.WithIssuer(a.issuer),
		jwt.WithAudience(a.audience),
		// A token without exp would be valid forever once leaked.
		jwt.WithRequiredClaim("exp"),
	)
	if err != nil {
		return nil, classify(err)
	}
	return tok, nil
}

// classify turns a jwx error into a fixed message. The library's text is not passed on: it is
// not part of sys1's contract and need not be safe to show.
func classify(err error) *contract.Error {
	switch {
	case errors.Is(err, jwt.TokenExpiredError()):
		return unauthenticated("token expired")
	case errors.Is(err, jwt.TokenNotYetValidError()):
		return unauthenticated("token not yet valid (nbf in the future)")
	case errors.Is(err, jwt.InvalidIssuedAtError()):
		return unauthenticated("token issued in the future (iat)")
	case errors.Is(err, jwt.InvalidIssuerError()):
		return unauthenticated("issuer mismatch")
	case errors.Is(err, jwt.InvalidAudienceError()):
		return unauthenticated("audience mismatch")
	case errors.Is(err, jwt.MissingRequiredClaimError()):
		return unauthenticated("token has no exp claim")
	case errors.Is(err, jws.VerificationError()), errors.Is(err, jws.VerifyError()):
		return unauthenticated("signature verification failed")
	case errors.Is(err, jwt.ValidateError()):
		return unauthenticated("token claims are invalid")
	default:
		return unauthenticated("malformed token")
	}
}

// claimStrings reads a claim that is a string or an array of strings. Non-string elements are
// ignored; they cannot grant anything.
func claimStrings(tok jwt.Token, name string) []string {
	var v any
	if err := tok.Get(name, &v); err != nil {
		return nil
	}
	return stringsOf(v, false)
}

// tokenScopes merges "scope" (RFC 8693: space-separated string) and "scp" (array or string,
// as issued by Azure AD and Okta).
func tokenScopes(tok jwt.Token) []string {
	var out []string
	for _, name := range []string{"scope", "scp"} {
		var v any
		if err := tok.Get(name, &v); err == nil {
			out = append(out, stringsOf(v, true)...)
		}
	}
	return dedupe(out)
}

func stringsOf(v any, splitSpaces bool) []string {
	var out []string
	add := func(s string) {
		if splitSpaces {
			out = append(out, strings.Fields(s)...)
		} else if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	switch t := v.(type) {
	case string:
		add(t)
	case []string:
		for _, s := range t {
			add(s)
		}
	case []any:
		for _, e := range t {
			if s, ok := e.(string); ok {
				add(s)
			}
		}
	}
	return dedupe(out)
}

func dedupe(in []string) []string {
	if len(in) == 0 {
		return nil
	}
	out := make([]string, 0, len(in))
	for _, s := range in {
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}

func hasAny(have, allowed []string) bool {
	for _, h := range have {
		if slices.Contains(allowed, h) {
			return true
		}
	}
	return false
}
