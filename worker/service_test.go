package worker_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/contract/wire"
	"github.com/sys1hq/sys1/provider/ollamatest"
	"github.com/sys1hq/sys1/provider/systemonetest"
	"github.com/sys1hq/sys1/worker"
	"github.com/sys1hq/sys1/worker/client"
	"github.com/sys1hq/sys1/worker/fleet"
	"github.com/sys1hq/sys1/worker/pause"
	"github.com/sys1hq/sys1/worker/topology"
)

// fleetHealth is every replica's health; with want ≥ 0 it waits until that many answer
// (replicas register their service as they start).
func (h *harness) fleetHealth(want int) []worker.Health {
	h.t.Helper()
	var out []worker.Health
	ask := func() bool {
		answers, err := fleet.Ask(context.Background(), h.nc, wire.HealthSubject, 5*time.Second)
		if err != nil {
			h.t.Fatal(err)
		}
		out = out[:0]
		for _, a := range answers {
			var hl worker.Health
			if err := json.Unmarshal(a, &hl); err != nil {
				h.t.Fatalf("health %s: %v", a, err)
			}
			out = append(out, hl)
		}
		return want < 0 || len(out) == want
	}
	waitFor(h.t, fmt.Sprint(want, " replicas answering health"), 10*time.Second, ask)
	return out
}

func validate(t *testing.T, schema string, doc []byte) {
	t.Helper()
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(doc))
	if err != nil {
		t.Fatal(err)
	}
	if err := compileSchema(t, schema).Validate(inst); err != nil {
		t.Errorf("%s does not match its schema: %v\n%s", schema, err, doc)
	}
}

// TestReplicasAnswerHealthAndCapabilitiesOverMicro: every replica registers micro service
// sys1 (found by $SRV.PING like `nats micro ls` does); health and capabilities come from each
// and match their published schemas; no secret is in either.
func TestReplicasAnswerHealthAndCapabilitiesOverMicro(t *testing.T) {
	t.Parallel() // waits out failovers and retries, not the CPU: runs beside the others
	const key = "sk-ollama-secret-key-0123456789"
	h := newHarness(t, ollamatest.WithAPIKey(key))
	h.apiKey = key
	for _, id := range []string{"replica-a", "replica-b"} {
		h.start(func(o *replicaOpts) { o.cfg.ID = id })
	}
	// Found the way `nats micro ls` finds services: both replicas answer a ping.
	waitFor(t, "two replicas registered", 10*time.Second, func() bool {
		pings, err := fleet.Ask(context.Background(), h.nc, "$SRV.PING."+wire.ServiceName, time.Second)
		return err == nil && len(pings) == 2
	})
	var ids []string
	for _, hl := range h.fleetHealth(2) {
		ids = append(ids, hl.Replica)
		if hl.Status != worker.HealthOK || len(hl.Providers) != 1 || !hl.Providers[0].OK {
			t.Errorf("health of %s: %+v", hl.Replica, hl)
		}
	}
	if strings.Join(ids, ",") != "replica-a,replica-b" && strings.Join(ids, ",") != "replica-b,replica-a" {
		t.Errorf("replicas %v", ids)
	}
	raw, err := fleet.Ask(context.Background(), h.nc, wire.HealthSubject, 5*time.Second)
	if err != nil || len(raw) != 2 {
		t.Fatalf("health: %d answers, %v", len(raw), err)
	}
	caps, err := fleet.Ask(context.Background(), h.nc, wire.CapabilitiesSubject, 5*time.Second)
	if err != nil || len(caps) != 2 {
		t.Fatalf("capabilities: %d answers, %v", len(caps), err)
	}
	for i := range raw {
		validate(t, "health", raw[i])
		validate(t, "capabilities", caps[i])
		for _, doc := range [][]byte{raw[i], caps[i]} {
			if bytes.Contains(doc, []byte(h.apiKey)) || bytes.Contains(doc, []byte(h.fake.URL())) {
				t.Errorf("a secret or a host in %s", doc)
			}
		}
	}
	var c worker.Capabilities
	if err := json.Unmarshal(caps[0], &c); err != nil {
		t.Fatal(err)
	}
	if c.Limits.MaxQuestions != 64 || c.Limits.MaxOptions != 26 || c.Limits.MaxTextBytes != 64<<10 || c.Limits.MaxImageRequestBytes != 32<<20 ||
		c.DefaultModel != "nimble" || len(c.Chain.Providers) != 1 || c.AuthMode != "none" || len(c.Schemas) != 3 || c.MaxDeliver != 3 {
		t.Errorf("capabilities %+v", c)
	}
}

