package batch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/contract/wire"
	"github.com/sys1hq/sys1/worker/client"
	"github.com/sys1hq/sys1/worker/rungate"
	"github.com/sys1hq/sys1/worker/topology"
)

// Defaults of RunConfig.
const (
	DefaultInFlight         = 256
	DefaultMaxInFlightBytes = 256 << 20
	DefaultResendAfter      = 2 * time.Minute
	DefaultPublishers       = 8
	DefaultCancelPoll       = time.Second
	// cancelledResend is how soon an unanswered item of a cancelled batch is published again:
	// 'sys1 batch cancel' purges the stream twice (see Cancel), and a deadline-passed request
	// costs the worker no provider call, so there is nothing to wait for.
	cancelledResend  = 2 * time.Second
	maxResendBackoff = 16 // a re-sent item waits at most 16× the base before the next
)

// ErrNoStream means nothing stores requests on the batch subject: no worker has created the
// request stream on this NATS (or permissions hide it).
var ErrNoStream = errors.New("no JetStream stream accepts sys1.batch.*: is a sys1 worker running against this NATS?")

// ErrInputChanged means the input's bytes changed between validating and sending.
var ErrInputChanged = errors.New("the input file changed while the batch ran; its output would not match its batch id, so it was not written (run again)")

// RunConfig configures one run of a batch.
type RunConfig struct {
	Caller  string // the subject token: requests go to sys1.batch.<caller>.<batch id>
	BatchID string
	// InFlight bounds the items published and not yet answered; the items answered but not yet
	// written (waiting for an earlier one, output is in input order) are bounded by it too.
	InFlight int
	// MaxInFlightBytes bounds the request bytes held for re-sending (large image requests).
	MaxInFlightBytes int64
	Deadline         time.Time // Sys1-Deadline of every request; zero: none
	Token            string    // bearer JWT (auth mode jwt)
	// ResendAfter is how long an item may go unanswered, once items sent after it were
	// answered, before it is published again (its reply was lost in transit); see resend.
	// Re-sending is safe: the run-id gate answers a finished run from its stored outcome and a
	// running one once it finishes, so nothing is scored twice.
	ResendAfter time.Duration
	Publishers  int
	// RunsBucket is the run-id gate's KV bucket, which holds cancel markers (see Cancel).
	RunsBucket string
	// CancelPoll is how often the cancel marker is read during the run; negative: never.
	CancelPoll time.Duration
	// Progress, when set, is called every ProgressEvery and once at the end.
	Progress      func(Progress)
	ProgressEvery time.Duration
	// Warn tells the person running the batch about trouble it survives.
	Warn func(string)
}

func (c *RunConfig) defaults() {
	if c.InFlight <= 0 {
		c.InFlight = DefaultInFlight
	}
	if c.MaxInFlightBytes <= 0 {
		c.MaxInFlightBytes = DefaultMaxInFlightBytes
	}
	if c.ResendAfter <= 0 {
		c.ResendAfter = DefaultResendAfter
	}
	if c.Publishers <= 0 {
		c.Publishers = DefaultPublishers
	}
	c.Publishers = min(c.Publishers, c.InFlight)
	if c.RunsBucket == "" {
		c.RunsBucket = wire.RunsBucket
	}
	if c.CancelPoll == 0 {
		c.CancelPoll = DefaultCancelPoll
	}
	if c.ProgressEvery <= 0 {
		c.ProgressEvery = 200 * time.Millisecond
	}
	if c.Warn == nil {
		c.Warn = func(string) {}
	}
}

// Progress is a live snapshot of a run.
type Progress struct {
	Total                                 int // items in the input
	Succeeded, Failed, Invalid, Cancelled int // concluded so far
	Outstanding                           int // published, not answered
	Resent                                int
	Elapsed                               time.Duration
	Final                                 bool
}

// Done is the number of concluded items.
func (p Progress) Done() int { return p.Succeeded + p.Failed + p.Invalid + p.Cancelled }

// Subject is where a batch's requests are published.
func Subject(caller, batchID string) string { return wire.Batch(caller, batchID) }

