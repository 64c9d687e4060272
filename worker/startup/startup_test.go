package startup

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

func apiErr(code int, errCode jetstream.ErrorCode, desc string) error {
	return fmt.Errorf("stream SYS1_REQUESTS: cannot create: %w", &jetstream.APIError{Code: code, ErrorCode: errCode, Description: desc})
}

func TestTransient(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"the look-up of issue 24", fmt.Errorf("stream SYS1_REQUESTS: cannot look up: %w", context.DeadlineExceeded), true},
		{"nats timeout", fmt.Errorf("kv: %w", nats.ErrTimeout), true},
		{"no responders", fmt.Errorf("stream info: %w", nats.ErrNoResponders), true},
		{"no stream response", jetstream.ErrNoStreamResponse, true},
		{"reconnecting", nats.ErrConnectionReconnecting, true},
		{"no meta leader", apiErr(503, 10008, "JetStream system temporarily unavailable"), true},
		{"not the leader", apiErr(500, 10009, "JetStream cluster can not handle request"), true},
		{"a node down for R3 placement", apiErr(400, 10005, "no suitable peers for placement"), true},
		{"insufficient resources", apiErr(503, 10023, "insufficient resources"), true},
		{"stream offline", apiErr(500, 10118, "stream is offline"), true},
		{"permission violation", fmt.Errorf("create: %w", nats.ErrPermissionViolation), false},
		{"authorization", nats.ErrAuthorization, false},
		{"replicas on one server", apiErr(500, 10074, "replicas > 1 not supported in non-clustered mode"), false},
		{"invalid config", apiErr(500, 10052, "invalid stream config"), false},
		{"name in use", jetstream.ErrStreamNameAlreadyInUse, false},
		{"sys1's own mismatch", errors.New("stream SYS1_REQUESTS exists with retention limits, sys1 needs workqueue"), false},
		{"the caller's context cancelled", context.Canceled, false},
		{"nil", nil, false},
	} {
		if got := Transient(tc.err); got != tc.want {
			t.Errorf("%s: Transient(%v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}

func fast() Retry {
	return Retry{What: "the test topology", Log: zerolog.Nop(), Min: time.Millisecond, Max: 2 * time.Millisecond}
}

func TestRetryWaitsOutTransientErrors(t *testing.T) {
	r := fast()
	r.PerTry = time.Minute
	var waits []error
	r.OnWait = func(err error, _ time.Duration) { waits = append(waits, err) }
	tries := 0
	err := r.Do(context.Background(), func(ctx context.Context) error {
		tries++
		if _, ok := ctx.Deadline(); !ok {
			t.Error("a try has no deadline of its own")
		}
		if tries < 3 {
			return fmt.Errorf("stream: %w", nats.ErrTimeout)
		}
		return nil
	})
	if err != nil || tries != 3 || len(waits) != 2 {
		t.Fatalf("err %v after %d tries, %d waits; want success on the third try after two waits", err, tries, len(waits))
	}
}

func TestRetryStopsAtAPermanentError(t *testing.T) {
	tries := 0
	bad := errors.New("stream SYS1_REQUESTS exists with retention limits")
	err := fast().Do(context.Background(), func(context.Context) error { tries++; return bad })
	if !errors.Is(err, bad) || tries != 1 {
		t.Fatalf("err %v after %d tries; want the permanent error after one", err, tries)
	}
}

// A request the server refused for permissions is never answered: it times out, and only
// the connection's last error says why. That timeout is permanent.
func TestRetryTreatsATimeoutBehindAPermissionViolationAsPermanent(t *testing.T) {
	r := fast()
	r.LastError = func() error {
		return fmt.Errorf("%w: permissions violation for publish to \"$JS.API.STREAM.INFO.SYS1_REQUESTS\"", nats.ErrPermissionViolation)
	}
	tries := 0
	err := r.Do(context.Background(), func(context.Context) error { tries++; return context.DeadlineExceeded })
	if err == nil || tries != 1 || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err %v after %d tries", err, tries)
	}
}

func TestRetryEndsWithItsContext(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err := fast().Do(ctx, func(context.Context) error { return nats.ErrNoResponders })
	if !errors.Is(err, nats.ErrNoResponders) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err %v; want the last error and the context's", err)
	}
}
