package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/contract/wire"
	"github.com/sys1hq/sys1/provider/chain"
	"github.com/sys1hq/sys1/provider/ollamatest"
	"github.com/sys1hq/sys1/worker"
	"github.com/sys1hq/sys1/worker/client"
	"github.com/sys1hq/sys1/worker/fleet"
	"github.com/sys1hq/sys1/worker/metricstest"
)

// routeInbox collects the replies of requests published without waiting for each.
type routeInbox struct {
	h       *harness
	inbox   string
	sub     *nats.Subscription
	replies map[string]*client.Reply
}

func (h *harness) routeInbox(caller string) *routeInbox {
	h.t.Helper()
	inbox := "_INBOX." + caller + "." + nats.NewInbox()[len("_INBOX."):]
	sub, err := h.nc.SubscribeSync(inbox)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { _ = sub.Unsubscribe() })
	return &routeInbox{h: h, inbox: inbox, sub: sub, replies: map[string]*client.Reply{}}
}

// publish sends n requests for model as caller, run ids <prefix>-0…, replies to the inbox.
func (b *routeInbox) publish(caller, model, prefix string, n int) {
	b.h.t.Helper()
	body := []byte(strings.Replace(ticket, `"model":"nimble"`, `"model":"`+model+`"`, 1))
	for i := range n {
		req := client.Request{Caller: caller, Body: body, RunID: fmt.Sprint(prefix, "-", i), ReplyTo: b.inbox}
		if _, err := b.h.cl.Publish(context.Background(), req); err != nil {
			b.h.t.Fatal(err)
		}
	}
}

// await reads replies until n have come, each run once.
func (b *routeInbox) await(n int) {
	b.h.t.Helper()
	for len(b.replies) < n {
		m, err := b.sub.NextMsg(30 * time.Second)
		if err != nil {
			b.h.t.Fatalf("%d of %d replies: %v", len(b.replies), n, err)
		}
		rep, err := client.ParseReply(m)
		if err != nil {
			b.h.t.Fatal(err)
		}
		if _, dup := b.replies[rep.RunID]; dup {
			b.h.t.Fatalf("run %s answered twice", rep.RunID)
		}
		b.replies[rep.RunID] = rep
	}
}

// concurrency is the replicas' SYS1_CONCURRENCY here; inHand the messages such a replica
// holds at most (2 × concurrency): each may have been let through by a breaker and be
// waiting for a provider slot when the breaker opens, so that many calls can still follow
// the one that opened it.
const (
	concurrency = 4
	inHand      = 2 * concurrency
)

// calls are the attempts of a reply that reached the provider (not skips).
func calls(rep *client.Reply) int {
	n := 0
	for _, a := range rep.Attempts {
		if a.Outcome != contract.OutcomeSkipped {
			n++
		}
	}
	return n
}

