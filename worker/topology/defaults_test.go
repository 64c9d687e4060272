package topology_test

import (
	"reflect"
	"testing"

	"github.com/caarlos0/env/v11"

	"github.com/sys1hq/sys1/contract/wire"
	"github.com/sys1hq/sys1/worker/topology"
)

// TestDefaultsAreStatedOnce: a default lives in Default() alone — no env tag states a second
// one (the command layer starts from Default() and lets SYS1_* variables override it, so
// parsing an empty environment changes nothing) — and its names are the wire names producers
// use.
func TestDefaultsAreStatedOnce(t *testing.T) {
	typ := reflect.TypeOf(topology.Config{})
	for i := range typ.NumField() {
		if f := typ.Field(i); f.Tag.Get("envDefault") != "" {
			t.Errorf("%s states a default in its env tag too (%s): Default() is the one place", f.Name, f.Tag.Get("envDefault"))
		}
	}
	fromEnv := topology.Default()
	if err := env.ParseWithOptions(&fromEnv, env.Options{Environment: map[string]string{}}); err != nil {
		t.Fatal(err)
	}
	if def := topology.Default(); !reflect.DeepEqual(fromEnv, def) {
		t.Fatalf("parsing an empty environment changed Default():\nenv     %+v\nDefault %+v", fromEnv, def)
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
