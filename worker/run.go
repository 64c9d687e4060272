package worker

import (
	"context"
	"fmt"
	"runtime/debug"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/worker/auth"
	"github.com/sys1hq/sys1/worker/budget"
	"github.com/sys1hq/sys1/worker/cache"
	"github.com/sys1hq/sys1/worker/policy"
)

// A run is one delivery of one request message. It goes through the stages below in order;
// each is a small method in its own file that reads what the stages before it found and adds
// its own part. A stage returns nil to let the run go on, or the error that ends it; how the
// delivery then ends is decided by settle alone (settle.go), and a run that is answered is
// published by publish (stage_publish.go). Later capabilities are new stages, not branches
// inside these — the shape of River's job executor and of Watermill's router middleware.
var stages = []struct {
	name string
	run  func(r *run, ctx context.Context) error
}{
	{"admit", (*run).admit},         // who sent it, and where may it be answered
	{"quota", (*run).quota},         // a caller over its pending quota on further subjects
	{"gate", (*run).gate},           // claim the run id (or find the run already finished)
	{"prepare", (*run).prepare},     // deadline, decode, resolve, size
	{"resume", (*run).resume},       // an answer an earlier delivery kept before its review
	{"cache", (*run).cacheLookup},   // an answer the same weights gave the same request
	{"budget", (*run).budget},       // the caller's limits, exact across replicas
	{"call", (*run).call},           // the provider chain
	{"remember", (*run).cacheStore}, // a fresh answer for the next identical request
	{"policy", (*run).policy},       // verdicts beside the answers; what goes to review
}

// run is one delivery's state, filled in stage by stage.
type run struct {
	p     *pipeline
	msg   jetstream.Msg
	meta  *jetstream.MsgMetadata
	log   zerolog.Logger
	start time.Time

	// admit
	runID    string // the id replies carry (the caller's, or derived)
	derived  string // the id derived from the stream sequence
	recordID string // the id the record is stored under (derived when the caller may not own runID)
	replyTo  string
	identity auth.Identity
	// batchID and itemID name a batch item (sys1.batch.<caller>.<batch id>); empty otherwise.
	batchID, itemID string

	// gate
	state    *runState // the gate entry, once claimed
	rev      uint64
	owner    string     // this delivery's token in the entry's lease
	leaseMu  sync.Mutex // guards state and rev while the call's heartbeat may renew the lease
	finished *runState  // the run had already finished: it is answered from this stored outcome

	// prepare
	deadline  time.Time
	requested string            // the model the caller asked for
	resolved  *contract.Request // the request as sent to the provider
	// omitRequest leaves the request out of the record: it could not be stored with it.
	omitRequest bool

	// call
	attempts    []contract.Attempt // across deliveries: the stored ones, then this delivery's
	newAttempts bool               // this delivery added attempts (saved when it is nak'ed)
	resp        *contract.Response
	// answeredBy and answeredModel name who answered with what (the chain's link and the
	// model sent to it).
	answeredBy, answeredModel string

	// policy
	minConfidence float64            // Sys1-Min-Confidence, checked in prepare (0: none)
	verdicts      []contract.Verdict // nil without a policy
	reviews       []policy.Review    // questions to send to human review
	review        *contract.ReviewRef
	hold          bool // no reply until a person has labelled the held questions
	// reviewQueued: the review message is on SYS1_REVIEW; reviewRefused: it could not be
	// stored (quota, stream full), so the reply says not_queued and nothing is held.
	reviewQueued, reviewRefused bool

	// cache and budget
	cacheKey *cache.Key // set when the run may use the cache
	cacheAge time.Duration
	cacheHit bool
	// resumed: the answer is one an earlier delivery kept in the gate (stage_resume.go).
	resumed bool
	// retried: the delivery was handed back for another (nak): the run goes on, and so does
	// its budget admission (settleBudget).
	retried bool
	ticket  *budget.Ticket // the run's admission under its caller's limits
	obs     observation    // spans and metrics (observe.go)
}

// handle processes one delivery of the request stream.
func (w *Worker) handle(ctx context.Context, msg jetstream.Msg) {
	if isBatchManifest(msg) {
		w.storeBatchManifest(ctx, msg) // not a run: what a batch's input held (batch_manifest.go)
		return
	}
	w.pipe.handle(ctx, msg)
}

// handle runs one request delivery through the stages and settles it. It never panics: a
// panic becomes SYS1_INTERNAL.
func (p *pipeline) handle(ctx context.Context, msg jetstream.Msg) {
	r := &run{p: p, msg: msg, start: time.Now(), log: p.log}
	ctx = r.begin(ctx)
	defer r.finish()
	defer func() {
		if p := recover(); p != nil {
			// The stack goes to the log (it has no request content); the reply says only that
			// the worker failed.
			r.log.Error().Str("panic", fmt.Sprint(p)).Str("stack", string(debug.Stack())).Msg("run panicked")
			r.failAfterPanic(ctx)
		}
	}()
	r.end(ctx, r.execute(ctx))
	r.settleBudget(ctx)
}

