package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/sys1hq/sys1/cmd/sys1/loadtest"
	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/provider/ollamatest"
	"github.com/sys1hq/sys1/worker/natsconn"
)

func init() {
	register(command{name: "bench", summary: "load generator and report (--self: a whole deployment in-process)", run: runBench})
}

const benchUsage = `usage: sys1 bench [flags]

Publishes System One requests to sys1.decide.<caller> from concurrent producers, collects every
reply and reports sent, succeeded, failed by code, throughput, end-to-end latency, queue wait,
provider time and the peak number of concurrent provider calls.

Against a running deployment it connects like 'sys1 decide' (SYS1_NATS_URL, default
nats://127.0.0.1:4222, and SYS1_NATS_*). Pass --metrics-url with the workers' /metrics
(SYS1_HTTP_ADDR) to report their provider-call peak.

With --self it starts, in this process, an embedded NATS server (temporary store), --replicas
worker replicas with --concurrency each, and a fake Ollama answering in --provider-latency, so
the worker's own overhead can be measured anywhere. With --provider-slots N the fake serves
like one real Ollama instead: N calls at once, an unbounded FIFO queue behind them (no 503,
as for a loaded model) and a service time of --provider-latency + questions ×
(--provider-per-question + --provider-per-kib × state KiB). See deploy/performance.md.

With --self --fairness it measures fair share between callers (issue 21; deploy/performance.md
figure 13), each measurement once with fair share and once in arrival order
(SYS1_FAIR_SHARE=off), alternating, on a fresh deployment each: a NATS server and a
'sys1 worker' as processes of their own (this binary), the fake Ollama and the load in this
one. floods: caller b's --fair-b requests, sent once a flood of --fair-floods times as many
from caller a is stored, against b alone (b's p50/p99, publish to reply). throughput: caller a
alone drains --fair-drain requests (decisions/s, fair share ÷ arrival order). callers:
--fair-callers-n requests round robin over --fair-callers callers (the worker's and the
server's CPU per 1,000 decisions and peak RSS, their flow consumers and how long creating them
took). --concurrency defaults to 8 there.

Exit status: 0 when every run succeeded, 1 when any failed, went unanswered or could not be
published (with --fairness, b still waiting at --fair-cap is a measurement, not a failure), 2
on usage or connection errors.

flags:
`

type benchFlags struct {
	n            int
	duration     time.Duration
	rate         float64
	producers    int
	template     string
	caller       string
	replyTimeout time.Duration
	jsonOut      bool
	metricsURLs  string
	progress     string

	self            bool
	replicas        int
	concurrency     int
	fetchBatch      int
	concurrencyMode string
	providerLatency time.Duration
	providerSlots   int
	perQuestion     time.Duration
	perKiB          time.Duration
	preload         bool
	hold            bool
	cpuProfile      string
	memProfile      string
	memSample       time.Duration
	batch           int
	natsNodes       int
	natsSync        string
	arrivalOrder    bool
	fair            fairFlags
}

func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	f, code, ok := parseBenchFlags(args, stderr)
	if !ok {
		return code
	}
	return f.run(ctx, stdout, stderr)
}

