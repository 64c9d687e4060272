package worker_test

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/trace"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/provider"
	"github.com/sys1hq/sys1/provider/chain"
	"github.com/sys1hq/sys1/provider/ollama"
	"github.com/sys1hq/sys1/provider/ollamatest"
	"github.com/sys1hq/sys1/worker"
	"github.com/sys1hq/sys1/worker/auth"
	"github.com/sys1hq/sys1/worker/client"
	"github.com/sys1hq/sys1/worker/limits"
	"github.com/sys1hq/sys1/worker/livefile"
	"github.com/sys1hq/sys1/worker/natsconn/natstest"
	"github.com/sys1hq/sys1/worker/policy"
	"github.com/sys1hq/sys1/worker/topology"
)

// harness is one in-process deployment: a real nats-server with JetStream, the fake Ollama,
// and any number of worker replicas.
type harness struct {
	t    *testing.T
	srv  *server.Server
	nc   *nats.Conn
	js   jetstream.JetStream
	fake *ollamatest.Server
	topo topology.Config
	logs *natstest.Buffer
	cl   *client.Client
	// NATS credentials, when the server requires them.
	user, password string
	// apiKey is sent to the fake Ollama when set.
	apiKey string
	// restartNATS stops the nats-server and starts it again on the same port and store.
	restartNATS func()
}

func newHarness(t *testing.T, fakeOpts ...ollamatest.Option) *harness {
	t.Helper()
	return newHarnessWith(t, nil, fakeOpts...)
}

// newHarnessWith lets a test shape the nats-server (e.g. require a password).
func newHarnessWith(t *testing.T, serverOpts func(*server.Options), fakeOpts ...ollamatest.Option) *harness {
	t.Helper()
	var user, password, storeDir string
	configure := func(o *server.Options) {
		o.MaxPayload = 8 << 20
		if serverOpts != nil {
			serverOpts(o)
		}
		user, password, storeDir = o.Username, o.Password, o.StoreDir
	}
	srv := natstest.Start(t, configure)
	h := &harness{t: t, srv: srv, logs: &natstest.Buffer{}, user: user, password: password}
	h.restartNATS = func() {
		// The same store on the same port: NATS restarting, not a new NATS.
		port := h.srv.Addr().(*net.TCPAddr).Port
		dir := storeDir
		h.srv.Shutdown()
		h.srv.WaitForShutdown()
		h.srv = natstest.Start(t, func(o *server.Options) {
			configure(o)
			o.Port, o.StoreDir = port, dir
		})
	}
	h.nc = h.connect()
	var err error
	h.js, err = jetstream.New(h.nc)
	if err != nil {
		t.Fatal(err)
	}
	h.cl, err = client.New(h.nc)
	if err != nil {
		t.Fatal(err)
	}
	h.fake = ollamatest.New(t, fakeOpts...)
	h.topo = topology.Default()
	h.topo.AckWait = 5 * time.Second
	return h
}

func (h *harness) connect() *nats.Conn {
	h.t.Helper()
	opts := []nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(50 * time.Millisecond)}
	if h.user != "" {
		opts = append(opts, nats.UserInfo(h.user, h.password))
	}
	nc, err := nats.Connect(h.srv.ClientURL(), opts...)
	if err != nil {
		h.t.Fatalf("connect: %v", err)
	}
	h.t.Cleanup(nc.Close)
	return nc
}

// replica is one running worker.
type replica struct {
	w      *worker.Worker
	nc     *nats.Conn
	cancel context.CancelFunc
	done   chan struct{} // closed when Run returns
	err    error         // Run's result, valid once done is closed
}

// stop cancels the replica (SIGTERM) and waits for Run to return.
func (r *replica) stop(t *testing.T) error {
	t.Helper()
	r.cancel()
	select {
	case <-r.done:
		return r.err
	case <-time.After(60 * time.Second):
		t.Fatal("worker did not stop within 60s")
		return nil
	}
}

type replicaOpts struct {
	cfg        worker.Config
	policy     contract.Policy
	provider   provider.Provider
	auth       auth.Authenticator
	topo       *topology.Config
	links      []chain.Link
	chainCfg   chain.Config
	abstention *policy.Handle
	limits     *livefile.File[*limits.Limits]
	prices     *livefile.File[*limits.Prices]
	// observability
	registry    *prometheus.Registry
	callerLabel bool
	tracer      trace.TracerProvider
}

func defaultWorkerConfig() worker.Config {
	return worker.Config{
		Concurrency: 4, ConcurrencyMode: "fixed", MaxDeliver: 3, ShutdownGrace: 10 * time.Second, FetchBatch: 4,
		RetryBase: 20 * time.Millisecond, RetryMax: 200 * time.Millisecond, StoreRetry: 2 * time.Second, ID: "test-worker",
	}
}

func (h *harness) ollama(timeout time.Duration) provider.Provider {
	h.t.Helper()
	return h.ollamaAt(h.fake.URL(), timeout)
}

func (h *harness) ollamaAt(url string, timeout time.Duration) provider.Provider {
	h.t.Helper()
	p, err := ollama.New(ollama.Config{BaseURL: url, TimeoutMS: strconv.Itoa(int(timeout / time.Millisecond)), APIKey: ollama.Secret(h.apiKey), MaxConns: 64}, ollama.Deps{Log: h.logger()})
	if err != nil {
		h.t.Fatalf("ollama adapter: %v", err)
	}
	return p
}

func (h *harness) logger() zerolog.Logger { return zerolog.New(h.logs).Level(zerolog.DebugLevel) }

