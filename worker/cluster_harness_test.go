package worker_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/contract/wire"
	"github.com/sys1hq/sys1/provider"
	"github.com/sys1hq/sys1/provider/ollama"
	"github.com/sys1hq/sys1/provider/ollamatest"
	"github.com/sys1hq/sys1/worker"
	"github.com/sys1hq/sys1/worker/auth"
	"github.com/sys1hq/sys1/worker/client"
	"github.com/sys1hq/sys1/worker/natsconn/natstest"
	"github.com/sys1hq/sys1/worker/topology"
)

// The cluster tests (cluster_test.go, killnode_test.go) run sys1 against a 3-node NATS
// cluster with R3 streams and buckets, as deployed (deploy/nats/nats-cluster.conf), and fail
// nodes under load. What they prove of every run, whatever failed: it is answered (its reply
// is in SYS1_REPLIES and reached the producer), the model scored it exactly once (the fake
// counts the calls per run), and its record is in SYS1_RUNS exactly once.

// nodeSet is what the cluster tests need of a cluster: in-process (natstest.Cluster) or of
// nats-server processes (natstest.ProcessCluster).
type nodeSet interface {
	Size() int
	URLs(first int) string
	NodeName(i int) string
	Index(name string) int
	WaitHealthy(within time.Duration)
}

// clusterHarness is sys1 on a NATS cluster: worker replicas on their own connections, the
// fake Ollama behind a provider that can hold answers, and the test's own connection.
type clusterHarness struct {
	t     *testing.T
	nodes nodeSet
	fake  *ollamatest.Server
	prov  *heldProvider
	topo  topology.Config
	cfg   worker.Config
	logs  *natstest.Buffer
	nc    *nats.Conn // the test's own connection (producers, inspection)
	js    jetstream.JetStream
	// workers are the replicas started, in order.
	workers []*clusterWorker
}

// clusterWorker is one replica and the connection it runs on.
type clusterWorker struct {
	w      *worker.Worker
	nc     *nats.Conn
	cancel context.CancelFunc
	done   chan struct{}
}

// Settings of the cluster tests: the deployed defaults where they decide the outcome of a
// failover (ack wait, store retry, redelivery schedule), small where they only set the pace.
const (
	clusterConcurrency = 4 // per replica; two replicas
	clusterCaller      = "svc-a"
)

func newClusterHarness(t *testing.T, nodes nodeSet, testNode int) *clusterHarness {
	t.Helper()
	h := &clusterHarness{t: t, nodes: nodes, logs: &natstest.Buffer{}}
	// Every call is recorded, so each run's calls can be counted; a little latency keeps calls
	// in flight whenever a node fails.
	h.fake = ollamatest.New(t, ollamatest.WithLatency(5*time.Millisecond), ollamatest.WithRecordLimit(1<<16))
	p, err := ollama.New(ollama.Config{BaseURL: h.fake.URL(), TimeoutMS: "10000", MaxConns: 64}, ollama.Deps{Log: h.logger()})
	if err != nil {
		t.Fatal(err)
	}
	h.prov = &heldProvider{Provider: p}
	h.topo = topology.Default()
	h.topo.Replicas = 3 // SYS1_STREAM_REPLICAS=3, as deploy/kubernetes sets it
	h.cfg = worker.Config{
		Concurrency: clusterConcurrency, ConcurrencyMode: "fixed", FetchBatch: clusterConcurrency, MaxDeliver: 5,
		ShutdownGrace: 10 * time.Second, RetryBase: time.Second, RetryMax: 60 * time.Second,
		StoreRetry: 2 * time.Minute,
	}
	h.nc = h.connect(testNode)
	h.js, err = jetstream.New(h.nc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("--- worker log (last 16 KiB) ---\n%s", lastBytes(h.logs.String(), 16<<10))
		}
	})
	return h
}

func (h *clusterHarness) logger() zerolog.Logger {
	return zerolog.New(h.logs).Level(zerolog.DebugLevel).With().Timestamp().Logger()
}