// parseBenchFlags parses and checks the flags; on !ok the command exits with code.
func parseBenchFlags(args []string, stderr io.Writer) (f *benchFlags, code int, ok bool) {
	f = &benchFlags{}
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, benchUsage); fs.PrintDefaults() }
	fs.IntVar(&f.n, "n", 2000, "requests to publish (with --duration: at most this many, no cap unless given; 0 = no cap)")
	fs.DurationVar(&f.duration, "duration", 0, "publish for this long instead of a fixed count")
	fs.Float64Var(&f.rate, "rate", 0, "target publish rate over all producers, per second (0 = as fast as possible)")
	fs.IntVar(&f.producers, "c", 16, "concurrent producers")
	fs.StringVar(&f.template, "template", "ticket", "request: "+strings.Join(loadtest.TemplateNames(), ", ")+" (contract/examples) or a JSON file")
	fs.StringVar(&f.caller, "caller", "bench", "caller token: publishes to sys1.decide.<caller>")
	fs.DurationVar(&f.replyTimeout, "reply-timeout", 30*time.Second, "give up on outstanding replies after this long without any reply")
	fs.BoolVar(&f.jsonOut, "json", false, "print the report as JSON")
	fs.StringVar(&f.metricsURLs, "metrics-url", "", "comma list of worker /metrics URLs to read the provider-call peak from")
	fs.StringVar(&f.progress, "progress", "auto", "live progress line on stderr: auto (when stderr is a terminal), always, never")
	fs.BoolVar(&f.self, "self", false, "start NATS, worker replicas and a fake Ollama in this process")
	fs.IntVar(&f.replicas, "replicas", 1, "--self: worker replicas (0: NATS and the fake only, for workers run separately; their URLs go to stderr)")
	fs.IntVar(&f.concurrency, "concurrency", 64, "--self: SYS1_CONCURRENCY of each replica")
	fs.IntVar(&f.fetchBatch, "fetch-batch", 0, "--self: SYS1_FETCH_BATCH of each replica (0 = the worker's default)")
	fs.StringVar(&f.concurrencyMode, "concurrency-mode", "fixed", "--self: SYS1_CONCURRENCY_MODE of each replica, fixed or adaptive")
	fs.DurationVar(&f.providerLatency, "provider-latency", 20*time.Millisecond, "--self: the fake Ollama's latency per call (with --provider-slots: the base service time)")
	fs.IntVar(&f.providerSlots, "provider-slots", 0, "--self: serve like one real Ollama with this many slots and an unbounded queue (0 = every call at once)")
	fs.DurationVar(&f.perQuestion, "provider-per-question", 0, "--self --provider-slots: service time added per question")
	fs.DurationVar(&f.perKiB, "provider-per-kib", 0, "--self --provider-slots: service time added per question per KiB of state")
	fs.BoolVar(&f.preload, "preload", false, "--self: publish every request before starting the workers (a backlog), then time the drain")
	fs.BoolVar(&f.hold, "hold", false, "--self: after the report, keep the NATS server up (its URL on stderr) until interrupted")
	fs.StringVar(&f.cpuProfile, "cpuprofile", "", "write a CPU profile of the run (generator and, with --self, the workers) to this file")
	fs.StringVar(&f.memProfile, "memprofile", "", "write a heap profile (in-use memory when the last reply arrived) to this file")
	fs.DurationVar(&f.memSample, "mem-sample", 250*time.Millisecond, "--self: memory sampling period")
	fs.IntVar(&f.natsNodes, "nats-nodes", 1, "--self: NATS servers: 1 (R1 streams) or 3 (an in-process cluster, R3 streams and buckets, as deployed)")
	fs.StringVar(&f.natsSync, "nats-sync", "always", "--self: the servers' JetStream sync_interval: always (as shipped: every write on disk before its ack) or a duration (2m: nats-server's default)")
	fs.BoolVar(&f.arrivalOrder, "arrival-order", false, "--self: run the replicas without fair share (SYS1_FAIR_SHARE=off: each lane read through one shared consumer, in arrival order)")
	fs.IntVar(&f.batch, "batch", 0, "--self: a batch of this many copies of the template drains beside the interactive load (published and read by the batch client; the load starts once the batch is draining and the batch stops when it ends); with -n 0, the batch alone")
	f.fair.define(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, exitOK, false
		}
		return nil, exitUsage, false
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "sys1 bench: unexpected argument %q\n", fs.Arg(0))
		fs.Usage()
		return nil, exitUsage, false
	}
	set := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	if f.fair.on && !set["concurrency"] {
		// The fairness figure's default: few slots, so a flood queues and b's wait shows.
		f.concurrency = 8
	}
	if f.duration > 0 && !set["n"] {
		// --duration alone publishes for that long: the default count would end it early.
		f.n = 0
	}
	if err := f.check(set); err != nil {
		fmt.Fprintf(stderr, "sys1 bench: %v\n", err)
		return nil, exitUsage, false
	}
	return f, exitOK, true
}