// start runs a replica on its own connection; mods adjust its options.
func (h *harness) start(mods ...func(*replicaOpts)) *replica {
	h.t.Helper()
	o := &replicaOpts{
		cfg:    defaultWorkerConfig(),
		policy: contract.Policy{DefaultModel: "nimble", AllowedModels: []string{"nimble", "tev1"}},
	}
	for _, m := range mods {
		m(o)
	}
	if o.provider == nil {
		o.provider = h.ollama(5 * time.Second)
	}
	if o.auth == nil {
		a, err := auth.New(context.Background(), auth.DefaultConfig(), h.logger())
		if err != nil {
			h.t.Fatal(err)
		}
		o.auth = a
	}
	topo := h.topo
	if o.topo != nil {
		topo = *o.topo
	}
	nc := h.connect()
	js, err := jetstream.New(nc)
	if err != nil {
		h.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	w, err := worker.New(ctx, o.cfg, worker.Options{
		NC: nc, JS: js, Topology: topo, Provider: o.provider, Links: o.links, ChainConfig: o.chainCfg, ModelPolicy: o.policy, Abstention: o.abstention, Limits: o.limits, Prices: o.prices, Auth: o.auth,
		Logger: h.logger(), Version: "test", FetchWait: 200 * time.Millisecond,
		Metrics: o.registry, MetricsCallerLabel: o.callerLabel, TracerProvider: o.tracer,
	})
	if err != nil {
		cancel()
		h.t.Fatalf("worker.New: %v", err)
	}
	r := &replica{w: w, nc: nc, cancel: cancel, done: make(chan struct{})}
	go func() { r.err = w.Run(ctx); close(r.done) }()
	h.t.Cleanup(func() {
		cancel()
		select {
		case <-r.done:
		case <-time.After(30 * time.Second):
		}
	})
	return r
}

// decide publishes body as caller and waits for the reply.
func (h *harness) decide(caller string, body []byte, mod ...func(*client.Request)) *client.Reply {
	h.t.Helper()
	req := client.Request{Caller: caller, Body: body}
	for _, m := range mod {
		m(&req)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rep, err := h.cl.Decide(ctx, req)
	if err != nil {
		h.t.Fatalf("decide: %v", err)
	}
	return rep
}

// records reads every run record in SYS1_RUNS.
func (h *harness) records() []contract.RunRecord {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := h.js.Stream(ctx, h.topo.RunsStream)
	if err != nil {
		h.t.Fatalf("runs stream: %v", err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		h.t.Fatal(err)
	}
	var out []contract.RunRecord
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			continue
		}
		var rec contract.RunRecord
		if err := json.Unmarshal(m.Data, &rec); err != nil {
			h.t.Fatalf("record %d does not decode: %v\n%s", seq, err, m.Data)
		}
		out = append(out, rec)
	}
	return out
}

// rawRecords returns every record's bytes.
func (h *harness) rawRecords() [][]byte {
	h.t.Helper()
	var out [][]byte
	for _, m := range h.streamMsgs(h.topo.RunsStream) {
		out = append(out, m.Data)
	}
	return out
}

// streamMsgs reads every message stored in a stream, oldest first.
func (h *harness) streamMsgs(stream string) []*jetstream.RawStreamMsg {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := h.js.Stream(ctx, stream)
	if err != nil {
		h.t.Fatal(err)
	}
	info, _ := s.Info(ctx)
	var out []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		if m, err := s.GetMsg(ctx, seq); err == nil {
			out = append(out, m)
		}
	}
	return out
}

// recordsByRun indexes records by run id, failing on duplicates.
func (h *harness) recordByRun(runID string) contract.RunRecord {
	h.t.Helper()
	var found []contract.RunRecord
	for _, r := range h.records() {
		if r.RunID == runID {
			found = append(found, r)
		}
	}
	if len(found) != 1 {
		h.t.Fatalf("run %s: want exactly 1 record, got %d", runID, len(found))
	}
	return found[0]
}

// awaitInFlight waits until n calls are in flight at the fake (an event, not a poll).
func (h *harness) awaitInFlight(n int64) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := h.fake.AwaitInFlight(ctx, n); err != nil {
		h.t.Fatal(err)
	}
}

// waitFor polls cond until it holds or d passes (natstest.WaitFor).
func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	natstest.WaitFor(t, d, what, cond)
}

// pending is the number of request messages not yet settled.
func (h *harness) pending() uint64 {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := h.js.Stream(ctx, h.topo.RequestsStream)
	if err != nil {
		return 1 << 62
	}
	info, err := s.Info(ctx)
	if err != nil {
		return 1 << 62
	}
	return info.State.Msgs
}

func example(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "contract", "examples", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// publishRefused publishes a request whose caller the worker cannot verify, with a reply
// inbox in the caller's own namespace, and returns a check that no reply reached it: workers
// answer nobody they could not verify. Call the check once the run's record exists (the
// record is published before any reply would be).
func (h *harness) publishRefused(caller string, body []byte, mod ...func(*client.Request)) (check func()) {
	h.t.Helper()
	inbox := "_INBOX." + caller + "." + nats.NewInbox()[len("_INBOX."):]
	sub, err := h.nc.SubscribeSync(inbox)
	if err != nil {
		h.t.Fatal(err)
	}
	req := client.Request{Caller: caller, Body: body, ReplyTo: inbox}
	for _, m := range mod {
		m(&req)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := h.cl.Publish(ctx, req); err != nil {
		h.t.Fatal(err)
	}
	return func() {
		h.t.Helper()
		// Absence can only be waited for: give a reply that was sent ample time to arrive.
		if m, err := sub.NextMsg(300 * time.Millisecond); err == nil {
			h.t.Errorf("an unverified request was answered: %s", m.Data)
		}
		_ = sub.Unsubscribe()
	}
}