// connect opens a connection to node first, failing over to the others in order.
func (h *clusterHarness) connect(first int) *nats.Conn {
	h.t.Helper()
	nc, err := nats.Connect(h.nodes.URLs(first), nats.DontRandomize(), nats.MaxReconnects(-1),
		nats.ReconnectWait(50*time.Millisecond), nats.ReconnectJitter(10*time.Millisecond, 10*time.Millisecond),
		nats.Timeout(2*time.Second),
		// A write to a node that just died is expected here; nats.go would print it.
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			fmt.Fprintf(h.logs, "{\"level\":\"warn\",\"message\":\"test connection: %s\"}\n", strings.ReplaceAll(err.Error(), `"`, `'`))
		}))
	if err != nil {
		h.t.Fatalf("connect to %s: %v", h.nodes.URLs(first), err)
	}
	h.t.Cleanup(nc.Close)
	return nc
}

// startWorker runs a replica connected to node.
func (h *clusterHarness) startWorker(node int) *clusterWorker {
	h.t.Helper()
	nc := h.connect(node)
	js, err := jetstream.New(nc)
	if err != nil {
		h.t.Fatal(err)
	}
	a, err := auth.New(context.Background(), auth.DefaultConfig(), h.logger())
	if err != nil {
		h.t.Fatal(err)
	}
	cfg := h.cfg
	cfg.ID = fmt.Sprintf("worker-%d-on-%s", len(h.workers)+1, h.nodes.NodeName(node))
	ctx, cancel := context.WithCancel(context.Background())
	nctx, ncancel := context.WithTimeout(ctx, 60*time.Second)
	defer ncancel()
	w, err := worker.New(nctx, cfg, worker.Options{
		NC: nc, JS: js, Topology: h.topo, Provider: h.prov, Auth: a, Logger: h.logger(), Version: "test",
		ModelPolicy: contract.Policy{DefaultModel: "nimble", AllowedModels: []string{"nimble"}},
		FetchWait:   500 * time.Millisecond,
	})
	if err != nil {
		cancel()
		h.t.Fatalf("worker.New on %s: %v", h.nodes.NodeName(node), err)
	}
	cw := &clusterWorker{w: w, nc: nc, cancel: cancel, done: make(chan struct{})}
	go func() { _ = w.Run(ctx); close(cw.done) }()
	h.t.Cleanup(func() {
		cancel()
		select {
		case <-cw.done:
		case <-time.After(30 * time.Second):
		}
	})
	h.workers = append(h.workers, cw)
	return cw
}

// leaderOf waits for stream (a KV bucket's is KV_<bucket>) to have a leader other than any of
// not, and returns its server name, as JetStream's stream info reports it.
func (h *clusterHarness) leaderOf(stream string, not ...string) string {
	h.t.Helper()
	var leader string
	waitFor(h.t, "a leader of "+stream, 60*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		s, err := h.js.Stream(ctx, stream)
		if err != nil {
			return false
		}
		info, err := s.Info(ctx)
		if err != nil || info.Cluster == nil || info.Cluster.Leader == "" {
			return false
		}
		for _, n := range not {
			if info.Cluster.Leader == n {
				return false
			}
		}
		leader = info.Cluster.Leader
		return true
	})
	return leader
}

// gateStream is the stream behind the run-id gate's bucket.
func (h *clusterHarness) gateStream() string { return "KV_" + h.topo.RunsBucket }

// awaitReplicasCurrent waits until every stream sys1 writes, and the worker consumer, has a
// leader and all its other replicas current and online: the cluster has healed.
func (h *clusterHarness) awaitReplicasCurrent() {
	h.t.Helper()
	natstest.WaitUntil(h.t, 60*time.Second, "every replica of sys1's streams current", func() (bool, string) {
		var why string
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		check := func(what string, ci *jetstream.ClusterInfo) bool {
			if ci == nil || ci.Leader == "" {
				why = what + ": no leader"
				return false
			}
			if len(ci.Replicas) != h.topo.Replicas-1 {
				why = fmt.Sprintf("%s: %d followers, want %d", what, len(ci.Replicas), h.topo.Replicas-1)
				return false
			}
			for _, p := range ci.Replicas {
				if !p.Current || p.Offline {
					why = fmt.Sprintf("%s: replica %s current=%v offline=%v lag=%d", what, p.Name, p.Current, p.Offline, p.Lag)
					return false
				}
			}
			return true
		}
		for _, name := range []string{h.topo.RequestsStream, h.topo.RunsStream, h.topo.RepliesStream, h.gateStream()} {
			s, err := h.js.Stream(ctx, name)
			if err != nil {
				return false, name + ": " + err.Error()
			}
			info, err := s.Info(ctx)
			if err != nil {
				return false, name + ": " + err.Error()
			}
			if !check(name, info.Cluster) {
				return false, why
			}
		}
		// The request consumers: the flows' (fair share) or the shared one.
		s, err := h.js.Stream(ctx, h.topo.RequestsStream)
		if err != nil {
			return false, "consumers: " + err.Error()
		}
		infos := s.ListConsumers(ctx)
		for info := range infos.Info() {
			if !check("consumer "+info.Name, info.Cluster) {
				return false, why
			}
		}
		if err := infos.Err(); err != nil {
			return false, "consumers: " + err.Error()
		}
		return true, why
	})
}

