// Command limiteval measures concurrency limiters the way issue 15 asks: replicas, each with
// its own limiter and closed-loop workers, calling one realistic model server (a few slots,
// an unbounded FIFO queue, service time growing with questions × state) over loopback HTTP
// through the real provider/ollama adapter, so timeouts are the adapter's own.
//
// Time is scaled down (-scale) so a row takes 30 seconds; every figure printed is scaled back
// to real time. It prints a Markdown table (goodput over the server's capacity, timeouts,
// p99 latency against the best fixed setting's, fairness between replicas) and writes the
// limits' trace over time as a PNG.
//
//	go run ./provider/limit/internal/limiteval -out deploy/adaptive-limit.png
//
// It is a benchmark program, not a test: the figures depend on the machine, and it takes a
// few minutes. CI runs the limiter's own tests (a virtual-clock simulation) instead.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/provider/limit"
	"github.com/sys1hq/sys1/provider/ollama"
	"github.com/sys1hq/sys1/provider/ollamatest"
)

// The real-time model (before scaling): a 64-question request over 1 KiB of state takes
// 2.4 s of a slot; SYS1_TIMEOUT_MS is 30 s. Four replicas at 16 park 64 calls, a 77 s queue
// on two slots; at 8, 38 s: both time out, as in the issue.
const (
	realPerQuestion = 25 * time.Millisecond
	realPerStateKiB = 12500 * time.Microsecond
	realTimeout     = 30 * time.Second
)

type options struct {
	scale    float64
	duration time.Duration // real time
	warmup   time.Duration // real time
	replicas int
	max      int
	slots    int
	out      string
	only     string
	window   int
	tol      float64
}

func main() {
	var o options
	flag.Float64Var(&o.scale, "scale", 1.0/20, "time scale: 1/20 runs 600 s of real time in 30 s (a 2.4 s call takes 120 ms)")
	flag.DurationVar(&o.duration, "duration", 600*time.Second, "run length per limiter, in real (unscaled) time")
	flag.DurationVar(&o.warmup, "warmup", 120*time.Second, "left out of goodput, p99 and fairness (timeouts always count), real time")
	flag.IntVar(&o.replicas, "replicas", 4, "replicas")
	flag.IntVar(&o.max, "max", 16, "each replica's concurrency (SYS1_CONCURRENCY; the adaptive limiters' max)")
	flag.IntVar(&o.slots, "slots", 2, "the model server's slots")
	flag.StringVar(&o.out, "out", "adaptive-limit.png", "PNG of the limits over time")
	flag.StringVar(&o.only, "only", "", "comma list of scenario names to run (default: all)")
	flag.IntVar(&o.window, "window", 0, "the adaptive limiter's Window (0: its default)")
	flag.Float64Var(&o.tol, "tolerance", 0, "the adaptive limiter's Tolerance (0: its default)")
	flag.Parse()
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "limiteval:", err)
		os.Exit(1)
	}
}

// request is one kind of call: its questions and state, and so its service time and size.
type request struct {
	req        *contract.Request
	questions  int
	stateBytes int
}

// size is what the worker would pass as limit.Result.Size (limit.CallSize).
func (r request) size() float64 { return limit.CallSize(r.questions, r.stateBytes) }

func makeRequest(questions, stateBytes int) (request, error) {
	var qs []string
	for i := range questions {
		qs = append(qs, fmt.Sprintf(`"q%02d":{"type":"noul","instructions":"Does the ticket say %d?","criteria":{"true":"yes","false":"no"}}`, i, i))
	}
	// the state's JSON is stateBytes long: a string of filler inside quotes
	body := fmt.Sprintf(`{"model":"nimble","state":"%s","questions":{%s}}`, strings.Repeat("x", stateBytes-2), strings.Join(qs, ","))
	req, derr := contract.DecodeRequest([]byte(body))
	if derr != nil {
		return request{}, derr
	}
	return request{req: req, questions: questions, stateBytes: stateBytes}, nil
}

// scenario is one workload; the limiters run against it in turn.
type scenario struct {
	name     string
	requests []request // each worker cycles through them, from its own offset
	// replicas and slots override the flags when set.
	replicas, slots int
}

// contender builds one limiter per replica.
type contender struct {
	name string
	new  func(o options, replica int) (limit.Limiter, error)
	// unsized drops Result.Size (every call counts as one unit): the control experiment
	// for size normalisation.
	unsized bool
}

