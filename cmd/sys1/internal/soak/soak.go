// Package soak is sys1's chaos run: a whole fleet — three NATS nodes as processes (R3
// streams and buckets), worker processes, the sink writing to ClickHouse, the review page —
// under a mixed load (interactive callers with and without budgets, with the exact cache, held
// for review; sys1 batch runs; producers' labels; an automatic reviewer), while a seeded plan
// SIGKILLs and restarts workers and NATS nodes (sometimes the leader of a stream the run-id
// gate or the budgets depend on, sometimes all three nodes at once), cuts ClickHouse off,
// pauses the fleet and makes the model slow or failing. At the end it checks, from outside
// the workers, what sys1 promises: every acknowledged request answered exactly once, nothing
// scored twice, every hold released once after its label, budgets exact, one record per run
// and per label in ClickHouse, no consumer left with work, every process still up (Check).
//
// `sys1 soak` runs it; deploy/reliability.md records its results.
package soak

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/crypto/bcrypt"

	"github.com/sys1hq/sys1/contract/wire"
	"github.com/sys1hq/sys1/sink"
	"github.com/sys1hq/sys1/worker/loopback"
	"github.com/sys1hq/sys1/worker/natsconn"
)

// DefaultSyncInterval is the NATS nodes' JetStream sync_interval: what deploy/nats ships and
// the embedded server uses.
const DefaultSyncInterval = natsconn.SyncAlways

// Options size a soak.
type Options struct {
	// Sys1 is the sys1 binary the fleet runs (workers, sink, review page, batch, pause).
	Sys1 string
	// NATSServer, when set, is a nats-server binary for the NATS nodes; empty runs them as
	// `sys1 soak --nats-node CONF` (go.mod's nats-server, in the sys1 binary).
	NATSServer string
	// Dir holds the stores, the configuration files and every process's log; empty means a
	// temporary directory, removed at the end unless Keep.
	Dir  string
	Keep bool
	// Duration is how long the load runs; faults stop by 85% of it. Drain bounds the wait
	// after it for the fleet to answer everything [3m].
	Duration, Drain time.Duration
	Seed            uint64
	Workers         int     // worker processes [3]
	Rate            float64 // interactive requests per second, over all callers [15]
	// BatchItems is the size of each sys1 batch run beside the load; 0 runs none.
	BatchItems int
	// ClickHouseDSN is the ClickHouse the sink writes to (a fresh database is used, and
	// dropped at the end unless Keep).
	ClickHouseDSN string
	// Kinds limits the faults (ParseKinds); empty means all.
	Kinds []FaultKind
	// SyncInterval is the NATS nodes' sync_interval [DefaultSyncInterval].
	SyncInterval string
	// ModelLatency is the fake model's time per call [20ms].
	ModelLatency time.Duration
	// Out receives the plan, the fault timeline as it happens, and progress.
	Out io.Writer
	// Env is added to every process's environment (a test runs its own binary as sys1).
	Env []string
}

func (o *Options) defaults() error {
	if o.Sys1 == "" {
		return errors.New("the sys1 binary is required")
	}
	if o.Duration <= 0 {
		return errors.New("the duration must be positive")
	}
	if o.Drain <= 0 {
		o.Drain = 3 * time.Minute
	}
	if o.Workers == 0 {
		o.Workers = 3
	}
	if o.Workers < 1 || o.Workers > 16 {
		return fmt.Errorf("workers must be 1–16, got %d", o.Workers)
	}
	if o.Rate == 0 {
		o.Rate = 15
	}
	if o.Rate < 0.1 || o.Rate > 2000 {
		return fmt.Errorf("the rate must be 0.1–2000 requests/s, got %g", o.Rate)
	}
	if o.ClickHouseDSN == "" {
		return errors.New("a ClickHouse DSN is required")
	}
	if o.SyncInterval == "" {
		o.SyncInterval = DefaultSyncInterval
	}
	if o.ModelLatency == 0 {
		o.ModelLatency = 20 * time.Millisecond
	}
	if o.Out == nil {
		o.Out = io.Discard
	}
	return nil
}