// heldProvider passes calls to the fake and, while held, keeps each answer it got from
// returning until release: a test can then fail a node at the moment the answers come back,
// when the runs go to store them.
type heldProvider struct {
	provider.Provider
	mu   sync.Mutex
	gate chan struct{} // non-nil while held
	held atomic.Int64  // answers waiting now
}

func (p *heldProvider) hold() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.gate == nil {
		p.gate = make(chan struct{})
	}
}

func (p *heldProvider) release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.gate != nil {
		close(p.gate)
		p.gate = nil
	}
}

func (p *heldProvider) Evaluate(ctx context.Context, req *contract.Request) (*contract.Response, error) {
	resp, err := p.Provider.Evaluate(ctx, req)
	p.mu.Lock()
	g := p.gate
	p.mu.Unlock()
	if g != nil {
		p.held.Add(1)
		defer p.held.Add(-1)
		select {
		case <-g:
		case <-ctx.Done():
		}
	}
	return resp, err
}

// holdAnswers holds the answers until every provider slot of every replica has one: the model
// has scored that many runs, none has stored its outcome. release lets them go.
func (h *clusterHarness) holdAnswers() int {
	h.t.Helper()
	h.prov.hold()
	want := int64(len(h.workers) * clusterConcurrency)
	waitFor(h.t, fmt.Sprintf("%d answers held", want), 60*time.Second, func() bool { return h.prov.held.Load() == want })
	return int(want)
}

// clusterLoad is a steady load of n runs from producers, each run with its own content (the
// fake tells runs apart by their state) and a durable reply (SYS1_REPLIES outlives any node,
// where a plain inbox reply is lost with the producer's node). Producers publish until
// JetStream acknowledges (retrying with the same Nats-Msg-Id, so a retry is stored once), then
// wait for their run's reply.
type clusterLoad struct {
	h         *clusterHarness
	n         int
	started   time.Time
	answered  atomic.Int64
	pubErrors atomic.Int64 // publishes retried

	mu      sync.Mutex
	replies map[string][][]byte      // run id → replies seen by the collector
	waiting map[string]chan struct{} // closed at a run's first reply
	took    []time.Duration          // publish to reply, per run
	failed  []string                 // runs a producer gave up on, with why

	done chan struct{} // closed when every producer has finished
}

func clusterRunID(i int) string { return fmt.Sprintf("cl-%04d", i) }

// clusterBody is run i's request; its state names the run.
func clusterBody(i int) []byte {
	return []byte(`{"state":"cluster run ` + clusterRunID(i) + `","questions":{` +
		`"label":{"type":"choice","instructions":"Which team owns this?","criteria":{"billing":"Payments","bug":null}},` +
		`"urgent":{"type":"noul","instructions":"Is it urgent?"}}}`)
}

// startLoad starts n runs from producers concurrent producers, a reply collector, and returns
// at once.
func (h *clusterHarness) startLoad(n, producers int) *clusterLoad {
	h.t.Helper()
	l := &clusterLoad{h: h, n: n, started: time.Now(), replies: map[string][][]byte{}, waiting: map[string]chan struct{}{}, done: make(chan struct{})}
	for i := range n {
		l.waiting[clusterRunID(i)] = make(chan struct{})
	}
	l.collectReplies()

	cl, err := client.New(h.nc)
	if err != nil {
		h.t.Fatal(err)
	}
	next := make(chan int, n)
	for i := range n {
		next <- i
	}
	close(next)
	var wg sync.WaitGroup
	for range producers {
		wg.Go(func() {
			for i := range next {
				l.produce(cl, i)
			}
		})
	}
	go func() { wg.Wait(); close(l.done) }()
	return l
}

