package ollamatest_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/provider/ollama"
	"github.com/sys1hq/sys1/provider/ollamatest"
)

// awaitQueue waits (5 s at most) until cond holds for srv's queue.
func awaitQueue(t *testing.T, srv *ollamatest.Server, what string, cond func(ollamatest.QueueStats) bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.AwaitQueue(ctx, cond); err != nil {
		t.Fatalf("%s: %v (%+v)", what, err, srv.Queue())
	}
}

// call posts body in the background and reports its status (0 when the call failed).
func call(ctx context.Context, srv *ollamatest.Server, body string) <-chan int {
	out := make(chan int, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL()+"/v1/systemone", strings.NewReader(body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			out <- 0
			return
		}
		resp.Body.Close()
		out <- resp.StatusCode
	}()
	return out
}

// withState is the ticket request with its question count and state size chosen.
func withState(questions, stateBytes int) string {
	var qs []string
	for i := range questions {
		qs = append(qs, fmt.Sprintf(`"q%d":{"type":"noul","instructions":"Is it?","criteria":{"true":"yes","false":"no"}}`, i))
	}
	state := `"` + strings.Repeat("x", max(stateBytes-2, 0)) + `"`
	return `{"model":"nimble","state":` + state + `,"questions":{` + strings.Join(qs, ",") + `}}`
}

func TestCapacityServesSlotsAtOnceInArrivalOrder(t *testing.T) {
	srv := ollamatest.New(t, ollamatest.WithCapacity(ollamatest.Capacity{Slots: 1, Base: 20 * time.Millisecond}))
	order := make(chan string, 3)
	send := func(name string) {
		status := call(context.Background(), srv, ticket)
		go func() {
			if s := <-status; s != http.StatusOK {
				t.Errorf("%s: status %d", name, s)
			}
			order <- name
		}()
	}
	send("a")
	awaitQueue(t, srv, "a in service", func(q ollamatest.QueueStats) bool { return q.Serving == 1 })
	send("b")
	awaitQueue(t, srv, "b waiting", func(q ollamatest.QueueStats) bool { return q.Waiting == 1 })
	send("c")
	awaitQueue(t, srv, "c waiting", func(q ollamatest.QueueStats) bool { return q.Waiting == 2 })
	if got := <-order + <-order + <-order; got != "abc" {
		t.Fatalf("answered in the order %q, want arrival order", got)
	}
	q := srv.Queue()
	if q.Served != 3 || q.MaxWaiting != 2 || q.Waiting != 0 || q.Serving != 0 || q.Wasted+q.Abandoned+q.Rejected != 0 {
		t.Fatalf("stats %+v", q)
	}
	if q.ServiceTime < 60*time.Millisecond || srv.BusyTime() != q.ServiceTime {
		t.Fatalf("service time %s, busy time %s: want at least 3 × 20ms, and busy time counting slot time only", q.ServiceTime, srv.BusyTime())
	}
	srv.ResetStats()
	if q := srv.Queue(); q.Served != 0 || q.ServiceTime != 0 || srv.BusyTime() != 0 {
		t.Fatalf("after ResetStats: %+v", q)
	}
}

func TestCapacitySlotsBoundConcurrency(t *testing.T) {
	srv := ollamatest.New(t, ollamatest.WithCapacity(ollamatest.Capacity{Slots: 2, Base: 5 * time.Millisecond}))
	const n = 12
	start := time.Now()
	var done []<-chan int
	for range n {
		done = append(done, call(context.Background(), srv, ticket))
	}
	for _, d := range done {
		if status := <-d; status != http.StatusOK {
			t.Fatalf("status %d", status)
		}
	}
	// Every call reached the handler, but no more than two were served at once: twelve
	// 5ms services take at least 30ms of wall time on two slots.
	if took := time.Since(start); took < n*5*time.Millisecond/2-2*time.Millisecond {
		t.Fatalf("%d calls of 5ms took %s on two slots", n, took)
	}
	q := srv.Queue()
	if q.Served != n || srv.Calls() != n {
		t.Fatalf("served %d of %d calls", q.Served, srv.Calls())
	}
	if q.ServiceTime < n*5*time.Millisecond {
		t.Fatalf("service time %s for %d calls of 5ms", q.ServiceTime, n)
	}
}

