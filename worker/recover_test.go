package worker_test

import (
	"context"
	"encoding/json"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/contract/wire"
	"github.com/sys1hq/sys1/worker/natsconn/natstest"
)

// decideWithoutRunID publishes body with no Sys1-Run-Id, so the worker derives the run's id,
// and waits for the reply.
func (h *harness) decideWithoutRunID(body []byte) (runID string, status contract.Status) {
	h.t.Helper()
	inbox := h.nc.NewInbox()
	sub, err := h.nc.SubscribeSync(inbox)
	if err != nil {
		h.t.Fatal(err)
	}
	defer sub.Unsubscribe()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m := &nats.Msg{Subject: "sys1.decide.svc-a", Data: body, Header: nats.Header{}}
	m.Header.Set(wire.HeaderReplyTo, inbox)
	if _, err := h.js.PublishMsg(ctx, m); err != nil {
		h.t.Fatalf("publish: %v", err)
	}
	reply, err := sub.NextMsgWithContext(ctx)
	if err != nil {
		h.t.Fatalf("no reply: %v", err)
	}
	var env struct {
		RunID  string          `json:"run_id"`
		Status contract.Status `json:"status"`
	}
	if err := json.Unmarshal(reply.Data, &env); err != nil {
		h.t.Fatalf("reply: %v\n%s", err, reply.Data)
	}
	return env.RunID, env.Status
}

// awaitStream waits until the request stream exists again (a worker recreates it).
func (h *harness) awaitStream() {
	h.t.Helper()
	waitFor(h.t, "the worker recreated the request stream", 30*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := h.js.Stream(ctx, h.topo.RequestsStream)
		return err == nil
	})
}

// NATS comes back without its data (a lost volume): the running worker recreates the streams,
// the run-id bucket and its consumer, and answers new requests without a restart.
func TestWorkerRecoversWhenNATSLosesItsData(t *testing.T) {
	t.Parallel() // waits out failovers and retries, not the CPU: runs beside the others
	h := newHarness(t)
	r := h.start()
	if rep := h.decide("svc-a", []byte(ticket)); rep.Status != contract.StatusSuccess {
		t.Fatalf("before: %s", rep.Raw)
	}

	port := h.srv.Addr().(*net.TCPAddr).Port
	h.srv.Shutdown()
	h.srv.WaitForShutdown()
	h.srv = natstest.Start(t, func(o *server.Options) { o.MaxPayload, o.Port = 8<<20, port }) // an empty store
	h.awaitStream()

	if rep := h.decide("svc-a", []byte(ticket)); rep.Status != contract.StatusSuccess {
		t.Fatalf("after: %s", rep.Raw)
	}
	// The counter moves just after the reply is published.
	waitFor(t, "two runs counted as succeeded", 10*time.Second, func() bool { return r.w.Stats().Succeeded == 2 })
	if !strings.Contains(h.logs.String(), "recreated the JetStream topology") {
		t.Error("no log line says the topology was recreated")
	}
}

// An operator deletes the request stream (to change what cannot be changed in place) while the
// run-id bucket keeps its entries. The recreated stream numbers messages from 1 again, so a
// run without an id must not inherit the derived id of the old stream's first run: that would
// answer it with the old run's stored outcome.
func TestRecreatedRequestStreamDoesNotReuseDerivedRunIDs(t *testing.T) {
	t.Parallel() // waits out failovers and retries, not the CPU: runs beside the others
	h := newHarness(t)
	r := h.start()
	firstID, status := h.decideWithoutRunID([]byte(ticket))
	if status != contract.StatusSuccess || !strings.HasPrefix(firstID, h.topo.RequestsStream+"~1~") {
		t.Fatalf("first run: %s %s, want a derived id for sequence 1", firstID, status)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := h.js.DeleteStream(ctx, h.topo.RequestsStream); err != nil {
		t.Fatal(err)
	}
	h.awaitStream()

	secondID, status := h.decideWithoutRunID([]byte(ticket))
	if status != contract.StatusSuccess || !strings.HasPrefix(secondID, h.topo.RequestsStream+"~1~") {
		t.Fatalf("second run: %s %s, want a derived id for sequence 1 of the new stream", secondID, status)
	}
	if secondID == firstID {
		t.Fatalf("the new stream's first run got the old one's id %s", firstID)
	}
	st := r.w.Stats()
	if st.Replayed != 0 || h.fake.Calls() != 2 {
		t.Errorf("replayed %d runs and the provider saw %d calls; want 0 replays and 2 calls (each run scored)", st.Replayed, h.fake.Calls())
	}
	if got := len(h.records()); got != 2 {
		t.Errorf("%d records, want 2 (one per run)", got)
	}
}

// The run-id bucket and SYS1_RUNS are deleted under a running worker while its consumer stays:
// the runs that cannot store their outcome or record are retried, the worker recreates what is
// missing, and they finish.
func TestWorkerRecreatesADeletedBucketAndRunsStream(t *testing.T) {
	t.Parallel() // waits out failovers and retries, not the CPU: runs beside the others
	h := newHarness(t)
	// Runs that cannot store their outcome are redelivered on the retry schedule, and those
	// deliveries count: give them a schedule (like the defaults, 1 s doubling over 5 deliveries)
	// that outlasts the wait before the topology is recreated.
	r := h.start(func(o *replicaOpts) {
		o.cfg.RetryBase, o.cfg.RetryMax, o.cfg.MaxDeliver = 300*time.Millisecond, time.Second, 10
	})
	if rep := h.decide("svc-a", []byte(ticket)); rep.Status != contract.StatusSuccess {
		t.Fatalf("before: %s", rep.Raw)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := h.js.DeleteKeyValue(ctx, h.topo.RunsBucket); err != nil {
		t.Fatal(err)
	}
	if err := h.js.DeleteStream(ctx, h.topo.RunsStream); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(h.logs.String())
		}
	})
	rep := h.decide("svc-a", []byte(ticket))
	if rep.Status != contract.StatusSuccess {
		t.Fatalf("after: %s", rep.Raw)
	}
	if rec := h.recordByRun(rep.RunID); rec.Status != contract.StatusSuccess {
		t.Errorf("record after recreation: %s", rec.Status)
	}
	waitFor(t, "two runs counted as succeeded", 10*time.Second, func() bool { return r.w.Stats().Succeeded == 2 })
}
