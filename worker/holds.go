package worker

import (
	"context"

	"github.com/sys1hq/sys1/worker/topology"
)

// Held replies are worker/internal/holds': this replica's part is the loop that reads the
// accepted labels from the shared holds consumer (topology.HoldsConsumer).

// heldReplies releases held replies as reviewers' labels arrive, until ctx ends.
func (w *Worker) heldReplies(ctx, runCtx context.Context) {
	w.consumeLabels(ctx, runCtx, w.opt.Topology.LabelsStream, w.opt.Topology.HoldsConsumer, &w.labelLoops.holds, topology.EnsureHoldsConsumer, w.holds.Release)
}