type slot struct {
	e          Entry
	runID      string
	sends      int  // publishes started
	publishing bool // a publish is under way
	resendNow  bool // publish again as soon as the current publish ends (the batch was cancelled)
	lastSent   time.Time
	sentSeq    int // the run's publish counter when it was last sent
	oc         *outcome
}

type pubJob struct {
	ord int
	msg *nats.Msg
}

type pubResult struct {
	ord int
	err error
	at  time.Time
}

type inbound struct {
	ord  int
	data []byte
	at   time.Time
}

type readResult struct {
	e    Entry
	err  error
	eof  bool
	hash [32]byte
}

// fatalError ends a run: retrying cannot help (no stream, a refused subject).
type fatalError struct{ err error }

func (f *fatalError) Error() string { return f.err.Error() }
func (f *fatalError) Unwrap() error { return f.err }

type runner struct {
	cfg     RunConfig
	nc      *nats.Conn
	js      jetstream.JetStream
	plan    *Plan
	out     *Output
	sum     *Summary
	subject string
	inbox   string
	session string

	window      map[int]*slot
	head, next  int // next ordinal to write; next ordinal to read
	outstanding int
	bytes       int64
	eof         bool
	pubSeq      int // publishes started by this run, in order
	// answeredSeq is the highest publish counter (sentSeq) of an item answered so far: an
	// unanswered item sent before it was overtaken, the mark of a lost reply.
	answeredSeq int
	maxLatency  time.Duration
	cancelAt    time.Time
	cancelMark  string
	progress    Progress
	start       time.Time

	// pending are publishes waiting for a free publisher, oldest first.
	pending []pubJob
	pubCh   chan pubJob
	pubDone chan pubResult
}

// Run publishes a scanned batch (plan is Scan's result for in) and writes its output, in input
// order, to out, which it commits when every item is concluded. It returns the summary; on an
// error out is left as .partial files (aborted), and running again resumes the batch.
func Run(ctx context.Context, nc *nats.Conn, in Input, plan *Plan, out *Output, cfg RunConfig) (*Summary, error) {
	cfg.defaults()
	if err := ValidCaller(cfg.Caller); err != nil {
		return nil, err
	}
	if err := ValidBatchID(cfg.BatchID); err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	r := &runner{
		cfg: cfg, nc: nc, js: js, plan: plan, out: out, sum: newSummary(),
		subject: Subject(cfg.Caller, cfg.BatchID), inbox: nc.NewInbox(), session: nuid.Next(),
		window:  map[int]*slot{},
		pubCh:   make(chan pubJob),
		pubDone: make(chan pubResult, cfg.Publishers),
		start:   time.Now(),
	}
	r.sum.BatchID, r.sum.Caller, r.sum.Input, r.sum.Output, r.sum.ErrorsOutput = cfg.BatchID, cfg.Caller, in.Path, out.Path, out.ErrorsPath
	r.progress.Total = plan.Entries
	err = r.run(ctx, in)
	r.sum.finish(time.Since(r.start))
	if err != nil {
		_ = out.Abort()
		return r.sum, err
	}
	if err := out.Commit(); err != nil {
		return r.sum, err
	}
	return r.sum, nil
}

