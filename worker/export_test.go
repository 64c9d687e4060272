package worker

import (
	"context"

	"github.com/sys1hq/sys1/worker/internal/orphans"
)

// SweepOrphansOf runs one orphan sweep of s instead of the request stream (tests plant
// orphans there: a work-queue consumer cannot be made to pass a message on purpose).
func (w *Worker) SweepOrphansOf(ctx context.Context, s orphans.Stream) (orphans.Report, error) {
	w.orphan.Requests = func() orphans.Stream { return s }
	return w.orphan.Sweep(ctx)
}