// Result is what a soak found.
type Result struct {
	Plan         Plan
	Observations Observations
	Report       Report
	Dir          string
	Database     string
	// Drained is false when the fleet had not answered everything when Drain ran out.
	Drained   bool
	DrainTook time.Duration
	// Stats are figures for the record: how much traffic, how many faults.
	Stats Stats
}

// Stats are a soak's figures.
type Stats struct {
	Requests, Acked, Replies, Calls, AnsweredCalls int
	BatchItems, Batches, BatchRestarts             int
	ProducerLabels, ReviewLabels                   int
	ReviewerConflicts                              int
	Faults                                         map[string]int
	PublishRetries                                 int64
}

// soak is one run's state.
type soak struct {
	o       Options
	dir     string
	start   time.Time
	tl      *Timeline
	plan    Plan
	nats    *natsCluster
	workers []*proc
	others  []*proc // sink, review page
	model   *model
	proxy   *cutProxy
	nc      *nats.Conn
	js      jetstream.JetStream
	db      string
	ch      driver.Conn
	files   struct{ policy, limits, prices, users string }
	budget  int
	ports   struct {
		workers []int
		sink    int
		review  int
	}
	password string
	replies  *replies
	labels   *labels
	load     *load
	batches  *batches
	reviewer *reviewer
	rng      *mrand.Rand
	// The collectors run from set-up until the observations are gathered.
	stopCollectors context.CancelFunc
	collecting     sync.WaitGroup
}

// Run runs a soak and checks it. The error is for a soak that could not run at all (a
// process that would not start, ClickHouse unreachable); what the soak found is the report.
func Run(ctx context.Context, o Options) (*Result, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	s := &soak{o: o, rng: mrand.New(mrand.NewPCG(o.Seed, o.Seed^0xfa17))}
	defer s.teardown()
	if err := s.setUp(ctx); err != nil {
		return nil, err
	}
	res := &Result{Plan: s.plan, Dir: s.dir, Database: s.db}
	res.Drained, res.DrainTook = s.exercise(ctx)
	res.Observations = s.observe(ctx)
	res.Report = Check(res.Observations)
	res.Stats = s.stats(res.Observations)
	return res, nil
}

func (s *soak) say(format string, args ...any) { fmt.Fprintf(s.o.Out, format+"\n", args...) }