// TestABrokenModelLeavesTheOthersAlone is issue 21's scenario against a real nats-server and
// the fake Ollama, with the default chain (ollama only) and SYS1_MAX_DELIVER=2: 40 requests
// for a model the server answers 500, 10 for a model it does not have (404), then, 0.5 s
// later, 40 for a healthy model. Every healthy request succeeds with exactly one provider
// call; every failing one ends with its own code after at most the calls its code allows
// (two deliveries, and none once its route is open or its absence remembered); the provider
// stays up, and health, the metrics and the schema say which route is in which state.
func TestABrokenModelLeavesTheOthersAlone(t *testing.T) {
	h := newHarness(t, ollamatest.WithModels("nimble:latest", "broken:latest"))
	h.fake.FailModel("broken", ollamatest.Status(500))
	r := h.start(func(o *replicaOpts) {
		o.cfg.MaxDeliver, o.cfg.Concurrency = 2, concurrency
		o.policy = contract.Policy{DefaultModel: "nimble", AllowedModels: []string{"nimble", "broken", "ghost"}}
	})
	in := h.routeInbox("svc-a")
	in.publish("svc-a", "broken", "broken", 40)
	in.publish("svc-a", "ghost", "ghost", 10)
	time.Sleep(500 * time.Millisecond) // the scenario: the healthy requests come half a second later
	in.publish("svc-a", "nimble", "nimble", 40)
	in.await(90)

	for i := range 40 {
		rep := in.replies[fmt.Sprint("nimble-", i)]
		if rep.Status != contract.StatusSuccess || len(rep.Attempts) != 1 || rep.Attempts[0].Outcome != contract.OutcomeOK {
			t.Errorf("healthy request %d: %s", i, rep.Raw)
		}
	}
	if n := h.fake.CallsFor("nimble"); n != 40 {
		t.Errorf("%d calls for the healthy model, want 40 (one each)", n)
	}
	routeOpenSeen := false
	for i := range 40 {
		rep := in.replies[fmt.Sprint("broken-", i)]
		if rep.Status != contract.StatusFailed || rep.Error.Code != contract.CodeUpstreamError || calls(rep) > 2 {
			t.Errorf("broken request %d: %s", i, rep.Raw)
		}
		routeOpenSeen = routeOpenSeen || strings.Contains(rep.Error.Message, `circuit open for model "broken" on ollama after`)
	}
	if n := h.fake.CallsFor("broken"); n < chain.DefaultBreakerFailures || n > chain.DefaultBreakerFailures+inHand-1 {
		t.Errorf("%d calls for the broken model: its route opens after %d (and the calls admitted before)", n, chain.DefaultBreakerFailures)
	}
	if !routeOpenSeen {
		t.Error("no broken request was refused by its open route")
	}
	for i := range 10 {
		rep := in.replies[fmt.Sprint("ghost-", i)]
		if rep.Status != contract.StatusFailed || rep.Error.Code != contract.CodeModelUnavailable || calls(rep) > 2 {
			t.Errorf("missing-model request %d: %s", i, rep.Raw)
		}
	}
	if n := h.fake.CallsFor("ghost"); n < 1 || n > inHand {
		t.Errorf("%d calls for the missing model: its absence is remembered after the first 404", n)
	}

	raw, err := fleet.Ask(context.Background(), h.nc, wire.HealthSubject, 5*time.Second)
	if err != nil || len(raw) != 1 {
		t.Fatalf("health: %d answers, %v", len(raw), err)
	}
	validate(t, "health", raw[0])
	var hl worker.Health
	if err := json.Unmarshal(raw[0], &hl); err != nil {
		t.Fatal(err)
	}
	p := hl.Providers[0]
	if hl.Status != worker.HealthOK || !p.OK || p.Breaker != chain.BreakerClosed || !(p.Routes.Counts == chain.RouteCounts{Closed: 1, Open: 1, Absent: 1}) || len(p.Routes.Listed) != 2 {
		t.Fatalf("health %s", raw[0])
	}
	for _, route := range p.Routes.Listed {
		want := map[string]contract.Code{"broken": contract.CodeUpstreamError, "ghost": contract.CodeModelUnavailable}[route.Model]
		if route.LastErrorCode != want || route.ReopensAt == nil {
			t.Errorf("route %+v", route)
		}
	}
	fams, _ := metricstest.Parse(scrape(t, r))
	for state, want := range map[string]float64{"closed": 1, "open": 1, "half_open": 0, "absent": 1} {
		if got := value(t, fams, "sys1_worker_provider_routes", map[string]string{"provider": "ollama", "state": state}); got != want {
			t.Errorf("sys1_worker_provider_routes{state=%q} = %v, want %v", state, got, want)
		}
	}
	if got := value(t, fams, "sys1_worker_provider_up", map[string]string{"provider": "ollama"}); got != 1 {
		t.Errorf("sys1_worker_provider_up = %v: one model's failures took the provider down", got)
	}
}

// TestAServerThatIsDownStillFailsFast: with nothing listening at the provider's address,
// its circuit opens after SYS1_BREAKER_FAILURES connection failures, whatever models they
// were for, and then every route to it is skipped without a call: SYS1_PROVIDER_UNAVAILABLE,
// as before routes existed.
func TestAServerThatIsDownStillFailsFast(t *testing.T) {
	t.Parallel() // waits out failovers and retries, not the CPU: runs beside the others
	h := newHarness(t)
	url := h.fake.URL()
	h.fake.Close() // nothing listens there any more: connection refused
	h.start(func(o *replicaOpts) {
		o.provider = h.ollamaAt(url, time.Second)
		o.cfg.MaxDeliver, o.cfg.Concurrency = 2, concurrency
		o.policy = contract.Policy{DefaultModel: "nimble", AllowedModels: []string{"nimble", "broken", "ghost"}}
	})
	in := h.routeInbox("svc-a")
	models := []string{"nimble", "broken", "ghost"}
	for _, m := range models {
		in.publish("svc-a", m, "first-"+m, 10)
	}
	in.await(30)
	called := 0
	for id, rep := range in.replies {
		if rep.Status != contract.StatusFailed || rep.Error.Code != contract.CodeProviderUnavailable {
			t.Errorf("%s: %s", id, rep.Raw)
		}
		called += calls(rep)
	}
	if called < chain.DefaultBreakerFailures || called > chain.DefaultBreakerFailures+inHand-1 {
		t.Errorf("%d calls to a server that is down, want %d (and the calls admitted before)", called, chain.DefaultBreakerFailures)
	}
	hl := h.fleetHealth(1)[0]
	if p := hl.Providers[0]; p.Breaker != chain.BreakerOpen || p.OK || hl.Status != worker.HealthDown {
		t.Fatalf("health %+v", hl)
	}
	// Every route to it is open now: requests for any model are refused without a call.
	for _, m := range models {
		in.publish("svc-a", m, "then-"+m, 1)
	}
	in.await(33)
	for _, m := range models {
		rep := in.replies["then-"+m+"-0"]
		if rep.Error == nil || rep.Error.Code != contract.CodeProviderUnavailable || calls(rep) != 0 || rep.Attempts[0].Detail != "circuit open" {
			t.Errorf("%s after the circuit opened: %s", m, rep.Raw)
		}
	}
}
