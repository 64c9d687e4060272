package topology_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sys1hq/sys1/contract/wire"
	"github.com/sys1hq/sys1/worker/natsconn/natstest"
	"github.com/sys1hq/sys1/worker/topology"
)

func TestFlowOfEverySubject(t *testing.T) {
	for _, tc := range []struct {
		subject string
		want    topology.Flow
		ok      bool
	}{
		{"sys1.decide.billing", topology.Flow{Lane: topology.LaneInteractive, Caller: "billing"}, true},
		{"sys1.decide.billing.eu.urgent", topology.Flow{Lane: topology.LaneInteractive, Caller: "billing"}, true},
		{"sys1.batch.billing.b-7", topology.Flow{Lane: topology.LaneBatch, Caller: "billing", Batch: "b-7"}, true},
		{"sys1.labels.billing", topology.Flow{Lane: topology.LaneLabels, Caller: "billing"}, true},
		{"sys1.labels.billing.accepted", topology.Flow{}, false}, // a checked label, not a submission
		{"sys1.batch.billing", topology.Flow{}, false},           // no batch id
		{"sys1.batch.billing.b.x", topology.Flow{}, false},
		{"sys1.decide.", topology.Flow{}, false},
		{"sys1.runs.succeeded", topology.Flow{}, false},
	} {
		got, ok := topology.FlowOf(tc.subject)
		if ok != tc.ok || got != tc.want {
			t.Errorf("FlowOf(%q) = %+v %v, want %+v %v", tc.subject, got, ok, tc.want, tc.ok)
		}
	}
}

func TestFlowConsumerNamesNeverCollide(t *testing.T) {
	c := topology.Default()
	flows := []topology.Flow{
		{Lane: topology.LaneInteractive, Caller: "billing"},
		{Lane: topology.LaneInteractive, Caller: "batch"},
		{Lane: topology.LaneInteractive, Caller: "batch-billing"},
		{Lane: topology.LaneBatch, Caller: "billing", Batch: "b1"},
		{Lane: topology.LaneBatch, Caller: "billing~b1", Batch: "x"},
		{Lane: topology.LaneLabels, Caller: "billing"},
		{Lane: topology.LaneInteractive, Caller: "svc/reports@example.com"},
		{Lane: topology.LaneInteractive, Caller: "=3fa"},
		{Lane: topology.LaneInteractive, Caller: strings.Repeat("x", 300)},
		{Lane: topology.LaneInteractive, Caller: strings.Repeat("x", 301)},
	}
	seen := map[string]topology.Flow{}
	for _, f := range flows {
		name := c.FlowConsumer(f)
		if other, dup := seen[name]; dup {
			t.Fatalf("%+v and %+v share the consumer %s", f, other, name)
		}
		seen[name] = f
		if len(name) > 255 || strings.ContainsAny(name, " \t\r\n\f.*>/\\") {
			t.Errorf("%q is not a consumer name JetStream accepts", name)
		}
		if !c.IsFlowConsumer(f.Lane, name) || topology.SharedName(name) != c.FlowConsumerPattern(f.Lane)[:len(c.FlowConsumerPattern(f.Lane))-2] {
			t.Errorf("%s is not recognised as a flow consumer of %s", name, f.Lane)
		}
	}
	if got := c.FlowConsumer(topology.Flow{Lane: topology.LaneInteractive, Caller: "billing"}); got != "sys1-worker~billing" {
		t.Errorf("a plain caller's consumer is %q, want the readable sys1-worker~billing", got)
	}
	if c.IsFlowConsumer(topology.LaneInteractive, c.FlowConsumer(topology.Flow{Lane: topology.LaneBatch, Caller: "a", Batch: "b"})) {
		t.Error("a batch flow's consumer is taken for an interactive one")
	}
}