func fixed(n int) contender {
	return contender{name: fmt.Sprintf("fixed %d", n), new: func(options, int) (limit.Limiter, error) { return limit.NewFixed(n), nil }}
}

func adaptive(unsized bool) contender {
	name := "adaptive (sys1)"
	if unsized {
		name = "adaptive (sys1), sizes ignored"
	}
	return contender{name: name, unsized: unsized, new: func(o options, replica int) (limit.Limiter, error) {
		cfg := limit.DefaultAdaptiveConfig(o.max)
		cfg.Seed = uint64(replica + 1)
		if o.window > 0 {
			cfg.Window = o.window
		}
		if o.tol > 0 {
			cfg.Tolerance = o.tol
		}
		return limit.NewAdaptive(cfg)
	}}
}

func run(o options) error {
	if o.scale <= 0 || o.scale > 1 || o.duration <= o.warmup || o.replicas < 1 || o.max < 1 || o.slots < 1 {
		return errors.New("bad flags: need 0 < scale ≤ 1, duration > warmup, replicas, max and slots ≥ 1")
	}
	uniform, err := makeRequest(64, 1024)
	if err != nil {
		return err
	}
	var mixed []request
	for _, shape := range [][2]int{{64, 1024}, {8, 512}, {32, 4096}, {16, 1024}, {64, 2048}, {4, 256}} {
		r, err := makeRequest(shape[0], shape[1])
		if err != nil {
			return err
		}
		mixed = append(mixed, r)
	}
	runs := []struct {
		sc         scenario
		contenders []contender
		traced     []string // contenders whose limit trace is plotted
	}{
		{
			sc:         scenario{name: "uniform", requests: []request{uniform}},
			contenders: []contender{fixed(1), fixed(2), fixed(4), fixed(8), fixed(16), adaptive(false), failsafe(false), failsafe(true)},
			traced:     []string{"adaptive (sys1)", failsafeName(false)},
		},
		{
			sc:         scenario{name: "mixed", requests: mixed},
			contenders: []contender{fixed(1), fixed(2), fixed(4), adaptive(false), adaptive(true), failsafe(false), failsafe(true)},
			traced:     []string{"adaptive (sys1)"},
		},
		{
			// Alone in front of a bigger server the limit must rise above Min, where a mix of
			// sizes would read as congestion without normalisation.
			sc:         scenario{name: "mixed-alone", requests: mixed, replicas: 1, slots: 4},
			contenders: []contender{fixed(2), fixed(4), fixed(8), adaptive(false), adaptive(true), failsafe(false)},
			traced:     []string{"adaptive (sys1)", "adaptive (sys1), sizes ignored"},
		},
	}
	var traces []trace
	for _, r := range runs {
		if o.only != "" && !slices.Contains(strings.Split(o.only, ","), r.sc.name) {
			continue
		}
		o := o
		if r.sc.replicas > 0 {
			o.replicas = r.sc.replicas
		}
		if r.sc.slots > 0 {
			o.slots = r.sc.slots
		}
		fmt.Printf("\n### %s: %d replicas × max %d against %d slots, timeout %s, %s of real time per row (scale 1/%.0f)\n\n",
			r.sc.name, o.replicas, o.max, o.slots, realTimeout, o.duration, 1/o.scale)
		describe(r.sc, o)
		var results []result
		for _, c := range r.contenders {
			res, err := measure(o, r.sc, c)
			if err != nil {
				return fmt.Errorf("%s / %s: %w", r.sc.name, c.name, err)
			}
			results = append(results, res)
			fmt.Fprintf(os.Stderr, "limiteval: %s / %s: goodput %.3f, %d timeouts, p99 %s\n", r.sc.name, c.name, res.goodput, res.timeouts, res.p99)
			if slices.Contains(r.traced, c.name) {
				res.trace.replicas, res.trace.slots, res.trace.scenario = o.replicas, o.slots, r.sc.name
				traces = append(traces, res.trace)
			}
		}
		table(results)
	}
	if len(traces) > 0 && o.out != "" {
		if err := plotTraces(o, traces); err != nil {
			return err
		}
		fmt.Printf("\nlimit trace: %s\n", o.out)
	}
	return nil
}

