package main

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sys1hq/sys1/cmd/sys1/loadtest"
	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/provider/ollamatest"
	"github.com/sys1hq/sys1/worker/natsconn/natstest"
)

type benchJSON struct {
	Setup struct {
		Replicas              int     `json:"replicas"`
		Concurrency           int     `json:"concurrency"`
		ProviderSlots         int     `json:"provider_slots"`
		ProviderPerQuestionMS float64 `json:"provider_per_question_ms"`
	} `json:"setup"`
	Report struct {
		Sent      int            `json:"sent"`
		Succeeded int            `json:"succeeded"`
		Failed    int            `json:"failed"`
		FailedBy  map[string]int `json:"failed_by_code"`
		Latency   struct {
			Count int     `json:"count"`
			P50   float64 `json:"p50_ms"`
			Max   float64 `json:"max_ms"`
		} `json:"latency"`
		Peak *struct {
			Calls      int64   `json:"calls"`
			PerReplica []int64 `json:"per_replica"`
		} `json:"provider_peak"`
		Memory *struct {
			PeakRSS uint64 `json:"peak_rss_bytes"`
		} `json:"memory"`
	} `json:"report"`
	ProviderBound       float64                `json:"provider_bound_per_s"`
	Efficiency          float64                `json:"efficiency"`
	ProviderUtilisation float64                `json:"provider_utilisation"`
	ProviderQueue       *ollamatest.QueueStats `json:"provider_queue"`
	Batch               *benchBatchReport      `json:"batch"`
}

func runBenchJSON(t *testing.T, args ...string) (benchJSON, string, int) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), append([]string{"bench", "--json", "--progress", "never"}, args...), &stdout, &stderr)
	var out benchJSON
	if code != exitUsage {
		if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
			t.Fatalf("bench --json output does not parse: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
		}
	}
	return out, stderr.String(), code
}

// A tiny in-process run: the report adds up, everything succeeded, and the provider was
// never called more concurrently than the replicas allow.
func TestBenchSelfTiny(t *testing.T) {
	const n, replicas, concurrency = 40, 2, 3
	out, stderr, code := runBenchJSON(t, "--self", "-n", "40", "-c", "4", "--replicas", "2", "--concurrency", "3",
		"--provider-latency", "1ms", "--template", "one")
	if code != exitOK {
		t.Fatalf("exit %d, stderr:\n%s", code, stderr)
	}
	r := out.Report
	if r.Sent != n || r.Sent != r.Succeeded+r.Failed || r.Succeeded != n {
		t.Fatalf("sent %d succeeded %d failed %d (%v), want %d = succeeded", r.Sent, r.Succeeded, r.Failed, r.FailedBy, n)
	}
	if r.Latency.Count != n || r.Latency.Max < r.Latency.P50 {
		t.Errorf("latency %+v, want %d samples with max ≥ p50", r.Latency, n)
	}
	if r.Peak == nil || r.Peak.Calls < 1 || r.Peak.Calls > replicas*concurrency || len(r.Peak.PerReplica) != replicas {
		t.Fatalf("provider peak %+v, want 1..%d over %d replicas", r.Peak, replicas*concurrency, replicas)
	}
	if r.Memory == nil || r.Memory.PeakRSS == 0 {
		t.Errorf("--self should report memory, got %+v", r.Memory)
	}
	if out.Setup.Replicas != replicas || out.Setup.Concurrency != concurrency || out.ProviderBound != float64(replicas*concurrency)/0.001 || out.Efficiency <= 0 {
		t.Errorf("setup %+v bound %g efficiency %g", out.Setup, out.ProviderBound, out.Efficiency)
	}
}

// With --provider-slots the fake serves like one Ollama: calls beyond its slot queue, and
// the report's bound is the slot over the template's service time.
func TestBenchSelfRealisticProvider(t *testing.T) {
	const n = 12
	out, stderr, code := runBenchJSON(t, "--self", "-n", "12", "-c", "4", "--replicas", "1", "--concurrency", "4",
		"--provider-slots", "1", "--provider-latency", "1ms", "--provider-per-question", "2ms", "--template", "one")
	if code != exitOK {
		t.Fatalf("exit %d, stderr:\n%s", code, stderr)
	}
	if r := out.Report; r.Succeeded != n {
		t.Fatalf("succeeded %d of %d (%v)", r.Succeeded, n, r.FailedBy)
	}
	q := out.ProviderQueue
	if q == nil || q.Served != n || q.Wasted+q.Abandoned+q.Rejected != 0 {
		t.Fatalf("model queue %+v, want %d served", q, n)
	}
	body, err := loadtest.Template("one")
	if err != nil {
		t.Fatal(err)
	}
	req, derr := contract.DecodeRequest(body)
	if derr != nil {
		t.Fatal(derr)
	}
	svc := time.Millisecond + time.Duration(len(req.Questions))*2*time.Millisecond
	if want := 1 / svc.Seconds(); math.Abs(out.ProviderBound-want) > 1e-9 || out.Setup.ProviderSlots != 1 || out.Setup.ProviderPerQuestionMS != 2 {
		t.Fatalf("bound %g (want %g), setup %+v", out.ProviderBound, want, out.Setup)
	}
	// One slot: the slot time can never exceed the elapsed time.
	if out.ProviderUtilisation <= 0 || out.ProviderUtilisation > 1 {
		t.Fatalf("utilisation %g of one slot", out.ProviderUtilisation)
	}
}

