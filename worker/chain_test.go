package worker_test

import (
	"testing"
	"time"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/provider/chain"
	"github.com/sys1hq/sys1/provider/ollamatest"
	"github.com/sys1hq/sys1/provider/systemone"
	"github.com/sys1hq/sys1/provider/systemonetest"
	"github.com/sys1hq/sys1/worker/client"
)

// chainOf is a replica option: Ollama (the harness's fake) first, then a hosted System One
// server that runs nimble as jev-1.13.0.
func (h *harness) chainOf(hosted *systemonetest.Server, failures int) func(*replicaOpts) {
	h.t.Helper()
	p, err := systemone.New(systemone.Config{BaseURL: hosted.URL(), APIKey: contract.Secret(hosted.Key()), Timeout: 5 * time.Second}, systemone.Deps{Log: h.logger()})
	if err != nil {
		h.t.Fatal(err)
	}
	models, err := chain.ParseModelMap("nimble=jev-1.13.0")
	if err != nil {
		h.t.Fatal(err)
	}
	links := []chain.Link{{Name: "ollama", Provider: h.ollama(5 * time.Second)}, {Name: "systemone", Provider: p, Models: models}}
	return func(o *replicaOpts) {
		o.links, o.chainCfg = links, chain.Config{BreakerFailures: failures, BreakerCooldown: time.Hour}
	}
}

// TestChainFallsBackAndNamesWhoAnswered: with Ollama down, the hosted provider answers within
// the same delivery; the reply and the record name it and the model it ran, and list both
// attempts. A permanent refusal from the primary is not retried elsewhere. After the breaker
// opens, the primary is skipped ("circuit open") without a call.
func TestChainFallsBackAndNamesWhoAnswered(t *testing.T) {
	h := newHarness(t)
	hosted := systemonetest.New(t)
	h.start(h.chainOf(hosted, 1))

	h.fake.FailAlways(ollamatest.Status(503))
	rep := h.decide("svc-a", []byte(ticket), func(r *client.Request) { r.RunID = "fell-back" })
	if rep.Status != contract.StatusSuccess || rep.Result.Provider != "systemone" || rep.Result.Model != "jev-1.13.0" {
		t.Fatalf("reply %s", rep.Raw)
	}
	if len(rep.Attempts) != 2 || rep.Attempts[0].Provider != "ollama" || rep.Attempts[0].Outcome != contract.OutcomeBusy ||
		rep.Attempts[1].Provider != "systemone" || rep.Attempts[1].Outcome != contract.OutcomeOK || rep.Attempts[1].Model != "jev-1.13.0" ||
		rep.Attempts[0].Delivery != 1 || rep.Attempts[1].Delivery != 1 {
		t.Fatalf("attempts %+v", rep.Attempts)
	}
	if rec := h.recordByRun("fell-back"); rec.Provider != "systemone" || rec.Model != "jev-1.13.0" || rec.RequestedModel != "nimble" || len(rec.Attempts) != 2 {
		t.Errorf("record: provider %q model %q requested %q, %d attempts", rec.Provider, rec.Model, rec.RequestedModel, len(rec.Attempts))
	}

	// One failure (SYS1_BREAKER_FAILURES=1 here) opened ollama's circuit: the next run skips it.
	rep = h.decide("svc-a", []byte(ticket))
	if rep.Status != contract.StatusSuccess || len(rep.Attempts) != 2 || rep.Attempts[0].Outcome != contract.OutcomeSkipped || rep.Attempts[0].Detail != "circuit open" {
		t.Fatalf("with the circuit open: %s", rep.Raw)
	}
	if n := len(h.fake.SystemOneRequests()); n != 1 {
		t.Errorf("ollama called %d times, want 1 (none while its circuit is open)", n)
	}
}

// TestChainStopsOnAPermanentRefusal: a request the primary refuses (upstream 400) is not sent
// to the next provider.
func TestChainStopsOnAPermanentRefusal(t *testing.T) {
	h := newHarness(t)
	hosted := systemonetest.New(t)
	h.start(h.chainOf(hosted, 5))
	h.fake.FailAlways(ollamatest.Body(400, "application/json", `{"error":"context length exceeded"}`))
	rep := h.decide("svc-a", []byte(ticket))
	if rep.Status != contract.StatusFailed || rep.Error.Code != contract.CodeInvalidRequest || len(rep.Attempts) != 1 {
		t.Fatalf("reply %s", rep.Raw)
	}
	if hosted.Calls() != 0 {
		t.Errorf("the hosted provider was called %d times after a permanent refusal", hosted.Calls())
	}
}
