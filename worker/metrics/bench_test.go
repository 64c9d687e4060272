package metrics

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// BenchmarkWorkerMetricsPerRun is what one ordinary run costs the worker's metrics: five
// stages, one attempt, the queue wait and the answer (the label lookups included, as the
// worker does them).
func BenchmarkWorkerMetricsPerRun(b *testing.B) {
	zero := func() float64 { return 0 }
	w, err := NewWorker(WorkerOptions{Replica: "bench", InFlight: zero, ProviderPeak: zero, Redeliveries: zero,
		Replays: zero, DeadLetters: zero, Orphans: zero, Paused: zero, Providers: func() []ProviderState { return nil }, Fits: func() []FitReading { return nil },
		Streams: func() []StreamState { return nil }, QuotaAtLimit: func() map[string]int { return nil }, Queues: func() []QueueState { return nil }}, prometheus.NewRegistry())
	if err != nil {
		b.Fatal(err)
	}
	stages := []string{"admit", "gate", "prepare", "call", "publish"}
	b.ReportAllocs()
	for b.Loop() {
		for _, s := range stages {
			w.Stage(s, time.Millisecond)
		}
		w.QueueWait("sys1-worker", 3*time.Millisecond)
		w.Attempt("ollama", "ok", true, 40*time.Millisecond)
		w.RunFinished("success", "", "ollama", "nimble", "", 50*time.Millisecond)
	}
}