func TestBenchSelfPreloadText(t *testing.T) {
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"bench", "--self", "--preload", "-n", "20", "--concurrency", "4", "--provider-latency", "0s", "--progress", "never"}, &stdout, &stderr)
	if code != exitOK {
		t.Fatalf("exit %d, stderr:\n%s", code, stderr.String())
	}
	for _, want := range []string{"preloaded backlog", "sent          20", "succeeded     20", "failed        0", "throughput", "provider peak", "memory"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, stdout.String())
		}
	}
}

// Against an external deployment (here a worker on the simulator), connecting with SYS1_NATS_URL.
func TestBenchAgainstADeployment(t *testing.T) {
	t.Setenv("SYS1_NATS_URL", startDeployment(t, true))
	out, stderr, code := runBenchJSON(t, "-n", "10", "-c", "2")
	if code != exitOK {
		t.Fatalf("exit %d, stderr:\n%s", code, stderr)
	}
	if r := out.Report; r.Sent != 10 || r.Succeeded != 10 || r.Peak != nil {
		t.Fatalf("report %+v: want 10 succeeded and no peak (no --metrics-url)", r)
	}
}

func TestBenchWithNoWorkerReportsNoReply(t *testing.T) {
	t.Setenv("SYS1_NATS_URL", startDeployment(t, false))
	out, _, code := runBenchJSON(t, "-n", "3", "-c", "1", "--reply-timeout", "50ms")
	if code != exitFailed {
		t.Fatalf("exit %d, want %d when runs go unanswered", code, exitFailed)
	}
	if r := out.Report; r.Sent != 3 || r.Failed != 3 || r.FailedBy["no_reply"] != 3 {
		t.Fatalf("report %+v: want 3 sent, 3 no_reply", r)
	}
}

func TestBenchUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--preload"}, "--preload needs --self"},
		{[]string{"--hold"}, "--hold needs --self"},
		{[]string{"-n", "0"}, "-n 0 needs a --duration"},
		{[]string{"-c", "0"}, "-c must be at least 1"},
		{[]string{"--rate", "-5"}, "--rate must not be negative"},
		{[]string{"--progress", "sometimes"}, "--progress must be auto, always or never"},
		{[]string{"--self", "--metrics-url", "http://x/metrics"}, "--self reports the peak itself"},
		{[]string{"--template", "seventy"}, `unknown template "seventy"`},
		{[]string{"--self", "--replicas", "-1"}, "replicas must be 0–64"},
		{[]string{"extra"}, `unexpected argument "extra"`},
		{[]string{"--replicas", "3"}, "--replicas needs --self"},
		{[]string{"--concurrency", "8"}, "--concurrency needs --self"},
		{[]string{"--fetch-batch", "4"}, "--fetch-batch needs --self"},
		{[]string{"--provider-latency", "1ms"}, "--provider-latency needs --self"},
		{[]string{"--mem-sample", "1s"}, "--mem-sample needs --self"},
		{[]string{"--duration", "-1s"}, "--duration must not be negative"},
		{[]string{"--self", "--fetch-batch", "-1"}, "--fetch-batch must not be negative"},
		{[]string{"--self", "--preload", "--duration", "1s"}, "--preload needs -n (a fixed backlog) and no --duration"},
		{[]string{"--provider-slots", "2"}, "--provider-slots needs --self"},
		{[]string{"--self", "--provider-slots", "-1"}, "--provider-slots must not be negative"},
		{[]string{"--self", "--provider-per-question", "1ms"}, "--provider-per-question needs --provider-slots"},
		{[]string{"--self", "--provider-slots", "1", "--provider-per-kib", "-1ms"}, "--provider-per-kib must not be negative"},
		{[]string{"--batch", "10"}, "--batch needs --self"},
		{[]string{"--arrival-order"}, "--arrival-order needs --self"},
		{[]string{"--self", "--batch", "-1"}, "--batch must not be negative"},
		{[]string{"--self", "--batch", "10", "--preload"}, "--batch and --preload do not go together"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), append([]string{"bench", "--progress", "never"}, tc.args...), &stdout, &stderr)
		if code != exitUsage || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("bench %v: exit %d, stderr %q; want exit %d mentioning %q", tc.args, code, stderr.String(), exitUsage, tc.want)
		}
	}
}

