package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sys1hq/sys1/cmd/sys1/loadtest"
	"github.com/sys1hq/sys1/contract/wire"
	"github.com/sys1hq/sys1/provider/ollamatest"
	"github.com/sys1hq/sys1/worker/topology"
)

// fairFlags are bench --fairness's own flags (issue 21's fairness figure, deploy/performance.md
// figure 13).
type fairFlags struct {
	on       bool
	rounds   int
	parts    string
	b        int
	bRate    float64
	floods   string
	cap      time.Duration
	drain    int
	drainLat time.Duration
	callers  string
	callersN int
	idle     time.Duration
	plot     string

	// Parsed from the strings above by check.
	partSet     map[string]bool
	floodList   []int
	callersList []int
	// bin is the sys1 binary the NATS server and the worker run as (default: this one).
	bin string
}

// fairParts are the measurements of --fairness, in the order each round runs them.
var fairParts = []string{"floods", "throughput", "callers"}

// fairnessOnly are the flags that only mean something with --fairness.
var fairnessOnly = []string{"fair-rounds", "fair-parts", "fair-b", "fair-b-rate", "fair-floods", "fair-cap", "fair-drain", "fair-drain-latency", "fair-callers", "fair-callers-n", "fair-idle", "fair-plot"}

// notWithFairness are bench flags --fairness has no use for: it publishes its own loads,
// starts its own deployments, and its worker runs in a process of its own.
var notWithFairness = []string{"n", "duration", "rate", "caller", "preload", "hold", "batch", "replicas", "nats-nodes",
	"provider-slots", "provider-per-question", "provider-per-kib", "arrival-order", "mem-sample", "cpuprofile", "memprofile", "metrics-url"}

func (f *fairFlags) define(fs *flag.FlagSet) {
	fs.BoolVar(&f.on, "fairness", false, "--self: the fairness figure (issue 21): caller b beside a flood of caller a, a's throughput, and the cost of many callers, with fair share and with arrival order (SYS1_FAIR_SHARE=off), alternated; NATS and the worker run as processes of their own")
	fs.IntVar(&f.rounds, "fair-rounds", 3, "--fairness: rounds; each runs every measurement once with fair share and once in arrival order, alternating which goes first")
	fs.StringVar(&f.parts, "fair-parts", strings.Join(fairParts, ","), "--fairness: the measurements to run, a comma list of "+strings.Join(fairParts, ", "))
	fs.IntVar(&f.b, "fair-b", 10, "--fairness floods: caller b's requests in each round")
	fs.Float64Var(&f.bRate, "fair-b-rate", 20, "--fairness floods: b's publish rate, per second (0: all at once)")
	fs.StringVar(&f.floods, "fair-floods", "10,100,1000", "--fairness floods: caller a's flood, in multiples of b's requests (b alone is always measured too)")
	fs.DurationVar(&f.cap, "fair-cap", time.Minute, "--fairness floods: the longest b is waited for; its requests unanswered by then are reported as waiting longer")
	fs.IntVar(&f.drain, "fair-drain", 4000, "--fairness throughput: the requests caller a alone publishes as fast as -c producers can")
	fs.DurationVar(&f.drainLat, "fair-drain-latency", 0, "--fairness throughput: the fake's latency for a alone (short, so the worker's own cost shows)")
	fs.StringVar(&f.callers, "fair-callers", "10,100,1000", "--fairness callers: numbers of active callers")
	fs.IntVar(&f.callersN, "fair-callers-n", 4000, "--fairness callers: requests in each round, round robin over the callers, as fast as -c producers can")
	fs.StringVar(&f.plot, "fair-plot", "", "--fairness floods: also draw b's p50 and p99 against a's flood, fair share and arrival order, as a PNG to this file")
	fs.DurationVar(&f.idle, "fair-idle", 3*time.Second, "--fairness callers: after the drain, how long the idle worker and server are measured (their consumers still in place)")
}