func describe(sc scenario, o options) {
	var shapes []string
	for _, r := range sc.requests {
		shapes = append(shapes, fmt.Sprintf("%d questions × %.1f KiB (%.2f s)", r.questions, float64(r.stateBytes)/1024, serviceTime(r, 1).Seconds()))
	}
	fmt.Printf("Requests: %s. Service time %s a question + %s a question per KiB of state.\n\n", strings.Join(shapes, ", "), realPerQuestion, realPerStateKiB)
}

// serviceTime is r's slot time at the given scale.
func serviceTime(r request, scale float64) time.Duration {
	return capacity(1, scale).ServiceTime(r.questions, r.stateBytes)
}

func capacity(slots int, scale float64) ollamatest.Capacity {
	return ollamatest.Capacity{
		Slots:       slots,
		PerQuestion: time.Duration(float64(realPerQuestion) * scale),
		PerStateKiB: time.Duration(float64(realPerStateKiB) * scale),
	}
}

type replicaStats struct {
	ok, timeouts, busy, other int
	useful                    time.Duration // scaled service time of the calls answered in time
	latency                   []time.Duration
}

type result struct {
	name               string
	goodput            float64 // of the server's capacity
	timeouts, busy     int
	other              int
	p50, p99           time.Duration // real time
	fairness           float64
	shares             []int
	meanLimit          float64
	trace              trace
	wasted, servedCall int64
	load               string // the machine's 1-minute load average at the end
}

// trace is one contender's limits over time.
type trace struct {
	name            string
	scenario        string
	replicas, slots int
	at              []float64   // real seconds
	limits          [][]float64 // per replica
	queue           []float64   // calls at the server (in service and waiting)
}

func measure(o options, sc scenario, c contender) (result, error) {
	srv := ollamatest.NewServer(ollamatest.WithCapacity(capacity(o.slots, o.scale)), ollamatest.WithRecordLimit(0))
	defer srv.Close()
	timeout := time.Duration(float64(realTimeout) * o.scale)
	duration := time.Duration(float64(o.duration) * o.scale)
	warmup := time.Duration(float64(o.warmup) * o.scale)

	lims := make([]limit.Limiter, o.replicas)
	clients := make([]*ollama.Client, o.replicas)
	for i := range lims {
		var err error
		if lims[i], err = c.new(o, i); err != nil {
			return result{}, err
		}
		clients[i], err = ollama.New(ollama.Config{BaseURL: srv.URL(), TimeoutMS: fmt.Sprint(timeout.Milliseconds()), MaxConns: o.max}, ollama.Deps{})
		if err != nil {
			return result{}, err
		}
		defer clients[i].Close()
	}

	ctx, cancel := context.WithTimeout(context.Background(), duration)
	defer cancel()
	start := time.Now()
	measuredFrom := start.Add(warmup)
	stats := make([]replicaStats, o.replicas)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for rep := range o.replicas {
		for w := range o.max {
			wg.Go(func() {
				for i := w + rep; ctx.Err() == nil; i++ {
					r := sc.requests[i%len(sc.requests)]
					tok, err := lims[rep].Acquire(ctx)
					if err != nil {
						return
					}
					t0 := time.Now()
					_, err = clients[rep].Evaluate(ctx, r.req)
					took := time.Since(t0)
					res := limit.Result{Latency: took, Size: r.size()}
					if c.unsized {
						res.Size = 1
					}
					code := codeOf(err)
					switch code {
					case "":
					case contract.CodeTimeout, contract.CodeProviderBusy:
						res.Dropped = true
					default:
						res.Ignore = true // the run's end cancelled it, or a bug: nothing about load
					}
					tok.Release(res)
					if ctx.Err() != nil && code != "" && code != contract.CodeTimeout {
						return // cancelled by the end of the run: not a result
					}
					mu.Lock()
					st := &stats[rep]
					switch {
					case code == contract.CodeTimeout:
						st.timeouts++
					case code == contract.CodeProviderBusy:
						st.busy++
					case code != "":
						st.other++
					case !time.Now().Before(measuredFrom): // answered within the measured window
						st.ok++
						st.useful += serviceTime(r, o.scale)
						st.latency = append(st.latency, took)
					}
					mu.Unlock()
				}
			})
		}
	}

	tr := trace{name: c.name, limits: make([][]float64, o.replicas)}
	tick := time.NewTicker(duration / 400)
	defer tick.Stop()
	var limitSum float64
	var limitN int
sample:
	for {
		select {
		case <-ctx.Done():
			break sample
		case now := <-tick.C:
			tr.at = append(tr.at, now.Sub(start).Seconds()/o.scale)
			for i, l := range lims {
				tr.limits[i] = append(tr.limits[i], float64(l.Limit()))
				if now.After(measuredFrom) {
					limitSum += float64(l.Limit())
					limitN++
				}
			}
			q := srv.Queue()
			tr.queue = append(tr.queue, float64(q.Waiting+q.Serving))
		}
	}
	wg.Wait()

	res := result{name: c.name, trace: tr}
	var useful time.Duration
	var all []time.Duration
	for _, st := range stats {
		res.timeouts += st.timeouts
		res.busy += st.busy
		res.other += st.other
		res.shares = append(res.shares, st.ok)
		useful += st.useful
		all = append(all, st.latency...)
	}
	window := duration - warmup
	res.goodput = useful.Seconds() / (window.Seconds() * float64(o.slots))
	res.p50 = unscale(quantile(all, 0.50), o.scale)
	res.p99 = unscale(quantile(all, 0.99), o.scale)
	res.fairness = jain(res.shares)
	if limitN > 0 {
		res.meanLimit = limitSum / float64(limitN)
	}
	q := srv.Queue()
	res.wasted, res.servedCall = q.Wasted, q.Served
	res.load = loadAverage()
	for i, l := range lims {
		if a, ok := l.(*limit.Adaptive); ok {
			st := a.Stats()
			fmt.Fprintf(os.Stderr, "limiteval:   replica %d: limit %.2f, baseline %s/unit, recent %s/unit, +%d −%d, %d drops, %d relearnt\n",
				i+1, st.Limit, st.Baseline, st.Recent, st.Increases, st.Decreases, st.Drops, st.Relearnt)
		}
	}
	return res, nil
}