// --hold keeps the embedded server (with the streams and the run records) up after the report
// until the command's context ends, for tools such as `nats bench` to use the same server.
func TestBenchSelfHoldKeepsTheServerUntilInterrupted(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr natstest.Buffer
	code := make(chan int, 1)
	go func() {
		code <- run(ctx, []string{"bench", "--self", "--hold", "-n", "5", "--concurrency", "2", "--provider-latency", "0s", "--progress", "never"}, &stdout, &stderr)
	}()
	deadline := time.After(60 * time.Second)
	for !strings.Contains(stderr.String(), "holding") {
		select {
		case c := <-code:
			t.Fatalf("bench exited (%d) without holding; stderr:\n%s", c, stderr.String())
		case <-deadline:
			t.Fatalf("no holding line; stderr:\n%s", stderr.String())
		case <-time.After(10 * time.Millisecond):
		}
	}
	url := regexp.MustCompile(`nats://[0-9.:]+`).FindString(stderr.String())
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatalf("connect to the held server %q: %v", url, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, "SYS1_RUNS")
	if err != nil {
		t.Fatalf("held server has no SYS1_RUNS: %v", err)
	}
	if info, err := s.Info(ctx); err != nil || info.State.Msgs != 5 {
		t.Fatalf("SYS1_RUNS holds %v records (%v), want the run's 5", info, err)
	}
	if !strings.Contains(stdout.String(), "succeeded     5") {
		t.Errorf("report before holding:\n%s", stdout.String())
	}
	cancel()
	select {
	case c := <-code:
		if c != exitOK {
			t.Fatalf("exit %d after interrupt, stderr:\n%s", c, stderr.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatal("bench did not stop after interrupt")
	}
}

// --duration alone publishes for that long: the default -n must not cap it; an explicit -n does.
func TestBenchDurationIsNotCappedByTheDefaultCount(t *testing.T) {
	for _, tc := range []struct {
		args []string
		n    int
	}{
		{[]string{}, 2000},
		{[]string{"--duration", "10s"}, 0},
		{[]string{"--duration", "10s", "-n", "50"}, 50},
		{[]string{"-n", "50"}, 50},
	} {
		var stderr bytes.Buffer
		f, code, ok := parseBenchFlags(tc.args, &stderr)
		if !ok {
			t.Fatalf("%v: exit %d: %s", tc.args, code, stderr.String())
		}
		if f.n != tc.n {
			t.Errorf("%v: -n %d, want %d", tc.args, f.n, tc.n)
		}
	}
}

// --batch N -n 0 drains a batch alone through the real batch client and reports its throughput
// against the provider bound; with -n it runs the interactive load beside the draining batch
// and stops the batch when the load ends.
func TestBenchSelfBatch(t *testing.T) {
	out, stderr, code := runBenchJSON(t, "--self", "--concurrency", "4", "--provider-latency", "2ms", "-n", "0", "--batch", "60")
	if code != exitOK {
		t.Fatalf("batch alone: exit %d\n%s\nbatch %+v", code, stderr, out.Batch)
	}
	b := out.Batch
	if b == nil || !b.Complete || b.Items != 60 || b.Succeeded != 60 || b.Concluded != 60 || b.Failed != 0 || b.Throughput <= 0 {
		t.Fatalf("batch alone: %+v", b)
	}
	if out.Report.Sent != 0 || out.ProviderBound != 2000 || out.Efficiency != b.Efficiency || b.Efficiency <= 0 {
		t.Fatalf("batch alone: sent %d, bound %g, efficiency %g (batch %g)", out.Report.Sent, out.ProviderBound, out.Efficiency, b.Efficiency)
	}

	out, stderr, code = runBenchJSON(t, "--self", "--concurrency", "4", "--provider-latency", "5ms", "-c", "1", "-n", "20", "--batch", "5000")
	if code != exitOK {
		t.Fatalf("beside a batch: exit %d\n%s\nreport %+v\nbatch %+v", code, stderr, out.Report, out.Batch)
	}
	b = out.Batch
	if out.Report.Succeeded != 20 || b == nil || b.Complete || b.Items != 5000 || b.Concluded < 1 || b.Failed != 0 {
		t.Fatalf("beside a batch: %d succeeded, batch %+v", out.Report.Succeeded, b)
	}
	// Items may still conclude between the load's end and the batch's stop, so what had
	// concluded when the load ended (Items - UnfinishedAfter) is at most Concluded.
	if b.UnfinishedAfter == 0 || b.Items-b.UnfinishedAfter > b.Concluded || b.DuringInteractive > b.Items-b.UnfinishedAfter {
		t.Fatalf("the batch was still draining when the load ended: %+v", b)
	}
	if out.Efficiency != 0 || out.ProviderUtilisation != 0 {
		t.Fatalf("a shared provider reports no efficiency of the load's own: %g, %g", out.Efficiency, out.ProviderUtilisation)
	}
}
