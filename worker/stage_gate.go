package worker

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/worker/topology"
)

// gate claims the run id for the verified caller in the run-id gate, or finds why it cannot:
// the id is another caller's (conflict), the run already finished (answer it again from its
// stored outcome), or another message with the same id is running it (wait for that one).
func (r *run) gate(ctx context.Context) error {
	w := r.w
	r.owner = w.cfg.ID + "/" + nuid.Next()
	claim, st, rev, err := w.gate.claim(ctx, r.runID, r.identity, r.meta.Sequence.Stream, r.start, r.owner, w.lease())
	if err != nil {
		// A full bucket is said once in the log and in health; the delivery comes back later.
		return w.noteStore(topology.KVStream(w.opt.Topology.RunsBucket), err)
	}
	switch claim {
	case claimBusy:
		// JetStream delivered this message again while another delivery still runs it (its
		// consumer's leader changed under it): wait for that one, never call the model twice.
		// Look again when the lease ends, or sooner (a third of the ack wait): the other
		// delivery usually finishes long before its lease would.
		until := time.Now().Add(max(w.opt.Topology.AckWait/3, leaseRecheck))
		if st.LeaseUntil.Before(until) {
			until = st.LeaseUntil
		}
		until = until.Add(rand.N(100 * time.Millisecond))
		return &waitError{ownerSeq: st.StreamSeq, until: until,
			why: fmt.Sprintf("another delivery of this message is running the run (%s, its lease until %s); answering once it finishes",
				st.Owner, st.LeaseUntil.UTC().Format(time.RFC3339Nano))}
	case claimRedelivery:
		// The last delivery ended, or its replica died and its lease lapsed: this one takes the
		// run over. Compare-and-set: of two deliveries doing so at once, one wins.
		st.Owner, st.LeaseUntil = r.owner, time.Now().Add(w.lease())
		if rev, err = w.gate.save(ctx, r.runID, st, rev); err != nil {
			if errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists) {
				return &waitError{ownerSeq: st.StreamSeq, why: "another delivery of this message took the run over first; answering once it finishes"}
			}
			return fmt.Errorf("take over the run: %w", err)
		}
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
		st.Owner, st.LeaseUntil = r.owner, time.Now().Add(w.lease())
		if rev, err = w.gate.save(ctx, r.runID, st, rev); err != nil {
			return fmt.Errorf("take over run from a vanished message: %w", err)
		}
		r.log.Warn().Msg("the message that owned this run id left the stream unfinished; this one takes the run over")
	}
	r.state, r.rev = st, rev
	r.attempts = append(r.attempts, st.Attempts...)
	return nil
}

// lease is how long a claim keeps a run its delivery's: the ack wait and a quarter. A live
// delivery renews it with every heartbeat of a long call (renewLease), so JetStream handing the
// message to another replica (a consumer leader's change can do it at once) finds it held; a
// dead replica's lapses a few seconds after JetStream redelivers its message for silence.
func (w *Worker) lease() time.Duration { return w.opt.Topology.AckWait + w.opt.Topology.AckWait/4 }

// renewLease extends this delivery's lease; the call's heartbeat calls it every third of the
// ack wait while a call runs long. A renewal that finds the run taken over (its lease lapsed
// while the gate could not be reached) leaves it to the new owner: storing would then fail.
func (r *run) renewLease(ctx context.Context) {
	r.leaseMu.Lock()
	defer r.leaseMu.Unlock()
	if r.state == nil || r.state.Owner != r.owner || time.Until(r.state.LeaseUntil) > r.w.lease()-r.w.opt.Topology.AckWait/4 {
		return
	}
	st := *r.state
	st.LeaseUntil = time.Now().Add(r.w.lease())
	sctx, cancel := context.WithTimeout(ctx, storeAttemptTimeout)
	defer cancel()
	rev, err := r.w.gate.save(sctx, r.runID, &st, r.rev)
	if err != nil {
		r.log.Warn().Err(err).Msg("could not renew the run's lease in the gate")
		return
	}
	*r.state, r.rev = st, rev
}

// releaseLease ends this delivery's claim on a run it did not finish (it is nak'ed), saving
// its attempts with it, so the next delivery takes the run at once instead of waiting the
// lease out.
func (r *run) releaseLease(ctx context.Context) error {
	r.leaseMu.Lock()
	defer r.leaseMu.Unlock()
	if r.state == nil || r.state.Owner != r.owner {
		return nil
	}
	r.state.Attempts = r.attempts
	r.state.Owner, r.state.LeaseUntil = "", time.Time{}
	rev, err := r.w.gate.save(ctx, r.runID, r.state, r.rev)
	if err != nil {
		return err
	}
	r.rev = rev
	return nil
}
