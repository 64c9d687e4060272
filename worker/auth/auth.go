// Package auth derives the verified caller of a request (SYS1_AUTH_MODE none, subject or jwt)
// and applies the access policy: the caller must hold an allowed role or scope.
//
// The caller comes only from a verified source: the NATS subject (made unforgeable by the
// server's per-user publish permissions, see deploy/nats) or a signature-checked JWT. The body
// and every other header are never read, so a request claiming "administrator" in its body or
// in an X-Caller header changes nothing.
//
// Nothing secret leaves this package: Identity carries no token, and error messages say what is
// wrong ("token expired", "audience mismatch") without quoting the token or any claim value
// other than the verified caller.
package auth

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/contract/wire"
	"github.com/sys1hq/sys1/worker/topology"
)

// Identity is a verified caller. It holds no credential, so it may be logged and recorded whole.
type Identity struct {
	// Caller is the subject's caller token (sys1.decide.<caller>…) in modes none and subject,
	// or the token's sub claim (mode jwt).
	Caller string
	// Kind is how Caller was established: contract.CallerKindSubject (verified by the NATS
	// permissions), CallerKindJWT (a checked signature), or CallerKindAnonymous in mode none,
	// where Caller is only what the subject claims: nothing verified it.
	Kind string
	// Roles and Scopes are the verified roles and scopes of a JWT caller; nil otherwise.
	Roles  []string
	Scopes []string
	// Subject is the NATS subject the request arrived on.
	Subject string
}

// Authenticator derives and authorises the caller of one request.
type Authenticator interface {
	// Authenticate derives the caller ONLY from the verified source (the subject, or the
	// Authorization header in jwt mode); the body and other headers are ignored. It returns a
	// SYS1_UNAUTHENTICATED error, with an empty Identity, for missing or invalid credentials,
	// and SYS1_FORBIDDEN for a verified caller without an allowed role or scope; a forbidden
	// caller's verified Identity comes back with the error, so that it can be recorded. Safe
	// for concurrent use.
	Authenticate(ctx context.Context, subject string, header nats.Header) (Identity, *contract.Error)
	// Mode is none, subject or jwt.
	Mode() string
}

// LegacyAnonymousCaller is the caller versions before issue 23 gave every request in mode
// none. Runs they stored in the run-id gate still carry it; SameOwner lets a mode-none caller
// reach them until the gate forgets them.
const LegacyAnonymousCaller = contract.LegacyAnonymousCaller

// New builds the Authenticator of cfg. In jwt mode with a JWKS it loads the key set once (an
// unreachable or empty JWKS is a start-up error) and refreshes it in the background until ctx
// ends. Mode none logs a warning: every request is accepted, its caller taken unverified from
// the subject (caller_kind anonymous).
func New(ctx context.Context, cfg Config, log zerolog.Logger) (Authenticator, error) {
	if errs := cfg.Validate(); len(errs) > 0 {
		return nil, fmt.Errorf("auth configuration: %w", errors.Join(errs...))
	}
	log = log.With().Str("auth_mode", cfg.Mode).Logger()
	if cfg.Mode != ModeJWT && (cfg.JWKSFile != "" || cfg.JWKSURL != "" || cfg.HS256Secret != "") {
		log.Warn().Msg("SYS1_JWT_* key settings are ignored: SYS1_AUTH_MODE is not jwt")
	}
	switch cfg.Mode {
	case ModeNone:
		log.Warn().Str("caller_from", wire.DecidePrefix+"<caller>").
			Msg("SYS1_AUTH_MODE=none is for development only: every request is accepted, its caller taken from the subject without any check (caller_kind anonymous)")
		return noneAuth{}, nil
	case ModeSubject:
		log.Info().Str("caller_from", wire.DecidePrefix+"<caller>").
			Msg("callers are taken from the request subject; the NATS server's per-user publish permissions must make it unforgeable (see deploy/nats)")
		return subjectAuth{}, nil
	default:
		return newJWTAuth(ctx, cfg, log)
	}
}

type noneAuth struct{}

func (noneAuth) Mode() string { return ModeNone }

// Authenticate in mode none names the caller exactly as mode subject does, so every
// per-caller feature (policy and limits globs, calibration fits, the review page's caller
// filter, reply namespaces, run-id ownership) behaves in development as in production; but
// nothing stops a client from publishing under any token, so the caller is recorded as
// unverified (CallerKindAnonymous).
func (noneAuth) Authenticate(_ context.Context, subject string, _ nats.Header) (Identity, *contract.Error) {
	caller, err := CallerFromSubject(subject)
	if err != nil {
		return Identity{}, contract.Errorf(contract.CodeUnauthenticated, "%v", err)
	}
	return Identity{Caller: caller, Kind: contract.CallerKindAnonymous, Subject: subject}, nil
}

// SameOwner reports whether the caller id, as authenticated, owns a run stored for owner (the
// run-id ownership rule: a run id belongs to the caller that first used it). One exception:
// a run stored for LegacyAnonymousCaller, before mode none named callers by their subject
// token, still belongs to any mode-none caller.
func SameOwner(owner string, id Identity) bool {
	return owner == id.Caller || (owner == LegacyAnonymousCaller && id.Kind == contract.CallerKindAnonymous)
}