// codeOf is the SPEC §5 code of an Evaluate error ("" for success, "cancelled" for the
// caller's own cancellation).
func codeOf(err error) contract.Code {
	if err == nil {
		return ""
	}
	if e, ok := contract.AsError(err); ok {
		return e.Code
	}
	return "cancelled"
}

// loadAverage is /proc/loadavg's first field, or "?": the figures mean little on a machine
// busy with other work, so each row says how busy it was.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	if f := strings.Fields(string(b)); len(f) > 0 {
		return f[0]
	}
	return "?"
}

func unscale(d time.Duration, scale float64) time.Duration {
	return time.Duration(float64(d) / scale).Round(10 * time.Millisecond)
}

func quantile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, max(0, int(math.Ceil(q*float64(len(s))))-1))]
}

// jain is Jain's fairness index: 1 when every replica had the same share, 1/n when one had all.
func jain(xs []int) float64 {
	var sum, sq float64
	for _, x := range xs {
		sum += float64(x)
		sq += float64(x) * float64(x)
	}
	if sq == 0 {
		return 0
	}
	return sum * sum / (float64(len(xs)) * sq)
}

func table(results []result) {
	// The best fixed setting: the highest goodput, a lower p99 breaking near ties.
	best := -1
	for i, r := range results {
		if !strings.HasPrefix(r.name, "fixed") {
			continue
		}
		if best < 0 || r.goodput > results[best].goodput+0.02 || (r.goodput > results[best].goodput-0.02 && r.p99 < results[best].p99) {
			best = i
		}
	}
	fmt.Println("| limiter | goodput ÷ capacity | timeouts | p50 | p99 | p99 ÷ best fixed | fairness (Jain) | answered per replica | mean limit | load |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|")
	for i, r := range results {
		ratio := "—"
		if best >= 0 && results[best].p99 > 0 && r.p99 > 0 {
			ratio = fmt.Sprintf("%.2f", r.p99.Seconds()/results[best].p99.Seconds())
		}
		name := r.name
		if i == best {
			name += " (best fixed)"
		}
		extra := ""
		if r.busy+r.other > 0 {
			extra = fmt.Sprintf(" (+%d busy, %d other)", r.busy, r.other)
		}
		fmt.Printf("| %s | %.3f | %d%s | %s | %s | %s | %.3f | %v | %.2f | %s |\n",
			name, r.goodput, r.timeouts, extra, r.p50, r.p99, ratio, r.fairness, r.shares, r.meanLimit, r.load)
	}
}
