package client_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sys1hq/sys1/contract/wire"
	"github.com/sys1hq/sys1/worker/client"
	"github.com/sys1hq/sys1/worker/natsconn/natstest"
	"github.com/sys1hq/sys1/worker/topology"
)

func TestPublishSetsTheSpecHeaders(t *testing.T) {
	srv := natstest.Start(t)
	nc, js := natstest.Connect(t, srv)
	ctx := context.Background()
	if _, err := topology.Ensure(ctx, js, topology.Default()); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	id, err := c.Publish(ctx, client.Request{Caller: "svc-a.batch", Body: []byte(`{"x":1}`), Deadline: deadline, Token: "tok", ReplyTo: "_INBOX.svc-a.r"})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(id, "r-") {
		t.Errorf("fresh run id %q", id)
	}
	s, _ := js.Stream(ctx, "SYS1_REQUESTS")
	m, err := s.GetLastMsgForSubject(ctx, "sys1.decide.svc-a.batch")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"Sys1-Run-Id": id, "Nats-Msg-Id": id, "Sys1-Reply-To": "_INBOX.svc-a.r",
		"Sys1-Deadline": "2030-01-02T03:04:05Z", "Authorization": "Bearer tok",
	}
	for k, v := range want {
		if got := m.Header.Get(k); got != v {
			t.Errorf("%s = %q, want %q", k, got, v)
		}
	}
	if string(m.Data) != `{"x":1}` {
		t.Errorf("body changed: %s", m.Data)
	}

	// The same run id again inside the de-duplication window is reported, not silently lost.
	if _, err := c.Publish(ctx, client.Request{Caller: "svc-a", Body: []byte(`{}`), RunID: id}); !errors.Is(err, client.ErrDuplicate) {
		t.Errorf("want ErrDuplicate, got %v", err)
	}
}

func TestPublishRefusesBadCallersAndMissingStreams(t *testing.T) {
	srv := natstest.Start(t)
	nc, _ := natstest.Connect(t, srv)
	c, _ := client.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, caller := range []string{"", "a b", "a.*", "a.>", "a..b"} {
		if _, err := c.Publish(ctx, client.Request{Caller: caller, Body: []byte(`{}`)}); err == nil || errors.Is(err, client.ErrNoStream) {
			t.Errorf("caller %q: want a caller error, got %v", caller, err)
		}
	}
	if _, err := c.Publish(ctx, client.Request{Caller: "svc-a", Body: []byte(`{}`)}); !errors.Is(err, client.ErrNoStream) {
		t.Errorf("no stream: want ErrNoStream, got %v", err)
	}
	if _, err := c.Decide(ctx, client.Request{Caller: "svc-a", Body: []byte(`{}`), ReplyTo: "_INBOX.x"}); err == nil {
		t.Error("Decide with a custom ReplyTo must be refused")
	}
}