func (s *soak) setUp(ctx context.Context) error {
	o := s.o
	s.dir = o.Dir
	if s.dir == "" {
		d, err := os.MkdirTemp("", "sys1-soak-")
		if err != nil {
			return err
		}
		s.dir = d
	}
	if err := os.MkdirAll(filepath.Join(s.dir, "logs"), 0o755); err != nil {
		return err
	}
	nodes := 3
	s.plan = NewPlan(PlanOptions{Seed: o.Seed, Duration: o.Duration, Workers: o.Workers, Nodes: nodes, Kinds: o.Kinds})
	s.say("sys1 soak: seed %d (replay with --seed %d), %s of load at %g requests/s, %d NATS nodes (sync_interval %s), %d workers",
		o.Seed, o.Seed, o.Duration, o.Rate, nodes, o.SyncInterval, o.Workers)
	s.say("logs and stores in %s", s.dir)
	s.say("fault plan (%d faults):", len(s.plan.Faults))
	for _, f := range s.plan.Faults {
		s.say("  %s", f)
	}

	// ClickHouse: a fresh database, reached by the sink through a proxy the soak can cut.
	s.db = fmt.Sprintf("sys1_soak_%d_%d", o.Seed, time.Now().Unix())
	ch, err := sink.Open(ctx, sink.Config{DSN: o.ClickHouseDSN})
	if err != nil {
		return fmt.Errorf("ClickHouse: %w", err)
	}
	s.ch = ch
	host, sinkDSN, err := proxiedDSN(o.ClickHouseDSN)
	if err != nil {
		return err
	}
	if s.proxy, err = newCutProxy(host); err != nil {
		return err
	}
	sinkDSN = strings.Replace(sinkDSN, "PROXY", s.proxy.addr(), 1)

	s.model = newModel(o.Workers, o.ModelLatency)

	// Ports for the child processes are chosen only after every listener of this process
	// (the proxy, the fake models) is open: a port freePorts hands back is free again, and
	// the kernel would give it to the next listener here (a CI run's w2 found a fake model
	// on its port, and exited "address already in use" until the soak gave up).
	ports, err := loopback.Ports(3*nodes + o.Workers + 2)
	if err != nil {
		return err
	}
	s.ports.workers = ports[3*nodes : 3*nodes+o.Workers]
	s.ports.sink, s.ports.review = ports[3*nodes+o.Workers], ports[3*nodes+o.Workers+1]

	if err := s.writeFiles(); err != nil {
		return err
	}

	// The timeline starts now: everything before was preparation.
	s.start = time.Now()
	s.tl = NewTimeline(s.start, o.Out)

	nodeList, confs, err := writeNATSConfigs(s.dir, nodes, o.SyncInterval, ports[:3*nodes])
	if err != nil {
		return err
	}
	s.nats = &natsCluster{nodes: nodeList}
	logs := filepath.Join(s.dir, "logs")
	for i, n := range nodeList {
		bin, args := o.Sys1, []string{"soak", "--nats-node", confs[i]}
		if o.NATSServer != "" {
			bin, args = o.NATSServer, []string{"-c", confs[i]}
		}
		n.proc = newProc(n.name, i+1, bin, args, func(int) []string { return s.baseEnv() }, logs, s.tl)
		if err := n.proc.start(""); err != nil {
			return err
		}
	}
	if err := s.nats.waitHealthy(ctx, 60*time.Second); err != nil {
		return fmt.Errorf("the NATS cluster did not become healthy: %w", err)
	}
	if s.nc, s.js, err = connect(s.nats.urls(0), "sys1-soak"); err != nil {
		return err
	}

	for slot := 1; slot <= o.Workers; slot++ {
		p := newProc(fmt.Sprintf("w%d", slot), slot, o.Sys1, []string{"worker"}, s.workerEnv(slot), logs, s.tl)
		s.workers = append(s.workers, p)
		if err := p.start(""); err != nil {
			return err
		}
	}
	common := func(extra ...string) func(int) []string {
		return func(int) []string {
			return append(s.baseEnv(), append([]string{"SYS1_NATS_URL=" + s.nats.urls(0), "SYS1_STREAM_REPLICAS=3", "SYS1_LOG_LEVEL=info"}, extra...)...)
		}
	}
	sinkProc := newProc("sink", 0, o.Sys1, []string{"sink"}, common(
		"SYS1_CLICKHOUSE_DSN="+sinkDSN, "SYS1_CLICKHOUSE_DATABASE="+s.db, fmt.Sprintf("SYS1_HTTP_ADDR=127.0.0.1:%d", s.ports.sink),
		"SYS1_SINK_BATCH_AGE=250ms", "SYS1_SINK_RETRY_MAX=5s"), logs, s.tl)
	reviewProc := newProc("review", 0, o.Sys1, []string{"review", "--http", fmt.Sprintf("127.0.0.1:%d", s.ports.review)},
		common("SYS1_REVIEW_USERS="+s.files.users), logs, s.tl)
	s.others = []*proc{sinkProc, reviewProc}
	for _, p := range s.others {
		if err := p.start(""); err != nil {
			return err
		}
	}
	// Everyone ready before the load: the workers and the sink answer /readyz, the review page
	// has read its stream.
	for _, target := range s.readiness() {
		if err := waitUntil(ctx, 120*time.Second, target.ready); err != nil {
			return fmt.Errorf("%s did not become ready: %w (its log: %s)", target.name, err, filepath.Join(logs, target.name+".log"))
		}
		s.tl.Add(Event{What: "ready", Target: target.name})
	}
	// The plan's times count from here: the fleet is up, the load starts.
	ready := time.Now()
	s.tl.Add(Event{At: ready, What: "fleet ready", Detail: fmt.Sprintf("%d NATS nodes, %d workers, sink, review page, in %s", nodes, o.Workers, ready.Sub(s.start).Round(100*time.Millisecond))})
	s.start = ready
	s.tl.setStart(ready)

	// The soak reads what the fleet stores through durable consumers of its own, found by the
	// subjects the streams hold, not by their names.
	s.replies, s.labels = newReplies(), &labels{}
	repliesStream, err := streamFor(ctx, s.js, wire.Replies(CallerPlain, "x"))
	if err != nil {
		return fmt.Errorf("the replies stream: %w", err)
	}
	var filters []string
	for _, c := range []string{CallerPlain, CallerBudget, CallerCache, CallerHold} {
		filters = append(filters, wire.RepliesOf(c))
	}
	rc, err := newCollector(ctx, s.js, repliesStream, "soak-replies", filters, 3, s.replies.handle)
	if err != nil {
		return fmt.Errorf("the replies collector: %w", err)
	}
	labelsStream, err := streamFor(ctx, s.js, wire.LabelAccepted(CallerPlain))
	if err != nil {
		return fmt.Errorf("the labels stream: %w", err)
	}
	lc, err := newCollector(ctx, s.js, labelsStream, "soak-labels", []string{"sys1.labels.*.accepted"}, 3, s.labels.handle)
	if err != nil {
		return fmt.Errorf("the labels collector: %w", err)
	}
	if s.load, err = newLoad(s.nc, o.Seed, o.Rate); err != nil {
		return err
	}
	s.replies.onReply = s.load.answered
	collectCtx, stopCollect := context.WithCancel(context.WithoutCancel(ctx))
	s.stopCollectors = stopCollect
	s.collecting.Go(func() { rc.run(collectCtx) })
	s.collecting.Go(func() { lc.run(collectCtx) })

	s.reviewer = newReviewer(fmt.Sprintf("http://127.0.0.1:%d", s.ports.review), s.password, []string{"alice", "bob"}, o.Seed, time.Second)
	if o.BatchItems > 0 {
		s.batches = &batches{dir: filepath.Join(s.dir, "batches"), sys1: o.Sys1, env: common(), items: o.BatchItems,
			rng: mrand.New(mrand.NewPCG(o.Seed, o.Seed^0xba7c)), tl: s.tl}
		if err := os.MkdirAll(s.batches.dir, 0o755); err != nil {
			return err
		}
	}
	return nil
}