// check validates the --fairness flags; set holds the names given on the command line.
func (f *fairFlags) check(b *benchFlags, set map[string]bool) []error {
	var errs []error
	if !f.on {
		for _, name := range fairnessOnly {
			if set[name] {
				errs = append(errs, fmt.Errorf("--%s needs --fairness", name))
			}
		}
		return errs
	}
	if !b.self {
		errs = append(errs, errors.New("--fairness needs --self (it starts deployments of its own)"))
	}
	for _, name := range notWithFairness {
		if set[name] {
			dash := "--"
			if len(name) == 1 {
				dash = "-"
			}
			errs = append(errs, fmt.Errorf("%s%s does not apply to --fairness", dash, name))
		}
	}
	if b.providerSlots > 0 {
		errs = append(errs, errors.New("--fairness uses the fake that answers every call in --provider-latency, not --provider-slots"))
	}
	if f.rounds < 1 {
		errs = append(errs, fmt.Errorf("--fair-rounds must be at least 1, got %d", f.rounds))
	}
	f.partSet = map[string]bool{}
	for _, p := range splitList(f.parts) {
		if !slices.Contains(fairParts, p) {
			errs = append(errs, fmt.Errorf("--fair-parts: %q is not one of %s", p, strings.Join(fairParts, ", ")))
		}
		f.partSet[p] = true
	}
	if len(f.partSet) == 0 {
		errs = append(errs, errors.New("--fair-parts names no measurement"))
	}
	var err error
	if f.floodList, err = positiveList(f.floods); err != nil {
		errs = append(errs, fmt.Errorf("--fair-floods: %w", err))
	}
	if f.callersList, err = positiveList(f.callers); err != nil {
		errs = append(errs, fmt.Errorf("--fair-callers: %w", err))
	}
	if f.b < 1 {
		errs = append(errs, fmt.Errorf("--fair-b must be at least 1, got %d", f.b))
	}
	if f.bRate < 0 {
		errs = append(errs, fmt.Errorf("--fair-b-rate must not be negative, got %g", f.bRate))
	}
	if f.cap <= 0 {
		errs = append(errs, fmt.Errorf("--fair-cap must be positive, got %s", f.cap))
	}
	if f.drain < 1 {
		errs = append(errs, fmt.Errorf("--fair-drain must be at least 1, got %d", f.drain))
	}
	if f.drainLat < 0 {
		errs = append(errs, fmt.Errorf("--fair-drain-latency must not be negative, got %s", f.drainLat))
	}
	if f.callersN < 1 {
		errs = append(errs, fmt.Errorf("--fair-callers-n must be at least 1, got %d", f.callersN))
	}
	for _, n := range f.callersList {
		if n > f.callersN {
			errs = append(errs, fmt.Errorf("--fair-callers-n %d gives %d callers no request", f.callersN, n))
			break
		}
	}
	if f.idle < 0 {
		errs = append(errs, fmt.Errorf("--fair-idle must not be negative, got %s", f.idle))
	}
	if f.plot != "" && !f.partSet["floods"] {
		errs = append(errs, errors.New("--fair-plot draws the floods: add floods to --fair-parts"))
	}
	return errs
}

// positiveList parses a comma list of positive integers ("10,100,1000"; "1,000" is not one).
func positiveList(s string) ([]int, error) {
	var out []int
	for _, p := range splitList(s) {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not a positive whole number", p)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, errors.New("empty")
	}
	return out, nil
}

// fairSetup echoes what was measured, so a JSON report stands on its own.
type fairSetup struct {
	Template          string   `json:"template"`
	Rounds            int      `json:"rounds"`
	Parts             []string `json:"parts"`
	Concurrency       int      `json:"concurrency"`
	ConcurrencyMode   string   `json:"concurrency_mode"`
	Producers         int      `json:"producers"`
	ProviderLatencyMS float64  `json:"provider_latency_ms"`
	NATSSync          string   `json:"nats_sync"`
	B                 int      `json:"b_requests"`
	BRate             float64  `json:"b_rate_per_s"`
	Floods            []int    `json:"floods"`
	CapMS             float64  `json:"cap_ms"`
	Drain             int      `json:"drain_requests"`
	DrainLatencyMS    float64  `json:"drain_provider_latency_ms"`
	Callers           []int    `json:"callers"`
	CallersRequests   int      `json:"callers_requests"`
	IdleMS            float64  `json:"idle_ms"`
}

// fairFloodRun is b beside one flood of a (Flood 0: b alone), in one mode.
type fairFloodRun struct {
	Round     int  `json:"round"`
	Flood     int  `json:"flood"`
	FairShare bool `json:"fair_share"`
	// AQueued is how many of a's requests the stream held (waiting or in the worker's hands)
	// when b started publishing.
	AQueued     int              `json:"a_queued_when_b_sent"`
	AAnswered   int              `json:"a_answered"`
	B           loadtest.Summary `json:"b_latency"`
	BUnanswered int              `json:"b_unanswered"`
	BFailed     int              `json:"b_failed"`
	// Errors are failures of the round other than b waiting past the cap: publishes refused,
	// replies with an error code.
	Errors    []string        `json:"errors,omitempty"`
	latencies []time.Duration // B's samples, ascending
}

// fairDrainRun is one load drained by the worker (a alone, or many callers), in one mode.
type fairDrainRun struct {
	Round      int              `json:"round"`
	Callers    int              `json:"callers"`
	FairShare  bool             `json:"fair_share"`
	Requests   int              `json:"requests"`
	Succeeded  int              `json:"succeeded"`
	Failed     int              `json:"failed"`
	Throughput float64          `json:"throughput_per_s"`
	ElapsedMS  float64          `json:"elapsed_ms"`
	Latency    loadtest.Summary `json:"latency"`
	// CPU over the run (first publish to last reply), in ms per 1,000 decisions: the worker
	// process, the NATS server process, and the bench process (load generator and fake).
	WorkerCPUPer1k float64 `json:"worker_cpu_ms_per_1000"`
	NATSCPUPer1k   float64 `json:"nats_cpu_ms_per_1000"`
	BenchCPUPer1k  float64 `json:"bench_cpu_ms_per_1000"`
	// Peak resident memory (VmHWM) of each process over its life: the deployment is fresh,
	// so that is this run's.
	WorkerPeakRSS uint64 `json:"worker_peak_rss_bytes"`
	NATSPeakRSS   uint64 `json:"nats_peak_rss_bytes"`
	// CPU after the run while idle, as a share of one core (callers runs).
	WorkerIdleCores float64 `json:"worker_idle_cores,omitempty"`
	NATSIdleCores   float64 `json:"nats_idle_cores,omitempty"`
	// FlowConsumers is how many flow consumers the requests stream had at the end, and
	// ConsumersMS how long after the first publish the last of them existed (fair share).
	FlowConsumers int      `json:"flow_consumers"`
	ConsumersMS   float64  `json:"consumers_ready_ms,omitempty"`
	Errors        []string `json:"errors,omitempty"`
}