// TestDecideTakesTheReplyUnderAnotherRunID: the worker answers a run id it refuses under the
// id it derived; Decide must return that reply, not wait for one that never comes.
func TestDecideTakesTheReplyUnderAnotherRunID(t *testing.T) {
	srv := natstest.Start(t)
	nc, js := natstest.Connect(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := topology.Ensure(ctx, js, topology.Default()); err != nil {
		t.Fatal(err)
	}
	// A stand-in worker: answers every request under a derived run id.
	worker, err := nc.Subscribe(wire.DecideSubjects, func(m *nats.Msg) {
		r := nats.NewMsg(m.Header.Get(wire.HeaderReplyTo))
		r.Header.Set(wire.HeaderRunID, "SYS1_REQUESTS~1")
		r.Header.Set(wire.HeaderStatus, "failed")
		r.Data = []byte(`{"run_id":"SYS1_REQUESTS~1","status":"failed","result":null,"error":{"code":"SYS1_INVALID_INPUT","message":"[SYS1_INVALID_INPUT] Sys1-Run-Id: bad","status":400},"attempts":[],"queued_ms":0,"latency_ms":0}`)
		_ = nc.PublishMsg(r)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = worker.Unsubscribe() }()
	c, _ := client.New(nc)
	rep, err := c.Decide(ctx, client.Request{Caller: "svc-a", Body: []byte(`{}`), RunID: "has space"})
	if err != nil {
		t.Fatalf("Decide: %v", err)
	}
	if rep.RunID != "SYS1_REQUESTS~1" || rep.Error == nil || rep.Error.Code != "SYS1_INVALID_INPUT" {
		t.Errorf("reply %s", rep.Raw)
	}
}

func TestParseReply(t *testing.T) {
	m := nats.NewMsg("_INBOX.x")
	m.Data = []byte(`{"run_id":"r1","status":"failed","result":null,"error":{"code":"SYS1_EXPIRED","message":"[SYS1_EXPIRED] late","status":408},"attempts":[],"queued_ms":1,"latency_ms":2}`)
	rep, err := client.ParseReply(m)
	if err != nil {
		t.Fatal(err)
	}
	if rep.RunID != "r1" || rep.Error == nil || rep.Error.Code != "SYS1_EXPIRED" || rep.Error.Status != 408 || rep.QueuedMS != 1 {
		t.Errorf("%+v", rep.Reply)
	}
	m.Data = []byte(`not json`)
	if _, err := client.ParseReply(m); err == nil {
		t.Error("want an error for a non-JSON reply")
	}
}

// TestDecideWithoutPermissionForItsInbox: under deploy/nats's permissions a producer may read
// only _INBOX.<user>.>. Without the matching inbox prefix Decide must say so at once, before
// anything is published, instead of storing the request and waiting out its context for a
// reply (and a publish ack) that can never arrive.
func TestDecideWithoutPermissionForItsInbox(t *testing.T) {
	srv := natstest.Start(t, func(o *server.Options) {
		o.Users = []*server.User{
			{Username: "admin", Password: "admin-pw"},
			{Username: "svc-a", Password: "svc-a-pw", Permissions: &server.Permissions{
				Publish:   &server.SubjectPermission{Allow: []string{"sys1.decide.svc-a", "sys1.decide.svc-a.>"}},
				Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX.svc-a.>"}},
			}},
		}
	})
	admin, js := natstest.Connect(t, srv, nats.UserInfo("admin", "admin-pw"))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := topology.Ensure(ctx, js, topology.Default()); err != nil {
		t.Fatal(err)
	}
	// A stand-in worker answering every request on its reply subject.
	worker, err := admin.Subscribe(wire.DecideSubjects, func(m *nats.Msg) {
		r := nats.NewMsg(m.Header.Get(wire.HeaderReplyTo))
		r.Data = []byte(`{"run_id":"` + m.Header.Get(wire.HeaderRunID) + `","status":"success","result":null,"error":null,"attempts":[],"queued_ms":0,"latency_ms":0}`)
		_ = admin.PublishMsg(r)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = worker.Unsubscribe() }()

	nc, _ := natstest.Connect(t, srv, nats.UserInfo("svc-a", "svc-a-pw"))
	c, _ := client.New(nc)
	start := time.Now()
	_, err = c.Decide(ctx, client.Request{Caller: "svc-a", Body: []byte(`{}`), RunID: "denied-1"})
	if !errors.Is(err, nats.ErrPermissionViolation) || !strings.Contains(err.Error(), "inbox prefix") {
		t.Fatalf("want a permission error naming the inbox prefix, got %v after %s", err, time.Since(start))
	}
	s, _ := js.Stream(ctx, "SYS1_REQUESTS")
	if info, err := s.Info(ctx); err != nil || info.State.Msgs != 0 {
		t.Fatalf("nothing may be published when no reply can be read: %+v, %v", info, err)
	}
	// Publish cannot get its JetStream ack either: it says why, not just that it timed out.
	pctx, pcancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer pcancel()
	if _, err := c.Publish(pctx, client.Request{Caller: "svc-a", Body: []byte(`{}`)}); !errors.Is(err, nats.ErrPermissionViolation) || !strings.Contains(err.Error(), "inbox prefix") {
		t.Fatalf("Publish: want a permission error naming the inbox prefix, got %v", err)
	}

	nc, _ = natstest.Connect(t, srv, nats.UserInfo("svc-a", "svc-a-pw"), nats.CustomInboxPrefix("_INBOX.svc-a"))
	c, _ = client.New(nc)
	rep, err := c.Decide(ctx, client.Request{Caller: "svc-a", Body: []byte(`{}`), RunID: "allowed-1"})
	if err != nil || rep.RunID != "allowed-1" {
		t.Fatalf("with the inbox prefix: %v", err)
	}
}

// A request stream between leaders is not a missing one (issue 24: sys1 batch run gave up,
// exit 2, "no JetStream stream accepts sys1.batch.*", while a NATS node's replicas elected a
// new leader). With two of three nodes gone the stream has no leader: the publish is refused
// with ErrNoLeader (publish again), never ErrNoStream; once a node is back it is stored.
func TestPublishToALeaderlessStreamIsNotANoStream(t *testing.T) {
	c := natstest.StartCluster(t, 3)
	nc, err := nats.Connect(c.URLs(0), nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	topo := topology.Default()
	topo.Replicas = 3
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := topology.Ensure(ctx, js, topo); err != nil {
		t.Fatal(err)
	}
	cl, _ := client.New(nc)
	c.Shutdown(1)
	c.Shutdown(2)
	pctx, pcancel := context.WithTimeout(ctx, 3*time.Second)
	_, err = cl.Publish(pctx, client.Request{Caller: "svc-a", Body: []byte(`{}`), RunID: "leaderless-1"})
	pcancel()
	if err == nil || errors.Is(err, client.ErrNoStream) {
		t.Fatalf("publish to a stream without a leader: %v; want a retryable error, not ErrNoStream", err)
	}
	t.Logf("without a leader: %v (ErrNoLeader: %v)", err, errors.Is(err, client.ErrNoLeader))
	c.Restart(1)
	natstest.WaitFor(t, 60*time.Second, "the request stored once a node is back", func() bool {
		pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
		defer pcancel()
		_, err := cl.Publish(pctx, client.Request{Caller: "svc-a", Body: []byte(`{}`), RunID: "leaderless-1"})
		return err == nil || errors.Is(err, client.ErrDuplicate)
	})
}
