package outbox

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/contract/wire"
	"github.com/sys1hq/sys1/worker/topology"
)

type keepAlive struct{ beats int }

func (k *keepAlive) InProgress() error { k.beats++; return nil }

// roomFor refuses every write to full, the way the replica's storage classifies a stream
// that answered "maximum bytes exceeded".
type roomFor struct{ full string }

func (r roomFor) Note(stream string, err error) error {
	if err != nil && stream == r.full {
		return &Refused{Stream: stream, Refusal: topology.RefusedFull, Err: err}
	}
	return err
}

func writer(cfg *Config) (Writer, *keepAlive) {
	k := &keepAlive{}
	return cfg.For(k, zerolog.Nop()), k
}

func TestStoreRetriesAMomentaryFailureInPlaceKeepingTheDeliveryAlive(t *testing.T) {
	w, k := writer(&Config{StoreRetry: time.Minute, AckWait: 30 * time.Second})
	calls := 0
	err := w.Store(context.Background(), "store", "RUNS", func(context.Context) error {
		calls++
		if calls < 3 {
			return nats.ErrTimeout
		}
		return nil
	})
	if err != nil || calls != 3 {
		t.Fatalf("Store = %v after %d calls, want success on the third", err, calls)
	}
	if k.beats != 2 {
		t.Fatalf("InProgress called %d times, want once per retry (2)", k.beats)
	}
}

func TestStoreGivesUpWhenTheRetryTimeIsSpent(t *testing.T) {
	w, _ := writer(&Config{StoreRetry: 120 * time.Millisecond, AckWait: time.Second})
	calls := 0
	err := w.Store(context.Background(), "store", "RUNS", func(context.Context) error { calls++; return nats.ErrTimeout })
	if !errors.Is(err, nats.ErrTimeout) {
		t.Fatalf("Store = %v, want the last timeout", err)
	}
	if calls < 2 || calls > 4 {
		t.Fatalf("%d attempts in 120 ms of retries (50 ms, then 100 ms apart), want 2 or 3", calls)
	}
}

func TestStoreEndsAtOnceOnWhatNoRetryFixes(t *testing.T) {
	for _, tc := range []struct {
		name   string
		stream string
		err    error
		check  func(error) bool
	}{
		{"too large", "RUNS", nats.ErrMaxPayload, func(err error) bool { return errors.Is(err, ErrTooLarge) && IsTooLarge(err) }},
		{"stream max message size", "RUNS", jetstream.ErrStreamMessageExceedsMaximum, IsTooLarge},
		{"final", "RUNS", Final(errors.New("another delivery took the run")), func(err error) bool { return err.Error() == "another delivery took the run" }},
		{"refused for room", "FULL", errors.New("maximum bytes exceeded"), func(err error) bool {
			r, ok := RefusedBy(err)
			return ok && r.Stream == "FULL"
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, k := writer(&Config{StoreRetry: time.Minute, AckWait: time.Second, Room: roomFor{full: "FULL"}})
			calls := 0
			err := w.Store(context.Background(), "store", tc.stream, func(context.Context) error { calls++; return tc.err })
			if calls != 1 || k.beats != 0 || !tc.check(err) {
				t.Fatalf("Store = %v after %d calls (%d keep-alives), want one call ending it", err, calls, k.beats)
			}
		})
	}
}

func TestStoreStopsWithItsContext(t *testing.T) {
	w, _ := writer(&Config{StoreRetry: time.Hour, AckWait: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	calls := 0
	err := w.Store(ctx, "store", "RUNS", func(context.Context) error {
		calls++
		cancel()
		return nats.ErrTimeout
	})
	if err == nil || calls != 1 {
		t.Fatalf("Store = %v after %d calls, want the error after one call once the context ended", err, calls)
	}
}

type streams struct{ msgs []*nats.Msg }

func (s *streams) PublishMsg(_ context.Context, m *nats.Msg, _ ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	s.msgs = append(s.msgs, m)
	return &jetstream.PubAck{}, nil
}

type core struct{ msgs []*nats.Msg }

func (c *core) PublishMsg(m *nats.Msg) error { c.msgs = append(c.msgs, m); return nil }

func TestReplyIsDurableOnlyUnderTheRepliesPrefix(t *testing.T) {
	js, nc := &streams{}, &core{}
	w, _ := writer(&Config{Streams: js, Core: nc, StoreRetry: time.Second, AckWait: time.Second})
	ctx := context.Background()
	if err := w.Reply(ctx, &nats.Msg{Subject: wire.RepliesPrefix + "a.x"}, "reply:1"); err != nil {
		t.Fatal(err)
	}
	if err := w.Reply(ctx, &nats.Msg{Subject: "_INBOX.abc"}, "reply:2"); err != nil {
		t.Fatal(err)
	}
	if len(js.msgs) != 1 || js.msgs[0].Subject != wire.RepliesPrefix+"a.x" || len(nc.msgs) != 1 || nc.msgs[0].Subject != "_INBOX.abc" {
		t.Fatalf("stream got %d, core got %d: want the sys1.replies. reply stored and the inbox reply sent plain", len(js.msgs), len(nc.msgs))
	}
}

func TestRunReplyHeaders(t *testing.T) {
	failed := RunReply("_INBOX.x", "r1", []byte(`{"status":"failed","error":{"code":"SYS1_UPSTREAM_ERROR","message":"m"}}`), contract.StatusFailed)
	if failed.Header.Get(wire.HeaderRunID) != "r1" || failed.Header.Get(wire.HeaderStatus) != string(contract.StatusFailed) ||
		failed.Header.Get(wire.HeaderErrorCode) != "SYS1_UPSTREAM_ERROR" || failed.Header.Get(wire.HeaderReview) != "" {
		t.Fatalf("failed reply headers: %v", failed.Header)
	}
	held := RunReply("_INBOX.x", "r2", []byte(`{"status":"success","review":{"status":"pending"},"answer":"\"review\":{\"status\":\"reviewed\""}`), contract.StatusSuccess)
	if held.Header.Get(wire.HeaderReview) != contract.ReviewPending || held.Header.Get(wire.HeaderErrorCode) != "" {
		t.Fatalf("held reply headers: %v (an answer's text must not read as a review status)", held.Header)
	}
}
