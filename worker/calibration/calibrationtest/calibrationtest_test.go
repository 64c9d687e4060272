package calibrationtest

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/worker/calibration"
	"github.com/sys1hq/sys1/worker/natsconn/natstest"
	"github.com/sys1hq/sys1/worker/topology"
)

// The helpers' whole use: a fit put here is what a Store returns after WaitRevision, and
// Apply with it gives the formula's values.
func TestCalibrationPutFitReachesAStore(t *testing.T) {
	srv := natstest.Start(t)
	_, js := natstest.Connect(t, srv)
	kv := Bucket(t, js, topology.Default().CalibrationBucketConfig())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := calibration.NewStore(ctx, kv, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Stop() }()
	fit, rev := PutFit(t, kv, "nimble", "billing", "refund_requested", contract.TypeNoul, 2)
	if err := s.WaitRevision(ctx, rev); err != nil {
		t.Fatal(err)
	}
	got, ok := s.Lookup("nimble", "billing", "refund_requested")
	if !ok || got.Temperature != fit.Temperature {
		t.Fatalf("Lookup = %+v, %v", got, ok)
	}
	c, err := calibration.Apply(got, &contract.Answer{Type: contract.TypeNoul, Noul: 0.9})
	if err != nil || math.Abs(*c.Noul-0.75) > 1e-12 || c.Temperature != 2 {
		t.Errorf("Apply = %+v, %v; want noul 0.75 (√0.9/(√0.9+√0.1)) at T = 2", c, err)
	}
}