// fairReport is the whole figure.
type fairReport struct {
	Setup      fairSetup       `json:"setup"`
	FloodRuns  []fairFloodRun  `json:"flood_runs,omitempty"`
	Floods     []fairFloodCell `json:"floods,omitempty"`
	Throughput []fairDrainRun  `json:"throughput_runs,omitempty"`
	// ThroughputRatio is fair share ÷ arrival order per round, and its median.
	ThroughputRatios []float64       `json:"throughput_ratios,omitempty"`
	ThroughputRatio  float64         `json:"throughput_ratio,omitempty"`
	CallersRuns      []fairDrainRun  `json:"callers_runs,omitempty"`
	Callers          []fairCallerRow `json:"callers,omitempty"`
}

// fairFloodCell pools b's latencies over the rounds for one flood and mode.
type fairFloodCell struct {
	Flood     int  `json:"flood"`
	FairShare bool `json:"fair_share"`
	Samples   int  `json:"samples"`
	// Unanswered requests count as waiting longer than the cap: a percentile that falls on
	// them is reported as Over (true) and CapMS.
	Unanswered  int     `json:"unanswered"`
	P50MS       float64 `json:"p50_ms"`
	P50Over     bool    `json:"p50_over_cap,omitempty"`
	P99MS       float64 `json:"p99_ms"`
	P99Over     bool    `json:"p99_over_cap,omitempty"`
	MaxMS       float64 `json:"max_ms"`
	MaxOver     bool    `json:"max_over_cap,omitempty"`
	AQueuedMean float64 `json:"a_queued_when_b_sent_mean"`
}

// fairCallerRow is the median over the rounds of the callers runs of one size and mode.
type fairCallerRow struct {
	Callers         int     `json:"callers"`
	FairShare       bool    `json:"fair_share"`
	Throughput      float64 `json:"throughput_per_s"`
	WorkerCPUPer1k  float64 `json:"worker_cpu_ms_per_1000"`
	NATSCPUPer1k    float64 `json:"nats_cpu_ms_per_1000"`
	WorkerPeakRSS   uint64  `json:"worker_peak_rss_bytes"`
	NATSPeakRSS     uint64  `json:"nats_peak_rss_bytes"`
	WorkerIdleCores float64 `json:"worker_idle_cores"`
	NATSIdleCores   float64 `json:"nats_idle_cores"`
	FlowConsumers   int     `json:"flow_consumers"`
	ConsumersMS     float64 `json:"consumers_ready_ms"`
	Runs            int     `json:"runs"`
}

// fairRunner runs the measurements.
type fairRunner struct {
	f      *benchFlags
	body   []byte
	stderr io.Writer
	fakes  map[time.Duration]*ollamatest.Server
}

func (f *benchFlags) runFairness(ctx context.Context, stdout, stderr io.Writer) int {
	body, err := loadtest.Template(f.template)
	if err != nil {
		fmt.Fprintf(stderr, "sys1 bench: --template: %v\n", err)
		return exitUsage
	}
	if f.fair.bin == "" {
		if f.fair.bin, err = os.Executable(); err != nil {
			fmt.Fprintf(stderr, "sys1 bench: --fairness runs this binary as the NATS server and the worker, and cannot find it: %v\n", err)
			return exitUsage
		}
	}
	if _, err := loadtest.ReadProcess(os.Getpid()); err != nil {
		fmt.Fprintf(stderr, "sys1 bench: --fairness reads the processes' CPU and memory from /proc: %v\n", err)
		return exitUsage
	}
	r := &fairRunner{f: f, body: body, stderr: stderr, fakes: map[time.Duration]*ollamatest.Server{}}
	defer func() {
		for _, s := range r.fakes {
			s.Close()
		}
	}()
	rep, err := r.run(ctx)
	if rep == nil {
		fmt.Fprintf(stderr, "sys1 bench: --fairness: %v\n", err)
		return exitUsage
	}
	if err != nil {
		fmt.Fprintf(stderr, "sys1 bench: --fairness stopped early: %v\n", err)
	}
	if werr := rep.write(stdout, f.jsonOut); werr != nil {
		fmt.Fprintf(stderr, "sys1 bench: %v\n", werr)
		return exitUsage
	}
	if f.fair.plot != "" && len(rep.Floods) > 0 {
		if perr := saveFairPlot(f.fair.plot, rep); perr != nil {
			fmt.Fprintf(stderr, "sys1 bench: --fair-plot: %v\n", perr)
			return exitFailed
		}
	}
	if err != nil || rep.failed() {
		return exitFailed
	}
	return exitOK
}