func (f *benchFlags) run(ctx context.Context, stdout, stderr io.Writer) int {
	if f.fair.on {
		return f.runFairness(ctx, stdout, stderr)
	}
	body, err := loadtest.Template(f.template)
	if err != nil {
		fmt.Fprintf(stderr, "sys1 bench: --template: %v\n", err)
		return exitUsage
	}
	opts := loadtest.Options{
		Requests: f.n, Duration: f.duration, Rate: f.rate, Producers: f.producers,
		Caller: f.caller, Body: body, ReplyTimeout: f.replyTimeout,
	}
	if showProgress(f.progress, stderr) {
		opts.Progress = func(p loadtest.Progress) {
			fmt.Fprintf(stderr, "\r\033[Ksent %d  answered %d  outstanding %d  %.1fs", p.Sent, p.Answered, p.Outstanding, p.Elapsed.Seconds())
		}
	}

	if f.cpuProfile != "" {
		pf, err := os.Create(f.cpuProfile)
		if err != nil {
			fmt.Fprintf(stderr, "sys1 bench: --cpuprofile: %v\n", err)
			return exitUsage
		}
		defer func() { _ = pf.Close() }()
		// Started after flag parsing, before the deployment, so a profile shows start-up too;
		// under load the steady state dominates it.
		if err := pprof.StartCPUProfile(pf); err != nil {
			fmt.Fprintf(stderr, "sys1 bench: --cpuprofile: %v\n", err)
			return exitUsage
		}
		defer pprof.StopCPUProfile()
	}

	var rep *loadtest.Report
	var batchRep *benchBatchReport
	var runErr error
	var self *loadtest.Self
	if f.self {
		log := zerolog.New(stderr).Level(zerolog.WarnLevel).With().Timestamp().Logger()
		self, err = loadtest.StartSelf(ctx, loadtest.SelfOptions{
			Replicas: f.replicas, Concurrency: f.concurrency, FetchBatch: f.fetchBatch, ConcurrencyMode: f.concurrencyMode,
			ProviderLatency: f.providerLatency, ProviderSlots: f.providerSlots,
			ProviderPerQuestion: f.perQuestion, ProviderPerStateKiB: f.perKiB, Logger: log,
			NATSNodes: f.natsNodes, SyncInterval: f.natsSync, ArrivalOrder: f.arrivalOrder,
		})
		if err != nil {
			fmt.Fprintf(stderr, "sys1 bench: --self: %v\n", err)
			return exitUsage
		}
		defer func() {
			if err := self.Close(); err != nil {
				fmt.Fprintf(stderr, "sys1 bench: tear-down: %v\n", err)
			}
		}()
		if f.replicas == 0 {
			fmt.Fprintf(stderr, "sys1 bench: no replicas in-process; run workers with SYS1_NATS_URL=%s SYS1_OLLAMA_BASE_URL=%s\n", self.URL(), self.ProviderURL())
		}
		if f.preload {
			opts.BeforeDrain = func(ctx context.Context, published int64) error {
				fmt.Fprintf(stderr, "sys1 bench: backlog of %d requests published; draining\n", published)
				return self.StartWorkers(ctx)
			}
		} else if err := self.StartWorkers(ctx); err != nil {
			fmt.Fprintf(stderr, "sys1 bench: %v\n", err)
			return exitUsage
		}
		opts.Sampler = &loadtest.MemorySampler{Interval: f.memSample}
		nc, err := self.Connect()
		if err != nil {
			fmt.Fprintf(stderr, "sys1 bench: %v\n", err)
			return exitUsage
		}
		defer nc.Close()
		if f.batch > 0 {
			bb, err := startBenchBatch(ctx, self.URL(), f.caller, body, f.batch)
			if err != nil {
				fmt.Fprintf(stderr, "sys1 bench: %v\n", err)
				return exitUsage
			}
			defer bb.cleanup()
			if batchRep, rep, runErr = f.runBesideBatch(ctx, bb, nc, opts); batchRep == nil {
				fmt.Fprintf(stderr, "sys1 bench: %v\n", runErr)
				return exitUsage
			}
		} else {
			rep, runErr = loadtest.Run(ctx, nc, opts)
		}
		if rep != nil {
			rep.Peak = self.Peak()
		}
	} else {
		conn, err := dialClient(ctx, "sys1-bench", stderr)
		if err != nil {
			fmt.Fprintf(stderr, "sys1 bench: %v\n", err)
			return exitUsage
		}
		defer conn.Close()
		rep, runErr = loadtest.Run(ctx, conn.NC, opts)
		if rep != nil && f.metricsURLs != "" {
			if rep.Peak, err = loadtest.ScrapePeak(ctx, splitList(f.metricsURLs)); err != nil {
				fmt.Fprintf(stderr, "sys1 bench: --metrics-url: %v\n", err)
			}
		}
	}
	if opts.Progress != nil {
		fmt.Fprint(stderr, "\r\033[K")
	}
	if f.memProfile != "" {
		// Before tear-down, so the profile shows what the deployment holds after the run.
		if err := writeHeapProfile(f.memProfile); err != nil {
			fmt.Fprintf(stderr, "sys1 bench: --memprofile: %v\n", err)
		}
	}
	if rep == nil && batchRep == nil {
		fmt.Fprintf(stderr, "sys1 bench: %v\n", runErr)
		return exitUsage
	}
	if runErr != nil {
		fmt.Fprintf(stderr, "sys1 bench: publishing stopped early: %v\n", runErr)
	}

	out := benchOutput{Setup: f.setup(body), Report: rep, Batch: batchRep}
	capacity, realistic := ollamatest.Capacity{}, false
	if f.self {
		capacity, realistic = self.ProviderCapacity()
	}
	if realistic && f.replicas > 0 {
		// The provider bound: its slots busy with the template's service time.
		if svc := templateService(capacity, body); svc > 0 {
			out.ProviderBound = float64(capacity.Slots) / svc.Seconds()
		}
		q := self.ProviderQueue()
		out.ProviderQueue = &q
	} else if f.self && f.providerLatency > 0 && f.replicas > 0 {
		// The provider bound: every replica's slots busy with calls that take providerLatency.
		out.ProviderBound = float64(f.replicas*f.concurrency) / f.providerLatency.Seconds()
	}
	switch {
	case out.ProviderBound > 0 && batchRep == nil:
		out.Efficiency = rep.Throughput / out.ProviderBound
	case out.ProviderBound > 0 && rep == nil:
		// The batch alone: its throughput is what the efficiency measures.
		batchRep.Efficiency = batchRep.Throughput / out.ProviderBound
		out.Efficiency = batchRep.Efficiency
	}
	// With a batch beside it, the provider's busy time is shared with the batch: no
	// utilisation of the interactive load's own.
	if f.self && f.replicas > 0 && batchRep == nil && rep.ElapsedMS > 0 && rep.Succeeded > 0 {
		// How busy the worker kept the provider's slots: the fake's own summed call time over
		// the run's window and the slots (exact, where the attempts' latency_ms is rounded
		// down to whole milliseconds), whatever the provider's overhead on its nominal latency.
		busy := self.ProviderBusy()
		slots := f.replicas * f.concurrency
		if realistic {
			slots = capacity.Slots // busy time is slot time only
		}
		out.ProviderUtilisation = busy.Seconds() / (rep.ElapsedMS / 1000) / float64(slots)
		var calls int64
		for _, st := range self.Stats() {
			calls += st.ProviderCalls
		}
		if calls > 0 {
			out.ProviderMeanCallMS = float64(busy.Microseconds()) / 1000 / float64(calls)
		}
	}
	if err := out.write(stdout, f.jsonOut); err != nil {
		fmt.Fprintf(stderr, "sys1 bench: %v\n", err)
		return exitUsage
	}

	if f.self && f.hold {
		fmt.Fprintf(stderr, "sys1 bench: holding; NATS at %s (workers still running); interrupt to stop\n", self.URL())
		<-ctx.Done()
	}
	if runErr != nil || rep != nil && (rep.Failed > 0 || rep.PublishErrors > 0) ||
		batchRep != nil && (batchRep.Failed > 0 || batchRep.Error != "") {
		return exitFailed
	}
	return exitOK
}

