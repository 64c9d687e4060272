package review

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Sessions live in a JetStream KV bucket, so every replica of `sys1 review` behind a load
// balancer knows every session and a logout ends the session everywhere at once. The cookie
// holds a random 256-bit id; the bucket is keyed by the id's SHA-256, so reading the bucket
// does not yield a usable cookie. Each session has a fixed expiry (no sliding renewal), which
// the bucket's TTL also enforces.

// session is one logged-in reviewer.
type session struct {
	User    string    `json:"user"`
	CSRF    string    `json:"csrf"` // the token every form of this session carries
	Created time.Time `json:"created"`
	Expires time.Time `json:"expires"`
	// Hash is the user's password-hash fingerprint at sign-in (Users.Fingerprint): a session
	// ends as soon as the reviewers file gives the user another hash.
	Hash string `json:"hash"`
}

type sessionStore struct {
	kv  jetstream.KeyValue
	ttl time.Duration
	now func() time.Time
}

// SessionsBucketConfig is the sessions bucket: entries outlive no session, and the bucket is
// bounded (SYS1_REVIEW_SESSIONS_MAX_BYTES; a session is a few hundred bytes).
func SessionsBucketConfig(bucket string, ttl time.Duration, replicas int, maxBytes int64) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket: bucket, Description: "sys1 review page sessions (key: SHA-256 of the cookie)",
		History: 1, TTL: ttl, Storage: jetstream.FileStorage, Replicas: replicas, MaxBytes: maxBytes,
	}
}

// randomToken returns 32 random bytes, base64url without padding (43 characters).
func randomToken() string {
	var b [32]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand panics if the OS source is broken)
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// wellFormedToken reports whether s could be a randomToken (checked before any lookup).
func wellFormedToken(s string) bool {
	if len(s) != 43 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

func sessionKey(id string) string {
	sum := sha256.Sum256([]byte(id))
	return "s" + hex.EncodeToString(sum[:])
}

// create starts a session for user, whose password hash has fingerprint hash, and returns its
// cookie value.
func (s *sessionStore) create(ctx context.Context, user, hash string) (string, session, error) {
	now := s.now()
	id := randomToken()
	sess := session{User: user, CSRF: randomToken(), Created: now, Expires: now.Add(s.ttl), Hash: hash}
	b, _ := json.Marshal(sess)
	if _, err := s.kv.Create(ctx, sessionKey(id), b); err != nil {
		return "", session{}, fmt.Errorf("store the session: %w", err)
	}
	return id, sess, nil
}

// errNoSession means the cookie names no live session (unknown, expired or logged out).
var errNoSession = errors.New("no such session")

// get returns the live session with cookie value id.
func (s *sessionStore) get(ctx context.Context, id string) (session, error) {
	if !wellFormedToken(id) {
		return session{}, errNoSession
	}
	e, err := s.kv.Get(ctx, sessionKey(id))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return session{}, errNoSession
	}
	if err != nil {
		return session{}, fmt.Errorf("look up the session: %w", err)
	}
	var sess session
	if err := json.Unmarshal(e.Value(), &sess); err != nil || sess.User == "" || sess.CSRF == "" {
		return session{}, errNoSession
	}
	if !s.now().Before(sess.Expires) {
		return session{}, errNoSession
	}
	return sess, nil
}

// end deletes the session (logout).
func (s *sessionStore) end(ctx context.Context, id string) error {
	if !wellFormedToken(id) {
		return nil
	}
	if err := s.kv.Purge(ctx, sessionKey(id)); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("end the session: %w", err)
	}
	return nil
}