func (r *fairRunner) setup() fairSetup {
	f, ff := r.f, &r.f.fair
	s := fairSetup{
		Template: f.template, Rounds: ff.rounds, Concurrency: f.concurrency, ConcurrencyMode: f.concurrencyMode,
		Producers: f.producers, ProviderLatencyMS: durMS(f.providerLatency), NATSSync: f.natsSync,
	}
	for _, p := range fairParts {
		if ff.partSet[p] {
			s.Parts = append(s.Parts, p)
		}
	}
	if ff.partSet["floods"] {
		s.B, s.BRate, s.Floods, s.CapMS = ff.b, ff.bRate, ff.floodList, durMS(ff.cap)
	}
	if ff.partSet["throughput"] {
		s.Drain, s.DrainLatencyMS = ff.drain, durMS(ff.drainLat)
	}
	if ff.partSet["callers"] {
		s.Callers, s.CallersRequests, s.IdleMS = ff.callersList, ff.callersN, durMS(ff.idle)
	}
	return s
}

func durMS(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// run runs every round: in each, every measurement with fair share and in arrival order, the
// mode that goes first alternating from one measurement to the next and from round to round,
// so a noisy minute on a shared machine does not land on one mode. It returns what was
// measured, and an error if it stopped early (nil report: nothing was).
func (r *fairRunner) run(ctx context.Context) (*fairReport, error) {
	ff := &r.f.fair
	rep := &fairReport{Setup: r.setup()}
	for round := 1; round <= ff.rounds; round++ {
		slot := round // alternates the first mode
		both := func(measure func(fair bool) error) error {
			first := slot%2 == 1
			slot++
			for _, fair := range []bool{first, !first} {
				if err := measure(fair); err != nil {
					return err
				}
			}
			return nil
		}
		if ff.partSet["floods"] {
			for _, flood := range append([]int{0}, ff.floodList...) {
				err := both(func(fair bool) error {
					run, err := r.flood(ctx, round, flood, fair)
					if err != nil {
						return err
					}
					rep.FloodRuns = append(rep.FloodRuns, run)
					r.progress("round %d/%d, b beside %s, %s: b p50 %s p99 %s, %d of %d unanswered after %s; a queued when b sent %d",
						round, ff.rounds, floodName(flood, ff.b), modeName(fair), fmtMSOrDash(run.B.P50MS), fmtMSOrDash(run.B.P99MS), run.BUnanswered, ff.b, ff.cap, run.AQueued)
					return nil
				})
				if err != nil {
					return rep.finish(), err
				}
			}
		}
		if ff.partSet["throughput"] {
			err := both(func(fair bool) error {
				run, err := r.drain(ctx, round, 1, ff.drain, ff.drainLat, fair, 0)
				if err != nil {
					return err
				}
				rep.Throughput = append(rep.Throughput, run)
				r.progress("round %d/%d, a alone, %s: %.0f/s, worker %.0f ms and nats-server %.0f ms of CPU per 1,000", round, ff.rounds, modeName(fair), run.Throughput, run.WorkerCPUPer1k, run.NATSCPUPer1k)
				return nil
			})
			if err != nil {
				return rep.finish(), err
			}
		}
		if ff.partSet["callers"] {
			for _, n := range ff.callersList {
				err := both(func(fair bool) error {
					run, err := r.drain(ctx, round, n, ff.callersN, r.f.providerLatency, fair, ff.idle)
					if err != nil {
						return err
					}
					rep.CallersRuns = append(rep.CallersRuns, run)
					r.progress("round %d/%d, %d callers, %s: %.0f/s, worker %.0f ms and nats-server %.0f ms of CPU per 1,000, %d flow consumers", round, ff.rounds, n, modeName(fair), run.Throughput, run.WorkerCPUPer1k, run.NATSCPUPer1k, run.FlowConsumers)
					return nil
				})
				if err != nil {
					return rep.finish(), err
				}
			}
		}
	}
	return rep.finish(), nil
}

func (r *fairRunner) progress(format string, args ...any) {
	if r.f.progress != "never" {
		fmt.Fprintf(r.stderr, "sys1 bench: "+format+"\n", args...)
	}
}

func modeName(fair bool) string {
	if fair {
		return "fair share"
	}
	return "arrival order"
}

func floodName(flood, b int) string {
	if flood == 0 {
		return "nothing (b alone)"
	}
	return fmt.Sprintf("%d× (%s requests of a)", flood, thousands(flood*b))
}

func fmtMSOrDash(v float64) string {
	if v == 0 {
		return "-"
	}
	return fmtDurMS(v)
}

// fake is the fake Ollama answering in latency (one per latency, shared by the rounds).
func (r *fairRunner) fake(latency time.Duration) *ollamatest.Server {
	s := r.fakes[latency]
	if s == nil {
		s = ollamatest.NewServer(ollamatest.WithLatency(latency), ollamatest.WithRecordLimit(0))
		r.fakes[latency] = s
	}
	return s
}

func (r *fairRunner) deploy(ctx context.Context, fair bool, latency time.Duration) (*fairDeployment, error) {
	return startFairDeployment(ctx, fairDeployOptions{
		bin: r.f.fair.bin, fairShare: fair, concurrency: r.f.concurrency, concurrencyMode: r.f.concurrencyMode,
		fetchBatch: r.f.fetchBatch, providerURL: r.fake(latency).URL(), natsSync: r.f.natsSync,
	})
}

// flood measures b beside a flood of a: a publishes flood × b requests as fast as the
// producers can (the worker already draining them); once they are all stored, b publishes
// its requests, and is waited for up to the cap. The deployment, and a's leftover flood with
// it, is then removed.
func (r *fairRunner) flood(ctx context.Context, round, flood int, fair bool) (run fairFloodRun, err error) {
	ff := &r.f.fair
	run = fairFloodRun{Round: round, Flood: flood, FairShare: fair}
	d, err := r.deploy(ctx, fair, r.f.providerLatency)
	if err != nil {
		return run, err
	}
	defer d.stop()
	ncA, err := d.connect("sys1-bench-a")
	if err != nil {
		return run, err
	}
	defer ncA.Close()
	ncB, err := d.connect("sys1-bench-b")
	if err != nil {
		return run, err
	}
	defer ncB.Close()

	var aRep *loadtest.Report
	var aErr error
	aCtx, stopA := context.WithCancel(ctx)
	defer stopA()
	var aDone sync.WaitGroup
	if flood > 0 {
		published := make(chan struct{})
		aDone.Go(func() {
			aRep, aErr = loadtest.Run(aCtx, ncA, loadtest.Options{
				Requests: flood * ff.b, Producers: r.f.producers, Caller: "a", Body: r.body,
				// Waited for only while b is; then the deployment goes, and a's leftover with it.
				ReplyTimeout: 24 * time.Hour,
				BeforeDrain: func(context.Context, int64) error {
					close(published)
					return nil
				},
			})
			select {
			case <-published:
			default:
				close(published) // publishing failed: b runs anyway, the error is reported
			}
		})
		select {
		case <-published:
		case <-ctx.Done():
			return run, ctx.Err()
		}
		if run.AQueued, err = subjectCount(ctx, ncA, wire.Decide("a")); err != nil {
			return run, err
		}
	}
	// b's requests due at its rate from now on; each waited for up to the cap.
	spread := time.Duration(0)
	producers := ff.b
	if ff.bRate > 0 {
		spread = time.Duration(float64(ff.b-1) / ff.bRate * float64(time.Second))
	}
	bCtx, stopB := context.WithTimeout(ctx, ff.cap+spread)
	bRep, bErr := loadtest.Run(bCtx, ncB, loadtest.Options{
		Requests: ff.b, Rate: ff.bRate, Producers: producers, Caller: "b", Body: r.body, ReplyTimeout: ff.cap + spread,
	})
	stopB()
	stopA()
	aDone.Wait()
	if ctx.Err() != nil {
		return run, ctx.Err()
	}
	if bRep == nil {
		return run, fmt.Errorf("caller b: %w", bErr)
	}
	run.B, run.latencies = bRep.Latency, bRep.Latencies
	run.BUnanswered = bRep.FailedBy[loadtest.CodeNoReply]
	run.BFailed = bRep.Failed - run.BUnanswered
	if bRep.PublishErrors > 0 || bErr != nil {
		run.Errors = append(run.Errors, fmt.Sprintf("b: %d publishes failed: %v %s", bRep.PublishErrors, bErr, bRep.FirstPublishError))
	}
	if run.BFailed > 0 {
		run.Errors = append(run.Errors, fmt.Sprintf("b: %d replies failed: %v", run.BFailed, bRep.FailedBy))
	}
	if flood > 0 {
		if aRep == nil {
			return run, fmt.Errorf("caller a: %w", aErr)
		}
		run.AAnswered = aRep.Latency.Count
		if n := aRep.Failed - aRep.FailedBy[loadtest.CodeNoReply]; n > 0 {
			run.Errors = append(run.Errors, fmt.Sprintf("a: %d replies failed: %v", n, aRep.FailedBy))
		}
		if aRep.PublishErrors > 0 {
			run.Errors = append(run.Errors, fmt.Sprintf("a: %d publishes failed: %s", aRep.PublishErrors, aRep.FirstPublishError))
		}
	}
	return run, d.stopped()
}

// subjectCount is how many messages the requests stream holds on subject.
func subjectCount(ctx context.Context, nc *nats.Conn, subject string) (int, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return 0, err
	}
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	s, err := js.Stream(sctx, topology.Default().RequestsStream)
	if err != nil {
		return 0, fmt.Errorf("the requests stream: %w", err)
	}
	info, err := s.Info(sctx, jetstream.WithSubjectFilter(subject))
	if err != nil {
		return 0, fmt.Errorf("the requests stream: %w", err)
	}
	return int(info.State.Subjects[subject]), nil
}

