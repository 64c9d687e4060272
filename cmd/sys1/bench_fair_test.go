package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/sys1hq/sys1/cmd/sys1/loadtest"
)

func TestBenchFairnessUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--fairness"}, "--fairness needs --self"},
		{[]string{"--fair-b", "5"}, "--fair-b needs --fairness"},
		{[]string{"--self", "--fair-floods", "10"}, "--fair-floods needs --fairness"},
		{[]string{"--self", "--fairness", "-n", "100"}, "-n does not apply to --fairness"},
		{[]string{"--self", "--fairness", "--preload"}, "--preload does not apply to --fairness"},
		{[]string{"--self", "--fairness", "--arrival-order"}, "--arrival-order does not apply to --fairness"},
		{[]string{"--self", "--fairness", "--cpuprofile", "x"}, "--cpuprofile does not apply to --fairness"},
		{[]string{"--self", "--fairness", "--provider-slots", "2"}, "not --provider-slots"},
		{[]string{"--self", "--fairness", "--fair-rounds", "0"}, "--fair-rounds must be at least 1"},
		{[]string{"--self", "--fairness", "--fair-parts", "floods,speed"}, `--fair-parts: "speed" is not one of floods, throughput, callers`},
		{[]string{"--self", "--fairness", "--fair-parts", ","}, "--fair-parts names no measurement"},
		{[]string{"--self", "--fairness", "--fair-floods", "10,1,000"}, `--fair-floods: "000" is not a positive whole number`},
		{[]string{"--self", "--fairness", "--fair-floods", ""}, "--fair-floods: empty"},
		{[]string{"--self", "--fairness", "--fair-callers", "0"}, `--fair-callers: "0" is not a positive whole number`},
		{[]string{"--self", "--fairness", "--fair-b", "0"}, "--fair-b must be at least 1"},
		{[]string{"--self", "--fairness", "--fair-b-rate", "-1"}, "--fair-b-rate must not be negative"},
		{[]string{"--self", "--fairness", "--fair-cap", "0s"}, "--fair-cap must be positive"},
		{[]string{"--self", "--fairness", "--fair-drain", "0"}, "--fair-drain must be at least 1"},
		{[]string{"--self", "--fairness", "--fair-drain-latency", "-1ms"}, "--fair-drain-latency must not be negative"},
		{[]string{"--self", "--fairness", "--fair-callers", "10,500", "--fair-callers-n", "100"}, "--fair-callers-n 100 gives 500 callers no request"},
		{[]string{"--self", "--fairness", "--fair-idle", "-1s"}, "--fair-idle must not be negative"},
		{[]string{"--self", "--fairness", "--fair-parts", "callers", "--fair-plot", "x.png"}, "--fair-plot draws the floods"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), append([]string{"bench", "--progress", "never"}, tc.args...), &stdout, &stderr)
		if code != exitUsage || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("bench %v: exit %d, stderr %q; want exit %d mentioning %q", tc.args, code, stderr.String(), exitUsage, tc.want)
		}
	}
	// The defaults parse, with the figure's concurrency unless one is given.
	var stderr bytes.Buffer
	f, _, ok := parseBenchFlags([]string{"--self", "--fairness"}, &stderr)
	if !ok || f.concurrency != 8 || !f.fair.partSet["floods"] || !f.fair.partSet["callers"] || len(f.fair.floodList) != 3 || f.fair.callersList[2] != 1000 {
		t.Fatalf("defaults: ok %v, %+v; stderr %s", ok, f, stderr.String())
	}
	if f, _, ok = parseBenchFlags([]string{"--self", "--fairness", "--concurrency", "4"}, &stderr); !ok || f.concurrency != 4 {
		t.Fatalf("--concurrency 4: ok %v, concurrency %d", ok, f.concurrency)
	}
}

func millis(v ...int) []time.Duration {
	out := make([]time.Duration, len(v))
	for i, x := range v {
		out[i] = time.Duration(x) * time.Millisecond
	}
	return out
}

