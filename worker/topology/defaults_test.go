package topology_test

import (
	"reflect"
	"testing"

	"github.com/caarlos0/env/v11"

	"github.com/sys1hq/sys1/contract/wire"
	"github.com/sys1hq/sys1/worker/topology"
)

// TestDefaultsAreStatedOnce pins the three places a default name lives to each other: the
// environment's defaults (what the command layer parses with nothing set), Default(), and
// the wire names producers use.
func TestDefaultsAreStatedOnce(t *testing.T) {
	var fromEnv topology.Config
	if err := env.ParseWithOptions(&fromEnv, env.Options{Environment: map[string]string{}}); err != nil {
		t.Fatal(err)
	}
	if def := topology.Default(); !reflect.DeepEqual(fromEnv, def) {
		t.Fatalf("the environment's defaults and Default() differ:\nenv     %+v\nDefault %+v", fromEnv, def)
	}
	d := topology.Default()
	for got, want := range map[string]string{
		d.RequestsStream: wire.RequestsStream, d.RunsStream: wire.RunsStream, d.RepliesStream: wire.RepliesStream,
		d.ReviewStream: wire.ReviewStream, d.LabelsStream: wire.LabelsStream, d.LabelSubmissionsStream: wire.LabelSubmissionsStream,
		d.DeadLetterStream: wire.DeadLetterStream, d.WorkerConsumer: wire.WorkerConsumer, d.BatchConsumer: wire.BatchConsumer,
		d.LabelsConsumer: wire.LabelsConsumer, d.HoldsConsumer: wire.HoldsConsumer, d.DeadLetterConsumer: wire.DeadLetterConsumer,
		d.SinkConsumer: wire.SinkConsumer, d.SinkLabelsConsumer: wire.SinkLabelsConsumer, d.RunsBucket: wire.RunsBucket,
		d.ReviewBucket: wire.ReviewBucket, d.ReviewSessionsBucket: wire.ReviewSessionsBucket, d.CalibrationBucket: wire.CalibrationBucket,
		d.CacheBucket: wire.CacheBucket, d.LimitsBucket: wire.LimitsBucket, d.FleetBucket: wire.FleetBucket,
	} {
		if got != want {
			t.Errorf("default %q, wire says %q", got, want)
		}
	}
}
