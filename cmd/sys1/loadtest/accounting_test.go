package loadtest

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sys1hq/sys1/contract/wire"
	"github.com/sys1hq/sys1/worker/client"
)

// These tests drive the generator without NATS: publish is a function of the test, and
// replies are handed to onReply as the reply subscription would, so every interleaving of
// publishes, acks and replies is exact rather than left to timing.

const successReply = `{"status":"success","queued_ms":3,"attempts":[{"latency_ms":7}]}`

func replyMsg(runID, body string) *nats.Msg {
	m := &nats.Msg{Subject: "_INBOX.x", Data: []byte(body), Header: nats.Header{}}
	if runID != "" {
		m.Header.Set(wire.HeaderRunID, runID)
	}
	return m
}

// fakeRun runs a generator whose publishes go to publish (given the generator, to answer).
func fakeRun(t *testing.T, o Options, publish func(g *generator, i int64, req client.Request) error) (*generator, *Report) {
	t.Helper()
	if o.Producers == 0 {
		o.Producers = 1
	}
	o.Caller, o.Body = "bench", []byte(`{}`)
	if o.ReplyTimeout == 0 {
		// Only reached by runs left unanswered on purpose: nothing can arrive later.
		o.ReplyTimeout = time.Millisecond
	}
	if err := o.check(); err != nil {
		t.Fatal(err)
	}
	var g *generator
	g = newGenerator(o, func(_ context.Context, req client.Request) error {
		i, ok := g.index(req.RunID)
		if !ok {
			t.Errorf("run id %q is not one of the generator's", req.RunID)
		}
		return publish(g, i, req)
	})
	rep, err := g.run(context.Background())
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	checkAddsUp(t, rep)
	return g, rep
}

// A reply that arrives before the publish call returns an error (JetStream stored the
// request, the ack was lost) is a sent, answered run, not a publish error plus an extra
// success: sent = succeeded + failed must hold.
func TestReplyBeforeAFailedPublishAckIsASentRun(t *testing.T) {
	_, rep := fakeRun(t, Options{Requests: 3}, func(g *generator, i int64, req client.Request) error {
		g.onReply(replyMsg(req.RunID, successReply))
		if i == 1 {
			return errors.New("publish: nats: timeout")
		}
		return nil
	})
	if rep.Sent != 3 || rep.Succeeded != 3 || rep.Failed != 0 || rep.PublishErrors != 0 {
		t.Fatalf("sent %d succeeded %d failed %d publish errors %d; want 3 sent, 3 succeeded, no errors",
			rep.Sent, rep.Succeeded, rep.Failed, rep.PublishErrors)
	}
}

// A second reply to an answered run is a duplicate; a reply matching no awaited run (a
// failed publish that was stored after all, another generator's, no run id) is unmatched.
// Neither changes the outcome counts.
func TestDuplicateAndUnmatchedRepliesAreNotOutcomes(t *testing.T) {
	var failedID string
	g, rep := fakeRun(t, Options{Requests: 4}, func(g *generator, i int64, req client.Request) error {
		switch i {
		case 0:
			g.onReply(replyMsg(req.RunID, successReply))
			g.onReply(replyMsg(req.RunID, successReply)) // at-least-once delivery
		case 2:
			failedID = req.RunID
			return errors.New("publish: stream full")
		default:
			g.onReply(replyMsg(req.RunID, `{"status":"failed","error":{"code":"SYS1_PROVIDER_ERROR"},"queued_ms":1,"attempts":[{"latency_ms":2},{"latency_ms":4}]}`))
		}
		return nil
	})
	if rep.Sent != 3 || rep.Succeeded != 1 || rep.Failed != 2 || rep.FailedBy["SYS1_PROVIDER_ERROR"] != 2 || rep.PublishErrors != 1 {
		t.Fatalf("report %+v: want 3 sent, 1 succeeded, 2 SYS1_PROVIDER_ERROR, 1 publish error", rep)
	}
	// After the report, as a late subscription would deliver them.
	g.onReply(replyMsg(failedID, successReply))
	g.onReply(replyMsg("someone-else-7", successReply))
	g.onReply(replyMsg("", successReply))
	rep = g.report(time.Now())
	checkAddsUp(t, rep)
	if rep.DuplicateReplies != 1 || rep.UnmatchedReplies != 3 || rep.Sent != 3 || rep.Succeeded != 1 {
		t.Fatalf("duplicates %d unmatched %d (sent %d succeeded %d); want 1 duplicate, 3 unmatched, counts unchanged",
			rep.DuplicateReplies, rep.UnmatchedReplies, rep.Sent, rep.Succeeded)
	}
	// Queue wait from every answered run's queued_ms, provider time from every attempt.
	if rep.QueueWait.Count != 3 || rep.QueueWait.MinMS != 1 || rep.QueueWait.MaxMS != 3 {
		t.Errorf("queue wait %+v, want 3 samples 1..3 ms", rep.QueueWait)
	}
	if rep.ProviderTime.Count != 5 || rep.ProviderTime.MinMS != 2 || rep.ProviderTime.MaxMS != 7 || rep.ProviderTime.P50MS != 4 {
		t.Errorf("provider time %+v, want 5 attempts 2,2,4,4,7 ms", rep.ProviderTime)
	}
}

