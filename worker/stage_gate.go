package worker

import (
	"context"
	"fmt"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/worker/topology"
)

// gate claims the run id for the verified caller in the run-id gate, or finds why it cannot:
// the id is another caller's (conflict), the run already finished (answer it again from its
// stored outcome), or another message with the same id is running it (wait for that one).
func (r *run) gate(ctx context.Context) error {
	w := r.w
	claim, st, rev, err := w.gate.claim(ctx, r.runID, r.identity, r.meta.Sequence.Stream, r.start)
	if err != nil {
		// A full bucket is said once in the log and in health; the delivery comes back later.
		return w.noteStore(topology.KVStream(w.opt.Topology.RunsBucket), err)
	}
	switch claim {
	case claimConflict:
		r.recordID = r.derived
		return contract.Errorf(contract.CodeRunIDConflict, "run id %q belongs to another caller's run; that run is untouched; use a fresh run id", r.runID)
	case claimFinished:
		r.finished = st
		return nil
	case claimDuplicate:
		// Another message with this id owns the run. While it is still queued or in flight,
		// answer once it has finished; if it is gone (aged out of the stream unfinished), this
		// message takes the run over, or it would wait for good.
		gone, err := w.messageGone(ctx, st.StreamSeq)
		if err != nil {
			// Not knowing is not "gone": taking the run over could score it twice. Try again.
			return &waitError{ownerSeq: st.StreamSeq, err: err, why: "could not look up the message that owns this run id; the run will be retried"}
		}
		if !gone {
			if int(r.meta.NumDelivered) >= w.opt.Topology.ConsumerMaxDeliver {
				// Waiting longer would outlast this message's own deliveries: give up as the
				// owner itself would, answered, and recorded apart (the run is the owner's).
				r.recordID = r.derived
				return contract.Errorf(contract.CodeRunIDConflict, "run id %q is still being run by another message (stream sequence %d); this one gave up waiting after %d deliveries and was not run; the run's own reply goes to the subject its message named", r.runID, st.StreamSeq, r.meta.NumDelivered)
			}
			return &waitError{ownerSeq: st.StreamSeq, why: "run id is in flight from another message; answering once it finishes"}
		}
		st.StreamSeq = r.meta.Sequence.Stream
		if rev, err = w.gate.save(ctx, r.runID, st, rev); err != nil {
			return fmt.Errorf("take over run from a vanished message: %w", err)
		}
		r.log.Warn().Msg("the message that owned this run id left the stream unfinished; this one takes the run over")
	}
	r.state, r.rev = st, rev
	r.attempts = append(r.attempts, st.Attempts...)
	return nil
}
