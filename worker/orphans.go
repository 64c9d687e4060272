package worker

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sys1hq/sys1/worker/rungate"
)

// Orphaned requests (below their consumer's acknowledgement floor, never answered) are found
// and answered by worker/internal/orphans; this replica's part is the loop that sweeps, and
// where an orphan's delivery count continues from.

// sweepOrphans sweeps for orphaned requests every OrphanSweepInterval until ctx ends. The
// interval is jittered so that replicas started together do not sweep in step.
func (w *Worker) sweepOrphans(ctx context.Context, runCtx context.Context) {
	every := w.cfg.OrphanSweepInterval
	for {
		t := time.NewTimer(every - every/5 + rand.N(every/5*2+1))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		if w.pausedGauge() != 0 {
			continue // a paused fleet runs nothing, orphans included; they wait for the resume
		}
		rep, err := w.orphan.Sweep(runCtx)
		switch {
		case err != nil:
			w.log.Debug().Err(err).Msg("orphan sweep failed; trying again next interval")
		case rep.Suspects+rep.Answered+rep.Retrying > 0:
			w.log.Info().Int("suspects", rep.Suspects).Int("answered", rep.Answered).Int("retrying", rep.Retrying).
				Msg("orphan sweep: requests below their consumer's acknowledgement floor")
		}
	}
}

// lastDelivery is the delivery number of the last attempt the run-id gate recorded for the
// run msg carries (0 when none): an orphan's delivery continues the run's count, so
// SYS1_MAX_DELIVER bounds its tries as it bounds any run's.
func (w *Worker) lastDelivery(ctx context.Context, msg *jetstream.RawStreamMsg) int {
	runID := runIDOf(msg.Header, derivedRunID(w.opt.Topology.RequestsStream, msg.Sequence, *w.requestsEpoch.Load()))
	e, err := w.gate.Get(ctx, rungate.Key(runID))
	if err != nil {
		return 0
	}
	var st rungate.State
	if json.Unmarshal(e.Value, &st) != nil {
		return 0
	}
	last := 0
	for _, a := range st.Attempts {
		last = max(last, a.Delivery)
	}
	return last
}