// clusterRunDeadline bounds one run from its first publish to its reply: longer than any
// failover the tests cause, shorter than the test's own timeout.
const clusterRunDeadline = 3 * time.Minute

func (l *clusterLoad) produce(cl *client.Client, i int) {
	id := clusterRunID(i)
	start := time.Now()
	deadline := start.Add(clusterRunDeadline)
	req := client.Request{Caller: clusterCaller, Body: clusterBody(i), RunID: id, ReplyTo: wire.RepliesPrefix + clusterCaller + "." + id}
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := cl.Publish(ctx, req)
		cancel()
		if err == nil || errors.Is(err, client.ErrDuplicate) {
			break // stored (a duplicate: an earlier try was stored and only its ack was lost)
		}
		l.pubErrors.Add(1)
		if time.Now().After(deadline) {
			l.fail(id, "never stored: "+err.Error())
			return
		}
		// A publish that failed (no ack within 5s, or no connection) is tried again with the
		// same Nats-Msg-Id; the wait is a retry's pause, not synchronisation.
		pause := time.NewTimer(100 * time.Millisecond)
		<-pause.C
	}
	giveUp := time.NewTimer(time.Until(deadline))
	defer giveUp.Stop()
	select {
	case <-l.waiting[id]:
		l.mu.Lock()
		l.took = append(l.took, time.Since(start))
		l.mu.Unlock()
	case <-giveUp.C:
		l.fail(id, "no reply within "+clusterRunDeadline.String())
	}
}

func (l *clusterLoad) fail(id, why string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.failed = append(l.failed, id+": "+why)
}

// collectReplies reads every reply the workers store in the replies stream and hands it to
// its producer. It reads with a durable, replicated consumer and plain pulls in a loop, like
// the worker's own: a JetStream ordered consumer (an R1 consumer that resets itself when its
// connection fails over) sometimes stopped delivering for good when the node the test is
// connected to was the one killed, and the whole load then waited on replies already stored.
func (l *clusterLoad) collectReplies() {
	h := l.h
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cons, err := h.js.CreateConsumer(ctx, h.topo.RepliesStream, jetstream.ConsumerConfig{
		Durable:        "test-reply-collector",
		FilterSubjects: []string{wire.RepliesPrefix + clusterCaller + ".>"},
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        5 * time.Second, // a reply lost with a dying node comes again
		Replicas:       h.topo.Replicas,
	})
	if err != nil {
		h.t.Fatalf("reply collector: %v", err)
	}
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		seen := map[uint64]bool{} // stream sequences handed on: a redelivery is not a second reply
		for {
			select {
			case <-stop:
				return
			default:
			}
			batch, err := cons.Fetch(64, jetstream.FetchMaxWait(time.Second))
			if err == nil {
				for m := range batch.Messages() {
					if meta, merr := m.Metadata(); merr == nil && !seen[meta.Sequence.Stream] {
						seen[meta.Sequence.Stream] = true
						l.gotReply(m.Headers().Get(wire.HeaderRunID), m.Data())
					}
					_ = m.Ack() // if this ack is lost, the redelivery is skipped above
				}
				err = batch.Error()
			}
			if err != nil && !errors.Is(err, nats.ErrTimeout) {
				// A node failing over: say so in the log and pull again shortly.
				fmt.Fprintf(h.logs, "{\"level\":\"warn\",\"message\":\"reply collector: %s\"}\n", strings.ReplaceAll(err.Error(), `"`, `'`))
				pause := time.NewTimer(50 * time.Millisecond)
				select {
				case <-stop:
					pause.Stop()
					return
				case <-pause.C:
				}
			}
		}
	}()
	h.t.Cleanup(func() { close(stop); <-stopped })
}