// baseEnv is what every process of the fleet inherits: no SYS1_* of the soak's own, and the
// options' Env.
func (s *soak) baseEnv() []string {
	var out []string
	for _, k := range []string{"PATH", "HOME", "TMPDIR", "TZ", "GOMAXPROCS", "GORACE", "GOCOVERDIR"} {
		if v, ok := os.LookupEnv(k); ok {
			out = append(out, k+"="+v)
		}
	}
	return append(out, s.o.Env...)
}

// workerEnv is worker slot's environment; each incarnation names itself w<slot>.<gen>.
func (s *soak) workerEnv(slot int) func(int) []string {
	return func(gen int) []string {
		return append(s.baseEnv(),
			"SYS1_NATS_URL="+s.nats.urls((slot-1)%len(s.nats.nodes)),
			fmt.Sprintf("SYS1_WORKER_ID=w%d.%d", slot, gen),
			"SYS1_STREAM_REPLICAS=3",
			"SYS1_AUTH_MODE=subject",
			"SYS1_PROVIDER=ollama",
			"SYS1_OLLAMA_BASE_URL="+s.model.url(slot),
			// A hung call gives up after 5 s, not 30: the failing model's hangs end soon.
			"SYS1_TIMEOUT_MS=5000",
			"SYS1_PROBE_INTERVAL=2s",
			"SYS1_POLICY_FILE="+s.files.policy,
			"SYS1_LIMITS_FILE="+s.files.limits,
			"SYS1_PRICES_FILE="+s.files.prices,
			fmt.Sprintf("SYS1_HTTP_ADDR=127.0.0.1:%d", s.ports.workers[slot-1]),
			"SYS1_LOG_LEVEL=info",
		)
	}
}

