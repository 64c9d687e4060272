package auth

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/sys1hq/sys1/contract"
)

// The auth modes of SYS1_AUTH_MODE.
const (
	ModeNone    = "none"
	ModeSubject = "subject"
	ModeJWT     = "jwt"
)

// Config is the worker's caller-authentication configuration (environment SYS1_AUTH_MODE and
// SYS1_JWT_*). Only the fields of the selected mode are used.
type Config struct {
	// Mode is none (development only), subject (NATS permissions make the subject unforgeable)
	// or jwt (an Authorization: Bearer header verified against a JWKS or an HS256 secret).
	Mode string `env:"SYS1_AUTH_MODE" envDefault:"none"`

	// Exactly one key source in jwt mode.
	JWKSFile    string `env:"SYS1_JWT_JWKS_FILE"`
	JWKSURL     string `env:"SYS1_JWT_JWKS_URL"`
	HS256Secret Secret `env:"SYS1_JWT_HS256_SECRET"`

	// Issuer and Audience are required in jwt mode: a token minted by another issuer, or for
	// another service of the same issuer, must not spend this service's model.
	Issuer   string `env:"SYS1_JWT_ISSUER"`
	Audience string `env:"SYS1_JWT_AUDIENCE"`

	// RolesClaim names the claim that holds the caller's roles (a string or an array). IdPs
	// such as Auth0 require namespaced custom claims, e.g. https://example.com/roles.
	RolesClaim    string   `env:"SYS1_JWT_ROLES_CLAIM" envDefault:"roles"`
	AllowedRoles  []string `env:"SYS1_ALLOWED_ROLES" envDefault:"administrator" envSeparator:","`
	AllowedScopes []string `env:"SYS1_ALLOWED_SCOPES" envDefault:"sys1:use" envSeparator:","`

	// Leeway absorbs clock skew between the issuer and the worker for exp, nbf and iat.
	Leeway time.Duration `env:"SYS1_JWT_LEEWAY" envDefault:"30s"`
	// JWKSRefresh is how often the key set is re-read (URL or file) so rotations are picked up.
	JWKSRefresh time.Duration `env:"SYS1_JWKS_REFRESH" envDefault:"5m"`
	// JWKSMinRefresh rate-limits the extra refresh a token with an unknown kid triggers, so a
	// flood of forged kids cannot turn the worker into a load generator against the IdP.
	JWKSMinRefresh time.Duration `env:"SYS1_JWKS_MIN_REFRESH" envDefault:"10s"`
}

// DefaultConfig is what env parsing yields with nothing set.
func DefaultConfig() Config {
	return Config{
		Mode: ModeNone, RolesClaim: "roles",
		AllowedRoles: []string{"administrator"}, AllowedScopes: []string{"sys1:use"},
		Leeway: 30 * time.Second, JWKSRefresh: 5 * time.Minute, JWKSMinRefresh: 10 * time.Second,
	}
}

// minHS256SecretBytes is RFC 7518 §3.2: an HMAC key must be at least as long as the hash.
const minHS256SecretBytes = 32

