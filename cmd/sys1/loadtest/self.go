package loadtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/provider/ollama"
	"github.com/sys1hq/sys1/provider/ollamatest"
	"github.com/sys1hq/sys1/worker"
	"github.com/sys1hq/sys1/worker/auth"
	"github.com/sys1hq/sys1/worker/loopback"
	"github.com/sys1hq/sys1/worker/natsconn"
	"github.com/sys1hq/sys1/worker/topology"
)

// SelfOptions size an in-process deployment.
type SelfOptions struct {
	// Replicas is the number of worker replicas, each on its own NATS connection. Zero runs
	// the server and the fake only, for workers in other processes (URL, ProviderURL).
	Replicas int
	// Concurrency is each replica's SYS1_CONCURRENCY.
	Concurrency int
	// FetchBatch is each replica's SYS1_FETCH_BATCH; 0 keeps the worker's default.
	FetchBatch int
	// ConcurrencyMode is each replica's SYS1_CONCURRENCY_MODE (fixed or adaptive); empty:
	// fixed.
	ConcurrencyMode string
	// ProviderLatency is how long the fake Ollama takes per call. With ProviderSlots it is
	// each call's base service time instead.
	ProviderLatency time.Duration
	// ProviderSlots, when positive, makes the fake serve like one real Ollama: that many
	// calls at once, an unbounded FIFO queue behind them (no 503 backpressure, as for a
	// loaded model, ollama#7758) and a service time of ProviderLatency + questions ×
	// (ProviderPerQuestion + ProviderPerStateKiB × state KiB). Zero keeps the fake that
	// answers every call at once in ProviderLatency.
	ProviderSlots int
	// ProviderPerQuestion and ProviderPerStateKiB grow the service time with the request
	// (ProviderSlots only).
	ProviderPerQuestion, ProviderPerStateKiB time.Duration
	// Dir holds the JetStream store; empty means a fresh temporary directory, removed by Close.
	Dir string
	// NATSNodes is 1 (one embedded server, R1 streams) or 3 (an in-process 3-node cluster,
	// R3 streams and buckets, as deployed); 0 means 1.
	NATSNodes int
	// SyncInterval is the servers' JetStream sync_interval (natsconn.ParseSyncInterval):
	// "always" (every write on disk before its ack, as shipped) by default, or a duration.
	SyncInterval string
	// ArrivalOrder runs the replicas without fair share (SYS1_FAIR_SHARE=off): every lane
	// read through one shared consumer, in arrival order, as before fair share.
	ArrivalOrder bool
	// Logger receives the workers' and the server's warnings.
	Logger zerolog.Logger
}