// A reply that comes after the generator gave up waiting is late: its run stays no_reply
// and the throughput window still ends at the last reply awaited.
func TestRepliesAfterTheWaitEndedAreLate(t *testing.T) {
	var lateID string
	g, rep := fakeRun(t, Options{Requests: 3}, func(g *generator, i int64, req client.Request) error {
		if i == 2 {
			lateID = req.RunID // never answered while the generator waits
			return nil
		}
		g.onReply(replyMsg(req.RunID, successReply))
		return nil
	})
	if rep.Sent != 3 || rep.Succeeded != 2 || rep.FailedBy[CodeNoReply] != 1 {
		t.Fatalf("report %+v: want 3 sent, 2 succeeded, 1 %s", rep, CodeNoReply)
	}
	elapsed := rep.ElapsedMS
	// The reply arrives between the end of the wait and the report being made.
	g.onReply(replyMsg(lateID, successReply))
	g.onReply(replyMsg(lateID, successReply))
	rep = g.report(time.Now())
	checkAddsUp(t, rep)
	if rep.Succeeded != 2 || rep.FailedBy[CodeNoReply] != 1 || rep.LateReplies != 2 || rep.Latency.Count != 2 || rep.ElapsedMS != elapsed {
		t.Fatalf("after a late reply: succeeded %d, %s %d, late %d, latency n=%d, elapsed %gms (was %gms); want 2, 1, 2, 2, unchanged",
			rep.Succeeded, CodeNoReply, rep.FailedBy[CodeNoReply], rep.LateReplies, rep.Latency.Count, rep.ElapsedMS, elapsed)
	}
}

// With a rate, producers that cannot keep up (here every publish takes 10 ms against a
// 100 µs schedule) publish late: the report says so instead of passing off the lower
// achieved rate silently. Only lower bounds are asserted: a slow publish cannot be early.
func TestScheduleLagShowsProducersBehindTheRate(t *testing.T) {
	const n, rate = 20, 10000.0
	_, rep := fakeRun(t, Options{Requests: n, Rate: rate}, func(g *generator, _ int64, req client.Request) error {
		<-time.After(10 * time.Millisecond) // the fake's publish latency
		g.onReply(replyMsg(req.RunID, successReply))
		return nil
	})
	if rep.TargetRate != rate || rep.ScheduleLag.Count != n || rep.Sent != n {
		t.Fatalf("target %g, schedule lag n=%d, sent %d; want %g, %d, %d", rep.TargetRate, rep.ScheduleLag.Count, rep.Sent, rate, n, n)
	}
	// Publish i starts at least i × 10 ms after the start and is due i × 0.1 ms after it.
	if want := (n - 1) * 9.9; rep.ScheduleLag.MaxMS < want {
		t.Fatalf("max schedule lag %gms, want ≥ %gms", rep.ScheduleLag.MaxMS, want)
	}
	if !rep.Behind() {
		t.Fatal("a run 190 ms behind a 100 µs schedule is not reported as behind")
	}
	// Latency counts from when each request was due: the last one waited its turn behind the
	// slow publishes, as a client on that schedule would have (no coordinated omission).
	if want := (n - 1) * 9.9; rep.Latency.MaxMS < want {
		t.Fatalf("max latency %gms hides the schedule lag; want ≥ %gms", rep.Latency.MaxMS, want)
	}
	var text strings.Builder
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"(target 10000/s)", "BEHIND SCHEDULE", "sched. lag    p50"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("text report lacks %q:\n%s", want, text.String())
		}
	}
}