// writeFiles writes the policy (the hold caller's approval questions wait for a reviewer), the
// limits (a day budget, the cache), the prices (a cent a decision, so the budget counts
// decisions) and the reviewers' file.
func (s *soak) writeFiles() error {
	dir := filepath.Join(s.dir, "config")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	// The budget pays for about half of what its caller asks for: refusals start midway.
	expected := s.o.Rate * s.o.Duration.Seconds() * 0.20
	s.budget = max(int(expected/2), 5)
	files := map[*string]struct{ name, body string }{
		&s.files.policy: {"policy.yaml", `rules:
  - name: soak-hold
    caller: ` + CallerHold + `
    question: approve
    noul_abstain_between: [0, 1]
    review: hold
`},
		&s.files.limits: {"limits.yaml", fmt.Sprintf(`rules:
  - name: soak-day
    caller: %s
    usd_per_day: %.2f
  - name: soak-cache
    caller: %s
    cache: 24h
`, CallerBudget, float64(s.budget)/100, CallerCache)},
		&s.files.prices: {"prices.yaml", `providers:
  ollama:
    nimble:
      input_per_million: 0
      output_per_million: 0
      per_request: 0.01
`},
	}
	pw := make([]byte, 12)
	if _, err := rand.Read(pw); err != nil {
		return err
	}
	s.password = hex.EncodeToString(pw)
	var users strings.Builder
	for _, name := range []string{"alice", "bob"} {
		h, err := bcrypt.GenerateFromPassword([]byte(s.password), 10)
		if err != nil {
			return err
		}
		users.WriteString(name + ":" + string(h) + "\n")
	}
	files[&s.files.users] = struct{ name, body string }{"reviewers", users.String()}
	for dst, f := range files {
		*dst = filepath.Join(dir, f.name)
		if err := os.WriteFile(*dst, []byte(f.body), 0o600); err != nil {
			return err
		}
	}
	return nil
}

// proxiedDSN returns the host:port the DSN names and the DSN with PROXY in its place.
func proxiedDSN(dsn string) (string, string, error) {
	u, err := url.Parse(dsn)
	if err != nil || u.Host == "" {
		return "", "", fmt.Errorf("the ClickHouse DSN is not a URL with a host")
	}
	host := u.Host
	if u.Port() == "" {
		switch u.Scheme {
		case "http":
			host += ":8123"
		case "https":
			host += ":8443"
		default:
			host += ":9000"
		}
	}
	u.Host = "PROXY"
	return host, u.String(), nil
}

type readiness struct {
	name  string
	ready func() (bool, string)
}

func (s *soak) readiness() []readiness {
	get := func(port int) func() (bool, string) {
		return func() (bool, string) {
			resp, err := monitor.Get(fmt.Sprintf("http://127.0.0.1:%d/readyz", port))
			if err != nil {
				return false, err.Error()
			}
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
			resp.Body.Close()
			return resp.StatusCode == http.StatusOK, strings.TrimSpace(string(body))
		}
	}
	var out []readiness
	for i, w := range s.workers {
		out = append(out, readiness{w.name, get(s.ports.workers[i])})
	}
	out = append(out, readiness{"sink", get(s.ports.sink)}, readiness{"review", get(s.ports.review)})
	return out
}