// Self is a whole sys1 deployment in this process: an embedded nats-server with JetStream,
// the fake Ollama, and worker replicas using the real Ollama adapter over loopback HTTP.
type Self struct {
	opt     SelfOptions
	srv     *server.Server
	nodes   []*server.Server // all of them, srv first
	fake    *ollamatest.Server
	dir     string
	ownDir  bool
	workers []*selfWorker

	mu      sync.Mutex
	running bool
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

type selfWorker struct {
	w    *worker.Worker
	nc   *nats.Conn
	prov *ollama.Client
	err  error
}

// StartSelf starts the server, the fake and the replicas (created, topology ensured, not yet
// consuming: call StartWorkers). On error everything started is torn down.
func StartSelf(ctx context.Context, o SelfOptions) (_ *Self, err error) {
	if o.Replicas < 0 || o.Replicas > 64 {
		return nil, fmt.Errorf("replicas must be 0–64, got %d", o.Replicas)
	}
	if o.Concurrency < 1 || o.Concurrency > 4096 {
		return nil, fmt.Errorf("concurrency must be 1–4096, got %d", o.Concurrency)
	}
	if o.ProviderLatency < 0 {
		return nil, fmt.Errorf("provider latency must not be negative, got %s", o.ProviderLatency)
	}
	capacity, realistic, err := o.capacity()
	if err != nil {
		return nil, err
	}
	s := &Self{opt: o, dir: o.Dir}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	if s.dir == "" {
		if s.dir, err = os.MkdirTemp("", "sys1-bench-"); err != nil {
			return nil, fmt.Errorf("store directory: %w", err)
		}
		s.ownDir = true
	}
	log := o.Logger
	switch o.NATSNodes {
	case 0, 1:
		if s.srv, err = natsconn.StartEmbedded(natsconn.EmbeddedOptions{Port: -1, StoreDir: s.dir, Logger: &log, SyncInterval: o.SyncInterval}); err != nil {
			return nil, err
		}
		s.nodes = []*server.Server{s.srv}
	case 3:
		if s.nodes, err = startCluster(ctx, s.dir, 3, o.SyncInterval); err != nil {
			return nil, err
		}
		s.srv = s.nodes[0]
	default:
		return nil, fmt.Errorf("NATS nodes must be 1 or 3, got %d", o.NATSNodes)
	}
	// Keep no request bodies: a long run would otherwise hold its last requests in memory.
	if realistic {
		s.fake = ollamatest.NewServer(ollamatest.WithCapacity(capacity), ollamatest.WithRecordLimit(0))
	} else {
		s.fake = ollamatest.NewServer(ollamatest.WithLatency(o.ProviderLatency), ollamatest.WithRecordLimit(0))
	}

	topo := topology.Default()
	topo.Replicas = len(s.nodes)
	topo.FairShare = !o.ArrivalOrder
	// The shared consumer's MaxAckPending caps every replica together.
	topo.MaxAckPending = max(topo.MaxAckPending, 2*o.Replicas*o.Concurrency)
	// Auth mode none warns that it is for development; in a benchmark that is the point.
	// The topology exists before any replica does, so a deployment without replicas (workers
	// running elsewhere, see Replicas) can take a backlog at once.
	if err := s.ensureTopology(ctx, topo); err != nil {
		return nil, err
	}
	authn, err := auth.New(ctx, auth.DefaultConfig(), log.Level(zerolog.ErrorLevel))
	if err != nil {
		return nil, fmt.Errorf("auth: %w", err)
	}
	for i := range o.Replicas {
		sw := &selfWorker{}
		s.workers = append(s.workers, sw)
		if sw.nc, err = nats.Connect(s.URL(), nats.Name("sys1-bench-worker-"+strconv.Itoa(i)), nats.MaxReconnects(-1)); err != nil {
			return nil, fmt.Errorf("replica %d: connect: %w", i, err)
		}
		js, err := jetstream.New(sw.nc)
		if err != nil {
			return nil, fmt.Errorf("replica %d: jetstream: %w", i, err)
		}
		if sw.prov, err = ollama.New(ollama.Config{BaseURL: s.fake.URL(), TimeoutMS: "30000", MaxConns: o.Concurrency}, ollama.Deps{Log: log}); err != nil {
			return nil, fmt.Errorf("replica %d: provider: %w", i, err)
		}
		cfg := worker.Config{
			Concurrency: o.Concurrency, ConcurrencyMode: o.concurrencyMode(), MaxDeliver: 5, ShutdownGrace: 10 * time.Second,
			FetchBatch: 16, RetryBase: time.Second, RetryMax: time.Minute, ID: "bench-" + strconv.Itoa(i),
		}
		if o.FetchBatch > 0 {
			cfg.FetchBatch = o.FetchBatch
		}
		if sw.w, err = worker.New(ctx, cfg, worker.Options{
			NC: sw.nc, JS: js, Topology: topo, Provider: sw.prov, ModelPolicy: contract.Policy{DefaultModel: "nimble"},
			Auth: authn, Logger: log, Version: "bench", FetchWait: 250 * time.Millisecond,
		}); err != nil {
			return nil, fmt.Errorf("replica %d: %w", i, err)
		}
	}
	return s, nil
}

// concurrencyMode is the replicas' SYS1_CONCURRENCY_MODE: fixed unless asked otherwise, so
// the figures measured before adaptive concurrency stay comparable.
func (o SelfOptions) concurrencyMode() string {
	if o.ConcurrencyMode == "" {
		return "fixed"
	}
	return o.ConcurrencyMode
}

// capacity is the realistic serving model the options ask for, if any.
func (o SelfOptions) capacity() (ollamatest.Capacity, bool, error) {
	if o.ProviderSlots < 0 {
		return ollamatest.Capacity{}, false, fmt.Errorf("provider slots must not be negative (0: every call at once), got %d", o.ProviderSlots)
	}
	if o.ProviderSlots == 0 {
		if o.ProviderPerQuestion != 0 || o.ProviderPerStateKiB != 0 {
			return ollamatest.Capacity{}, false, errors.New("a per-question or per-KiB provider cost needs provider slots")
		}
		return ollamatest.Capacity{}, false, nil
	}
	c := ollamatest.Capacity{Slots: o.ProviderSlots, Base: o.ProviderLatency, PerQuestion: o.ProviderPerQuestion, PerStateKiB: o.ProviderPerStateKiB}
	if err := c.Validate(); err != nil {
		return ollamatest.Capacity{}, false, err
	}
	return c, true, nil
}

// ProviderCapacity is the fake's serving model and whether it has one (ProviderSlots > 0).
func (s *Self) ProviderCapacity() (ollamatest.Capacity, bool) {
	c, ok, _ := s.opt.capacity()
	return c, ok
}

// ProviderQueue is the realistic fake's queue counters (zero without ProviderSlots).
func (s *Self) ProviderQueue() ollamatest.QueueStats { return s.fake.Queue() }

// URL is the embedded servers' client URLs (one, or the cluster's three).
func (s *Self) URL() string {
	urls := make([]string, len(s.nodes))
	for i, n := range s.nodes {
		urls[i] = n.ClientURL()
	}
	return strings.Join(urls, ",")
}

// ProviderURL is the fake Ollama's base URL (what SYS1_OLLAMA_BASE_URL would hold).
func (s *Self) ProviderURL() string { return s.fake.URL() }

// ProviderBusy is the fake Ollama's summed call time (see ollamatest.Server.BusyTime).
func (s *Self) ProviderBusy() time.Duration { return s.fake.BusyTime() }

func (s *Self) ensureTopology(ctx context.Context, topo topology.Config) error {
	nc, err := s.Connect()
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	if _, err := topology.Ensure(ctx, js, topo); err != nil {
		return err
	}
	if !topo.FairShare {
		if _, err := topology.EnsureWorkerConsumer(ctx, js, topo); err != nil {
			return err
		}
	}
	return nil
}

// StartWorkers starts every replica's pull loop. It is idempotent.
func (s *Self) StartWorkers(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.running {
		return nil
	}
	// The replicas outlive the caller's context: Close stops them, after the run is measured.
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel, s.running = cancel, true
	for _, sw := range s.workers {
		s.wg.Go(func() { sw.err = sw.w.Run(ctx) })
	}
	return nil
}

// Peak is the most concurrent provider calls: exact from the fake, with each replica's own.
func (s *Self) Peak() *Peak {
	p := &Peak{Calls: s.fake.MaxConcurrent(), Source: "fake Ollama (all replicas)"}
	for _, sw := range s.workers {
		p.PerReplica = append(p.PerReplica, sw.w.Stats().ProviderPeak)
	}
	return p
}

// Stats are each replica's counters.
func (s *Self) Stats() []worker.Stats {
	out := make([]worker.Stats, 0, len(s.workers))
	for _, sw := range s.workers {
		out = append(out, sw.w.Stats())
	}
	return out
}

// Close stops the replicas (letting in-flight runs finish), the fake and the server, and
// removes a temporary store. It returns the replicas' Run errors.
func (s *Self) Close() error {
	s.mu.Lock()
	if s.cancel != nil {
		s.cancel()
	}
	s.mu.Unlock()
	s.wg.Wait()
	var errs []error
	for _, sw := range s.workers {
		if sw.err != nil {
			errs = append(errs, sw.err)
		}
		if sw.nc != nil {
			sw.nc.Close()
		}
		if sw.prov != nil {
			sw.prov.Close()
		}
	}
	if s.fake != nil {
		s.fake.Close()
	}
	for _, n := range s.nodes {
		n.Shutdown()
		n.WaitForShutdown()
	}
	if s.ownDir && s.dir != "" {
		if err := os.RemoveAll(s.dir); err != nil {
			errs = append(errs, fmt.Errorf("remove %s: %w", s.dir, err))
		}
	}
	return errors.Join(errs...)
}

// Connect opens a producer connection to the embedded server.
func (s *Self) Connect() (*nats.Conn, error) {
	nc, err := nats.Connect(s.URL(), nats.Name("sys1-bench"), nats.MaxReconnects(-1))
	if err != nil {
		return nil, fmt.Errorf("connect to the embedded server: %w", err)
	}
	return nc, nil
}

// startCluster runs an n-node JetStream cluster of in-process servers on loopback, each with
// its own store under dir, and waits until its meta leader can place an R3 asset on them all.
func startCluster(ctx context.Context, dir string, n int, sync string) ([]*server.Server, error) {
	always, every, err := natsconn.ParseSyncInterval(sync)
	if err != nil {
		return nil, err
	}
	if always {
		every = 2 * time.Minute
	}
	// Free ports, released before the servers bind them.
	ports, err := loopback.Ports(2 * n)
	if err != nil {
		return nil, err
	}
	var routes []string
	for i := range n {
		routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", ports[2*i+1]))
	}
	var nodes []*server.Server
	stop := func() {
		for _, s := range nodes {
			s.Shutdown()
		}
	}
	for i := range n {
		opts := &server.Options{
			ServerName: fmt.Sprintf("bench-%d", i+1), Host: "127.0.0.1", Port: ports[2*i],
			JetStream: true, StoreDir: filepath.Join(dir, fmt.Sprintf("n%d", i+1)), NoLog: true, NoSigs: true,
			MaxPayload: 8 << 20, SyncAlways: always, SyncInterval: every,
			// sys1's stream limits add up to more than a small disk's free space: reserve them
			// whatever it says, as the embedded server does.
			JetStreamMaxStore: 1 << 40,
			Cluster:           server.ClusterOpts{Name: "sys1-bench", Host: "127.0.0.1", Port: ports[2*i+1]},
			Routes:            server.RoutesFromStr(strings.Join(routes, ",")),
		}
		s, err := server.NewServer(opts)
		if err != nil {
			stop()
			return nil, fmt.Errorf("nats node %d: %w", i+1, err)
		}
		nodes = append(nodes, s)
	}
	for _, s := range nodes {
		go s.Start()
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		ready := true
		for _, s := range nodes {
			if !s.ReadyForConnections(10*time.Millisecond) || s.Healthz(nil).Status != "ok" {
				ready = false
			}
		}
		if ready {
			for _, s := range nodes {
				if s.JetStreamIsLeader() && len(s.JetStreamClusterPeers()) == n {
					return nodes, nil
				}
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			stop()
			return nil, fmt.Errorf("the %d-node NATS cluster did not form within 60s", n)
		}
		time.Sleep(20 * time.Millisecond) // polling the servers with a deadline
	}
}
