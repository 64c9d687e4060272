package worker

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
)

// Dead letters are answered by worker/internal/deadletter; this replica's part is the loop
// that pulls the advisories from the shared consumer.

// deadLetters answers dead-lettered requests until ctx ends.
func (w *Worker) deadLetters(ctx context.Context, runCtx context.Context) {
	var fails int
	for ctx.Err() == nil {
		cons := w.deadCons.Load()
		// Bounded by the server's expiry, not a context (see pullWaiting).
		batch, err := pullWaiting(*cons, 4, w.opt.FetchWait)
		if err == nil {
			for m := range batch.Messages() {
				w.dead.Answer(runCtx, m)
			}
			err = batch.Error()
		}
		if err != nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, nats.ErrTimeout) {
			fails++
			delay := min(time.Duration(fails)*200*time.Millisecond, 5*time.Second)
			w.log.Debug().Err(err).Dur("retry_in", delay).Msg("dead-letter pull failed")
			select {
			case <-time.After(delay):
			case <-ctx.Done():
			}
			continue
		}
		fails = 0
	}
}