func TestCapacityServiceTimeGrowsWithQuestionsTimesState(t *testing.T) {
	c := ollamatest.Capacity{Slots: 1, Base: 10 * time.Millisecond, PerQuestion: time.Millisecond, PerStateKiB: 2 * time.Millisecond}
	for _, tc := range []struct {
		questions, state int
		want             time.Duration
	}{
		{1, 0, 11 * time.Millisecond},
		{64, 0, 74 * time.Millisecond},
		{64, 1024, 10*time.Millisecond + 64*3*time.Millisecond},
		{8, 4096, 10*time.Millisecond + 8*9*time.Millisecond},
	} {
		if got := c.ServiceTime(tc.questions, tc.state); got != tc.want {
			t.Errorf("ServiceTime(%d, %d) = %s, want %s", tc.questions, tc.state, got, tc.want)
		}
	}
	srv := ollamatest.New(t, ollamatest.WithCapacity(c))
	body := withState(8, 4096)
	start := time.Now()
	status, _, answer := post(t, srv, body)
	if status != http.StatusOK {
		t.Fatalf("status %d: %s", status, answer)
	}
	req, derr := contract.DecodeRequest([]byte(body))
	if derr != nil {
		t.Fatal(derr)
	}
	if _, derr := contract.DecodeResponse(req, answer); derr != nil {
		t.Fatalf("the answer breaks the contract: %v", derr)
	}
	// The call held its slot for its service time (state measured as sent: 4096 bytes).
	want := c.ServiceTime(8, 4096)
	if took := time.Since(start); took < want-2*time.Millisecond {
		t.Fatalf("answered in %s, service time %s", took, want)
	}
	if q := srv.Queue(); q.ServiceTime < want-2*time.Millisecond {
		t.Fatalf("recorded service %s, want about %s", q.ServiceTime, want)
	}
}