// runBesideBatch runs the interactive load once the batch is draining and stops the batch when
// it ends; with -n 0 it waits for the batch alone. A nil batch report means the batch could
// not run; err says why.
func (f *benchFlags) runBesideBatch(ctx context.Context, bb *benchBatch, nc *nats.Conn, opts loadtest.Options) (*benchBatchReport, *loadtest.Report, error) {
	if f.n == 0 && f.duration <= 0 {
		if err := bb.wait(ctx); err != nil {
			return bb.report(), nil, err
		}
		return bb.report(), nil, nil
	}
	if err := bb.waitDraining(ctx); err != nil {
		return nil, nil, err
	}
	before := bb.snapshot()
	rep, err := loadtest.Run(ctx, nc, opts)
	after := bb.snapshot()
	bb.stop()
	br := bb.report()
	br.DuringInteractive = after.Done() - before.Done()
	br.UnfinishedAfter = after.Total - after.Done()
	return br, rep, err
}

// selfOnly are the flags that only mean something with --self.
var selfOnly = []string{"replicas", "concurrency", "fetch-batch", "concurrency-mode", "provider-latency", "provider-slots", "provider-per-question", "provider-per-kib", "preload", "hold", "mem-sample", "batch", "nats-nodes", "nats-sync", "arrival-order"}