// drain measures a load the worker drains: n requests, round robin over callers (one: caller
// a alone), published as fast as the producers can while the worker runs; with idle, the
// idle worker and server are measured for that long afterwards.
func (r *fairRunner) drain(ctx context.Context, round, callers, n int, latency time.Duration, fair bool, idle time.Duration) (run fairDrainRun, err error) {
	run = fairDrainRun{Round: round, Callers: callers, FairShare: fair, Requests: n}
	d, err := r.deploy(ctx, fair, latency)
	if err != nil {
		return run, err
	}
	defer d.stop()
	nc, err := d.connect("sys1-bench")
	if err != nil {
		return run, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return run, err
	}
	stream, err := js.Stream(ctx, topology.Default().RequestsStream)
	if err != nil {
		return run, fmt.Errorf("the requests stream: %w", err)
	}
	before, err := consumerCount(ctx, stream)
	if err != nil {
		return run, err
	}
	opts := loadtest.Options{Requests: n, Producers: r.f.producers, Caller: "a", Body: r.body, ReplyTimeout: r.f.replyTimeout}
	if callers > 1 {
		opts.Caller, opts.Callers = "c", callers
	}
	// How long until every caller's consumer exists, polled from the stream's consumer count
	// (cheap: one stream info a poll) until it is reached.
	watchCtx, stopWatch := context.WithCancel(ctx)
	var watch sync.WaitGroup
	start := time.Now()
	if fair {
		want := before + callers
		watch.Go(func() {
			for watchCtx.Err() == nil {
				ictx, cancel := context.WithTimeout(watchCtx, 2*time.Second)
				info, err := stream.Info(ictx)
				cancel()
				if err == nil && info.State.Consumers >= want {
					run.ConsumersMS = durMS(time.Since(start))
					return
				}
				_ = sleepCtx(watchCtx, 50*time.Millisecond)
			}
		})
	}
	w0, s0 := d.worker.usage(), d.nats.usage()
	rep, runErr := loadtest.Run(ctx, nc, opts)
	w1, s1 := d.worker.usage(), d.nats.usage()
	// The last consumers may come after the last reply (a short run); they are waited for,
	// a while.
	stopAt := time.AfterFunc(30*time.Second, stopWatch)
	watch.Wait()
	stopAt.Stop()
	stopWatch()
	if rep == nil {
		return run, runErr
	}
	run.Succeeded, run.Failed, run.Throughput, run.ElapsedMS, run.Latency = rep.Succeeded, rep.Failed, rep.Throughput, rep.ElapsedMS, rep.Latency
	if decided := rep.Latency.Count; decided > 0 {
		per1k := func(cpu time.Duration) float64 { return durMS(cpu) * 1000 / float64(decided) }
		run.WorkerCPUPer1k, run.NATSCPUPer1k = per1k(w1.CPU-w0.CPU), per1k(s1.CPU-s0.CPU)
		run.BenchCPUPer1k = rep.CPUMS * 1000 / float64(decided)
	}
	if runErr != nil {
		run.Errors = append(run.Errors, runErr.Error())
	}
	if rep.Failed > 0 || rep.PublishErrors > 0 {
		run.Errors = append(run.Errors, fmt.Sprintf("%d failed %v, %d publishes failed %s", rep.Failed, rep.FailedBy, rep.PublishErrors, rep.FirstPublishError))
	}
	if idle > 0 {
		if err := sleepCtx(ctx, idle); err != nil {
			return run, err
		}
		w2, s2 := d.worker.usage(), d.nats.usage()
		run.WorkerIdleCores = (w2.CPU - w1.CPU).Seconds() / idle.Seconds()
		run.NATSIdleCores = (s2.CPU - s1.CPU).Seconds() / idle.Seconds()
	}
	after, err := consumerCount(ctx, stream)
	if err != nil {
		return run, err
	}
	run.FlowConsumers = after - before
	if fair && run.ConsumersMS == 0 && run.FlowConsumers < callers {
		run.Errors = append(run.Errors, fmt.Sprintf("%d flow consumers for %d callers", run.FlowConsumers, callers))
	}
	end := d.worker.usage()
	run.WorkerPeakRSS, run.NATSPeakRSS = end.HighWater, d.nats.usage().HighWater
	return run, d.stopped()
}