// exercise runs the load, the batches, the reviewer and the fault plan for the duration, then
// waits (up to Drain) for the fleet to answer everything. It reports whether it did.
func (s *soak) exercise(ctx context.Context) (bool, time.Duration) {
	loadCtx, stopLoad := context.WithTimeout(ctx, s.o.Duration)
	defer stopLoad()
	workCtx, stopWork := context.WithCancel(context.WithoutCancel(ctx))
	defer stopWork()
	var wg sync.WaitGroup
	wg.Go(func() { s.load.run(loadCtx) })
	wg.Go(func() { s.reviewer.run(workCtx) })
	wg.Go(func() { s.load.runLabels(workCtx) })
	batchStop, stopBatches := context.WithCancel(context.WithoutCancel(ctx))
	defer stopBatches()
	if s.batches != nil {
		wg.Go(func() { s.batches.run(loadCtx, batchStop) })
	}
	faultsDone := make(chan struct{})
	go func() { defer close(faultsDone); s.runPlan(loadCtx) }()
	progress := time.NewTicker(10 * time.Second)
	defer progress.Stop()

	for loadCtx.Err() == nil {
		select {
		case <-loadCtx.Done():
		case <-progress.C:
			s.progress("load")
		}
	}
	<-faultsDone
	s.tl.Add(Event{What: "load ended", Detail: "draining: waiting for every acknowledged request to be answered"})

	// Drain: every acknowledged request answered (held ones released) and the batches done;
	// then, with the producers' labels and the reviewer stopped, the sink caught up and every
	// consumer drained.
	drainStart := time.Now()
	deadline := time.NewTimer(s.o.Drain)
	defer deadline.Stop()
	check := time.NewTicker(time.Second)
	defer check.Stop()
	for phase := 1; phase <= 2; {
		select {
		case <-ctx.Done():
			stopBatches()
			stopWork()
			wg.Wait()
			return false, time.Since(drainStart)
		case <-deadline.C:
			s.tl.Add(Event{What: "drain ran out", Detail: s.pendingSummary(ctx, phase)})
			stopBatches()
			stopWork()
			wg.Wait()
			return false, time.Since(drainStart)
		case <-progress.C:
			s.progress("drain")
		case <-check.C:
			if s.pendingSummary(ctx, phase) != "" {
				continue
			}
			if phase == 1 {
				stopWork() // the label producer and the reviewer: nothing is left for them
				wg.Wait()
			}
			phase++
		}
	}
	took := time.Since(drainStart)
	s.tl.Add(Event{What: "drained", Detail: fmt.Sprintf("in %s", took.Round(100*time.Millisecond))})
	return true, took
}

func (s *soak) progress(phase string) {
	reqs, _ := s.load.snapshot()
	acked, answered := 0, 0
	for _, r := range reqs {
		if r.Acked() {
			acked++
			if s.replies.answered(r.RunID, r.Kind == KindHold) {
				answered++
			}
		}
	}
	s.say("%8s  %s: %d requests sent, %d acknowledged, %d answered; %d model answers; %d labels by the reviewer",
		offset(s.start, time.Now()), phase, len(reqs), acked, answered, s.model.answered(), s.reviewer.labelled.Load())
}

