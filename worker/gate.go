package worker

import (
	"context"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sys1hq/sys1/worker/rungate"
	"github.com/sys1hq/sys1/worker/topology"
)

// The run-id gate is rungate's (its entries, keys and compare-and-set transitions), which
// sys1 batch status reads too.
const (
	runRunning = rungate.StatusRunning
	runDone    = rungate.StatusDone
)

type (
	runState      = rungate.State
	finishedState = rungate.Finished
)

// GateKey is a run id's key in the run-id gate (rungate.Key).
func GateKey(runID string) string { return rungate.Key(runID) }

// newGate is the gate over the run-id bucket kv, read from its stream's leader
// (topology.LeaderGet says why).
func newGate(js jetstream.JetStream, kv jetstream.KeyValue, bucket string) rungate.Gate {
	return rungate.New(kv, func(ctx context.Context, key string) ([]byte, uint64, bool, error) {
		return topology.LeaderGet(ctx, js, bucket, key)
	})
}