// check validates the flags; set holds the names given on the command line.
func (f *benchFlags) check(set map[string]bool) error {
	var errs []error
	if f.n < 0 {
		errs = append(errs, fmt.Errorf("-n must not be negative, got %d", f.n))
	}
	if f.duration < 0 {
		errs = append(errs, fmt.Errorf("--duration must not be negative, got %s", f.duration))
	}
	if f.concurrencyMode != "fixed" && f.concurrencyMode != "adaptive" {
		errs = append(errs, fmt.Errorf("--concurrency-mode must be fixed or adaptive, got %q", f.concurrencyMode))
	}
	if f.fetchBatch < 0 {
		errs = append(errs, fmt.Errorf("--fetch-batch must not be negative, got %d", f.fetchBatch))
	}
	if f.n == 0 && f.duration <= 0 && f.batch == 0 {
		errs = append(errs, errors.New("-n 0 needs a --duration (or a --batch to run alone)"))
	}
	if f.batch < 0 {
		errs = append(errs, fmt.Errorf("--batch must not be negative, got %d", f.batch))
	}
	if f.batch > 0 && f.preload {
		errs = append(errs, errors.New("--batch and --preload do not go together: the batch is the backlog"))
	}
	if f.producers < 1 {
		errs = append(errs, fmt.Errorf("-c must be at least 1, got %d", f.producers))
	}
	if f.rate < 0 {
		errs = append(errs, fmt.Errorf("--rate must not be negative, got %g", f.rate))
	}
	if f.replyTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--reply-timeout must be positive, got %s", f.replyTimeout))
	}
	switch f.progress {
	case "auto", "always", "never":
	default:
		errs = append(errs, fmt.Errorf("--progress must be auto, always or never, got %q", f.progress))
	}
	if !f.self {
		for _, name := range selfOnly {
			if set[name] {
				errs = append(errs, fmt.Errorf("--%s needs --self", name))
			}
		}
	} else if f.metricsURLs != "" {
		errs = append(errs, errors.New("--metrics-url is for an external deployment; --self reports the peak itself"))
	}
	if f.preload && (f.n == 0 || f.duration > 0) {
		errs = append(errs, errors.New("--preload needs -n (a fixed backlog) and no --duration"))
	}
	if f.providerSlots < 0 {
		errs = append(errs, fmt.Errorf("--provider-slots must not be negative, got %d", f.providerSlots))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"provider-per-question", f.perQuestion}, {"provider-per-kib", f.perKiB}} {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("--%s must not be negative, got %s", d.name, d.v))
		}
		if set[d.name] && f.providerSlots == 0 {
			errs = append(errs, fmt.Errorf("--%s needs --provider-slots", d.name))
		}
	}
	if f.memSample <= 0 {
		errs = append(errs, fmt.Errorf("--mem-sample must be positive, got %s", f.memSample))
	}
	if f.natsNodes != 1 && f.natsNodes != 3 {
		errs = append(errs, fmt.Errorf("--nats-nodes must be 1 or 3, got %d", f.natsNodes))
	}
	if _, _, err := natsconn.ParseSyncInterval(f.natsSync); err != nil {
		errs = append(errs, fmt.Errorf("--nats-sync: %v", err))
	}
	errs = append(errs, f.fair.check(f, set)...)
	return errors.Join(errs...)
}