// Unanswered requests waited longer than the cap: a percentile that falls on them is "over".
func TestPercentileWithUnanswered(t *testing.T) {
	for _, tc := range []struct {
		answered   []time.Duration
		unanswered int
		p          float64
		want       float64
		over       bool
	}{
		{nil, 0, 50, 0, false},
		{millis(10, 20, 30, 40), 0, 50, 20, false},
		{millis(10, 20, 30, 40), 0, 99, 40, false},
		{millis(10, 20, 30, 40), 0, 100, 40, false},
		{millis(10, 20, 30, 40, 50, 60, 70, 80, 90, 100), 0, 99, 100, false},
		// 10 samples: p50 is the 5th, p99 the 10th.
		{millis(10, 20, 30, 40, 50), 5, 50, 50, false},
		{millis(10, 20, 30, 40, 50), 5, 99, 60000, true},
		{nil, 10, 50, 60000, true},
		{millis(1, 2, 3), 1, 75, 3, false},
		{millis(1, 2, 3), 1, 76, 60000, true},
	} {
		got, over := percentileWithUnanswered(tc.answered, tc.unanswered, tc.p, 60000)
		if got != tc.want || over != tc.over {
			t.Errorf("%v + %d unanswered, p%g: %g (over %v), want %g (over %v)", tc.answered, tc.unanswered, tc.p, got, over, tc.want, tc.over)
		}
	}
}

// fakeFairReport is a report as three rounds would make it, without running any.
func fakeFairReport() *fairReport {
	rep := &fairReport{Setup: fairSetup{
		Template: "ticket", Rounds: 2, Parts: fairParts, Concurrency: 8, ConcurrencyMode: "fixed", Producers: 16,
		ProviderLatencyMS: 20, NATSSync: "always", B: 4, BRate: 20, Floods: []int{10, 1000}, CapMS: 60000,
		Drain: 4000, Callers: []int{10, 1000}, CallersRequests: 4000, IdleMS: 3000,
	}}
	for round := 1; round <= 2; round++ {
		rep.FloodRuns = append(rep.FloodRuns,
			fairFloodRun{Round: round, Flood: 0, FairShare: round == 1, latencies: millis(21, 22, 23, 24+round)},
			fairFloodRun{Round: round, Flood: 0, FairShare: round != 1, latencies: millis(20, 21, 22, 23)},
			fairFloodRun{Round: round, Flood: 1000, FairShare: true, AQueued: 3000 + round, latencies: millis(30, 40, 50, 60*round)},
			fairFloodRun{Round: round, Flood: 1000, FairShare: false, AQueued: 3100, BUnanswered: 2, latencies: millis(59000, 59500)},
		)
		rep.Throughput = append(rep.Throughput,
			fairDrainRun{Round: round, Callers: 1, FairShare: true, Throughput: 1900 + 100*float64(round), WorkerCPUPer1k: 400},
			fairDrainRun{Round: round, Callers: 1, FairShare: false, Throughput: 2000, WorkerCPUPer1k: 380},
		)
		for _, n := range []int{1000, 10} {
			rep.CallersRuns = append(rep.CallersRuns,
				fairDrainRun{Round: round, Callers: n, FairShare: false, Throughput: 390, WorkerCPUPer1k: 900, NATSCPUPer1k: 1300, WorkerPeakRSS: 40 << 20, NATSPeakRSS: 90 << 20},
				fairDrainRun{Round: round, Callers: n, FairShare: true, Throughput: 300 + float64(round), WorkerCPUPer1k: 1200, NATSCPUPer1k: 4000 + float64(n),
					WorkerPeakRSS: 45 << 20, NATSPeakRSS: 190 << 20, FlowConsumers: n, ConsumersMS: float64(7 * n)},
			)
		}
	}
	return rep.finish()
}