// consumerCount is how many consumers the stream has (flow consumers and the others).
func consumerCount(ctx context.Context, s jetstream.Stream) (int, error) {
	ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	info, err := s.Info(ictx)
	if err != nil {
		return 0, fmt.Errorf("the requests stream: %w", err)
	}
	return info.State.Consumers, nil
}

// finish computes the tables from the runs.
func (rep *fairReport) finish() *fairReport {
	rep.Floods = floodCells(rep.FloodRuns, rep.Setup.CapMS)
	rep.ThroughputRatios, rep.ThroughputRatio = throughputRatios(rep.Throughput)
	rep.Callers = callerRows(rep.CallersRuns)
	return rep
}

// failed reports whether any run went wrong beyond b waiting past the cap.
func (rep *fairReport) failed() bool {
	for _, r := range rep.FloodRuns {
		if len(r.Errors) > 0 {
			return true
		}
	}
	for _, runs := range [][]fairDrainRun{rep.Throughput, rep.CallersRuns} {
		for _, r := range runs {
			if len(r.Errors) > 0 {
				return true
			}
		}
	}
	return false
}

// floodCells pools b's latencies of the runs per flood and mode, in flood order, fair share
// first.
func floodCells(runs []fairFloodRun, capMS float64) []fairFloodCell {
	type key struct {
		flood int
		fair  bool
	}
	pooled := map[key][]time.Duration{}
	cells := map[key]*fairFloodCell{}
	var order []key
	for _, r := range runs {
		k := key{r.Flood, r.FairShare}
		c := cells[k]
		if c == nil {
			c = &fairFloodCell{Flood: r.Flood, FairShare: r.FairShare}
			cells[k] = c
			order = append(order, k)
		}
		pooled[k] = append(pooled[k], r.latencies...)
		c.Unanswered += r.BUnanswered
		c.Samples += len(r.latencies) + r.BUnanswered
		c.AQueuedMean += float64(r.AQueued)
	}
	slices.SortFunc(order, func(a, b key) int {
		if a.flood != b.flood {
			return a.flood - b.flood
		}
		if a.fair == b.fair {
			return 0
		}
		if a.fair {
			return -1
		}
		return 1
	})
	out := make([]fairFloodCell, 0, len(order))
	for _, k := range order {
		c := cells[k]
		lat := pooled[k]
		slices.Sort(lat)
		runsOf := 0
		for _, r := range runs {
			if r.Flood == k.flood && r.FairShare == k.fair {
				runsOf++
			}
		}
		c.AQueuedMean /= float64(runsOf)
		c.P50MS, c.P50Over = percentileWithUnanswered(lat, c.Unanswered, 50, capMS)
		c.P99MS, c.P99Over = percentileWithUnanswered(lat, c.Unanswered, 99, capMS)
		c.MaxMS, c.MaxOver = percentileWithUnanswered(lat, c.Unanswered, 100, capMS)
		out = append(out, *c)
	}
	return out
}