// benchSetup echoes what was measured, so a JSON report stands on its own.
type benchSetup struct {
	Template          string  `json:"template"`
	RequestBytes      int     `json:"request_bytes"`
	Requests          int     `json:"requests"`
	DurationMS        float64 `json:"duration_ms,omitempty"`
	Rate              float64 `json:"rate_per_s"`
	Producers         int     `json:"producers"`
	Self              bool    `json:"self"`
	Replicas          int     `json:"replicas,omitempty"`
	Concurrency       int     `json:"concurrency,omitempty"`
	ProviderLatencyMS float64 `json:"provider_latency_ms,omitempty"`
	// ProviderSlots and the per-question and per-KiB costs describe the realistic fake.
	ProviderSlots         int     `json:"provider_slots,omitempty"`
	ProviderPerQuestionMS float64 `json:"provider_per_question_ms,omitempty"`
	ProviderPerKiBMS      float64 `json:"provider_per_kib_ms,omitempty"`
	Preload               bool    `json:"preload,omitempty"`
	NATSNodes             int     `json:"nats_nodes,omitempty"`
	NATSSync              string  `json:"nats_sync,omitempty"`
	ArrivalOrder          bool    `json:"arrival_order,omitempty"`
}

func (f *benchFlags) setup(body []byte) benchSetup {
	s := benchSetup{Template: f.template, RequestBytes: len(body), Requests: f.n, Rate: f.rate, Producers: f.producers, Self: f.self}
	if f.duration > 0 {
		s.DurationMS = float64(f.duration.Milliseconds())
	}
	if f.self {
		s.Replicas, s.Concurrency, s.Preload = f.replicas, f.concurrency, f.preload
		s.NATSNodes, s.NATSSync, s.ArrivalOrder = f.natsNodes, f.natsSync, f.arrivalOrder
		s.ProviderLatencyMS = float64(f.providerLatency.Microseconds()) / 1000
		s.ProviderSlots = f.providerSlots
		s.ProviderPerQuestionMS = float64(f.perQuestion.Microseconds()) / 1000
		s.ProviderPerKiBMS = float64(f.perKiB.Microseconds()) / 1000
	}
	return s
}

type benchOutput struct {
	Setup  benchSetup       `json:"setup"`
	Report *loadtest.Report `json:"report"`
	// ProviderBound is replicas × concurrency ÷ provider latency (--self with a latency),
	// or with --provider-slots the slots ÷ the template's service time; Efficiency is the
	// achieved throughput over it.
	ProviderBound float64 `json:"provider_bound_per_s,omitempty"`
	Efficiency    float64 `json:"efficiency,omitempty"`
	// ProviderUtilisation is the average share of the provider slots (replicas × concurrency)
	// in use: throughput × mean provider time ÷ slots (--self).
	ProviderUtilisation float64 `json:"provider_utilisation,omitempty"`
	// ProviderMeanCallMS is the fake's mean call time (--self): against the nominal
	// --provider-latency it is the provider's own overhead, which efficiency counts and
	// utilisation does not.
	ProviderMeanCallMS float64 `json:"provider_mean_call_ms,omitempty"`
	// ProviderQueue is the realistic fake's queue counters (--provider-slots).
	ProviderQueue *ollamatest.QueueStats `json:"provider_queue,omitempty"`
	// Batch is the batch that drained beside the load (--batch).
	Batch *benchBatchReport `json:"batch,omitempty"`
}