func TestFairReportTables(t *testing.T) {
	rep := fakeFairReport()
	// b's cells: flood order, fair share first, latencies pooled over the rounds.
	if len(rep.Floods) != 4 {
		t.Fatalf("%d flood cells, want 4: %+v", len(rep.Floods), rep.Floods)
	}
	alone, flooded, arrival := rep.Floods[0], rep.Floods[2], rep.Floods[3]
	if alone.Flood != 0 || !alone.FairShare || alone.Samples != 8 || alone.P99MS != 25 || alone.P50MS != 22 {
		t.Errorf("b alone, fair share: %+v; want 8 samples, p50 22 ms, p99 25 ms", alone)
	}
	if flooded.Flood != 1000 || !flooded.FairShare || flooded.P99MS != 120 || flooded.AQueuedMean != 3001.5 {
		t.Errorf("1000×, fair share: %+v; want p99 120 ms, a queued 3001.5", flooded)
	}
	if arrival.FairShare || arrival.Unanswered != 4 || arrival.Samples != 8 || arrival.P50MS != 59500 || arrival.P50Over || !arrival.P99Over || !arrival.MaxOver {
		t.Errorf("1000×, arrival order: %+v; want p50 59.5 s, p99 and max over the cap", arrival)
	}
	// a's throughput: fair share ÷ arrival order per round, and the median.
	if len(rep.ThroughputRatios) != 2 || rep.ThroughputRatios[0] != 1 || rep.ThroughputRatios[1] != 1.05 || rep.ThroughputRatio != 1.025 {
		t.Errorf("ratios %v, median %g; want [1 1.05], 1.025", rep.ThroughputRatios, rep.ThroughputRatio)
	}
	// Callers: medians per size and mode, sizes ascending, fair share first.
	if len(rep.Callers) != 4 || rep.Callers[0].Callers != 10 || !rep.Callers[0].FairShare || rep.Callers[3].Callers != 1000 || rep.Callers[3].FairShare {
		t.Fatalf("callers rows %+v", rep.Callers)
	}
	if c := rep.Callers[2]; c.Throughput != 301.5 || c.FlowConsumers != 1000 || c.ConsumersMS != 7000 || c.NATSCPUPer1k != 5000 || c.Runs != 2 {
		t.Errorf("1,000 callers, fair share: %+v", c)
	}

	var text bytes.Buffer
	if err := rep.write(&text, false); err != nil {
		t.Fatal(err)
	}
	out := text.String()
	for _, want := range []string{
		"b beside a flood (provider latency 20.0 ms)",
		"none (b alone)  fair share",
		"1000× (4,000)   arrival order  59.5 s   > 60.0 s  > 60.0 s  8, 4 unanswered  3,100",
		"1000× (4,000)   fair share     40.0 ms  120 ms    120 ms    8                3,002",
		"fair share ÷ arrival order: 1.000, 1.050; median 1.025 (target ≥ 0.95)",
		"1,000    fair share     302          1200 ms     5000 ms          45.0 MiB         190.0 MiB",
		"1,000           7.00 s",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the text lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "failures") {
		t.Errorf("failures reported for runs without errors:\n%s", out)
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.HasSuffix(line, " ") {
			t.Errorf("trailing space: %q", line)
		}
	}

	var js bytes.Buffer
	if err := rep.write(&js, true); err != nil {
		t.Fatal(err)
	}
	var back struct {
		Floods []struct {
			Flood   int     `json:"flood"`
			P99MS   float64 `json:"p99_ms"`
			P99Over bool    `json:"p99_over_cap"`
		} `json:"floods"`
		ThroughputRatio float64 `json:"throughput_ratio"`
		Callers         []struct {
			ConsumersMS float64 `json:"consumers_ready_ms"`
		} `json:"callers"`
	}
	if err := json.Unmarshal(js.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if len(back.Floods) != 4 || !back.Floods[3].P99Over || back.ThroughputRatio != 1.025 || back.Callers[2].ConsumersMS != 7000 {
		t.Errorf("JSON %s", js.String())
	}
}

func TestFairPlot(t *testing.T) {
	var png bytes.Buffer
	if err := writeFairPlot(&png, fakeFairReport()); err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(png.Bytes(), []byte("\x89PNG\r\n\x1a\n")) || png.Len() < 10000 {
		t.Fatalf("not a PNG of a figure: %d bytes", png.Len())
	}
	if err := writeFairPlot(&png, &fairReport{}); err == nil {
		t.Fatal("a plot without floods")
	}
}

func TestFairReportFailures(t *testing.T) {
	rep := fakeFairReport()
	if rep.failed() {
		t.Fatal("a report without errors failed")
	}
	rep.CallersRuns[1].Errors = []string{"3 failed map[SYS1_UPSTREAM_ERROR:3]"}
	if !rep.failed() {
		t.Fatal("a run's error did not fail the report")
	}
	var text bytes.Buffer
	if err := rep.write(&text, false); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text.String(), "failures:\n  round 1, 1000 caller(s), fair share: 3 failed") {
		t.Errorf("failures not listed:\n%s", text.String())
	}
}

