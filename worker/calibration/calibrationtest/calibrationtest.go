// Package calibrationtest helps tests that need temperature fits in effect: a worker test puts
// a fit with PutFit, waits for the worker's calibration.Store with Store.WaitRevision(rev),
// sends a request, and compares the reply's calibrated values with calibration.Apply(fit,
// answer) — the very function the worker applies.
package calibrationtest

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/worker/calibration"
)

// Fit returns a valid fit of temperature T for one question, as `sys1 calibrate` would store
// it (metrics are placeholders: a worker reads only the names, the type and T).
func Fit(model, caller, question string, typ contract.QuestionType, T float64) *calibration.Fit {
	now := time.Now().UTC().Truncate(time.Millisecond)
	empty := calibration.Metrics{Coverage: []calibration.CoveragePoint{}, Bins: []calibration.Bin{}}
	return &calibration.Fit{
		Format: calibration.FormatVersion, Model: model, Caller: caller, Question: question, Type: typ,
		Temperature: T, N: calibration.DefaultMinLabels, Converged: true, ThresholdOn: calibration.OnConfidence,
		Before: empty, After: empty, FittedAt: now,
		Window: calibration.Window{Since: now.Add(-30 * 24 * time.Hour), Until: now, FirstLabel: now.Add(-29 * 24 * time.Hour), LastLabel: now.Add(-time.Hour)},
	}
}

// Bucket opens the calibration bucket cfg describes (topology.Config.CalibrationBucketConfig()),
// creating it when it does not exist.
func Bucket(tb testing.TB, js jetstream.JetStream, cfg jetstream.KeyValueConfig) jetstream.KeyValue {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv, err := js.CreateOrUpdateKeyValue(ctx, cfg)
	if err != nil {
		tb.Fatalf("calibration bucket %s: %v", cfg.Bucket, err)
	}
	return kv
}

// PutFit stores Fit(model, caller, question, typ, T) in kv and returns it with the entry's
// revision, for Store.WaitRevision.
func PutFit(tb testing.TB, kv jetstream.KeyValue, model, caller, question string, typ contract.QuestionType, T float64) (*calibration.Fit, uint64) {
	tb.Helper()
	f := Fit(model, caller, question, typ, T)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rev, err := calibration.Put(ctx, kv, f)
	if err != nil {
		tb.Fatalf("put fit: %v", err)
	}
	return f, rev
}