// percentileWithUnanswered is the nearest-rank p-th percentile of the answered latencies
// (ascending) and of unanswered requests that each waited longer than capMS: when the rank
// falls on one of them, the answer is capMS and over is true.
func percentileWithUnanswered(answered []time.Duration, unanswered int, p, capMS float64) (ms float64, over bool) {
	n := len(answered) + unanswered
	if n == 0 {
		return 0, false
	}
	x := p * float64(n) / 100
	rank := min(max(int(math.Ceil(x-x*1e-12)), 1), n)
	if rank > len(answered) {
		return capMS, true
	}
	return durMS(answered[rank-1]), false
}

// throughputRatios is fair share ÷ arrival order of each round that has both, and their
// median.
func throughputRatios(runs []fairDrainRun) ([]float64, float64) {
	byRound := map[int][2]float64{} // [arrival order, fair share]
	var rounds []int
	for _, r := range runs {
		v, ok := byRound[r.Round]
		if !ok {
			rounds = append(rounds, r.Round)
		}
		i := 0
		if r.FairShare {
			i = 1
		}
		v[i] = r.Throughput
		byRound[r.Round] = v
	}
	var ratios []float64
	for _, round := range rounds {
		v := byRound[round]
		if v[0] > 0 && v[1] > 0 {
			ratios = append(ratios, v[1]/v[0])
		}
	}
	return ratios, median(ratios)
}

// callerRows are the medians over the rounds per number of callers and mode, in that order,
// fair share first.
func callerRows(runs []fairDrainRun) []fairCallerRow {
	type key struct {
		callers int
		fair    bool
	}
	groups := map[key][]fairDrainRun{}
	var keys []key
	for _, r := range runs {
		k := key{r.Callers, r.FairShare}
		if _, ok := groups[k]; !ok {
			keys = append(keys, k)
		}
		groups[k] = append(groups[k], r)
	}
	slices.SortFunc(keys, func(a, b key) int {
		if a.callers != b.callers {
			return a.callers - b.callers
		}
		if a.fair == b.fair {
			return 0
		}
		if a.fair {
			return -1
		}
		return 1
	})
	var out []fairCallerRow
	for _, k := range keys {
		g := groups[k]
		col := func(v func(fairDrainRun) float64) float64 {
			xs := make([]float64, len(g))
			for i, r := range g {
				xs[i] = v(r)
			}
			return median(xs)
		}
		out = append(out, fairCallerRow{
			Callers: k.callers, FairShare: k.fair, Runs: len(g),
			Throughput:      col(func(r fairDrainRun) float64 { return r.Throughput }),
			WorkerCPUPer1k:  col(func(r fairDrainRun) float64 { return r.WorkerCPUPer1k }),
			NATSCPUPer1k:    col(func(r fairDrainRun) float64 { return r.NATSCPUPer1k }),
			WorkerPeakRSS:   uint64(col(func(r fairDrainRun) float64 { return float64(r.WorkerPeakRSS) })),
			NATSPeakRSS:     uint64(col(func(r fairDrainRun) float64 { return float64(r.NATSPeakRSS) })),
			WorkerIdleCores: col(func(r fairDrainRun) float64 { return r.WorkerIdleCores }),
			NATSIdleCores:   col(func(r fairDrainRun) float64 { return r.NATSIdleCores }),
			FlowConsumers:   int(col(func(r fairDrainRun) float64 { return float64(r.FlowConsumers) })),
			ConsumersMS:     col(func(r fairDrainRun) float64 { return r.ConsumersMS }),
		})
	}
	return out
}