func (l *clusterLoad) gotReply(id string, data []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.replies[id] = append(l.replies[id], append([]byte(nil), data...))
	if ch, ok := l.waiting[id]; ok && len(l.replies[id]) == 1 {
		close(ch)
		l.answered.Add(1)
	}
}

// awaitAnswered waits until at least n runs have their reply.
func (l *clusterLoad) awaitAnswered(n int, within time.Duration) {
	l.h.t.Helper()
	// The count at the deadline, not at the start (waitFor's message is fixed beforehand).
	defer func() {
		if l.h.t.Failed() {
			l.h.t.Logf("%d runs answered when the wait ended", l.answered.Load())
		}
	}()
	waitFor(l.h.t, fmt.Sprintf("%d runs answered", n), within, func() bool { return l.answered.Load() >= int64(n) })
}

// wait waits for every producer to finish (each run answered, or given up on).
func (l *clusterLoad) wait() time.Duration {
	l.h.t.Helper()
	select {
	case <-l.done:
	case <-time.After(clusterRunDeadline + 30*time.Second):
		l.h.t.Fatalf("producers did not finish; %d of %d runs answered", l.answered.Load(), l.n)
	}
	return time.Since(l.started)
}

// p99 is the 99th percentile of the runs' publish-to-reply times, and the longest.
func (l *clusterLoad) p99() (p99, longest time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.took) == 0 {
		return 0, 0
	}
	d := append([]time.Duration(nil), l.took...)
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	return d[len(d)*99/100], d[len(d)-1]
}

// verify checks every run once the load is over: answered by its producer, with every reply
// stored for it identical and a success; scored by the model exactly once; recorded in
// SYS1_RUNS exactly once; and no request left in SYS1_REQUESTS (each was acknowledged) or
// dead-lettered. It reports each run that breaks any of these, and what happened to it.
func (h *clusterHarness) verify(l *clusterLoad) {
	h.t.Helper()
	t := h.t
	// Acks are fire-and-forget: one lost with a node comes back after the ack wait as a
	// replay, answered from the stored outcome. Wait for those too, so a run scored again by
	// its redelivery could not escape the count below.
	waitFor(t, "every request acknowledged (SYS1_REQUESTS empty)", h.topo.AckWait+60*time.Second, func() bool {
		return h.streamMsgs(h.topo.RequestsStream) == 0
	})
	if n := h.streamMsgs(h.topo.DeadLetterStream); n != 0 {
		t.Errorf("%d requests were dead-lettered (ran out of deliveries)", n)
	}

	calls := map[string]int{}
	for _, r := range h.fake.SystemOneRequests() {
		raw, _ := r.Field("state")
		var state string
		_ = json.Unmarshal(raw, &state)
		calls[strings.TrimPrefix(state, "cluster run ")]++
	}
	records := map[string]int{}
	recordStatus := map[string]string{}
	for _, m := range h.readStream(h.topo.RunsStream) {
		var rec contract.RunRecord
		if err := json.Unmarshal(m.Data(), &rec); err != nil {
			t.Fatalf("a record does not decode: %v", err)
		}
		records[rec.RunID]++
		recordStatus[rec.RunID] = string(rec.Status)
	}
	stored := map[string][][]byte{}
	for _, m := range h.readStream(h.topo.RepliesStream) {
		id := m.Headers().Get(wire.HeaderRunID)
		stored[id] = append(stored[id], m.Data())
	}

	l.mu.Lock()
	defer l.mu.Unlock()
	var bad []string
	for i := range l.n {
		id := clusterRunID(i)
		var why []string
		if calls[id] != 1 {
			why = append(why, fmt.Sprintf("scored %d times", calls[id]))
		}
		if records[id] != 1 {
			why = append(why, fmt.Sprintf("%d records", records[id]))
		} else if recordStatus[id] != string(contract.StatusSuccess) {
			why = append(why, "record "+recordStatus[id])
		}
		if len(l.replies[id]) == 0 {
			why = append(why, "no reply reached the producer")
		}
		if len(stored[id]) == 0 {
			why = append(why, "no reply in "+h.topo.RepliesStream)
		}
		all := append(append([][]byte(nil), stored[id]...), l.replies[id]...)
		for _, r := range all {
			var rep contract.Reply
			if err := json.Unmarshal(r, &rep); err != nil || rep.Status != contract.StatusSuccess || rep.RunID != id {
				why = append(why, "a reply is not this run's success: "+lastBytes(string(r), 300))
				break
			}
			if !bytes.Equal(r, all[0]) {
				why = append(why, "replies differ (the run was answered twice with different outcomes)")
				break
			}
		}
		if len(why) > 0 {
			bad = append(bad, id+": "+strings.Join(why, ", "))
		}
	}
	bad = append(bad, l.failed...)
	if len(bad) > 0 {
		show := bad
		if len(show) > 20 {
			show = show[:20]
		}
		var logs strings.Builder
		for _, b := range show[:min(3, len(show))] {
			id, _, _ := strings.Cut(b, ":")
			fmt.Fprintf(&logs, "--- worker log lines of run %s ---\n%s\n", id, h.logLinesOf(id, 40))
		}
		t.Errorf("%d of %d runs were not answered once, scored once and recorded once:\n%s\n%s",
			len(bad), l.n, strings.Join(show, "\n"), logs.String())
	}
	for id := range calls {
		if _, ok := l.waiting[id]; !ok {
			t.Errorf("the model was called %d times for %q, a run the load never sent", calls[id], id)
		}
	}
}