// TestHealthSaysDegradedDownAndPaused: ok with every provider up; degraded when the first is
// down and a later one up; down when none is; paused while the fleet's consumer is paused.
func TestHealthSaysDegradedDownAndPaused(t *testing.T) {
	t.Parallel() // waits out failovers and retries, not the CPU: runs beside the others
	h := newHarness(t)
	hosted := systemonetest.New(t)
	h.start(h.chainOf(hosted, 5), func(o *replicaOpts) {
		o.cfg.ProbeInterval, o.cfg.StatusInterval = 50*time.Millisecond, 50*time.Millisecond
	})
	status := func() string { return h.fleetHealth(1)[0].Status }
	waitFor(t, "ok", 10*time.Second, func() bool { return status() == worker.HealthOK })
	h.fake.SetVersion("0.20.0") // too old for System One: the primary's probe fails
	waitFor(t, "degraded", 10*time.Second, func() bool { return status() == worker.HealthDegraded })
	hosted.Close()
	waitFor(t, "down", 10*time.Second, func() bool { return status() == worker.HealthDown })
	setPause(t, h, topology.LaneInteractive, time.Now().Add(time.Hour), "maintenance")
	waitFor(t, "paused", 10*time.Second, func() bool { return status() == worker.HealthPaused })
	if p := h.fleetHealth(1)[0].Paused; p == nil || p.Reason != "maintenance" || p.Until == nil {
		t.Errorf("pause %+v", p)
	}
}

// TestPauseStopsTheFleetAndLosesNothing: paused, two replicas make no provider call however
// much is queued; resumed, they drain the backlog, and a request whose deadline passed
// meanwhile is answered SYS1_EXPIRED. A replica started during the pause does not resume it.
func TestPauseStopsTheFleetAndLosesNothing(t *testing.T) {
	h := newHarness(t)
	fast := func(o *replicaOpts) { o.cfg.StatusInterval = 50 * time.Millisecond }
	h.start(fast, func(o *replicaOpts) { o.cfg.ID = "a" })
	ctx := context.Background()
	setPause(t, h, topology.LaneInteractive, time.Now().Add(worker.UntilResumed), "")
	h.start(fast, func(o *replicaOpts) { o.cfg.ID = "b" }) // starts while paused
	waitFor(t, "both replicas paused", 10*time.Second, func() bool {
		hs := h.fleetHealth(-1)
		return len(hs) == 2 && hs[0].Status == worker.HealthPaused && hs[1].Status == worker.HealthPaused
	})
	inbox := "_INBOX.svc-a." + nats.NewInbox()[7:]
	sub, _ := h.nc.SubscribeSync(inbox)
	const n = 200
	for i := range n {
		req := client.Request{Caller: "svc-a", Body: []byte(ticket), RunID: fmt.Sprint("queued-", i), ReplyTo: inbox}
		if i == 0 {
			req.RunID, req.Deadline = "expires-while-paused", time.Now().Add(300*time.Millisecond)
		}
		if _, err := h.cl.Publish(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	// Paused is the behaviour under test: give the replicas time in which they would have
	// called the provider.
	time.Sleep(time.Second)
	if calls := h.fake.Calls(); calls != 0 {
		t.Fatalf("%d provider calls while paused", calls)
	}
	if p := h.pending(); p != n {
		t.Fatalf("%d requests in the stream while paused, want %d", p, n)
	}
	clearPause(t, h, topology.LaneInteractive)
	answered := map[string]*client.Reply{}
	for len(answered) < n {
		m, err := sub.NextMsg(30 * time.Second)
		if err != nil {
			t.Fatalf("%d of %d answered after resume: %v", len(answered), n, err)
		}
		rep, _ := client.ParseReply(m)
		answered[rep.RunID] = rep
	}
	if rep := answered["expires-while-paused"]; rep.Status != contract.StatusFailed || rep.Error.Code != contract.CodeExpired {
		t.Errorf("the expired request: %s", rep.Raw)
	}
	if calls := h.fake.Calls(); calls != n-1 {
		t.Errorf("provider calls = %d, want %d", calls, n-1)
	}
}

// setPause pauses a lane as sys1 pause does (KV sys1-fleet).
func setPause(t *testing.T, h *harness, lane topology.Lane, until time.Time, reason string) {
	t.Helper()
	ctx := context.Background()
	kv, err := h.js.KeyValue(ctx, h.topo.FleetBucket)
	if err != nil {
		t.Fatal(err)
	}
	if err := pause.Set(ctx, kv, lane, pause.State{Until: until, Reason: reason, At: time.Now()}); err != nil {
		t.Fatal(err)
	}
}

// clearPause resumes a lane as sys1 resume does.
func clearPause(t *testing.T, h *harness, lane topology.Lane) {
	t.Helper()
	ctx := context.Background()
	kv, err := h.js.KeyValue(ctx, h.topo.FleetBucket)
	if err != nil {
		t.Fatal(err)
	}
	if err := pause.Clear(ctx, kv, lane); err != nil {
		t.Fatal(err)
	}
}
