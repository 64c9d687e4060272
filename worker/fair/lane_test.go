package fair_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/sys1hq/sys1/contract/wire"
	"github.com/sys1hq/sys1/worker/fair"
	"github.com/sys1hq/sys1/worker/natsconn/natstest"
	"github.com/sys1hq/sys1/worker/topology"
)

// laneEnv is a nats-server with sys1's streams and one lane reading them, fed by the
// arrivals as a replica's is.
type laneEnv struct {
	nc   *nats.Conn
	js   jetstream.JetStream
	topo topology.Config
	lane *fair.Lane
}

func newLaneEnv(t *testing.T, l topology.Lane, weight func(string) int, follow bool) *laneEnv {
	t.Helper()
	nc, js := natstest.Connect(t, natstest.Start(t))
	topo := topology.Default()
	if _, err := topology.Ensure(context.Background(), js, topo); err != nil {
		t.Fatal(err)
	}
	e := &laneEnv{nc: nc, js: js, topo: topo,
		lane: fair.NewLane(fair.LaneConfig{Lane: l, Topology: topo, JS: js, Weight: weight, Log: zerolog.Nop()})}
	if follow {
		sub, err := nc.Subscribe(wire.ArrivalsSubjects, func(m *nats.Msg) {
			if f, ok := topology.FlowOf(strings.TrimPrefix(m.Subject, wire.ArrivalsPrefix)); ok {
				e.lane.Notify(f)
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sub.Unsubscribe() })
	}
	return e
}

func (e *laneEnv) publish(t *testing.T, subject string, n int) {
	t.Helper()
	for i := range n {
		if _, err := e.js.PublishAsync(subject, []byte(fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-e.js.PublishAsyncComplete():
	case <-time.After(30 * time.Second):
		t.Fatal("publishes not acknowledged")
	}
}

// waitActive waits until the lane serves flows flows of callers callers (their consumers
// created).
func (e *laneEnv) waitActive(t *testing.T, flows, callers int) {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		if _, err := e.lane.Take(context.Background(), 0, nil); err != nil {
			t.Fatal(err)
		}
		if f, c := e.lane.Active(); f >= flows && c >= callers {
			return
		}
		select {
		case <-e.lane.Ready():
		case <-time.After(50 * time.Millisecond):
		case <-deadline:
			t.Fatalf("the lane never served %d callers", callers)
		}
	}
}

// take takes up to n messages, waiting for the lane to have them (as an idle pull loop
// does), and acks each; it returns their subjects in order.
func (e *laneEnv) take(t *testing.T, n int) []string {
	t.Helper()
	var got []string
	deadline := time.After(20 * time.Second)
	for len(got) < n {
		_, err := e.lane.Take(context.Background(), n-len(got), func(m jetstream.Msg, f topology.Flow) bool {
			got = append(got, m.Subject())
			_ = m.Ack()
			return true
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(got) >= n {
			break
		}
		select {
		case <-e.lane.Ready():
		case <-time.After(50 * time.Millisecond): // the fresh recheck's own timer may be due
		case <-deadline:
			t.Fatalf("took %d of %d: %v", len(got), n, got)
		}
	}
	return got
}

func count(subjects []string, subject string) int {
	n := 0
	for _, s := range subjects {
		if s == subject {
			n++
		}
	}
	return n
}

// TestANewCallerIsServedAheadOfAFlood: caller a has 1,000 requests queued when b's 10
// arrive; slots freeing one at a time alternate between them, so b's 10 are all taken
// within its next 20 slots, while a is still served every other slot.
func TestANewCallerIsServedAheadOfAFlood(t *testing.T) {
	e := newLaneEnv(t, topology.LaneInteractive, nil, true)
	e.publish(t, "sys1.decide.a", 1000)
	first := e.take(t, 8) // a alone: its backlog fills the slots
	if count(first, "sys1.decide.a") != 8 {
		t.Fatalf("first slots: %v", first)
	}
	e.publish(t, "sys1.decide.b", 10)
	e.waitActive(t, 2, 2) // b's consumer is created beside the pull loop
	var next []string
	for range 20 {
		next = append(next, e.take(t, 1)...)
	}
	if b := count(next, "sys1.decide.b"); b != 10 {
		t.Fatalf("b got %d of the 20 slots after its 10 arrived, want 10 (a has ~990 queued): %v", b, next)
	}
	if a := count(next, "sys1.decide.a"); a != 10 {
		t.Fatalf("a got %d of the 20 slots, want 10: %v", a, next)
	}
}

func TestWeightsFromTheLimitsFileShareTheSlots(t *testing.T) {
	e := newLaneEnv(t, topology.LaneInteractive, func(c string) int {
		if c == "heavy" {
			return 3
		}
		return 1
	}, true)
	e.publish(t, "sys1.decide.light", 300)
	e.publish(t, "sys1.decide.heavy", 300)
	e.waitActive(t, 2, 2)
	var got []string
	for range 200 {
		got = append(got, e.take(t, 1)...)
	}
	if h := count(got, "sys1.decide.heavy"); h < 149 || h > 151 {
		t.Fatalf("heavy (weight 3) got %d of 200 slots, want ~150", h)
	}
}

// TestBatchesShareByCallerThenByBatch: caller a's three batches together get what caller b's
// one batch gets.
func TestBatchesShareByCallerThenByBatch(t *testing.T) {
	e := newLaneEnv(t, topology.LaneBatch, nil, true)
	for _, s := range []string{"sys1.batch.a.b1", "sys1.batch.a.b2", "sys1.batch.a.b3", "sys1.batch.b.x"} {
		e.publish(t, s, 100)
	}
	e.waitActive(t, 4, 2)
	var got []string
	for range 120 {
		got = append(got, e.take(t, 1)...)
	}
	if b := count(got, "sys1.batch.b.x"); b != 60 {
		t.Fatalf("caller b's batch got %d of 120, want ~60 (callers share first)", b)
	}
	for _, s := range []string{"sys1.batch.a.b1", "sys1.batch.a.b2", "sys1.batch.a.b3"} {
		if n := count(got, s); n != 20 {
			t.Fatalf("%s got %d of caller a's ~60, want ~20 each", s, n)
		}
	}
}

// TestDiscoveryFindsWhatNoArrivalAnnounced: a lane that missed every arrival (a replica
// started after the requests were stored, or an arrival lost in a failover) finds them all by
// reading the stream's subjects.
func TestDiscoveryFindsWhatNoArrivalAnnounced(t *testing.T) {
	e := newLaneEnv(t, topology.LaneInteractive, nil, false)
	e.publish(t, "sys1.decide.a", 5)
	e.publish(t, "sys1.decide.b.eu", 5)
	stream, err := e.js.Stream(context.Background(), e.topo.RequestsStream)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.lane.Discover(context.Background(), stream); err != nil {
		t.Fatal(err)
	}
	per, total := e.lane.Waiting()
	if total != 10 || per["a"] != 5 || per["b"] != 5 {
		t.Fatalf("discovery counted %v (%d in all), want a:5 b:5", per, total)
	}
	got := e.take(t, 10)
	if count(got, "sys1.decide.a") != 5 || count(got, "sys1.decide.b.eu") != 5 {
		t.Fatalf("took %v", got)
	}
}

// TestAFlowConsumerRemovedWhileIdleIsCreatedAgain: JetStream removes an idle flow's consumer;
// the caller's next request creates it again and is served.
func TestAFlowConsumerRemovedWhileIdleIsCreatedAgain(t *testing.T) {
	e := newLaneEnv(t, topology.LaneInteractive, nil, true)
	e.publish(t, "sys1.decide.a", 1)
	e.take(t, 1)
	name := e.topo.FlowConsumer(topology.Flow{Lane: topology.LaneInteractive, Caller: "a"})
	if err := e.js.DeleteConsumer(context.Background(), e.topo.RequestsStream, name); err != nil {
		t.Fatal(err)
	}
	e.publish(t, "sys1.decide.a", 3)
	if got := e.take(t, 3); count(got, "sys1.decide.a") != 3 {
		t.Fatalf("after its consumer was removed, took %v", got)
	}
}

// TestManyCallersAtOnce: 300 callers arriving together are all served, none twice, and
// creating their consumers never holds up the ones that exist.
func TestManyCallersAtOnce(t *testing.T) {
	e := newLaneEnv(t, topology.LaneInteractive, nil, true)
	var wg sync.WaitGroup
	for i := range 300 {
		wg.Go(func() {
			if _, err := e.js.Publish(context.Background(), fmt.Sprintf("sys1.decide.c%03d", i), []byte("x")); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	got := e.take(t, 300)
	seen := map[string]bool{}
	for _, s := range got {
		if seen[s] {
			t.Fatalf("%s taken twice", s)
		}
		seen[s] = true
	}
}