// pendingSummary says what is still outstanding ("" when nothing): in phase 1 the answers and
// the batches, in phase 2 the labels, the consumers and ClickHouse.
func (s *soak) pendingSummary(ctx context.Context, phase int) string {
	var out []string
	reqs, _ := s.load.snapshot()
	if phase == 1 {
		unanswered := 0
		for _, r := range reqs {
			if r.Acked() && !s.replies.answered(r.RunID, r.Kind == KindHold) {
				unanswered++
			}
		}
		if unanswered > 0 {
			out = append(out, fmt.Sprintf("%d acknowledged requests unanswered", unanswered))
		}
		if s.batches != nil {
			s.batches.mu.Lock()
			cur := s.batches.cur
			s.batches.mu.Unlock()
			if cur != nil && cur.running() {
				out = append(out, "a batch still running")
			}
		}
		return strings.Join(out, ", ")
	}
	if n := s.load.labelsInFlight(); n > 0 {
		return fmt.Sprintf("%d producer labels being published", n)
	}
	cs, err := consumerStates(ctx, s.js)
	if err != nil {
		return "consumers: " + err.Error()
	}
	for _, c := range cs {
		if c.Pending > 0 || c.AckPending > 0 {
			out = append(out, fmt.Sprintf("consumer %s/%s %d pending %d unacknowledged", c.Stream, c.Name, c.Pending, c.AckPending))
		}
	}
	left, err := leftovers(ctx, s.js)
	if err != nil {
		return "streams: " + err.Error()
	}
	for _, l := range left {
		out = append(out, fmt.Sprintf("%d messages left in %s", l.Msgs, l.Stream))
	}
	if len(out) > 0 {
		return strings.Join(out, ", ")
	}
	// The sink has caught up once every answered run has its record, and every accepted label
	// its row.
	rows, labelRows, err := s.countRows(ctx)
	if err != nil {
		return "ClickHouse: " + err.Error()
	}
	want := 0
	for _, r := range reqs {
		if len(s.replies.byRunSnapshot(r.RunID)) > 0 || (r.Kind == KindHold && r.Acked()) {
			want++
		}
	}
	if s.batches != nil {
		for _, b := range s.batches.snapshot() {
			want += len(b.Lines)
		}
	}
	if rows < want {
		return fmt.Sprintf("ClickHouse has %d of %d records", rows, want)
	}
	accepted := map[[2]string]bool{}
	for _, l := range s.labels.snapshot() {
		accepted[[2]string{l.RunID, l.Question}] = true
	}
	if labelRows < len(accepted) {
		return fmt.Sprintf("ClickHouse has %d of %d labels", labelRows, len(accepted))
	}
	return ""
}

func (r *replies) byRunSnapshot(runID string) []Reply {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Reply(nil), r.byRun[runID]...)
}

// runPlan executes the fault plan until ctx ends; process faults one at a time, environment
// faults beside them.
func (s *soak) runPlan(ctx context.Context) {
	var procMu sync.Mutex
	var wg sync.WaitGroup
	for _, f := range s.plan.Faults {
		wait := time.Until(s.start.Add(f.At))
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			wg.Wait()
			return
		case <-t.C:
		}
		wg.Go(func() {
			switch f.Kind {
			case KillWorker, KillNATS, KillNATSAndWorker, CrashCluster:
				procMu.Lock()
				defer procMu.Unlock()
			}
			s.inject(ctx, f)
		})
	}
	wg.Wait()
}

// inject makes one fault happen, and undoes it after its time.
func (s *soak) inject(ctx context.Context, f Fault) {
	hold := func(d time.Duration) { pause(context.WithoutCancel(ctx), d) }
	switch f.Kind {
	case KillWorker:
		w := s.workers[f.Worker-1]
		w.kill("fault: " + string(f.Kind))
		hold(f.Down)
		s.startProc(w, "after "+f.Down.Round(100*time.Millisecond).String()+" down")
	case KillNATS, KillNATSAndWorker:
		i, why := s.pickNode(ctx, f)
		n := s.nats.nodes[i]
		n.proc.kill("fault: " + string(f.Kind) + "; " + why)
		if f.Kind == KillNATSAndWorker {
			w := s.workers[f.Worker-1]
			w.kill("fault: " + string(f.Kind) + "; with " + n.name)
			hold(min(f.Down/3, time.Second))
			// Started again while the node is down: it must ride out the failover.
			s.startProc(w, "while "+n.name+" is down")
			hold(f.Down - min(f.Down/3, time.Second))
		} else {
			hold(f.Down)
		}
		s.startProc(n.proc, "after "+f.Down.Round(100*time.Millisecond).String()+" down")
		s.awaitNATS(ctx)
	case CrashCluster:
		var wg sync.WaitGroup
		for _, n := range s.nats.nodes {
			wg.Go(func() { n.proc.kill("fault: " + string(f.Kind)) })
		}
		wg.Wait()
		hold(f.Down)
		for _, n := range s.nats.nodes {
			s.startProc(n.proc, "the cluster comes back")
		}
		s.awaitNATS(ctx)
	case CutClickHouse:
		s.proxy.setCut(true)
		s.tl.Add(Event{What: "cut clickhouse", Target: "sink → ClickHouse", Until: time.Now().Add(f.Down), Detail: "every connection closed, new ones refused"})
		hold(f.Down)
		s.proxy.setCut(false)
		s.tl.Add(Event{What: "restore clickhouse"})
	case PauseFleet:
		s.pauseFleet(f.Down)
	case SlowModel:
		s.model.slow(f.Latency)
		s.tl.Add(Event{What: "slow model", Until: time.Now().Add(f.Down), Detail: fmt.Sprintf("+%s a call", f.Latency)})
		hold(f.Down)
		s.model.heal()
		s.tl.Add(Event{What: "model healthy"})
	case FailModel:
		s.model.fail(f.Failure)
		s.tl.Add(Event{What: "failing model", Until: time.Now().Add(f.Down), Detail: f.Failure})
		hold(f.Down)
		s.model.heal()
		s.tl.Add(Event{What: "model healthy"})
	}
}

