package review

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"unicode/utf8"

	"golang.org/x/crypto/bcrypt"
)

// Users are the reviewers allowed to log in, read from an htpasswd file whose every hash is
// bcrypt (`htpasswd -B`, or `sys1 review --hash-password`). Other htpasswd hash kinds (MD5
// "$apr1$", SHA-1 "{SHA}", crypt, plain text) are refused: they are cheap to brute-force.
type Users struct {
	hashes map[string][]byte
	// Weak lists the lines whose bcrypt cost is below RecommendedCost (htpasswd -B uses 5
	// unless given -C), for a start-up warning.
	Weak []string
}

// RecommendedCost is the bcrypt cost --hash-password uses; lower costs are accepted with a
// warning (htpasswd -B's default is 5).
const RecommendedCost = 12

// hashCost is the cost of the hashes this package makes (tests lower it: bcrypt under the race
// detector takes seconds).
var hashCost = RecommendedCost

// maxNameLen bounds reviewer names: they are recorded in every label.
const maxNameLen = 64

// ParseUsers reads an htpasswd file: one "name:hash" per line; blank lines and lines starting
// with '#' are ignored. The error names every bad line (by number and user, never quoting a
// hash).
func ParseUsers(data []byte) (Users, error) {
	u := Users{hashes: map[string][]byte{}}
	var problems []string
	if !utf8.Valid(data) {
		return u, errors.New("not valid UTF-8")
	}
	for i, line := range bytes.Split(data, []byte("\n")) {
		n := i + 1
		line = bytes.TrimRight(line, "\r")
		trimmed := bytes.TrimSpace(line)
		if len(trimmed) == 0 || trimmed[0] == '#' {
			continue
		}
		name, hash, ok := strings.Cut(string(line), ":")
		if !ok {
			problems = append(problems, fmt.Sprintf("line %d: not name:hash", n))
			continue
		}
		where := fmt.Sprintf("line %d (user %q)", n, name)
		if err := checkName(name); err != nil {
			problems = append(problems, fmt.Sprintf("line %d: %v", n, err))
			continue
		}
		if _, dup := u.hashes[name]; dup {
			problems = append(problems, where+": the user is listed twice")
			continue
		}
		if kind := hashKind(hash); kind != "" {
			problems = append(problems, fmt.Sprintf("%s: the password hash is %s; only bcrypt ($2y$, $2b$, $2a$) is accepted: create it with `htpasswd -B -C 12` or `sys1 review --hash-password`", where, kind))
			continue
		}
		cost, err := bcrypt.Cost([]byte(hash))
		if err != nil {
			problems = append(problems, where+": the bcrypt hash is malformed")
			continue
		}
		if cost < RecommendedCost {
			u.Weak = append(u.Weak, fmt.Sprintf("%s: bcrypt cost %d (recommended: %d)", where, cost, RecommendedCost))
		}
		u.hashes[name] = []byte(hash)
	}
	if len(problems) > 0 {
		return u, errors.New(strings.Join(problems, "; "))
	}
	if len(u.hashes) == 0 {
		return u, errors.New("no users: add lines name:bcrypt-hash (e.g. with `htpasswd -B -C 12 FILE NAME`)")
	}
	return u, nil
}

// checkName accepts names that read well in a label and in a log: 1–64 letters, digits and
// . _ @ + -.
func checkName(name string) error {
	if name == "" || len(name) > maxNameLen {
		return fmt.Errorf("user name must be 1–%d characters", maxNameLen)
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("._@+-", r)) {
			return fmt.Errorf("user name %q: only letters, digits and . _ @ + - are allowed", name)
		}
	}
	return nil
}

// hashKind names a non-bcrypt htpasswd hash, or returns "" for a bcrypt one.
func hashKind(h string) string {
	switch {
	case strings.HasPrefix(h, "$2y$"), strings.HasPrefix(h, "$2b$"), strings.HasPrefix(h, "$2a$"):
		return ""
	case strings.HasPrefix(h, "$apr1$"):
		return "Apache MD5 ($apr1$)"
	case strings.HasPrefix(h, "{SHA}"):
		return "SHA-1 ({SHA})"
	case strings.HasPrefix(h, "$1$"):
		return "MD5-crypt ($1$)"
	case strings.HasPrefix(h, "$5$"), strings.HasPrefix(h, "$6$"):
		return "SHA-crypt"
	case strings.HasPrefix(h, "$argon2"):
		return "argon2 (not supported by htpasswd files)"
	case h == "":
		return "empty"
	case len(h) == 13:
		return "crypt (DES)"
	}
	return "not a recognised hash (plain text?)"
}

// dummyHash is compared against when the user is unknown, so a login for a missing user takes
// as long as one with a wrong password and does not reveal which names exist.
// It is made on first use: a package-level bcrypt would slow every sys1 command's start.
var dummyHash = sync.OnceValue(func() []byte {
	h, _ := bcrypt.GenerateFromPassword([]byte("sys1 review: no such user"), hashCost)
	return h
})

// Verify reports whether password is name's. It always does one bcrypt comparison.
func (u Users) Verify(name, password string) bool {
	h, ok := u.hashes[name]
	if !ok {
		_ = bcrypt.CompareHashAndPassword(dummyHash(), []byte(password))
		return false
	}
	return bcrypt.CompareHashAndPassword(h, []byte(password)) == nil
}

// Has reports whether name may log in (sessions of a user removed from the file end).
func (u Users) Has(name string) bool {
	_, ok := u.hashes[name]
	return ok
}

// deviceKey is what name's device cookies are signed with: its password hash, so a new
// password voids them; nil for an unknown name.
func (u Users) deviceKey(name string) []byte {
	h, ok := u.hashes[name]
	if !ok {
		return nil
	}
	return append([]byte("device\x00"), h...)
}

// Fingerprint identifies name's current password hash without revealing it: a session
// remembers it, and ends when it changes (a new password, or the user re-created). "" for an
// unknown name.
func (u Users) Fingerprint(name string) string {
	h, ok := u.hashes[name]
	if !ok {
		return ""
	}
	sum := sha256.Sum256(append([]byte("session\x00"), h...))
	return hex.EncodeToString(sum[:12])
}

// Len is the number of users.
func (u Users) Len() int { return len(u.hashes) }

// HashPassword returns an htpasswd line for name with a bcrypt hash at RecommendedCost.
func HashPassword(name, password string) (string, error) {
	if err := checkName(name); err != nil {
		return "", err
	}
	if len(password) < 8 {
		return "", errors.New("the password must have at least 8 characters")
	}
	if len(password) > 72 {
		return "", errors.New("bcrypt uses at most 72 bytes of a password; choose a shorter one")
	}
	h, err := bcrypt.GenerateFromPassword([]byte(password), hashCost)
	if err != nil {
		return "", err
	}
	return name + ":" + string(h), nil
}
