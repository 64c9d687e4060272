package worker_test

import (
	"context"
	"encoding/json"
	"math"
	"testing"
	"time"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/contract/wire"
	"github.com/sys1hq/sys1/worker"
	"github.com/sys1hq/sys1/worker/calibration"
	"github.com/sys1hq/sys1/worker/calibration/calibrationtest"
	"github.com/sys1hq/sys1/worker/client"
	"github.com/sys1hq/sys1/worker/fleet"
)

// TestCalibrationFitsApplyFromTheNextRun: a fit put in sys1-calibration applies from the next
// run on, without a restart: the verdict carries the calibrated values (exactly
// calibration.Apply's), the answers stay raw, capabilities list the fit, and a rule with
// use: calibrated judges the calibrated P(yes) — here a sharpening fit (T < 1) turns an
// answer abstained in the uncertain middle into a decided one. A fit for another model is
// never applied.
func TestCalibrationFitsApplyFromTheNextRun(t *testing.T) {
	h := newHarness(t)
	h.start(withPolicy(t, `
rules:
  - name: yes-no
    noul_abstain_between: [0.45, 0.55]
    use: calibrated
  - name: rest
    min_confidence: 0
`))
	before := h.decide("svc-a", []byte(ticket))
	v, _ := before.Verdicts.Get("urgent")
	if v.Status != contract.VerdictAbstained || v.Calibrated != nil {
		t.Fatalf("without a fit (the fake's P(yes) for this ticket is 0.54): %s", before.Raw)
	}
	kv := calibrationtest.Bucket(t, h.js, h.topo.CalibrationBucketConfig())
	calibrationtest.PutFit(t, kv, "other-model", "svc-a", "urgent", contract.TypeNoul, 20)
	fit, _ := calibrationtest.PutFit(t, kv, "nimble", "svc-a", "urgent", contract.TypeNoul, 0.1)
	waitFor(t, "the fits in capabilities", 10*time.Second, func() bool {
		caps, err := fleet.Ask(context.Background(), h.nc, wire.CapabilitiesSubject, time.Second)
		var c worker.Capabilities
		return err == nil && len(caps) == 1 && json.Unmarshal(caps[0], &c) == nil && len(c.Calibration) == 2
	})
	after := h.decide("svc-a", []byte(ticket), func(r *client.Request) { r.RunID = "calibrated-1" })
	v, _ = after.Verdicts.Get("urgent")
	if v.Calibrated == nil || v.Calibrated.Temperature != 0.1 || v.Calibrated.Noul == nil {
		t.Fatalf("with a fit: %s", after.Raw)
	}
	var raw *contract.Answer
	for i := range after.Result.Answers {
		if after.Result.Answers[i].Name == "urgent" {
			raw = &after.Result.Answers[i]
		}
	}
	want, err := calibration.Apply(fit, raw)
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(*v.Calibrated.Noul-*want.Noul) > 1e-12 {
		t.Errorf("calibrated P(yes) %v, want %v", *v.Calibrated.Noul, *want.Noul)
	}
	if raw.Noul == *v.Calibrated.Noul {
		t.Errorf("the answer was changed, or the fit did nothing: raw %v", raw.Noul)
	}
	if *want.Noul <= 0.55 || v.Status != contract.VerdictDecided || v.Rule != "yes-no" {
		t.Errorf("use: calibrated: calibrated P(yes) %v, verdict %+v", *want.Noul, v)
	}
	if rec := h.recordByRun("calibrated-1"); rec.Verdicts == nil {
		t.Errorf("the record lacks the verdicts")
	} else if rv, _ := rec.Verdicts.Get("urgent"); rv.Calibrated == nil || rv.Calibrated.Temperature != 0.1 {
		t.Errorf("record verdict %+v", rv)
	}
}