// TestFlowConsumersShareTheWorkQueue: flows' consumers read their own subjects side by side
// on the work queue, the stream republishes each arrival's headers (no body) on
// sys1.arrivals.<subject>, and an idle flow consumer is removed by JetStream.
func TestFlowConsumersShareTheWorkQueue(t *testing.T) {
	nc, js := natstest.Connect(t, natstest.Start(t))
	ctx := context.Background()
	cfg := topology.Default()
	cfg.FlowInactiveThreshold = time.Second
	if _, err := topology.Ensure(ctx, js, cfg); err != nil {
		t.Fatal(err)
	}
	arrivals, err := nc.SubscribeSync(wire.ArrivalsSubjects)
	if err != nil {
		t.Fatal(err)
	}
	a := topology.Flow{Lane: topology.LaneInteractive, Caller: "a"}
	b := topology.Flow{Lane: topology.LaneInteractive, Caller: "b"}
	ab := topology.Flow{Lane: topology.LaneBatch, Caller: "a", Batch: "b1"}
	cons := map[topology.Flow]jetstream.Consumer{}
	for _, f := range []topology.Flow{a, b, ab} {
		c, err := js.CreateOrUpdateConsumer(ctx, cfg.RequestsStream, cfg.FlowConsumerConfig(f))
		if err != nil {
			t.Fatalf("%s: %v", cfg.FlowConsumer(f), err)
		}
		cons[f] = c
	}
	for _, subject := range []string{"sys1.decide.a", "sys1.decide.a.more", "sys1.decide.b", "sys1.batch.a.b1"} {
		if _, err := js.Publish(ctx, subject, []byte(`{"body":"secret"}`)); err != nil {
			t.Fatal(err)
		}
	}
	for _, want := range []string{"sys1.decide.a", "sys1.decide.a.more", "sys1.decide.b", "sys1.batch.a.b1"} {
		m, err := arrivals.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatalf("no arrival for %s: %v", want, err)
		}
		if m.Subject != wire.ArrivalsPrefix+want || len(m.Data) != 0 || m.Header.Get("Nats-Msg-Size") == "" {
			t.Fatalf("arrival %s %q %v, want the headers of %s only", m.Subject, m.Data, m.Header, want)
		}
	}
	for f, want := range map[topology.Flow][]string{a: {"sys1.decide.a", "sys1.decide.a.more"}, b: {"sys1.decide.b"}, ab: {"sys1.batch.a.b1"}} {
		// A waiting fetch: a consumer learns of a stored message a moment after the stream
		// republished it (worker/fair rechecks a fresh arrival for that reason).
		mb, err := cons[f].Fetch(10, jetstream.FetchMaxWait(300*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for m := range mb.Messages() {
			got = append(got, m.Subject())
			_ = m.Ack()
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s read %v, want %v", cfg.FlowConsumer(f), got, want)
		}
	}
	// Idle for longer than the threshold, with nothing in hand: JetStream removes it.
	natstest.WaitFor(t, 15*time.Second, "the idle flow consumer removed after its inactive threshold", func() bool {
		_, err := js.Consumer(ctx, cfg.RequestsStream, cfg.FlowConsumer(b))
		return err != nil
	})
}

// TestModesRemoveEachOthersConsumers: a fleet switching to fair share removes the lanes'
// shared consumers (a work queue refuses a flow consumer beside them), and back again the
// flow consumers; the messages stay in the stream.
func TestModesRemoveEachOthersConsumers(t *testing.T) {
	js := jetStream(t)
	ctx := context.Background()
	shared := topology.Default()
	shared.FairShare = false
	if _, err := topology.Ensure(ctx, js, shared); err != nil {
		t.Fatal(err)
	}
	for _, ensure := range []func(context.Context, jetstream.JetStream, topology.Config) (jetstream.Consumer, error){topology.EnsureWorkerConsumer, topology.EnsureBatchConsumer, topology.EnsureLabelsConsumer} {
		if _, err := ensure(ctx, js, shared); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := js.Publish(ctx, "sys1.decide.a", []byte("{}")); err != nil {
		t.Fatal(err)
	}
	fair := topology.Default()
	flow := topology.Flow{Lane: topology.LaneInteractive, Caller: "a"}
	if _, err := js.CreateOrUpdateConsumer(ctx, fair.RequestsStream, fair.FlowConsumerConfig(flow)); err == nil {
		t.Fatal("the work queue took a flow consumer beside the shared one; the removal below tests nothing")
	}
	removed, err := topology.RemoveOtherModeConsumers(ctx, js, fair)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(removed)
	if want := []string{"SYS1_LABEL_SUBMISSIONS/sys1-labels", "SYS1_REQUESTS/sys1-worker", "SYS1_REQUESTS/sys1-worker-batch"}; !slices.Equal(removed, want) {
		t.Fatalf("removed %v, want %v", removed, want)
	}
	c, err := js.CreateOrUpdateConsumer(ctx, fair.RequestsStream, fair.FlowConsumerConfig(flow))
	if err != nil {
		t.Fatal(err)
	}
	if info, _ := c.Info(ctx); info.NumPending != 1 {
		t.Fatalf("the flow consumer has %d pending, want the 1 request sent before the switch", info.NumPending)
	}
	removed, err = topology.RemoveOtherModeConsumers(ctx, js, shared)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(removed, []string{"SYS1_REQUESTS/sys1-worker~a"}) {
		t.Fatalf("switching back removed %v, want the flow consumer", removed)
	}
	if _, err := topology.EnsureWorkerConsumer(ctx, js, shared); err != nil {
		t.Fatal(err)
	}
}
