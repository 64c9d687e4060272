package simulator_test

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/provider/ollama"
	"github.com/sys1hq/sys1/provider/ollamatest"
	"github.com/sys1hq/sys1/provider/simulator"
)

const ticket = `{"model":"clef","state":{"ticket":"checkout fails"},"questions":{
 "urgency":{"type":"score","instructions":"How urgent?","criteria":["calm","annoyed","blocked"]},
 "label":{"type":"choice","instructions":"Which team?","criteria":{"bug":"Software","billing":"Money"}},
 "refund":{"type":"noul","instructions":"Refund asked?"}}}`

func resolved(t testing.TB) *contract.Request {
	t.Helper()
	req, err := contract.DecodeRequest([]byte(ticket))
	if err != nil {
		t.Fatal(err)
	}
	out, err := contract.Policy{DefaultModel: "nimble", AllowedModels: []string{"clef"}}.Resolve(req)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestSimulatorAnswersDeterministicallyAndSaysSo(t *testing.T) {
	sim := simulator.New(0)
	if sim.Name() != "simulator" {
		t.Fatalf("Name = %q", sim.Name())
	}
	req := resolved(t)
	a, err := sim.Evaluate(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	b, err := sim.Evaluate(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(a, b) {
		t.Fatal("the same request got different answers")
	}
	if a.Model != "clef" {
		t.Errorf("model = %q, want the requested model", a.Model)
	}
	if len(a.Answers) != 3 || a.Answers[0].Name != "urgency" || a.Answers[2].Name != "refund" || a.Usage.OutputTokens != 1 || a.Usage.InputTokens < 1 {
		t.Fatalf("response = %+v", a)
	}
	res := sim.Probe(context.Background())
	if !res.Healthy() || res.Version != "simulator" {
		t.Errorf("probe = %+v", res)
	}
	if c := sim.Capabilities(); c.MaxOptions != 26 || c.MaxLevels != 26 || !c.Images {
		t.Errorf("capabilities = %+v", c)
	}
}

// The simulator and the fake Ollama share one answering rule: the same request gets the same
// answers from both (only usage, an estimate, may differ).
func TestSimulatorMatchesTheFakeOllama(t *testing.T) {
	srv := ollamatest.New(t, ollamatest.WithModels("clef"))
	c, err := ollama.New(ollama.Config{BaseURL: srv.URL()}, ollama.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	req := resolved(t)
	fromFake, err := c.Evaluate(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	fromSim, err := simulator.New(0).Evaluate(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	for i := range fromFake.Answers {
		if string(fromFake.Answers[i].Raw) != string(fromSim.Answers[i].Raw) {
			t.Errorf("answer %d differs:\nfake %s\nsim  %s", i, fromFake.Answers[i].Raw, fromSim.Answers[i].Raw)
		}
	}
}

func TestSimulatorLatencyHonoursCancel(t *testing.T) {
	sim := simulator.New(time.Hour)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	_, err := sim.Evaluate(ctx, resolved(t))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v, want the caller's deadline", err)
	}
	if _, ok := contract.AsError(err); ok {
		t.Fatal("a cancellation must not be a *contract.Error")
	}

	start := time.Now()
	if _, err := simulator.New(30*time.Millisecond).Evaluate(context.Background(), resolved(t)); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < 30*time.Millisecond {
		t.Fatalf("answered after %v, before the configured latency", took)
	}
}

func BenchmarkEvaluate(b *testing.B) {
	sim := simulator.New(0)
	req := resolved(b)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := sim.Evaluate(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
}
