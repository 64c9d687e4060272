package main

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/sys1hq/sys1/cmd/sys1/internal/soak"
	"github.com/sys1hq/sys1/sink/chtest"
)

// TestSoak is the 60-second soak of issue 24, run by .ci/test: 3 NATS nodes, 2 workers, the
// sink (into the test ClickHouse: chshim in CI) and the review page under a small mixed load,
// with a fixed seed whose plan combines every fault — a worker SIGKILLed, a NATS node SIGKILLed
// (the leader of a stream sys1 depends on), both at once with the worker started again while
// the node is down, the whole cluster crashed, ClickHouse cut off, the fleet paused, the model
// slow and failing. Its verdict does not depend on timing: every check is an invariant sys1
// promises whatever happens when. Longer runs: deploy/reliability.md.
func TestSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the soak runs the whole fleet for over a minute (CI runs it)")
	}
	// Beside the script tests, which mostly wait too: the package's wall time is what CI pays.
	t.Parallel()
	dsn := chtest.DSN(t)
	// The fleet runs this test binary as sys1 (testscript.Main put it on PATH, script_test.go):
	// no second build, and with the race detector when the tests have it.
	self, err := exec.LookPath("sys1")
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	res, err := soak.Run(ctx, soak.Options{
		Sys1: self, Dir: t.TempDir(),
		Duration: 60 * time.Second, Drain: 4 * time.Minute, Seed: 24,
		Workers: 2, Rate: 5, BatchItems: 100, ClickHouseDSN: dsn, Out: &logWriter{t: t},
	})
	if err != nil {
		t.Fatalf("the soak could not run: %v", err)
	}
	res.Print(&out)
	t.Log(out.String())
	for _, kind := range []string{"kill worker", "kill nats node", "cut clickhouse", "pause the fleet", "slow model", "failing model"} {
		if res.Stats.Faults[kind] == 0 {
			t.Errorf("the plan of seed 24 injected no %q: %v", kind, res.Stats.Faults)
		}
	}
	if res.Observations.Timeline.Count("kill") < 8 {
		t.Errorf("only %d processes killed", res.Observations.Timeline.Count("kill"))
	}
	if vs := res.Report.Violations(); len(vs) > 0 {
		t.Errorf("%d violations (the report above says which, with the fault timeline around each)", len(vs))
	}
	if !res.Drained {
		t.Errorf("the fleet had not answered everything %s after the load", res.DrainTook.Round(time.Second))
	}
}

// logWriter sends the soak's timeline to the test log, a line at a time.
type logWriter struct{ t *testing.T }

func (w *logWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