func (s *soak) startProc(p *proc, why string) {
	if p.running() {
		return // it came back on its own (restarted after exiting)
	}
	if err := p.start(why); err != nil {
		s.tl.Add(Event{What: "cannot start", Target: p.name, Detail: err.Error()})
	}
}

// pickNode is the node a NATS fault kills: the leader its role names, found now, or the node
// the plan names.
func (s *soak) pickNode(ctx context.Context, f Fault) (int, string) {
	if f.Role == "" {
		return f.Node - 1, "chosen by the plan"
	}
	var stream string
	switch f.Role {
	case RoleRequests:
		stream, _ = streamFor(ctx, s.js, wire.Decide(CallerPlain))
	case RoleGate:
		stream = "KV_sys1-runs"
	case RoleBudgets:
		stream = "KV_sys1-limits"
	}
	if stream != "" {
		if leader, err := leaderOf(ctx, s.js, stream); err == nil {
			if i := s.nats.index(leader); i >= 0 {
				return i, "leader of " + stream
			}
		}
	}
	i := s.rng.IntN(len(s.nats.nodes))
	return i, "the " + f.Role + " could not be found; a random node"
}

// awaitNATS waits (60 s at most) for every node to be back and healthy, so the next process
// fault never makes two nodes down at once by accident.
func (s *soak) awaitNATS(ctx context.Context) {
	if err := s.nats.waitHealthy(ctx, 60*time.Second); err != nil {
		s.tl.Add(Event{What: "nats not healthy", Detail: err.Error()})
	}
}

// pauseFleet pauses the fleet with sys1 pause, as an operator does, and resumes it.
func (s *soak) pauseFleet(d time.Duration) {
	env := append(s.baseEnv(), "SYS1_NATS_URL="+s.nats.urls(0))
	run := func(args ...string) error {
		var last error
		for try := 0; try < 10; try++ {
			cmd := exec.Command(s.o.Sys1, args...)
			cmd.Env = env
			out, err := cmd.CombinedOutput()
			if err == nil {
				return nil
			}
			last = fmt.Errorf("%s: %v: %s", strings.Join(args, " "), err, lastLine(string(out)))
			time.Sleep(500 * time.Millisecond) // NATS failing over: the command is tried again
		}
		return last
	}
	if err := run("pause", "--for", d.Round(time.Second).String(), "--reason", "sys1 soak"); err != nil {
		s.tl.Add(Event{What: "cannot pause", Detail: err.Error()})
		return
	}
	until := time.Now().Add(d) // from when the pause took: the command may have waited for NATS
	s.tl.Add(Event{What: "pause the fleet", Until: until, Detail: "sys1 pause --for " + d.Round(time.Second).String()})
	pause(context.Background(), time.Until(until))
	if err := run("resume"); err != nil {
		s.tl.Add(Event{What: "cannot resume", Detail: err.Error() + " (the pause ends by itself)"})
		return
	}
	s.tl.Add(Event{What: "resume the fleet"})
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