// logLinesOf returns the last max worker log lines that name run id.
func (h *clusterHarness) logLinesOf(id string, max int) string {
	var out []string
	for line := range strings.SplitSeq(h.logs.String(), "\n") {
		if strings.Contains(line, `"run_id":"`+id+`"`) {
			out = append(out, line)
		}
	}
	if len(out) > max {
		out = out[len(out)-max:]
	}
	return strings.Join(out, "\n")
}

// streamMsgs is the number of messages in stream (a large number when it cannot be read).
func (h *clusterHarness) streamMsgs(stream string) uint64 {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := h.js.Stream(ctx, stream)
	if err != nil {
		return 1 << 62
	}
	info, err := s.Info(ctx)
	if err != nil {
		return 1 << 62
	}
	return info.State.Msgs
}

// readStream returns every message of stream, through an ordered consumer. A read that
// fails (a node still settling after a failover) goes on from the last message it got.
func (h *clusterHarness) readStream(stream string) []jetstream.Msg {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	want := h.streamMsgs(stream)
	var out []jetstream.Msg
	var next uint64 // the stream sequence to read from; 0: the start
	var last error
	for uint64(len(out)) < want {
		if ctx.Err() != nil {
			h.t.Fatalf("read %s: %d of %d messages (last error: %v)", stream, len(out), want, last)
		}
		cfg := jetstream.OrderedConsumerConfig{}
		if next > 0 {
			cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, next
		}
		cons, err := h.js.OrderedConsumer(ctx, stream, cfg)
		if err != nil {
			last = err
			continue
		}
		for uint64(len(out)) < want {
			batch, err := cons.Fetch(int(min(want-uint64(len(out)), 256)), jetstream.FetchMaxWait(5*time.Second))
			if err != nil {
				last = err
				break
			}
			n := 0
			for m := range batch.Messages() {
				out = append(out, m)
				if meta, err := m.Metadata(); err == nil {
					next = meta.Sequence.Stream + 1
				}
				n++
			}
			if n == 0 {
				last = batch.Error()
				break
			}
		}
	}
	return out
}

// report logs the figures of a cluster test.
func (h *clusterHarness) report(l *clusterLoad, took time.Duration, what string) {
	p99, longest := l.p99()
	var st worker.Stats
	for _, w := range h.workers {
		s := w.w.Stats()
		st.ProviderCalls += s.ProviderCalls
		st.Succeeded += s.Succeeded
		st.Retried += s.Retried
		st.Replayed += s.Replayed
	}
	h.t.Logf("%s: %d runs in %s (%.0f runs/s), p99 %s, longest %s; %d calls, %d replays, %d publishes retried, %d store retries in place",
		what, l.n, took.Round(time.Millisecond), float64(l.n)/took.Seconds(), p99.Round(time.Millisecond), longest.Round(time.Millisecond),
		st.ProviderCalls, st.Replayed, l.pubErrors.Load(), strings.Count(h.logs.String(), "retrying in place"))
}

func lastBytes(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}
