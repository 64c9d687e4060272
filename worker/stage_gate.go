package worker

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/nats-io/nuid"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/worker/auth"
	"github.com/sys1hq/sys1/worker/internal/outbox"
	"github.com/sys1hq/sys1/worker/rungate"
	"github.com/sys1hq/sys1/worker/topology"
)

// gate claims the run id for the verified caller in the run-id gate, or finds why it cannot:
// the id is another caller's (conflict), the run already finished (answer it again from its
// stored outcome), or another message with the same id is running it (wait for that one).
func (r *run) gate(ctx context.Context) error {
	p := r.p
	r.owner = p.cfg.ID + "/" + nuid.Next()
	claim, st, rev, err := r.claim(ctx)
	if err != nil {
		// A full bucket is said once in the log and in health; the delivery comes back later.
		return p.room.Note(topology.KVStream(p.topo.RunsBucket), err)
	}
	switch claim {
	case rungate.ClaimBusy:
		// Another delivery still held the run when this one gave up waiting: try again later.
		return &waitError{ownerSeq: st.StreamSeq, until: st.LeaseUntil,
			why: fmt.Sprintf("another delivery of this message is still running the run (%s, its lease until %s)", st.Owner, st.LeaseUntil.UTC().Format(time.RFC3339Nano))}
	case rungate.ClaimRedelivery:
		// The last delivery ended, or its replica died and its lease lapsed: this one takes the
		// run over. Compare-and-set: of two deliveries doing so at once, one wins.
		st.Owner, st.LeaseUntil = r.owner, time.Now().Add(p.lease())
		if rev, err = p.gate.Save(ctx, r.runID, st, rev); err != nil {
			if rungate.IsConflict(err) {
				return &waitError{ownerSeq: st.StreamSeq, why: "another delivery of this message took the run over first; answering once it finishes"}
			}
			return fmt.Errorf("take over the run: %w", err)
		}
	case rungate.ClaimConflict:
		r.recordID = r.derived
		return contract.Errorf(contract.CodeRunIDConflict, "run id %q belongs to another caller's run; that run is untouched; use a fresh run id", r.runID)
	case rungate.ClaimFinished:
		r.finished = st
		return nil
	case rungate.ClaimDuplicate:
		// Another message with this id owns the run. While it is still queued or in flight,
		// answer once it has finished; if it is gone (aged out of the stream unfinished), this
		// message takes the run over, or it would wait for good.
		gone, err := p.messageGone(ctx, st.StreamSeq)
		if err != nil {
			// Not knowing is not "gone": taking the run over could score it twice. Try again.
			return &waitError{ownerSeq: st.StreamSeq, err: err, why: "could not look up the message that owns this run id; the run will be retried"}
		}
		if !gone {
			if int(r.meta.NumDelivered) >= p.topo.ConsumerMaxDeliver {
				// Waiting longer would outlast this message's own deliveries: give up as the
				// owner itself would, answered, and recorded apart (the run is the owner's).
				r.recordID = r.derived
				return contract.Errorf(contract.CodeRunIDConflict, "run id %q is still being run by another message (stream sequence %d); this one gave up waiting after %d deliveries and was not run; the run's own reply goes to the subject its message named", r.runID, st.StreamSeq, r.meta.NumDelivered)
			}
			return &waitError{ownerSeq: st.StreamSeq, why: "run id is in flight from another message; answering once it finishes"}
		}
		st.StreamSeq = r.meta.Sequence.Stream
		st.Owner, st.LeaseUntil = r.owner, time.Now().Add(p.lease())
		if rev, err = p.gate.Save(ctx, r.runID, st, rev); err != nil {
			return fmt.Errorf("take over run from a vanished message: %w", err)
		}
		r.log.Warn().Msg("the message that owned this run id left the stream unfinished; this one takes the run over")
	}
	r.state, r.rev = st, rev
	r.attempts = append(r.attempts, st.Attempts...)
	return nil
}

// claim claims the run in the gate. JetStream can deliver a message again while another
// delivery still runs it (when a consumer's leader dies before that delivery was replicated,
// the new leader hands the message out at once): then this delivery waits, keeping the
// message alive, until the other one finishes (the run is answered from its stored outcome),
// releases it, or its lease lapses (its replica died: this one takes the run over) — never
// calling the model beside it. Waiting inside the delivery, rather than nak'ing, spends none
// of the message's deliveries, which count the run's tries.
func (r *run) claim(ctx context.Context) (rungate.Claim, *runState, uint64, error) {
	p := r.p
	var logged bool
	lastBeat := time.Now()
	for {
		claim, st, rev, err := p.gate.Claim(ctx, rungate.Claimant{RunID: r.runID, Caller: r.identity.Caller,
			Owns:      func(owner string) bool { return auth.SameOwner(owner, r.identity) },
			StreamSeq: r.meta.Sequence.Stream, Start: r.start, Lease: r.owner, LeaseFor: p.lease()})
		if err != nil || claim != rungate.ClaimBusy {
			return claim, st, rev, err
		}
		if !logged {
			r.log.Info().Str("owner", st.Owner).Time("lease_until", st.LeaseUntil).
				Msg("another delivery of this message is running the run; waiting for it instead of calling the model again")
			logged = true
		}
		if time.Since(r.start) > p.lease()+p.topo.AckWait/2 {
			return claim, st, rev, nil // its lease keeps being renewed: come back later
		}
		if time.Since(lastBeat) >= p.topo.AckWait/3 {
			_ = r.msg.InProgress()
			lastBeat = time.Now()
		}
		wait := min(time.Until(st.LeaseUntil), time.Second) + rand.N(50*time.Millisecond)
		t := time.NewTimer(max(wait, leaseRecheck))
		select {
		case <-ctx.Done():
			t.Stop()
			return 0, nil, 0, ErrShutdown
		case <-t.C:
		}
	}
}

// renewLease extends this delivery's lease; the call's heartbeat calls it every third of the
// ack wait while a call runs long. A renewal that finds the run taken over (its lease lapsed
// while the gate could not be reached) leaves it to the new owner: storing would then fail.
func (r *run) renewLease(ctx context.Context) {
	r.leaseMu.Lock()
	defer r.leaseMu.Unlock()
	if r.state == nil || r.state.Owner != r.owner || time.Until(r.state.LeaseUntil) > r.p.lease()-r.p.topo.AckWait/4 {
		return
	}
	st := *r.state
	st.LeaseUntil = time.Now().Add(r.p.lease())
	sctx, cancel := context.WithTimeout(ctx, outbox.AttemptTimeout)
	defer cancel()
	rev, err := r.p.gate.Save(sctx, r.runID, &st, r.rev)
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
	rev, err := r.p.gate.Save(ctx, r.runID, r.state, r.rev)
	if err != nil {
		return err
	}
	r.rev = rev
	return nil
}