func TestCapacityMaxQueueAnswers503LikeOllama(t *testing.T) {
	srv := ollamatest.New(t, ollamatest.WithCapacity(ollamatest.Capacity{Slots: 1, MaxQueue: 1, Base: time.Hour}))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	first := call(ctx, srv, ticket)
	awaitQueue(t, srv, "first in service", func(q ollamatest.QueueStats) bool { return q.Serving == 1 })
	second := call(ctx, srv, ticket)
	awaitQueue(t, srv, "second waiting", func(q ollamatest.QueueStats) bool { return q.Waiting == 1 })

	// The third goes through the real adapter: a 503 is SYS1_PROVIDER_BUSY, retryable.
	var logs bytes.Buffer
	c, err := ollama.New(ollama.Config{BaseURL: srv.URL(), TimeoutMS: "5000"}, ollama.Deps{Log: zerolog.New(&logs)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	req, derr := contract.DecodeRequest([]byte(ticket))
	if derr != nil {
		t.Fatal(derr)
	}
	_, err = c.Evaluate(context.Background(), req)
	if e, ok := contract.AsError(err); !ok || e.Code != contract.CodeProviderBusy || !strings.Contains(logs.String(), "maximum pending requests exceeded") {
		t.Fatalf("a call beyond the queue: %v, want SYS1_PROVIDER_BUSY, Ollama's text in the log (%s)", err, logs.String())
	}
	if q := srv.Queue(); q.Rejected != 1 || q.Waiting != 1 || q.Serving != 1 {
		t.Fatalf("stats %+v", q)
	}
	cancel()
	if <-first != 0 || <-second != 0 {
		t.Fatal("cancelled calls answered")
	}
}

func TestCapacityUnboundedQueueByDefault(t *testing.T) {
	srv := ollamatest.New(t, ollamatest.WithCapacity(ollamatest.Capacity{Slots: 1, Base: time.Hour}))
	ctx, cancel := context.WithCancel(context.Background())
	var calls []<-chan int
	for i := range 20 {
		calls = append(calls, call(ctx, srv, ticket))
		awaitQueue(t, srv, "queued", func(q ollamatest.QueueStats) bool { return q.Serving+q.Waiting == i+1 })
	}
	if q := srv.Queue(); q.Rejected != 0 || q.Waiting != 19 {
		t.Fatalf("stats %+v: an unbounded queue refuses nothing (ollama#7758)", q)
	}
	cancel()
	for _, c := range calls {
		<-c
	}
	awaitQueue(t, srv, "abandoned", func(q ollamatest.QueueStats) bool { return q.Abandoned == 19 && q.Waiting == 0 })
}

func TestCapacityAbandonedCallsCostNothingServedOnesWasteTheirSlot(t *testing.T) {
	srv := ollamatest.New(t, ollamatest.WithCapacity(ollamatest.Capacity{Slots: 1, Base: 150 * time.Millisecond}))
	ctxA, cancelA := context.WithCancel(context.Background())
	a := call(ctxA, srv, ticket)
	awaitQueue(t, srv, "a in service", func(q ollamatest.QueueStats) bool { return q.Serving == 1 })
	ctxB, cancelB := context.WithCancel(context.Background())
	b := call(ctxB, srv, ticket)
	awaitQueue(t, srv, "b waiting", func(q ollamatest.QueueStats) bool { return q.Waiting == 1 })

	// b gives up while queued: it leaves the queue and never takes the slot.
	cancelB()
	if <-b != 0 {
		t.Fatal("b answered after its client gave up")
	}
	awaitQueue(t, srv, "b abandoned", func(q ollamatest.QueueStats) bool { return q.Abandoned == 1 && q.Waiting == 0 })

	// a gives up in service: the model's pass goes on, so c still waits for the slot.
	cancelA()
	if <-a != 0 {
		t.Fatal("a answered after its client gave up")
	}
	c := call(context.Background(), srv, ticket)
	awaitQueue(t, srv, "c waits behind a's wasted service", func(q ollamatest.QueueStats) bool { return q.Waiting == 1 || q.Wasted == 1 })
	if status := <-c; status != http.StatusOK {
		t.Fatalf("c: status %d", status)
	}
	q := srv.Queue()
	if q.Wasted != 1 || q.Served != 1 || q.Abandoned != 1 || q.ServiceTime < 300*time.Millisecond-4*time.Millisecond {
		t.Fatalf("stats %+v: want a wasted, c served, b abandoned, two services of 150ms", q)
	}
}

func TestCapacityRefusesBadRequestsWithoutQueueing(t *testing.T) {
	srv := ollamatest.New(t, ollamatest.WithCapacity(ollamatest.Capacity{Slots: 1, Base: time.Hour}))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	busy := call(ctx, srv, ticket)
	awaitQueue(t, srv, "slot taken", func(q ollamatest.QueueStats) bool { return q.Serving == 1 })
	// Ollama validates before it schedules: these answer at once with the slot taken.
	if status, _, _ := post(t, srv, `{"model":"nimble","state":"x"}`); status != http.StatusBadRequest {
		t.Errorf("invalid request: status %d", status)
	}
	if status, _, _ := post(t, srv, strings.Replace(ticket, `"nimble"`, `"absent"`, 1)); status != http.StatusNotFound {
		t.Errorf("unknown model: status %d", status)
	}
	srv.Fail(1, ollamatest.Busy(http.StatusTooManyRequests, "1"))
	if status, _, _ := post(t, srv, ticket); status != http.StatusTooManyRequests {
		t.Errorf("programmed fault: status %d", status)
	}
	if q := srv.Queue(); q.Waiting != 0 || q.Served != 0 {
		t.Fatalf("stats %+v", q)
	}
	cancel()
	<-busy
}

func TestCapacityCloseReleasesQueuedAndServedCalls(t *testing.T) {
	srv := ollamatest.NewServer(ollamatest.WithCapacity(ollamatest.Capacity{Slots: 1, Base: time.Hour}))
	a := call(context.Background(), srv, ticket)
	awaitQueue(t, srv, "a in service", func(q ollamatest.QueueStats) bool { return q.Serving == 1 })
	b := call(context.Background(), srv, ticket)
	awaitQueue(t, srv, "b waiting", func(q ollamatest.QueueStats) bool { return q.Waiting == 1 })
	srv.Close()
	if <-a != 0 || <-b != 0 {
		t.Fatal("calls held at Close answered instead of failing at the transport")
	}
}

func TestCapacityValidation(t *testing.T) {
	err := ollamatest.Capacity{Slots: 0, MaxQueue: -1, Base: -1, PerQuestion: -1, PerStateKiB: -1}.Validate()
	for _, want := range []string{"slots", "max queue", "base", "per-question", "per-KiB-of-state"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate: %v, want it to name %s", err, want)
		}
	}
	if err := (ollamatest.Capacity{Slots: 2}).Validate(); err != nil {
		t.Errorf("a valid capacity: %v", err)
	}
	defer func() {
		if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "slots") {
			t.Errorf("WithCapacity of a bad capacity: recovered %v", r)
		}
	}()
	ollamatest.WithCapacity(ollamatest.Capacity{})
}

func TestQueueWithoutCapacity(t *testing.T) {
	srv := ollamatest.New(t)
	if q := srv.Queue(); q != (ollamatest.QueueStats{}) {
		t.Fatalf("stats %+v", q)
	}
	if err := srv.AwaitQueue(context.Background(), func(ollamatest.QueueStats) bool { return true }); err == nil || errors.Is(err, context.Canceled) {
		t.Fatalf("AwaitQueue without a capacity: %v", err)
	}
}