// Validate reports every bad variable, each error naming it. It never echoes a secret.
func (c *Config) Validate() []error {
	var errs []error
	switch c.Mode {
	case ModeNone, ModeSubject:
		return nil
	case ModeJWT:
	default:
		return []error{fmt.Errorf("SYS1_AUTH_MODE: %q is not one of none, subject, jwt", c.Mode)}
	}

	var sources []string // the key sources set, by variable
	for _, s := range []struct {
		name string
		set  bool
	}{{"SYS1_JWT_JWKS_URL", c.JWKSURL != ""}, {"SYS1_JWT_JWKS_FILE", c.JWKSFile != ""}, {"SYS1_JWT_HS256_SECRET", c.HS256Secret != ""}} {
		if s.set {
			sources = append(sources, s.name)
		}
	}
	switch {
	case len(sources) == 0:
		errs = append(errs, fmt.Errorf("SYS1_JWT_JWKS_URL: jwt mode needs one key source: SYS1_JWT_JWKS_URL, SYS1_JWT_JWKS_FILE or SYS1_JWT_HS256_SECRET"))
	case len(sources) > 1:
		errs = append(errs, fmt.Errorf("%s: set only one of %s (a second key source would widen what is trusted)", sources[0], strings.Join(sources, ", ")))
	}
	if c.JWKSURL != "" {
		if err := validateJWKSURL(c.JWKSURL); err != nil {
			errs = append(errs, fmt.Errorf("SYS1_JWT_JWKS_URL: %w", err))
		}
	}
	if c.JWKSFile != "" {
		if st, err := os.Stat(c.JWKSFile); err != nil {
			errs = append(errs, fmt.Errorf("SYS1_JWT_JWKS_FILE: cannot read %q: %w", c.JWKSFile, err))
		} else if st.IsDir() {
			errs = append(errs, fmt.Errorf("SYS1_JWT_JWKS_FILE: %q is a directory, not a JWKS file", c.JWKSFile))
		}
	}
	if c.HS256Secret != "" && len(c.HS256Secret) < minHS256SecretBytes {
		errs = append(errs, fmt.Errorf("SYS1_JWT_HS256_SECRET: must be at least %d bytes, got %d", minHS256SecretBytes, len(c.HS256Secret)))
	}
	if strings.TrimSpace(c.Issuer) == "" {
		errs = append(errs, fmt.Errorf("SYS1_JWT_ISSUER: required in jwt mode (the iss every accepted token must carry)"))
	}
	if strings.TrimSpace(c.Audience) == "" {
		errs = append(errs, fmt.Errorf("SYS1_JWT_AUDIENCE: required in jwt mode (the aud every accepted token must carry)"))
	}
	if strings.TrimSpace(c.RolesClaim) == "" {
		errs = append(errs, fmt.Errorf("SYS1_JWT_ROLES_CLAIM: must name a claim"))
	}
	if len(cleanList(c.AllowedRoles)) == 0 && len(cleanList(c.AllowedScopes)) == 0 {
		errs = append(errs, fmt.Errorf("SYS1_ALLOWED_ROLES: SYS1_ALLOWED_ROLES and SYS1_ALLOWED_SCOPES are both empty; no caller could ever be allowed"))
	}
	if c.Leeway < 0 || c.Leeway > 5*time.Minute {
		errs = append(errs, fmt.Errorf("SYS1_JWT_LEEWAY: must be between 0s and 5m, got %s", c.Leeway))
	}
	if c.JWKSRefresh < time.Second {
		errs = append(errs, fmt.Errorf("SYS1_JWKS_REFRESH: must be at least 1s, got %s", c.JWKSRefresh))
	}
	if c.JWKSMinRefresh < 0 {
		errs = append(errs, fmt.Errorf("SYS1_JWKS_MIN_REFRESH: must not be negative, got %s", c.JWKSMinRefresh))
	}
	return errs
}

// validateJWKSURL accepts https anywhere and plain http only on loopback (a local IdP or a
// test): keys fetched in clear text over a network could be swapped by anyone on the path.
func validateJWKSURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("not a URL")
	}
	if u.Host == "" {
		return fmt.Errorf("%q has no host", redactURL(u))
	}
	switch u.Scheme {
	case "https":
		return nil
	case "http":
		host := u.Hostname()
		if ip := net.ParseIP(host); host == "localhost" || ip != nil && ip.IsLoopback() {
			return nil
		}
		return fmt.Errorf("%q must use https (plain http is accepted only on loopback)", redactURL(u))
	default:
		return fmt.Errorf("%q must be an https URL", redactURL(u))
	}
}

// redactURL drops userinfo and the query, either of which may carry a credential.
func redactURL(u *url.URL) string {
	c := *u
	c.User = nil
	c.RawQuery = ""
	c.ForceQuery = false
	return c.String()
}

// cleanList trims entries and drops empty ones ("a, b,," is ["a" "b"]).
func cleanList(in []string) []string {
	var out []string
	for _, s := range in {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// Secret is the one secret type of sys1's configuration: it never prints (see
// contract.Secret).
type Secret = contract.Secret
