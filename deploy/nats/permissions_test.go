package natsdeploy

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/sys1hq/sys1/worker/auth"
	"github.com/sys1hq/sys1/worker/natsconn"
	"github.com/sys1hq/sys1/worker/topology"
)

// negativeWait bounds a request the server is expected to refuse: a refused request is never
// answered, so it ends in this timeout. The refusal itself is proven by the permissions
// violation the server reports, which every negative check also waits for.
const negativeWait = 300 * time.Millisecond

var passwords = map[string]string{
	"sys1-worker": "worker-pw-ab12", "sys1-sink": "sink-pw-cd34", "sys1-review": "review-pw-ij90",
	"svc-a": "svc-a-pw-ef56", "svc-b": "svc-b-pw-gh78", "sys1-calibrate": "calibrate-pw-kl12",
}

// startFromFile runs nats-server with deploy/nats/nats-server.conf, overriding only the listen
// address and the store directory.
func startFromFile(t *testing.T) *server.Server {
	t.Helper()
	t.Setenv("SYS1_NATS_WORKER_PASSWORD", passwords["sys1-worker"])
	t.Setenv("SYS1_NATS_SINK_PASSWORD", passwords["sys1-sink"])
	t.Setenv("SYS1_NATS_REVIEW_PASSWORD", passwords["sys1-review"])
	t.Setenv("SYS1_NATS_CALIBRATE_PASSWORD", passwords["sys1-calibrate"])
	t.Setenv("SYS1_NATS_SVC_A_PASSWORD", passwords["svc-a"])
	t.Setenv("SYS1_NATS_SVC_B_PASSWORD", passwords["svc-b"])
	s, err := natsconn.StartEmbedded(natsconn.EmbeddedOptions{ConfigFile: "nats-server.conf", Port: -1, StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	return s
}

// user is one authenticated client plus the asynchronous errors (permission violations) the
// server sent it.
type user struct {
	name string
	nc   *nats.Conn
	js   jetstream.JetStream
	errs chan error
}

func connect(t *testing.T, s *server.Server, name string) *user {
	t.Helper()
	u := &user{name: name, errs: make(chan error, 64)}
	nc, err := nats.Connect(s.ClientURL(),
		nats.UserInfo(name, passwords[name]),
		nats.CustomInboxPrefix("_INBOX."+name), // the only inbox the file lets it read
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { u.errs <- err }),
	)
	if err != nil {
		t.Fatalf("%s: connect: %v", name, err)
	}
	t.Cleanup(nc.Close)
	u.nc = nc
	if u.js, err = jetstream.New(nc); err != nil {
		t.Fatal(err)
	}
	return u
}

// expectViolation waits for the server's permissions-violation error mentioning subject.
func (u *user) expectViolation(t *testing.T, kind, subject string) {
	t.Helper()
	timeout := time.After(5 * time.Second)
	for {
		select {
		case err := <-u.errs:
			if strings.Contains(err.Error(), "Permissions Violation for "+kind) && strings.Contains(err.Error(), subject) {
				return
			}
		case <-timeout:
			t.Fatalf("%s: no permissions violation for %s %q", u.name, kind, subject)
		}
	}
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func msgCount(t *testing.T, js jetstream.JetStream, stream string) uint64 {
	t.Helper()
	st, err := js.Stream(ctxT(t, 5*time.Second), stream)
	if err != nil {
		t.Fatalf("stream %s: %v", stream, err)
	}
	return st.CachedInfo().State.Msgs
}

func TestPermissionsFromDeployConfig(t *testing.T) {
	s := startFromFile(t)
	cfg := topology.Default()

	// The worker, connected as the real component does, sets up every stream and its consumer.
	wcfg := natsconn.DefaultConfig()
	wcfg.URL, wcfg.User, wcfg.Password, wcfg.InboxPrefix = s.ClientURL(), "sys1-worker", natsconn.Secret(passwords["sys1-worker"]), "_INBOX.sys1-worker"
	wconn, err := natsconn.Connect(context.Background(), wcfg, "sys1-worker", zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(wconn.Close)
	kv, err := topology.Ensure(ctxT(t, 10*time.Second), wconn.JS, cfg)
	if err != nil {
		t.Fatalf("worker: topology.Ensure: %v", err)
	}
	if _, err := topology.Ensure(ctxT(t, 10*time.Second), wconn.JS, cfg); err != nil {
		t.Fatalf("worker: topology.Ensure (update path): %v", err)
	}
	workerCons, err := topology.EnsureWorkerConsumer(ctxT(t, 10*time.Second), wconn.JS, cfg)
	if err != nil {
		t.Fatalf("worker: consumer: %v", err)
	}
	// Requests that ran out of deliveries: the worker reads their advisories and removes each
	// request once it has answered it.
	deadCons, err := topology.EnsureDeadLetterConsumer(ctxT(t, 10*time.Second), wconn.JS, cfg)
	if err != nil {
		t.Fatalf("worker: dead-letter consumer: %v", err)
	}
	if _, err := deadCons.Fetch(1, jetstream.FetchMaxWait(200*time.Millisecond)); err != nil {
		t.Fatalf("worker: pull dead letters: %v", err)
	}
	requests, err := wconn.JS.Stream(ctxT(t, 5*time.Second), cfg.RequestsStream)
	if err != nil {
		t.Fatal(err)
	}
	// Answered by JetStream (no such message), not refused (a refused request times out).
	if err := requests.DeleteMsg(ctxT(t, 5*time.Second), 1<<40); err == nil || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("worker: remove a request message: %v, want JetStream's answer that there is none", err)
	}

	// The fleet watcher reads every stream's and bucket's size (sys1_worker_stream_bytes):
	// each lookup is answered (found, or not yet created), none refused (a refusal times out).
	for _, name := range []string{cfg.RequestsStream, cfg.RunsStream, cfg.RepliesStream, cfg.ReviewStream, cfg.LabelsStream,
		cfg.LabelSubmissionsStream, cfg.DeadLetterStream, topology.KVStream(cfg.RunsBucket), topology.KVStream(cfg.ReviewBucket),
		topology.KVStream(cfg.CalibrationBucket), topology.KVStream(cfg.CacheBucket), topology.KVStream(cfg.LimitsBucket),
		topology.KVStream(cfg.ReviewSessionsBucket)} {
		st, err := wconn.JS.Stream(ctxT(t, 3*time.Second), name)
		if err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			t.Fatalf("worker: the size of %s: %v", name, err)
		}
		if st != nil && name == cfg.RequestsStream {
			if _, err := st.Info(ctxT(t, 3*time.Second), jetstream.WithSubjectFilter("sys1.decide.*.>")); err != nil {
				t.Fatalf("worker: per-subject counts of %s: %v", name, err)
			}
		}
	}

	svcA := connect(t, s, "svc-a")
	svcB := connect(t, s, "svc-b")
	worker := connect(t, s, "sys1-worker")
	if got := svcA.nc.MaxPayload(); got != 8<<20 {
		t.Fatalf("max_payload from the file: %d, want 8 MiB", got)
	}

	t.Run("producers publish requests under their own name", func(t *testing.T) {
		for _, p := range []struct {
			u       *user
			subject string
		}{{svcA, "sys1.decide.svc-a"}, {svcA, "sys1.decide.svc-a.batch"}, {svcB, "sys1.decide.svc-b"}} {
			// Identity-looking headers and body are the producer's to write; they must not matter.
			msg := &nats.Msg{Subject: p.subject, Data: []byte(`{"caller":"svc-b","roles":["administrator"]}`), Header: nats.Header{}}
			msg.Header.Set("Sys1-Caller", "svc-b")
			msg.Header.Set("X-Caller", "administrator")
			ack, err := p.u.js.PublishMsg(ctxT(t, 5*time.Second), msg)
			if err != nil {
				t.Fatalf("%s → %s: %v", p.u.name, p.subject, err)
			}
			if ack.Stream != cfg.RequestsStream {
				t.Fatalf("ack from %s", ack.Stream)
			}
		}
		if n := msgCount(t, wconn.JS, cfg.RequestsStream); n != 3 {
			t.Fatalf("requests stream holds %d messages, want 3", n)
		}
	})

	t.Run("svc-a cannot publish as svc-b", func(t *testing.T) {
		before := msgCount(t, wconn.JS, cfg.RequestsStream)
		for _, subj := range []string{"sys1.decide.svc-b", "sys1.decide.svc-b.x", "sys1.decide.anonymous"} {
			_, err := svcA.js.Publish(ctxT(t, negativeWait), subj, []byte(`{"claims":"administrator"}`))
			if err == nil {
				t.Fatalf("svc-a published to %s", subj)
			}
			svcA.expectViolation(t, "Publish", subj)
		}
		if after := msgCount(t, wconn.JS, cfg.RequestsStream); after != before {
			t.Fatalf("forged requests landed in the stream: %d → %d", before, after)
		}
	})

	t.Run("producers cannot touch run records, the gate or the JetStream API", func(t *testing.T) {
		runsBefore := msgCount(t, wconn.JS, cfg.RunsStream)
		if err := svcA.nc.Publish("sys1.runs.x", []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
		svcA.expectViolation(t, "Publish", "sys1.runs.x")
		if err := svcA.nc.Publish("sys1.replies.svc-b.r1", []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
		svcA.expectViolation(t, "Publish", "sys1.replies.svc-b.r1")
		if n := msgCount(t, wconn.JS, cfg.RunsStream); n != runsBefore {
			t.Fatal("a producer wrote a run record")
		}

		for _, subj := range []string{"sys1.runs.>", "_INBOX.>", "_INBOX.svc-b.>", "sys1.replies.svc-b.>", "sys1.replies.>", "sys1.decide.>"} {
			if _, err := svcA.nc.SubscribeSync(subj); err != nil {
				t.Fatal(err)
			}
			svcA.expectViolation(t, "Subscription", subj)
		}

		// Stream-level reads, other callers' consumers, the worker's consumer, the KV gate and
		// stream administration: each is refused by the server (a permissions violation on the
		// API subject), not merely unanswered.
		api := func(subject string, call func(ctx context.Context) error) {
			t.Helper()
			if err := call(ctxT(t, negativeWait)); err == nil {
				t.Fatalf("svc-a reached %s", subject)
			}
			svcA.expectViolation(t, "Publish", subject)
		}
		api("$JS.API.STREAM.INFO.SYS1_RUNS", func(ctx context.Context) error {
			_, err := svcA.js.Stream(ctx, cfg.RunsStream)
			return err
		})
		api("$JS.API.CONSUMER.CREATE.SYS1_RUNS.svc-a", func(ctx context.Context) error {
			_, err := svcA.js.CreateOrUpdateConsumer(ctx, cfg.RunsStream, jetstream.ConsumerConfig{Durable: "svc-a"})
			return err
		})
		api("$JS.API.CONSUMER.CREATE.SYS1_REPLIES.svc-a", func(ctx context.Context) error { // unfiltered: every caller's replies
			_, err := svcA.js.CreateOrUpdateConsumer(ctx, cfg.RepliesStream, jetstream.ConsumerConfig{Durable: "svc-a"})
			return err
		})
		api("$JS.API.CONSUMER.CREATE.SYS1_REPLIES.svc-a.sys1.replies.svc-b.>", func(ctx context.Context) error {
			_, err := svcA.js.CreateOrUpdateConsumer(ctx, cfg.RepliesStream, jetstream.ConsumerConfig{Durable: "svc-a", FilterSubject: "sys1.replies.svc-b.>"})
			return err
		})
		api("$JS.API.CONSUMER.CREATE.SYS1_REPLIES.svc-b.sys1.replies.svc-a.>", func(ctx context.Context) error {
			_, err := svcA.js.CreateOrUpdateConsumer(ctx, cfg.RepliesStream, jetstream.ConsumerConfig{Durable: "svc-b", FilterSubject: "sys1.replies.svc-a.>"})
			return err
		})
		for _, subj := range []string{
			"$JS.API.CONSUMER.MSG.NEXT." + cfg.RequestsStream + "." + cfg.WorkerConsumer,
			"$JS.API.CONSUMER.MSG.NEXT." + cfg.RepliesStream + ".svc-b",
			"$JS.API.STREAM.MSG.GET." + cfg.RepliesStream,
			"$JS.API.DIRECT.GET." + cfg.RepliesStream,
			"$JS.API.STREAM.DELETE." + cfg.RequestsStream,
			"$JS.API.STREAM.PURGE." + cfg.RunsStream,
		} {
			api(subj, func(ctx context.Context) error {
				_, err := svcA.nc.RequestWithContext(ctx, subj, []byte(`{"seq":1,"batch":1}`))
				return err
			})
		}
		api("$JS.API.STREAM.INFO.KV_"+cfg.RunsBucket, func(ctx context.Context) error {
			_, err := svcA.js.KeyValue(ctx, cfg.RunsBucket)
			return err
		})
		if err := svcA.nc.Publish("$KV."+cfg.RunsBucket+".run-1", []byte(`{"caller":"svc-a"}`)); err != nil {
			t.Fatal(err)
		}
		svcA.expectViolation(t, "Publish", "$KV."+cfg.RunsBucket+".run-1")
	})

	t.Run("the worker consumes, keeps the gate, replies and records", func(t *testing.T) {
		batch, err := workerCons.Fetch(3, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		// In SYS1_AUTH_MODE=subject the caller the worker derives is the user NATS authenticated,
		// whatever the message claims.
		authn, err := auth.New(context.Background(), auth.Config{Mode: auth.ModeSubject}, zerolog.Nop())
		if err != nil {
			t.Fatal(err)
		}
		var subjects, callers []string
		requests, err := wconn.JS.Stream(ctxT(t, 10*time.Second), "SYS1_REQUESTS")
		if err != nil {
			t.Fatalf("worker: request stream: %v", err)
		}
		for m := range batch.Messages() {
			subjects = append(subjects, m.Subject())
			// The worker reads a request by sequence (is the message owning a run still there?).
			meta, _ := m.Metadata()
			if _, err := requests.GetMsg(ctxT(t, 10*time.Second), meta.Sequence.Stream); err != nil {
				t.Fatalf("worker: get request %d: %v", meta.Sequence.Stream, err)
			}
			id, aerr := authn.Authenticate(context.Background(), m.Subject(), m.Headers())
			if aerr != nil {
				t.Fatalf("authenticate %s: %v", m.Subject(), aerr)
			}
			callers = append(callers, id.Caller)
			if err := m.Ack(); err != nil {
				t.Fatalf("ack: %v", err)
			}
		}
		if batch.Error() != nil {
			t.Fatal(batch.Error())
		}
		if strings.Join(subjects, " ") != "sys1.decide.svc-a sys1.decide.svc-a.batch sys1.decide.svc-b" {
			t.Fatalf("worker got %v", subjects)
		}
		if strings.Join(callers, " ") != "svc-a svc-a svc-b" {
			t.Fatalf("verified callers %v", callers)
		}

		ctx := ctxT(t, 10*time.Second)
		rev, err := kv.Create(ctx, "run-1", []byte(`{"caller":"svc-a"}`))
		if err != nil {
			t.Fatalf("kv create: %v", err)
		}
		if _, err := kv.Update(ctx, "run-1", []byte(`{"caller":"svc-a","done":true}`), rev); err != nil {
			t.Fatalf("kv update: %v", err)
		}
		if e, err := kv.Get(ctx, "run-1"); err != nil || !strings.Contains(string(e.Value()), "done") {
			t.Fatalf("kv get: %v", err)
		}
		if _, err := wconn.JS.Publish(ctx, "sys1.runs.success", []byte(`{"run_id":"run-1"}`)); err != nil {
			t.Fatalf("publish run: %v", err)
		}
		if _, err := wconn.JS.Publish(ctx, "sys1.replies.svc-a.run-1", []byte(`{"run_id":"run-1"}`)); err != nil {
			t.Fatalf("publish durable reply: %v", err)
		}

		// A plain reply into svc-a's inbox reaches svc-a.
		inbox := svcA.nc.NewInbox()
		if !strings.HasPrefix(inbox, "_INBOX.svc-a.") {
			t.Fatalf("inbox %s", inbox)
		}
		sub, err := svcA.nc.SubscribeSync(inbox)
		if err != nil {
			t.Fatal(err)
		}
		if err := svcA.nc.Flush(); err != nil {
			t.Fatal(err)
		}
		if err := worker.nc.Publish(inbox, []byte("reply")); err != nil {
			t.Fatal(err)
		}
		if m, err := sub.NextMsg(5 * time.Second); err != nil || string(m.Data) != "reply" {
			t.Fatalf("svc-a did not get its reply: %v", err)
		}

		// A reply subject naming another caller's request subject must not make the worker
		// publish a request on that caller's behalf.
		if err := worker.nc.Publish("sys1.decide.svc-b", []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
		worker.expectViolation(t, "Publish", "sys1.decide.svc-b")
	})

	t.Run("svc-a reads its durable replies through its own filtered consumer", func(t *testing.T) {
		cons, err := svcA.js.CreateOrUpdateConsumer(ctxT(t, 5*time.Second), cfg.RepliesStream, jetstream.ConsumerConfig{
			Durable: "svc-a", FilterSubject: "sys1.replies.svc-a.>", AckPolicy: jetstream.AckExplicitPolicy,
		})
		if err != nil {
			t.Fatalf("svc-a replies consumer: %v", err)
		}
		m, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if m.Subject() != "sys1.replies.svc-a.run-1" {
			t.Fatalf("got %s", m.Subject())
		}
		if err := m.Ack(); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("the sink reads run records and nothing else", func(t *testing.T) {
		sconn, err := natsconn.Connect(context.Background(), func() natsconn.Config {
			c := natsconn.DefaultConfig()
			c.URL, c.User, c.Password, c.InboxPrefix = s.ClientURL(), "sys1-sink", natsconn.Secret(passwords["sys1-sink"]), "_INBOX.sys1-sink"
			return c
		}(), "sys1-sink", zerolog.Nop())
		if err != nil {
			t.Fatal(err)
		}
		defer sconn.Close()
		if err := topology.EnsureRunsStream(ctxT(t, 5*time.Second), sconn.JS, cfg); err != nil {
			t.Fatalf("sink: EnsureRunsStream: %v", err)
		}
		cons, err := topology.EnsureSinkConsumer(ctxT(t, 5*time.Second), sconn.JS, cfg, 30*time.Second, 100)
		if err != nil {
			t.Fatalf("sink: consumer: %v", err)
		}
		m, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if m.Subject() != "sys1.runs.success" {
			t.Fatalf("sink got %s", m.Subject())
		}
		if err := m.Ack(); err != nil {
			t.Fatal(err)
		}
		if _, err := sconn.JS.Stream(ctxT(t, negativeWait), cfg.RequestsStream); err == nil {
			t.Fatal("the sink can read the requests stream")
		}
		if _, err := sconn.JS.KeyValue(ctxT(t, negativeWait), cfg.RunsBucket); err == nil {
			t.Fatal("the sink can open the run-id gate")
		}
	})

	t.Run("wrong password is refused", func(t *testing.T) {
		_, err := nats.Connect(s.ClientURL(), nats.UserInfo("svc-a", passwords["svc-b"]))
		if !errors.Is(err, nats.ErrAuthorization) {
			t.Fatalf("want an authorization violation, got %v", err)
		}
	})
}