func TestThousands(t *testing.T) {
	for n, want := range map[int]string{0: "0", 7: "7", 999: "999", 1000: "1,000", 10000: "10,000", 1234567: "1,234,567", -4000: "-4,000"} {
		if got := thousands(n); got != want {
			t.Errorf("thousands(%d) = %q, want %q", n, got, want)
		}
	}
}

// A tiny --fairness run end to end: NATS and the worker as processes of their own (this test
// binary, which testscript put on PATH as sys1), each measurement in both modes. It checks the
// plumbing, not the figures: a's flood was queued when b sent, b was answered, every caller's
// consumer exists with fair share and none without.
func TestBenchFairnessTiny(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts six deployments of NATS and worker processes (CI runs it)")
	}
	t.Parallel()
	bin, err := exec.LookPath("sys1")
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	f, code, ok := parseBenchFlags([]string{"--self", "--fairness", "--json", "--progress", "never", "--concurrency", "2", "-c", "4",
		"--provider-latency", "5ms", "--nats-sync", "2m", "--fair-rounds", "1", "--fair-parts", "floods,callers",
		"--fair-b", "2", "--fair-b-rate", "0", "--fair-floods", "20", "--fair-cap", "20s",
		"--fair-callers", "3", "--fair-callers-n", "9", "--fair-idle", "100ms"}, &stderr)
	if !ok {
		t.Fatalf("flags: exit %d: %s", code, stderr.String())
	}
	f.fair.bin = bin
	var stdout bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if code := f.run(ctx, &stdout, &stderr); code != exitOK {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout.String(), stderr.String())
	}
	var rep struct {
		FloodRuns []struct {
			Flood       int              `json:"flood"`
			FairShare   bool             `json:"fair_share"`
			AQueued     int              `json:"a_queued_when_b_sent"`
			B           loadtest.Summary `json:"b_latency"`
			BUnanswered int              `json:"b_unanswered"`
		} `json:"flood_runs"`
		CallersRuns []fairDrainRun `json:"callers_runs"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatalf("%v\n%s", err, stdout.String())
	}
	if len(rep.FloodRuns) != 4 || len(rep.CallersRuns) != 2 {
		t.Fatalf("%d flood runs and %d callers runs, want 4 and 2:\n%s", len(rep.FloodRuns), len(rep.CallersRuns), stdout.String())
	}
	for _, r := range rep.FloodRuns {
		if r.B.Count != 2 || r.BUnanswered != 0 {
			t.Errorf("flood %d, fair share %v: b answered %d of 2", r.Flood, r.FairShare, r.B.Count)
		}
		if r.Flood == 20 && r.AQueued == 0 {
			t.Errorf("flood 20, fair share %v: none of a's 40 requests queued when b sent", r.FairShare)
		}
	}
	for _, r := range rep.CallersRuns {
		want := 0
		if r.FairShare {
			want = 3
		}
		// CPU is read in 10 ms ticks: a run this small may use none.
		if r.Succeeded != 9 || r.FlowConsumers != want || r.WorkerPeakRSS == 0 || r.NATSPeakRSS == 0 {
			t.Errorf("3 callers, fair share %v: %+v; want 9 succeeded, %d flow consumers, memory read", r.FairShare, r, want)
		}
		if r.FairShare && r.ConsumersMS <= 0 {
			t.Errorf("3 callers with fair share: no time for their consumers")
		}
	}
}