func (o benchOutput) write(w io.Writer, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(o)
	}
	s := o.Setup
	target := "as fast as possible"
	if s.Rate > 0 {
		target = fmt.Sprintf("%g/s", s.Rate)
	}
	fmt.Fprintf(w, "sys1 bench: template %s (%d bytes), %d producers, rate %s", s.Template, s.RequestBytes, s.Producers, target)
	if s.Self {
		fmt.Fprintf(w, "; in-process: %d replica(s) × concurrency %d, provider latency %gms", s.Replicas, s.Concurrency, s.ProviderLatencyMS)
		if s.ProviderSlots > 0 {
			fmt.Fprintf(w, " + %gms a question + %gms a question per KiB of state, %d slot(s), unbounded queue", s.ProviderPerQuestionMS, s.ProviderPerKiBMS, s.ProviderSlots)
		}
		if s.Preload {
			fmt.Fprint(w, ", preloaded backlog")
		}
		fmt.Fprintf(w, "; %d NATS node(s), sync_interval %s", s.NATSNodes, s.NATSSync)
		if s.ArrivalOrder {
			fmt.Fprint(w, "; arrival order (no fair share)")
		}
	}
	switch {
	case o.Batch != nil && o.Report == nil:
		fmt.Fprintf(w, "; a %d-item batch alone, no interactive load", o.Batch.Items)
	case o.Batch != nil:
		fmt.Fprintf(w, "; a %d-item batch draining beside it", o.Batch.Items)
	}
	fmt.Fprintln(w)
	if o.Report != nil {
		if err := o.Report.WriteText(w); err != nil {
			return err
		}
	}
	if o.Batch != nil {
		o.Batch.write(w)
	}
	switch {
	case o.Efficiency == 0:
		// A batch beside the load shares the provider: no efficiency of the load's own.
	case o.ProviderBound > 0 && s.ProviderSlots > 0:
		fmt.Fprintf(w, "efficiency    %.3f of the provider bound %.2f/s (slots ÷ the template's service time)\n", o.Efficiency, o.ProviderBound)
	case o.ProviderBound > 0:
		fmt.Fprintf(w, "efficiency    %.3f of the provider bound %.0f/s (replicas × concurrency ÷ provider latency)\n", o.Efficiency, o.ProviderBound)
	}
	if q := o.ProviderQueue; q != nil {
		fmt.Fprintf(w, "model queue   served %d, wasted %d (served after the caller timed out), abandoned %d, most waiting %d\n", q.Served, q.Wasted, q.Abandoned, q.MaxWaiting)
	}
	if o.ProviderUtilisation > 0 {
		fmt.Fprintf(w, "utilisation   %.3f of the provider slots busy on average (the fake's summed call time ÷ elapsed ÷ slots; mean call %.2f ms)\n", o.ProviderUtilisation, o.ProviderMeanCallMS)
	}
	return nil
}

// templateService is the realistic fake's service time for the template's request.
func templateService(c ollamatest.Capacity, body []byte) time.Duration {
	req, derr := contract.DecodeRequest(body)
	if derr != nil {
		return 0
	}
	return c.ServiceTime(len(req.Questions), len(req.State))
}

// showProgress decides whether to draw the live line: only on a terminal unless forced, so
// logs and pipes stay clean.
func showProgress(mode string, stderr io.Writer) bool {
	switch mode {
	case "always":
		return true
	case "never":
		return false
	}
	f, ok := stderr.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	runtime.GC() // in-use figures are as of the last collection
	if err := pprof.WriteHeapProfile(f); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}
