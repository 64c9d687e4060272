package budget

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sys1hq/sys1/worker/natsconn/natstest"
	"github.com/sys1hq/sys1/worker/topology"
)

// clock is a settable test clock, shared by the replicas of a test (or not, to skew them).
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock(t time.Time) *clock { return &clock{t: t} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Set(t time.Time) {
	c.mu.Lock()
	c.t = t
	c.mu.Unlock()
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// replica is one worker replica's view: its own NATS connection, KV handle and Budget.
type replica struct {
	nc *nats.Conn
	kv jetstream.KeyValue
	b  *Budget
}

// fleet starts a nats-server, creates the limits bucket as the worker does and opens n
// replicas on it, each on its own connection. configure adjusts each replica's Config.
func fleet(t testing.TB, n int, configure func(i int, c *Config)) (*server.Server, []*replica) {
	t.Helper()
	srv := natstest.Start(t)
	_, js := natstest.Connect(t, srv)
	ctx := context.Background()
	cfg := topology.Default().LimitsBucketConfig()
	if _, err := js.CreateKeyValue(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	reps := make([]*replica, n)
	for i := range reps {
		nc, js := natstest.Connect(t, srv)
		kv, err := js.KeyValue(ctx, cfg.Bucket)
		if err != nil {
			t.Fatal(err)
		}
		c := Config{KV: kv}
		if configure != nil {
			configure(i, &c)
		}
		b, err := New(c)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(b.Close)
		reps[i] = &replica{nc: nc, kv: kv, b: b}
	}
	return srv, reps
}

// counter reads a day counter straight from the bucket.
func counter(t testing.TB, kv jetstream.KeyValue, caller, rule string, day time.Time) dayCounter {
	t.Helper()
	var c dayCounter
	b := &Budget{kv: kv}
	if err := b.read(context.Background(), dayKey(caller, rule, utcDay(day)), &c); err != nil {
		t.Fatal(err)
	}
	return c
}