// median of xs (the mean of the middle two for an even count); 0 for none.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func (rep *fairReport) write(w io.Writer, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	s := rep.Setup
	fmt.Fprintf(w, "sys1 bench --fairness: one `sys1 worker` process (SYS1_CONCURRENCY=%d, %s) and its own nats-server process (sync_interval %s), the fake Ollama and the load in this process; template %s; %d round(s), each measurement once with fair share and once in arrival order (SYS1_FAIR_SHARE=off), on a fresh deployment each, alternating which goes first\n",
		s.Concurrency, s.ConcurrencyMode, s.NATSSync, s.Template, s.Rounds)
	if len(rep.Floods) > 0 {
		rate := "all at once"
		if s.BRate > 0 {
			rate = fmt.Sprintf("at %g/s", s.BRate)
		}
		fmt.Fprintf(w, "\nb beside a flood (provider latency %s): a publishes the flood as fast as %d producers can, the worker draining it; once it is stored, b sends %d requests %s. b's latency, publish to reply, pooled over the rounds; a request unanswered after %s counts as waiting longer\n",
			fmtDurMS(s.ProviderLatencyMS), s.Producers, s.B, rate, fmtDurMS(s.CapMS))
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "a's flood\tmode\tb p50\tb p99\tb max\tb samples\ta queued when b sent (mean)")
		for _, c := range rep.Floods {
			flood := "none (b alone)"
			if c.Flood > 0 {
				flood = fmt.Sprintf("%d× (%s)", c.Flood, thousands(c.Flood*s.B))
			}
			unanswered := ""
			if c.Unanswered > 0 {
				unanswered = fmt.Sprintf(", %d unanswered", c.Unanswered)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d%s\t%s\n", flood, modeName(c.FairShare),
				overCap(c.P50MS, c.P50Over), overCap(c.P99MS, c.P99Over), overCap(c.MaxMS, c.MaxOver), c.Samples, unanswered, thousands(int(math.Round(c.AQueuedMean))))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if len(rep.Throughput) > 0 {
		fmt.Fprintf(w, "\na alone (provider latency %s): %s requests published as fast as %d producers can; decisions/s from the first publish to the last reply, CPU per 1,000 decisions\n",
			fmtDurMS(s.DrainLatencyMS), thousands(s.Drain), s.Producers)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "round\tmode\tdecisions/s\tworker CPU\tnats-server CPU\tbench CPU\tworker peak RSS\tnats-server peak RSS")
		for _, r := range rep.Throughput {
			fmt.Fprintf(tw, "%d\t%s\t%.0f\t%.0f ms\t%.0f ms\t%.0f ms\t%s\t%s\n", r.Round, modeName(r.FairShare), r.Throughput,
				r.WorkerCPUPer1k, r.NATSCPUPer1k, r.BenchCPUPer1k, mib(r.WorkerPeakRSS), mib(r.NATSPeakRSS))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		if len(rep.ThroughputRatios) > 0 {
			parts := make([]string, len(rep.ThroughputRatios))
			for i, x := range rep.ThroughputRatios {
				parts[i] = fmt.Sprintf("%.3f", x)
			}
			fmt.Fprintf(w, "fair share ÷ arrival order: %s; median %.3f (target ≥ 0.95)\n", strings.Join(parts, ", "), rep.ThroughputRatio)
		}
	}
	if len(rep.Callers) > 0 {
		fmt.Fprintf(w, "\nmany callers (provider latency %s): %s requests round robin over the callers, published as fast as %d producers can; medians over the rounds; CPU per 1,000 decisions over the run, then idle for %s (as cores)\n",
			fmtDurMS(s.ProviderLatencyMS), thousands(s.CallersRequests), s.Producers, fmtDurMS(s.IdleMS))
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "callers\tmode\tdecisions/s\tworker CPU\tnats-server CPU\tworker peak RSS\tnats-server peak RSS\tidle worker / nats-server\tflow consumers\tall created after")
		for _, c := range rep.Callers {
			created := "-"
			if c.ConsumersMS > 0 {
				created = fmtDurMS(c.ConsumersMS)
			}
			fmt.Fprintf(tw, "%s\t%s\t%.0f\t%.0f ms\t%.0f ms\t%s\t%s\t%.3f / %.3f\t%s\t%s\n", thousands(c.Callers), modeName(c.FairShare), c.Throughput,
				c.WorkerCPUPer1k, c.NATSCPUPer1k, mib(c.WorkerPeakRSS), mib(c.NATSPeakRSS), c.WorkerIdleCores, c.NATSIdleCores, thousands(c.FlowConsumers), created)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	var errs []string
	for _, r := range rep.FloodRuns {
		for _, e := range r.Errors {
			errs = append(errs, fmt.Sprintf("round %d, %s, %s: %s", r.Round, floodName(r.Flood, rep.Setup.B), modeName(r.FairShare), e))
		}
	}
	for _, runs := range [][]fairDrainRun{rep.Throughput, rep.CallersRuns} {
		for _, r := range runs {
			for _, e := range r.Errors {
				errs = append(errs, fmt.Sprintf("round %d, %d caller(s), %s: %s", r.Round, r.Callers, modeName(r.FairShare), e))
			}
		}
	}
	if len(errs) > 0 {
		fmt.Fprintf(w, "\nfailures:\n  %s\n", strings.Join(errs, "\n  "))
	}
	return nil
}

func overCap(ms float64, over bool) string {
	if over {
		return "> " + fmtDurMS(ms)
	}
	return fmtDurMS(ms)
}

// fmtDurMS prints milliseconds as ms below a second, else as seconds.
func fmtDurMS(ms float64) string {
	switch {
	case ms >= 10000:
		return fmt.Sprintf("%.1f s", ms/1000)
	case ms >= 1000:
		return fmt.Sprintf("%.2f s", ms/1000)
	case ms >= 100:
		return fmt.Sprintf("%.0f ms", ms)
	default:
		return fmt.Sprintf("%.1f ms", ms)
	}
}

func mib(b uint64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// thousands writes n with a comma every three digits (10,000).
func thousands(n int) string {
	s := strconv.Itoa(n)
	if n < 0 {
		return "-" + thousands(-n)
	}
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}
