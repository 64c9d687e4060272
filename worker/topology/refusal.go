package topology

import (
	"errors"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// Refusal is why JetStream refused to store a message, as far as sys1 distinguishes.
type Refusal int

const (
	// NotRefused: the error is not a storage refusal (a timeout, a lost connection, …).
	NotRefused Refusal = iota
	// RefusedFull: the stream is at its byte (or message) limit and refuses new messages.
	RefusedFull
	// RefusedQuota: the message's subject holds as many messages as the stream allows per
	// subject: for sys1, the caller's quota.
	RefusedQuota
	// RefusedStorage: the NATS server or account has no storage left at all ("insufficient
	// resources"), whatever the stream's own limit.
	RefusedStorage
)

func (r Refusal) String() string {
	switch r {
	case RefusedFull:
		return "stream full"
	case RefusedQuota:
		return "per-caller quota"
	case RefusedStorage:
		return "server storage exhausted"
	}
	return "not refused"
}

// JetStream's error codes for a refused store (nats-server's jetstream_errors_generated.go).
const (
	errCodeAccountResources      = 10002
	errCodeInsufficientResources = 10023
	errCodeStorageResources      = 10047
	errCodeMemoryResources       = 10028
	errCodeStoreFailed           = 10077 // with the store's own error as its description
)

// Refused classifies a publish error. The store's own reasons come as the description of
// JetStream's "store failed" error: "maximum bytes exceeded", "maximum messages exceeded",
// "maximum messages per subject exceeded" (nats-server's ErrMaxBytes, ErrMaxMsgs,
// ErrMaxMsgsPerSubject, with discard policy new).
func Refused(err error) Refusal {
	var apiErr *jetstream.APIError
	if err == nil || !errors.As(err, &apiErr) {
		return NotRefused
	}
	switch apiErr.ErrorCode {
	case errCodeInsufficientResources, errCodeAccountResources, errCodeStorageResources, errCodeMemoryResources:
		return RefusedStorage
	case errCodeStoreFailed:
		d := strings.ToLower(apiErr.Description)
		switch {
		case strings.Contains(d, "per subject"):
			return RefusedQuota
		case strings.Contains(d, "maximum bytes"), strings.Contains(d, "maximum messages"):
			return RefusedFull
		}
	}
	return NotRefused
}