type subjectAuth struct{}

func (subjectAuth) Mode() string { return ModeSubject }

func (subjectAuth) Authenticate(_ context.Context, subject string, _ nats.Header) (Identity, *contract.Error) {
	caller, err := CallerFromSubject(subject)
	if err != nil {
		return Identity{}, contract.Errorf(contract.CodeUnauthenticated, "%v", err)
	}
	return Identity{Caller: caller, Kind: contract.CallerKindSubject, Subject: subject}, nil
}

// CallerFromSubject returns the caller token of the subjects producers publish on:
// sys1.decide.<caller>[.<more>], sys1.batch.<caller>.<batch id> and sys1.labels.<caller>
// (topology.CallerToken).
func CallerFromSubject(subject string) (string, error) { return topology.CallerToken(subject) }

// inboxPrefix is the NATS request-reply inbox namespace (nats.go's default and the per-user
// _INBOX.<user> prefixes of deploy/nats).
const inboxPrefix = "_INBOX."

// ReplyPolicy is where replies may go beyond the checks every reply subject passes.
type ReplyPolicy struct {
	// AnyInbox lets verified callers name any _INBOX.… subject, not only _INBOX.<caller>.…
	// (SYS1_ALLOW_ANY_INBOX). For deployments whose producers cannot set an inbox prefix; it
	// gives up the guarantee that one producer cannot make the worker answer, with a run id of
	// its choosing, into another producer's predictable inbox.
	AnyInbox bool
}

// CheckReplyTo applies the reply-subject policy to a request's Sys1-Reply-To (empty: no reply).
// The worker publishes to it with its own permissions, so an unchecked value would make it a
// confused deputy: a reply into sys1.runs.> forges a run record, one into sys1.decide.> a
// request, one into another producer's inbox plants an answer it never asked for. Only inboxes
// (_INBOX.…) and durable replies (sys1.replies.…) are accepted, and in modes subject and jwt
// both must stay in the namespace of the subject's caller token: _INBOX.<token>.… and
// sys1.replies.<token>[.…] (the token of the subject the request was published on, which the
// NATS permissions tie to the producer's user; the caller itself in subject mode). Subjects
// with control bytes, invalid UTF-8, wildcards or empty tokens are refused.
// Errors: SYS1_INVALID_INPUT for a malformed subject or one outside those namespaces,
// SYS1_FORBIDDEN for another caller's namespace.
func CheckReplyTo(id Identity, replyTo string, policy ReplyPolicy) *contract.Error {
	if replyTo == "" {
		return nil
	}
	if len(replyTo) > 512 || !utf8.ValidString(replyTo) || strings.ContainsFunc(replyTo, func(r rune) bool {
		return r <= ' ' || r == 0x7f || r == '*' || r == '>' || unicode.IsControl(r) || unicode.IsSpace(r)
	}) || strings.HasSuffix(replyTo, ".") || strings.Contains(replyTo, "..") {
		return contract.Errorf(contract.CodeInvalidInput, "Sys1-Reply-To: %q is not a valid reply subject (no wildcards, spaces, control bytes or empty tokens; valid UTF-8; at most 512 bytes)", truncate(replyTo, 64))
	}
	var ns string
	switch {
	case strings.HasPrefix(replyTo, inboxPrefix):
		if policy.AnyInbox {
			return nil
		}
		ns = inboxPrefix
	case strings.HasPrefix(replyTo, wire.RepliesPrefix):
		ns = wire.RepliesPrefix
	default:
		return contract.Errorf(contract.CodeInvalidInput, "Sys1-Reply-To: %q must start with %s or %s", truncate(replyTo, 64), inboxPrefix, wire.RepliesPrefix)
	}
	// Replies stay in the namespace of the subject the request came on: its caller token,
	// which the NATS permissions tie to the producer's NATS user (the caller itself in mode
	// subject; in mode jwt a token's sub need not be a valid subject token). An unverified
	// request (failed authentication, Kind empty) is held to its subject token too, and so is
	// a verified jwt caller refused for its roles (Kind jwt). Mode none (Kind anonymous, its
	// caller unverified) keeps no namespaces: anyone may publish there under any token, so
	// they would protect nobody, and development clients keep their default inboxes.
	if id.Kind == contract.CallerKindAnonymous {
		return nil
	}
	token, err := CallerFromSubject(id.Subject)
	if err != nil {
		return contract.Errorf(contract.CodeInvalidInput, "Sys1-Reply-To: replies need a caller token in the request subject")
	}
	own := ns + token
	if (ns == wire.RepliesPrefix && replyTo == own) || strings.HasPrefix(replyTo, own+".") {
		return nil
	}
	return contract.Errorf(contract.CodeForbidden, "Sys1-Reply-To: %q is outside the caller's reply subjects %s.>", truncate(replyTo, 64), own)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