func (r *runner) run(ctx context.Context, in Input) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	replies := make(chan inbound, 2*r.cfg.InFlight)
	sub, err := r.nc.Subscribe(r.inbox+".*", func(m *nats.Msg) {
		ord, err := strconv.Atoi(m.Subject[len(r.inbox)+1:])
		if err != nil {
			return
		}
		select {
		case replies <- inbound{ord: ord, data: m.Data, at: time.Now()}:
		case <-ctx.Done():
		}
	})
	if err != nil {
		return fmt.Errorf("subscribe to the reply inbox: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := r.confirmSubscribed(); err != nil {
		return err
	}

	// A publish the server's permissions refuse is never acknowledged: each would wait out its
	// timeout. The server says so at once, asynchronously; listen for it, and end the run.
	denied := make(chan error, 1)
	prev := r.nc.ErrorHandler()
	r.nc.SetErrorHandler(func(nc *nats.Conn, sub *nats.Subscription, err error) {
		if errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), `"`+r.subject+`"`) {
			select {
			case denied <- &fatalError{fmt.Errorf("NATS refuses this user's publishes to %s (%v): check --caller; a producer may publish only its own sys1.batch.<user>.*", r.subject, err)}:
			default:
			}
		}
		if prev != nil {
			prev(nc, sub, err)
		}
	})
	defer r.nc.SetErrorHandler(prev)

	// The cancel marker: read once before anything is sent, then every CancelPoll.
	cancels := make(chan time.Time, 1)
	if r.cfg.CancelPoll > 0 {
		at, found, err := ReadCancelMarker(ctx, r.nc, r.cfg.RunsBucket, r.cfg.BatchID)
		switch {
		case err != nil:
			r.cfg.Warn(fmt.Sprintf("cannot read the batch's cancel marker (%v); this run will not notice a 'sys1 batch cancel'", err))
		case found:
			r.setCancelled(at)
		default:
			go r.pollCancel(ctx, cancels)
		}
	}

	// The manifest first: batch status counts the lines that are never sent from it. Without
	// it the batch still runs (a producer that may not publish to sys1.decide.<caller>).
	if err := r.publish(ctx, r.manifest()); err != nil {
		if ctx.Err() != nil || errors.Is(err, ErrNoStream) || errors.Is(err, nats.ErrConnectionClosed) {
			return err
		}
		r.cfg.Warn(fmt.Sprintf("could not publish the batch's manifest (%v); 'sys1 batch status' will not count its invalid lines", err))
	}

	rd, err := in.Open()
	if err != nil {
		return err
	}
	defer func() { _ = rd.Close() }()
	entries := make(chan readResult)
	go func() {
		defer close(entries)
		for {
			e, err := rd.Next()
			rr := readResult{e: e, err: err}
			if errors.Is(err, io.EOF) {
				rr = readResult{eof: true, hash: rd.Hash()}
			}
			select {
			case entries <- rr:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()

	for range r.cfg.Publishers {
		go r.publisher(ctx)
	}

	tick := time.NewTicker(min(r.cfg.ProgressEvery, r.cfg.ResendAfter/4, time.Second))
	defer tick.Stop()
	lastProgress := time.Now()
	for !(r.eof && r.head == r.next) {
		var entryCh <-chan readResult
		if r.canRead() {
			entryCh = entries
		}
		var pubCh chan<- pubJob
		var job pubJob
		if len(r.pending) > 0 {
			pubCh, job = r.pubCh, r.pending[0]
		}
		select {
		case pubCh <- job:
			r.pending = r.pending[1:]
		case rr := <-entryCh:
			if err := r.admit(rr); err != nil {
				return err
			}
		case in := <-replies:
			r.answer(in)
		case pr := <-r.pubDone:
			if err := r.published(pr); err != nil {
				return err
			}
		case at := <-cancels:
			r.setCancelled(at)
		case err := <-denied:
			return err
		case now := <-tick.C:
			r.resend(now)
			if now.Sub(lastProgress) >= r.cfg.ProgressEvery {
				lastProgress = now
				r.report(false)
			}
		case <-ctx.Done():
			return fmt.Errorf("interrupted with %d of %d items concluded: %w", r.head, r.plan.Entries, ctx.Err())
		}
		if err := r.flush(); err != nil {
			return err
		}
	}
	r.report(true)
	return nil
}

// canRead: room for one more item in the window and the reorder buffer.
func (r *runner) canRead() bool {
	return !r.eof && r.outstanding < r.cfg.InFlight && r.next-r.head < 2*r.cfg.InFlight &&
		(r.bytes < r.cfg.MaxInFlightBytes || r.outstanding == 0)
}

func (r *runner) admit(rr readResult) error {
	switch {
	case rr.err != nil:
		return rr.err
	case rr.eof:
		r.eof = true
		if r.next != r.plan.Entries || rr.hash != r.plan.InputHash {
			return ErrInputChanged
		}
		return nil
	}
	e := rr.e
	if e.Ord != r.next || e.Ord >= r.plan.Entries {
		return ErrInputChanged
	}
	r.next++
	s := &slot{e: e, runID: RunID(r.cfg.BatchID, e.ItemID)}
	r.window[e.Ord] = s
	if !e.Valid() {
		r.conclude(s, &outcome{status: StatusInvalid, errJSON: mustJSON(e.Err), code: string(e.Err.Code)})
		return nil
	}
	if mp := r.nc.MaxPayload(); mp > 0 && int64(len(e.Body)) > mp {
		r.conclude(s, localError(StatusFailed, contract.Errorf(contract.CodeRequestTooLarge,
			"the request is %d bytes; the NATS server accepts messages up to %d bytes (max_payload); it was not sent", len(e.Body), mp)))
		return nil
	}
	r.outstanding++
	r.bytes += int64(len(e.Body))
	r.send(s)
	return nil
}

func mustJSON(e *contract.Error) []byte {
	b, _ := e.MarshalJSON()
	return b
}

// manifest is the batch's manifest message (rungate.Manifest): how many items the input
// has and how many are invalid, on the caller's sys1.decide.<caller> (see
// worker/batch_manifest.go). Its message id is derived from its content, so running the batch
// again stores it once.
func (r *runner) manifest() *nats.Msg {
	m := nats.NewMsg(wire.Decide(r.cfg.Caller))
	m.Data, _ = json.Marshal(rungate.Manifest{BatchID: r.cfg.BatchID, Items: r.plan.Entries, Invalid: r.plan.Invalid})
	m.Header.Set(wire.HeaderBatchManifest, "1")
	m.Header.Set(wire.HeaderMsgID, fmt.Sprintf("manifest:%s:%d:%d", r.cfg.BatchID, r.plan.Entries, r.plan.Invalid))
	if r.cfg.Token != "" {
		m.Header.Set(wire.HeaderAuthorization, "Bearer "+r.cfg.Token)
	}
	return m
}

// send queues one publish of s for the publishers.
func (r *runner) send(s *slot) {
	s.publishing = true
	s.sends++
	r.pubSeq++
	s.sentSeq = r.pubSeq
	r.sum.Sent++
	if s.sends > 1 {
		r.sum.Resent++
		r.progress.Resent++
	}
	m := nats.NewMsg(r.subject)
	m.Data = s.e.Body
	m.Header.Set(wire.HeaderRunID, s.runID)
	// A Nats-Msg-Id per publish, not the run id: the run-id gate de-duplicates runs, while a
	// stream-level duplicate of a killed invocation's message (inside the 2-minute window)
	// would be dropped and its reply would go to the dead invocation's inbox. The same id is
	// kept while one publish is retried, so a lost ack cannot store it twice.
	m.Header.Set(wire.HeaderMsgID, s.runID+"/"+r.session+"/"+strconv.Itoa(s.sends))
	m.Header.Set(wire.HeaderReplyTo, r.inbox+"."+strconv.Itoa(s.e.Ord))
	deadline := r.cfg.Deadline
	if !r.cancelAt.IsZero() && (deadline.IsZero() || r.cancelAt.Before(deadline)) {
		deadline = r.cancelAt
	}
	if !deadline.IsZero() {
		m.Header.Set(wire.HeaderDeadline, deadline.UTC().Format(time.RFC3339Nano))
	}
	if r.cfg.Token != "" {
		m.Header.Set(wire.HeaderAuthorization, "Bearer "+r.cfg.Token)
	}
	r.pending = append(r.pending, pubJob{ord: s.e.Ord, msg: m})
}

func (r *runner) published(pr pubResult) error {
	s := r.window[pr.ord]
	if s == nil {
		return nil
	}
	s.publishing = false
	var local *contract.Error
	switch {
	case pr.err == nil:
		s.lastSent = pr.at
	case errors.As(pr.err, &local):
		if s.oc == nil {
			r.conclude(s, localError(StatusFailed, local))
		}
		return nil
	default:
		return pr.err
	}
	if s.resendNow && s.oc == nil {
		s.resendNow = false
		r.send(s)
	}
	return nil
}

// publisher publishes queued jobs until ctx ends.
func (r *runner) publisher(ctx context.Context) {
	for {
		select {
		case job := <-r.pubCh:
			err := r.publish(ctx, job.msg)
			select {
			case r.pubDone <- pubResult{ord: job.ord, err: err, at: time.Now()}:
			case <-ctx.Done():
				return
			}
		case <-ctx.Done():
			return
		}
	}
}

// publish stores one message in the stream, retrying what a retry can fix. It returns a
// *contract.Error for an item the stream refuses (too large) and a *fatalError when no
// publish can succeed.
func (r *runner) publish(ctx context.Context, m *nats.Msg) error {
	wait := 100 * time.Millisecond
	for attempt := 1; ; attempt++ {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := r.js.PublishMsg(pctx, m)
		cancel()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var apiErr *jetstream.APIError
		switch {
		case errors.Is(err, nats.ErrMaxPayload):
			return contract.Errorf(contract.CodeRequestTooLarge, "the request is %d bytes, over the NATS server's max_payload; it was not sent", len(m.Data))
		case errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamMessageExceedsMaximum:
			return contract.Errorf(contract.CodeRequestTooLarge, "the request is %d bytes, over the request stream's largest message (SYS1_MAX_MSG_SIZE); it was not sent", len(m.Data))
		case errors.Is(err, nats.ErrConnectionClosed):
			return &fatalError{fmt.Errorf("publish to %s: %w", m.Subject, err)}
		case errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders):
			// No stream at all, or one between leaders (a NATS node died: its election takes
			// seconds)? JetStream says; only the first is fatal.
			if errors.Is(client.NoStream(ctx, r.js, m.Subject, err), client.ErrNoStream) {
				return &fatalError{ErrNoStream}
			}
		}
		if last := r.nc.LastError(); errors.Is(last, nats.ErrPermissionViolation) && strings.Contains(last.Error(), `"`+m.Subject+`"`) {
			return &fatalError{fmt.Errorf("NATS refuses this user's publishes to %s (%v): check --caller; a producer may publish only its own sys1.batch.<user>.*", m.Subject, last)}
		}
		switch refusal := topology.Refused(err); {
		case refusal != topology.NotRefused && attempt%10 == 1:
			// The stream has no room for this batch now (its quota per batch subject,
			// SYS1_REQUESTS_MAX_PER_CALLER, or SYS1_REQUESTS full): wait for the workers to
			// drain it, as back-pressure, rather than fail the batch.
			r.cfg.Warn(fmt.Sprintf("the request stream refuses %s for now (%s: %v); waiting for room and retrying", m.Subject, refusal, err))
		case refusal == topology.NotRefused && attempt%10 == 0:
			r.cfg.Warn(fmt.Sprintf("publishing to %s keeps failing (%v); retrying", m.Subject, err))
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		wait = min(wait*2, 5*time.Second)
	}
}

// answer takes a reply. Replies are at least once: a second reply for a concluded item, or one
// for an item already written, is counted and dropped.
func (r *runner) answer(in inbound) {
	s := r.window[in.ord]
	if s == nil || s.oc != nil {
		r.sum.DuplicateReplies++
		return
	}
	if s.sends == 1 && !s.lastSent.IsZero() {
		r.maxLatency = max(r.maxLatency, in.at.Sub(s.lastSent))
	}
	r.answeredSeq = max(r.answeredSeq, s.sentSeq)
	r.conclude(s, parseReply(in.data, r.cancelMark))
}

// conclude records an item's outcome; flush writes it once every earlier item is written.
func (r *runner) conclude(s *slot, oc *outcome) {
	s.oc = oc
	if s.e.Valid() {
		r.outstanding--
		r.bytes -= int64(len(s.e.Body))
	}
	s.e.Body = nil
	switch oc.status {
	case StatusSuccess:
		r.progress.Succeeded++
	case StatusFailed:
		r.progress.Failed++
	case StatusInvalid:
		r.progress.Invalid++
	case StatusCancelled:
		r.progress.Cancelled++
	}
}

// flush writes every concluded item at the head of the window, in input order.
func (r *runner) flush() error {
	for {
		s := r.window[r.head]
		if s == nil || s.oc == nil {
			return nil
		}
		if err := r.out.write(s.e.line(s.runID, s.oc), s.oc.status); err != nil {
			return err
		}
		r.sum.add(s.oc)
		delete(r.window, r.head)
		r.head++
	}
}

// resend publishes again the items whose reply is overdue. An item sent before one that was
// answered has been overtaken: its reply, not the pipeline, is what is missing, so it is sent
// again after ResendAfter. An item nobody overtook (the last ones of a batch, or a stalled
// pipeline) is sent again only after four times the larger of ResendAfter and 3× the slowest
// answer seen. Each re-send of an item doubles its wait (up to 16×).
func (r *runner) resend(now time.Time) {
	slow := 4 * max(r.cfg.ResendAfter, 3*r.maxLatency)
	for _, s := range r.window {
		if s.oc != nil || s.publishing || s.lastSent.IsZero() {
			continue
		}
		if !r.cancelAt.IsZero() {
			if now.Sub(s.lastSent) >= cancelledResend {
				r.send(s)
			}
			continue
		}
		backoff := time.Duration(min(1<<(s.sends-1), maxResendBackoff))
		waited := now.Sub(s.lastSent)
		if waited >= r.cfg.ResendAfter*backoff && r.answeredSeq > s.sentSeq || waited >= slow*backoff {
			r.send(s)
		}
	}
}

// setCancelled switches the run to a cancelled batch: every item still unanswered is published
// again with Sys1-Deadline at the cancel time, so the worker answers a finished one from its
// stored outcome and expires any other without calling the provider; those are reported
// cancelled.
func (r *runner) setCancelled(at time.Time) {
	if !r.cancelAt.IsZero() {
		return
	}
	r.cancelAt = at
	r.cancelMark = at.UTC().Format(time.RFC3339Nano)
	r.cfg.Warn(fmt.Sprintf("batch %s was cancelled at %s ('sys1 batch cancel'): finished items keep their results, the others are reported cancelled", r.cfg.BatchID, r.cancelMark))
	for _, s := range r.window {
		if s.oc != nil || s.sends == 0 {
			continue
		}
		if s.publishing {
			s.resendNow = true
		} else {
			r.send(s)
		}
	}
}

func (r *runner) pollCancel(ctx context.Context, found chan<- time.Time) {
	t := time.NewTicker(r.cfg.CancelPoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		at, ok, err := ReadCancelMarker(ctx, r.nc, r.cfg.RunsBucket, r.cfg.BatchID)
		if err != nil {
			if ctx.Err() == nil {
				r.cfg.Warn(fmt.Sprintf("cannot read the batch's cancel marker (%v); will try again", err))
			}
			continue
		}
		if ok {
			found <- at
			return
		}
	}
}

func (r *runner) report(final bool) {
	if r.cfg.Progress == nil {
		return
	}
	p := r.progress
	p.Outstanding = r.outstanding
	p.Elapsed = time.Since(r.start)
	p.Final = final
	r.cfg.Progress(p)
}

// confirmSubscribed waits for the server to take the inbox subscription and reports a
// refusal: a connection that may not read its inbox would publish the whole batch and wait
// for replies that cannot reach it.
func (r *runner) confirmSubscribed() error {
	if err := r.nc.FlushTimeout(10 * time.Second); err != nil {
		return fmt.Errorf("subscribe to the reply inbox: %w", err)
	}
	if err := r.nc.LastError(); errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), r.inbox) {
		return fmt.Errorf("%w: this connection may not subscribe to its reply inbox %s.*, so no reply could reach it and nothing was published; "+
			"use an inbox prefix it may read (SYS1_NATS_INBOX_PREFIX=_INBOX.<user>; unset, sys1 batch uses _INBOX.<caller>: is --caller this NATS user?)", nats.ErrPermissionViolation, r.inbox)
	}
	return nil
}