func TestBehindThresholds(t *testing.T) {
	for _, tc := range []struct {
		rate, maxLagMS float64
		want           bool
	}{
		{0, 5000, false},    // no target: no schedule
		{1000, 100, false},  // 100 ms is the floor, not above it
		{1000, 100.5, true}, // > 100 ms and > 10 intervals (10 ms)
		{50, 150, false},    // 10 intervals at 50/s are 200 ms
		{50, 200.5, true},
	} {
		r := &Report{TargetRate: tc.rate, ScheduleLag: Summary{Count: 1, MaxMS: tc.maxLagMS}}
		if got := r.Behind(); got != tc.want {
			t.Errorf("rate %g max lag %gms: behind %v, want %v", tc.rate, tc.maxLagMS, got, tc.want)
		}
	}
}

// The JSON report has the same keys whatever the run measured: a consumer of --json can rely
// on every documented field being there (null or zero when not measured).
func TestReportJSONKeysAreStable(t *testing.T) {
	want := []string{"sent", "succeeded", "failed", "failed_by_code", "publish_errors", "first_publish_error", "duplicate_replies",
		"unmatched_replies", "late_replies", "elapsed_ms", "throughput_per_s", "publish_ms", "publish_rate_per_s",
		"target_rate_per_s", "schedule_lag", "latency", "queue_wait", "provider_time", "cpu_ms",
		"cpu_per_decision_ms", "provider_peak", "memory"}
	for _, r := range []*Report{{}, {Sent: 1, FailedBy: map[string]int{CodeNoReply: 1}, Peak: &Peak{Calls: 2}}} {
		b, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		var keys map[string]json.RawMessage
		if err := json.Unmarshal(b, &keys); err != nil {
			t.Fatal(err)
		}
		for _, k := range want {
			if _, ok := keys[k]; !ok {
				t.Errorf("report JSON %s lacks %q", b, k)
			}
		}
	}
}

// A preload in which some publishes failed drains what was published, and is told how many
// that is (the backlog line says so, not the requested count).
func TestPreloadDrainsWhatWasPublished(t *testing.T) {
	var ids []string
	var drained int64 = -1
	var gen *generator // the generator fakeRun builds, as the publish callback sees it
	_, rep := fakeRun(t, Options{Requests: 4, BeforeDrain: func(_ context.Context, published int64) error {
		drained = published
		for _, id := range ids { // the workers answer the backlog once started
			gen.onReply(replyMsg(id, successReply))
		}
		return nil
	}}, func(g *generator, i int64, req client.Request) error {
		gen = g
		if i == 2 {
			return errors.New("publish: stream full")
		}
		ids = append(ids, req.RunID)
		return nil
	})
	if drained != int64(len(ids)) || int64(rep.Sent) != drained || int64(rep.Succeeded) != drained || rep.PublishErrors == 0 {
		t.Fatalf("drain started with %d, published %d; report sent %d succeeded %d publish errors %d",
			drained, len(ids), rep.Sent, rep.Succeeded, rep.PublishErrors)
	}
}

// Callers spreads the requests round robin over that many callers, Caller-0 to Caller-(n-1),
// and the report keeps every answered run's latency, ascending.
func TestCallersSpreadRoundRobinAndLatenciesAreKept(t *testing.T) {
	seen := map[string]int{}
	var order []string
	_, rep := fakeRun(t, Options{Requests: 7, Callers: 3}, func(g *generator, i int64, req client.Request) error {
		seen[req.Caller]++
		order = append(order, req.Caller)
		g.onReply(replyMsg(req.RunID, successReply))
		return nil
	})
	if seen["bench-0"] != 3 || seen["bench-1"] != 2 || seen["bench-2"] != 2 || len(seen) != 3 {
		t.Fatalf("requests per caller %v, want bench-0: 3, bench-1: 2, bench-2: 2", seen)
	}
	if order[0] != "bench-0" || order[1] != "bench-1" || order[3] != "bench-0" {
		t.Fatalf("order %v, want round robin", order)
	}
	if len(rep.Latencies) != 7 {
		t.Fatalf("%d latencies kept, want 7", len(rep.Latencies))
	}
	for i := 1; i < len(rep.Latencies); i++ {
		if rep.Latencies[i] < rep.Latencies[i-1] {
			t.Fatalf("latencies not ascending: %v", rep.Latencies)
		}
	}
	// One caller (0 or 1) publishes as Caller itself.
	_, _ = fakeRun(t, Options{Requests: 2, Callers: 1}, func(g *generator, _ int64, req client.Request) error {
		if req.Caller != "bench" {
			t.Errorf("caller %q, want bench", req.Caller)
		}
		g.onReply(replyMsg(req.RunID, successReply))
		return nil
	})
}