// execute runs the stages until one ends the run or the run is known to have finished before.
func (r *run) execute(ctx context.Context) error {
	for _, s := range stages {
		if err := r.stage(ctx, s.name, s.run); err != nil {
			return err
		}
		if r.finished != nil {
			return nil
		}
	}
	return nil
}

// end settles the delivery: a run that is answered is published first (its outcome stored,
// its record and reply sent); if that fails, settle decides again on the failure.
func (r *run) end(ctx context.Context, err error) {
	s := r.settle(err)
	if s.Answers() {
		if perr := r.publishStage(ctx, err); perr != nil {
			err, s = perr, r.settle(perr)
		}
	}
	r.apply(ctx, s, err)
}

// settle asks settle (settle.go) about this delivery.
func (r *run) settle(err error) Settlement {
	in := SettleInput{Err: err, MaxDeliver: r.p.cfg.MaxDeliver, Deadline: r.deadline, Retry: r.p.cfg.retry(), Now: time.Now()}
	if r.meta != nil {
		in.Deliveries = r.tries()
	}
	return settle(in)
}

// tries is how many deliveries of the run tried to run it: all of them but those that waited
// for the caller's limits (recorded in the gate), which SYS1_MAX_DELIVER does not count.
func (r *run) tries() int {
	n := int(r.meta.NumDelivered)
	if r.state != nil {
		n -= r.state.Waits
	}
	return max(n, 1)
}

// apply ends the delivery as s says.
func (r *run) apply(ctx context.Context, s Settlement, err error) {
	r.retried = s.Disposition == Nak
	switch s.Disposition {
	case Ack:
		_ = r.msg.Ack()
	case Term:
		_ = r.msg.Term()
	case Nak:
		r.logNak(s, err)
		// A stream or the gate's bucket may be gone: the pull loop recreates them.
		r.p.repair(err)
		_, waited := isDelay(err)
		if waited && r.state != nil {
			r.state.Waits++ // a wait is not a try: the next delivery must know
		}
		if _, busy := err.(*waitError); busy {
			// Waiting for another delivery or message: the run is not this delivery's to write.
		} else if r.state != nil && r.state.Owner == r.owner {
			// The next delivery, on any replica, continues the same record, and may take the
			// run at once: this delivery's lease ends with it.
			if serr := r.releaseLease(context.WithoutCancel(ctx)); serr != nil {
				r.log.Warn().Err(serr).Msg("could not store the run's progress in the gate; the next delivery may count this one, and waits for its lease")
			}
		} else if (r.newAttempts || waited) && (r.state == nil || r.state.Status != runDone) {
			// (A finished run's outcome holds its attempts already: one whose record waits
			// for room in SYS1_RUNS is handed back with nothing more to save.)
			if serr := r.saveAttempts(context.WithoutCancel(ctx)); serr != nil {
				r.log.Warn().Err(serr).Msg("could not store the run's progress in the gate; the next delivery may count this one")
			}
		}
		if s.Delay <= 0 {
			_ = r.msg.Nak()
			return
		}
		_ = r.msg.NakWithDelay(s.Delay)
	}
}

func (r *run) logNak(s Settlement, err error) {
	if err == ErrShutdown {
		r.log.Warn().Msg("run cancelled by shutdown; nak'ed for redelivery")
		return
	}
	if cerr, ok := contract.AsError(err); ok {
		r.p.stats.retried.Add(1)
		r.log.Info().Str("error_code", string(cerr.Code)).Dur("retry_in", s.Delay).Msg("transient provider error; redelivering")
		return
	}
	if d, ok := isDelay(err); ok {
		r.log.Info().Dur("retry_in", s.Delay).Msg(d.why)
		return
	}
	if w, ok := err.(*waitError); ok {
		if w.err != nil {
			r.log.Warn().Err(w.err).Uint64("owner_seq", w.ownerSeq).Dur("retry_in", s.Delay).Msg(w.why)
			return
		}
		r.log.Info().Uint64("owner_seq", w.ownerSeq).Dur("retry_in", s.Delay).Msg(w.why)
		return
	}
	r.log.Warn().Err(err).Dur("retry_in", s.Delay).Msg("could not finish the run; redelivering")
}

// waitError is a delivery that must wait for another message with the same run id: not a
// failure, and never answered; settle naks it.
type waitError struct {
	ownerSeq uint64
	why      string
	err      error // what went wrong finding out, if anything
	// until, when set, is when to look again: another delivery's lease on the run ends then.
	until time.Time
}

func (e *waitError) Error() string { return e.why }

// failAfterPanic answers SYS1_INTERNAL after a recovered panic. If that panics too, the
// delivery is nak'ed rather than taking the replica down.
func (r *run) failAfterPanic(ctx context.Context) {
	defer func() {
		if p := recover(); p != nil {
			r.log.Error().Str("panic", fmt.Sprint(p)).Msg("concluding a panicked run panicked; nak'ed")
			perr := fmt.Errorf("concluding a panicked run panicked: %v", p)
			r.apply(ctx, r.settle(perr), perr)
		}
	}()
	r.finished = nil
	r.end(ctx, contract.Errorf(contract.CodeInternal, "internal error in the worker; the run was not completed"))
}
