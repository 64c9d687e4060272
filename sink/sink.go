// Package sink drains run records from the SYS1_RUNS stream into ClickHouse, losslessly.
//
// The delivery guarantee is at least once into ClickHouse, exactly once under FINAL:
//
//   - A durable pull consumer fetches a batch: up to BatchSize records or what arrives within
//     BatchAge, whichever comes first. One stage fetches and decodes while the other inserts,
//     so at most three batches are held (being inserted, queued, being fetched); each is kept
//     alive with InProgress from the moment it is fetched.
//   - The batch is inserted with one PrepareBatch/Send per table. Its insert_deduplication_token
//     is derived from the batch's stream sequences and message timestamps, so an insert
//     retried after an ambiguous failure (timeout, connection cut after the server committed)
//     is dropped by ClickHouse.
//   - Only after the insert returns success are the messages acked. A crash before the ack
//     redelivers them; if the redelivered batch is composed differently the token differs, and
//     the runs table (ReplacingMergeTree ordered by run_id) still folds the copies into one row
//     under FINAL.
//   - ClickHouse down or slow: the insert is retried with capped exponential backoff for as
//     long as it takes, the messages stay unacked in JetStream, and InProgress is sent every
//     AckWait/3 so JetStream does not redeliver them to another sink replica meanwhile. New
//     records wait in the stream; Stats reports the lag. When ClickHouse returns, the backlog
//     drains at full batch size.
//   - A record that can never be a row (not JSON, not a run record, a time ClickHouse cannot
//     store) goes to the runs_dead_letter table in the same flush, is counted and logged
//     (subject and sequence only, never content), and is acked like the rest. So does a row
//     ClickHouse itself rejects as data (a constraint, say): the batch is halved until the
//     rejected rows are isolated, so one bad record cannot stall the stream.
//
// Acks: every message but the last is acked asynchronously, the last with a synchronous
// (double) ack. JetStream processes one consumer's acks in order, so the confirmed last ack
// means the batch is acknowledged, at the cost of one round trip per batch instead of one per
// record. A lost ack only causes a redelivery, which the deduplication above absorbs.
//
// Labels take the same road in a second lane of the same Sink: consumer sys1-sink-labels on
// SYS1_LABELS, filtered to the checked labels (sys1.labels.*.accepted and .rejected). Accepted
// labels become rows of <db>.labels; rejected ones, and anything that cannot be a label row,
// go to the dead-letter table with their reason. A label lane that cannot be set up (a NATS
// user without permission for SYS1_LABELS, say) is retried in the background and never holds
// up the run records.
package sink

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/sys1hq/sys1/contract/wire"
	"github.com/sys1hq/sys1/worker/startup"
	"github.com/sys1hq/sys1/worker/topology"
)

// Sink drains SYS1_RUNS (and the checked labels on SYS1_LABELS) into ClickHouse. Create it
// with New and run it with Run.
type Sink struct {
	js   jetstream.JetStream
	conn driver.Conn
	topo topology.Config
	cfg  Config
	log  zerolog.Logger

	insertRuns, insertDead, insertLabels string

	// runs and labels are the two lanes: a stream and consumer each, drained the same way.
	runs, labels *lane

	// hooks for tests: called after a batch's insert succeeded and before it is acked.
	afterInsert func()

	// obs are the histograms and the tracer (metrics.go).
	obs *observers
}

// lane is one stream drained into one table: its consumer, how its messages become rows and
// dead letters, and its counters.
type lane struct {
	name     string // "runs" or "labels", in logs
	stream   string
	consumer string
	// ensure creates or updates the stream and the consumer.
	ensure  func(ctx context.Context) (jetstream.Consumer, error)
	prepare func(msgs []jetstream.Msg) prepared
	// insertRows is the rows' INSERT; rowsScope, deadScope and rejectedScope tell the
	// deduplication tokens of its three kinds of insert apart.
	insertRows                          string
	rowsScope, deadScope, rejectedScope string

	received, inserted, deadLettered, rejected, batches atomic.Uint64
	insertFailures, ackFailures                         atomic.Uint64
	running                                             atomic.Bool

	mu         sync.Mutex
	pending    uint64
	ackPending uint64
	lagAt      time.Time
	lastInsert time.Time
	lastError  string
	retrying   bool
}

// Stats is a snapshot of the sink's counters and lag, for logs and /metrics.
type Stats struct {
	Received       uint64 // messages taken from SYS1_RUNS (redeliveries included)
	Inserted       uint64 // rows sent to <db>.runs by successful inserts
	DeadLettered   uint64 // records parked in <db>.runs_dead_letter
	Batches        uint64 // successful flushes
	InsertFailures uint64 // failed insert attempts (each retried)
	AckFailures    uint64 // batches whose acks failed (they will be redelivered)
	// Pending (not yet delivered) and AckPending (delivered, not yet acked) are the sink
	// consumer's lag as of LagAt; the backlog is their sum.
	Pending, AckPending uint64
	LagAt               time.Time
	LastInsert          time.Time
	// Retrying is true while an insert is failing; LastError is the last failure's text.
	Retrying  bool
	LastError string

	// Labels are the label lane's figures (SYS1_LABELS into <db>.labels).
	Labels LabelStats
}

// LabelStats is the label lane's part of Stats.
type LabelStats struct {
	// Running is true once SYS1_LABELS and the sink's label consumer are set up.
	Running        bool
	Received       uint64 // checked labels taken from SYS1_LABELS (redeliveries included)
	Inserted       uint64 // rows sent to <db>.labels by successful inserts
	Rejected       uint64 // labels the workers refused, parked with their reason
	DeadLettered   uint64 // messages that could not become a label row (rejected ones included)
	Batches        uint64
	InsertFailures uint64
	AckFailures    uint64
	Pending        uint64
	AckPending     uint64
	LagAt          time.Time
	LastInsert     time.Time
	Retrying       bool
	LastError      string
}

// Deps are the sink's collaborators.
type Deps struct {
	// JS reads the run records and labels; ClickHouse must reach a database migrated with
	// Migrate. Both are required.
	JS         jetstream.JetStream
	ClickHouse driver.Conn
	// Topology names the streams and the sink's consumers (topology.Default() unless the
	// deployment renamed them).
	Topology topology.Config
	Log      zerolog.Logger
}

// New checks the configuration and returns a Sink; it does no I/O.
func New(cfg Config, deps Deps) (*Sink, error) {
	js, conn, topo, logger := deps.JS, deps.ClickHouse, deps.Topology, deps.Log
	if js == nil || conn == nil {
		return nil, errors.New("sink: a JetStream context and a ClickHouse connection are required")
	}
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("sink: %w", err)
	}
	if errs := topo.Validate(); len(errs) > 0 {
		return nil, fmt.Errorf("sink: %w", errors.Join(errs...))
	}
	db := "`" + cfg.Database + "`"
	s := &Sink{
		js: js, conn: conn, topo: topo, cfg: cfg, log: logger,
		insertRuns:   "INSERT INTO " + db + ".runs (" + strings.Join(runColumns, ", ") + ")",
		insertDead:   "INSERT INTO " + db + ".runs_dead_letter (" + strings.Join(deadLetterColumns, ", ") + ")",
		insertLabels: "INSERT INTO " + db + ".labels (" + strings.Join(labelColumns, ", ") + ")",
		obs:          newObservers(),
	}
	s.runs = &lane{
		name: "runs", stream: topo.RunsStream, consumer: topo.SinkConsumer,
		insertRows: s.insertRuns, rowsScope: "runs", deadScope: "runs_dead_letter", rejectedScope: "runs_dead_letter/rejected",
		ensure: func(ctx context.Context) (jetstream.Consumer, error) {
			if err := topology.EnsureRunsStream(ctx, js, topo, topology.WithLogger(logger)); err != nil {
				return nil, err
			}
			return topology.EnsureSinkConsumer(ctx, js, topo, cfg.AckWait, cfg.MaxAckPending)
		},
	}
	s.runs.prepare = s.prepare
	s.labels = &lane{
		name: "labels", stream: topo.LabelsStream, consumer: topo.SinkLabelsConsumer,
		insertRows: s.insertLabels, rowsScope: "labels", deadScope: "labels/runs_dead_letter", rejectedScope: "labels/runs_dead_letter/rejected",
		ensure: func(ctx context.Context) (jetstream.Consumer, error) {
			if err := topology.EnsureLabelsStream(ctx, js, topo, topology.WithLogger(logger)); err != nil {
				return nil, err
			}
			return topology.EnsureSinkLabelsConsumer(ctx, js, topo, cfg.AckWait, cfg.MaxAckPending)
		},
	}
	s.labels.prepare = s.prepareLabels
	return s, nil
}

// Ready reports whether the sink drains SYS1_RUNS: its consumer is set up (Run waits for
// JetStream until it is).
func (s *Sink) Ready() bool { return s.runs.running.Load() }

// Stats returns a snapshot of the counters and the last measured lag.
func (s *Sink) Stats() Stats {
	r, l := s.runs, s.labels
	r.mu.Lock()
	st := Stats{
		Received: r.received.Load(), Inserted: r.inserted.Load(), DeadLettered: r.deadLettered.Load(),
		Batches: r.batches.Load(), InsertFailures: r.insertFailures.Load(), AckFailures: r.ackFailures.Load(),
		Pending: r.pending, AckPending: r.ackPending, LagAt: r.lagAt, LastInsert: r.lastInsert,
		Retrying: r.retrying, LastError: r.lastError,
	}
	r.mu.Unlock()
	l.mu.Lock()
	st.Labels = LabelStats{
		Running: l.running.Load(), Received: l.received.Load(), Inserted: l.inserted.Load(), Rejected: l.rejected.Load(),
		DeadLettered: l.deadLettered.Load(), Batches: l.batches.Load(), InsertFailures: l.insertFailures.Load(),
		AckFailures: l.ackFailures.Load(), Pending: l.pending, AckPending: l.ackPending, LagAt: l.lagAt,
		LastInsert: l.lastInsert, Retrying: l.retrying, LastError: l.lastError,
	}
	l.mu.Unlock()
	return st
}

// Run ensures SYS1_RUNS and the sink consumer exist, then drains the stream until ctx is
// cancelled; beside it, the label lane drains the checked labels of SYS1_LABELS (set up in the
// background, retried until it works). On cancellation the batches in hand are inserted and
// acked if that succeeds within ShutdownTimeout, otherwise nak'ed for prompt redelivery; then
// Run returns nil. It returns an error only when SYS1_RUNS or its consumer cannot be set up.
func (s *Sink) Run(ctx context.Context) error {
	// A sink started while NATS fails over (a stream electing a leader, a node down) waits
	// for it, not ready meanwhile; only a permanent error (a permission refused) stops it.
	var cons jetstream.Consumer
	setUp := startup.Retry{What: "the sink's consumer on " + s.topo.RunsStream, Log: s.log, Min: s.cfg.RetryMin, Max: s.cfg.RetryMax, LastError: s.js.Conn().LastError}
	err := setUp.Do(ctx, func(ctx context.Context) error {
		var err error
		cons, err = s.runs.ensure(ctx)
		return err
	})
	if err != nil {
		return fmt.Errorf("sink: %w", err)
	}
	s.runs.running.Store(true)
	s.log.Info().Str("stream", s.topo.RunsStream).Str("consumer", s.topo.SinkConsumer).
		Str("labels_stream", s.topo.LabelsStream).Str("labels_consumer", s.topo.SinkLabelsConsumer).
		Str("database", s.cfg.Database).Str("cluster", s.cfg.Cluster).Str("record_state", string(s.cfg.RecordState)).
		Int("batch_size", s.cfg.BatchSize).Dur("batch_age", s.cfg.BatchAge).Msg("sink started")

	var wg sync.WaitGroup
	wg.Go(func() { s.drain(ctx, s.runs, cons) })
	wg.Go(func() {
		cons, ok := s.setUp(ctx, s.labels)
		if ok {
			s.drain(ctx, s.labels, cons)
		}
	})
	wg.Wait()
	s.logStats("sink stopped")
	return nil
}

// setUp ensures a lane's stream and consumer, retrying with backoff until it works or ctx
// ends. Every failure is logged at error level: a sink whose labels never arrive says why.
func (s *Sink) setUp(ctx context.Context, l *lane) (jetstream.Consumer, bool) {
	backoff := s.cfg.RetryMin
	for {
		cons, err := l.ensure(ctx)
		if err == nil {
			l.running.Store(true)
			return cons, true
		}
		if ctx.Err() != nil {
			return nil, false
		}
		s.log.Error().Err(err).Str("stream", l.stream).Str("consumer", l.consumer).Dur("retry_in", backoff).
			Msg("sink: cannot set up the " + l.name + " lane (may this NATS user use it?); run records are not held up; retrying")
		if !sleep(ctx, backoff) {
			return nil, false
		}
		backoff = min(backoff*2, s.cfg.RetryMax)
	}
}

// drain runs one lane until ctx is cancelled. Two stages, so decoding the next batch overlaps
// inserting this one: the fetcher pulls and prepares batches, the flusher (this goroutine)
// inserts and acks them. The channel holds one batch; every batch the fetcher took is flushed
// or nak'ed, even on shutdown.
func (s *Sink) drain(ctx context.Context, l *lane, cons jetstream.Consumer) {
	var wg sync.WaitGroup
	wg.Go(func() { s.watchLag(ctx, l, cons) })
	work := make(chan *pending, 1)
	wg.Go(func() { defer close(work); s.fetchLoop(ctx, l, cons, work) })
	for p := range work {
		s.flush(ctx, l, p)
	}
	wg.Wait()
}

// pending is a fetched batch on its way to ClickHouse, kept alive with InProgress until it
// is acked or nak'ed.
type pending struct {
	msgs          []jetstream.Msg
	prepared      prepared
	stopKeepAlive func()
}

// fetchLoop pulls and prepares batches until ctx is cancelled.
func (s *Sink) fetchLoop(ctx context.Context, l *lane, cons jetstream.Consumer, work chan<- *pending) {
	backoff := s.cfg.RetryMin
	var goneSince time.Time // when the consumer was first found missing (recreateIfGone)
	for ctx.Err() == nil {
		msgs, err := s.fetch(l, cons)
		if len(msgs) > 0 {
			// Kept alive from now on: the batch may wait behind a flush that is retrying.
			p := &pending{msgs: msgs, stopKeepAlive: s.keepAlive(msgs)}
			p.prepared = l.prepare(msgs)
			work <- p // never dropped: the flusher drains the channel until it is closed
		}
		if err != nil && ctx.Err() == nil {
			// NATS trouble: the messages are safe in the stream; wait and pull again.
			s.log.Warn().Err(err).Dur("retry_in", backoff).Msg("sink: fetch from " + l.stream + " failed")
			if !sleep(ctx, backoff) {
				return
			}
			if c, ok := s.recreateIfGone(ctx, l, err, &goneSince); ok {
				cons = c
			}
			backoff = min(backoff*2, s.cfg.RetryMax)
			continue
		}
		backoff = s.cfg.RetryMin
		goneSince = time.Time{}
	}
}

// recreateIfGone recreates a lane's consumer, and its stream, when a failed pull was because
// they no longer exist (deleted by someone, or NATS came back without its data) rather than
// because NATS is unreachable, and have been missing for topology.RecreateSettle (*goneSince
// tracks that). A recreated consumer starts again from the beginning of the stream, and the
// copies it re-inserts fold away under FINAL.
func (s *Sink) recreateIfGone(ctx context.Context, l *lane, fetchErr error, goneSince *time.Time) (jetstream.Consumer, bool) {
	gone := errors.Is(fetchErr, jetstream.ErrConsumerDeleted) || errors.Is(fetchErr, jetstream.ErrConsumerNotFound) ||
		topology.ConsumerGone(ctx, s.js, l.stream, l.consumer)
	if !gone {
		return nil, false
	}
	if goneSince.IsZero() {
		*goneSince = time.Now()
		s.log.Warn().Str("stream", l.stream).Dur("recreate_in", topology.RecreateSettle).Msg("sink: the consumer (or its stream) is gone; recreating it")
	}
	if time.Since(*goneSince) < topology.RecreateSettle {
		return nil, false
	}
	c, err := l.ensure(ctx)
	if err != nil {
		s.log.Warn().Err(err).Str("stream", l.stream).Msg("sink: the consumer is gone and could not be recreated; trying again")
		return nil, false
	}
	*goneSince = time.Time{}
	s.log.Warn().Str("stream", l.stream).Str("consumer", l.consumer).Msg("sink: the consumer (or its stream) was gone; recreated it")
	return c, true
}

// fetch pulls one batch: up to BatchSize messages, waiting at most BatchAge. Bounding the pull
// itself (not the time since the first message) keeps exactly one pull request outstanding,
// and bounding it by the server's expiry (FetchMaxWait, not a context) means the client reads
// until the server's "request expired" status, which follows every message sent for the pull:
// no message is delivered to a sink that stopped listening (a context deadline stops the
// client 10% of the wait after the server's expiry, and a record the server sent in that
// window would sit unacknowledged until AckWait). On shutdown the last pull ends within
// BatchAge and what it brought is inserted like any other batch.
func (s *Sink) fetch(l *lane, cons jetstream.Consumer) ([]jetstream.Msg, error) {
	batch, err := cons.Fetch(s.cfg.BatchSize, jetstream.FetchMaxWait(s.cfg.BatchAge))
	if err != nil {
		return nil, fmt.Errorf("pull from %s/%s: %w", l.stream, l.consumer, err)
	}
	msgs := make([]jetstream.Msg, 0, min(s.cfg.BatchSize, 1024))
	for m := range batch.Messages() {
		msgs = append(msgs, m)
	}
	l.received.Add(uint64(len(msgs)))
	if err := batch.Error(); err != nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
		return msgs, fmt.Errorf("pull from %s/%s: %w", l.stream, l.consumer, err)
	}
	return msgs, nil
}

// insertable is a row of a lane's table: its values in the lane's INSERT column order.
type insertable interface{ values() []any }

// prepared is a batch split into insertable rows and dead letters, and how far its insert got
// (each step is done once; a retry resumes where the last attempt failed).
type prepared struct {
	rows   []insertable
	rowSrc []source // the message of each row, should ClickHouse reject the row
	dead   []*deadLetter
	// rejected counts the dead letters that are labels the workers refused (a label lane's).
	refused int

	deadDone, rowsDone, rejectedDone bool
	// rejected are rows ClickHouse refused as data (see insertIsolating), parked as dead letters.
	rejected []*deadLetter
}

// source is what a dead letter needs of a message.
type source struct {
	data       []byte
	subject    string
	runID      string // the record's run id, for log lines about it
	deliveries uint64
	from       origin
	kind       string // its dead-letter kind, should ClickHouse reject the row
}

func (s *Sink) prepare(msgs []jetstream.Msg) prepared {
	p := prepared{rows: make([]insertable, 0, len(msgs))}
	for _, m := range msgs {
		from := origin{stream: s.topo.RunsStream}
		var deliveries uint64
		meta, err := m.Metadata()
		if err == nil {
			from.seq, from.published, deliveries = meta.Sequence.Stream, meta.Timestamp, meta.NumDelivered
			from.stream = meta.Stream
		}
		if err != nil {
			p.dead = append(p.dead, newDeadLetter(m.Data(), from, m.Subject(), deliveries, "no JetStream metadata: "+err.Error(), s.cfg.RecordState))
			continue
		}
		r, err := decodeRecord(m.Data(), from, s.cfg.RecordState)
		if err != nil {
			// Only the error (which names the field, never its content), subject, sequence and
			// the run id the worker put in the record's header (the body may not have one).
			ev := s.log.Error()
			if id := m.Headers().Get(wire.HeaderRunID); id != "" {
				ev = ev.Str("run_id", id)
			}
			ev.Str("subject", m.Subject()).Uint64("runs_seq", from.seq).Int("bytes", len(m.Data())).
				Str("reason", err.Error()).Msg("sink: run record cannot be stored; parking it in the dead-letter table")
			p.dead = append(p.dead, newDeadLetter(m.Data(), from, m.Subject(), deliveries, err.Error(), s.cfg.RecordState))
			continue
		}
		p.rows = append(p.rows, r)
		p.rowSrc = append(p.rowSrc, source{data: m.Data(), subject: m.Subject(), runID: r.runID, deliveries: deliveries, from: from, kind: deadRun})
	}
	p.deadDone = len(p.dead) == 0
	return p
}

// dedupToken identifies a batch by its messages: the same messages inserted again carry the
// same token and ClickHouse drops the repeat. A message is named by its stream sequence and its
// JetStream timestamp, both fixed when it was stored and the same on every redelivery. The
// sequence alone is not enough: a stream deleted and recreated (NATS storage wiped, a changed
// storage type) numbers its messages from 1 again, and a token repeating one still in
// ClickHouse's deduplication window would make it silently drop new records.
func dedupToken(stream, table string, msgs []origin) string {
	h := sha256.New()
	h.Write([]byte(stream + "\x00" + table + "\x00"))
	var b [16]byte
	for _, m := range msgs {
		binary.BigEndian.PutUint64(b[:8], m.seq)
		binary.BigEndian.PutUint64(b[8:], uint64(m.published.UnixNano()))
		h.Write(b[:])
	}
	return "sys1-sink-" + hex.EncodeToString(h.Sum(nil)[:16])
}

// flush inserts a batch, retrying until it succeeds or ctx is cancelled, then acks it (or naks
// it when it could not be inserted before shutdown).
func (s *Sink) flush(ctx context.Context, l *lane, work *pending) {
	defer work.stopKeepAlive()
	msgs, p := work.msgs, &work.prepared
	ctx, span := s.startInsert(ctx, l, msgs)
	defer span.End()
	// In-flight work may finish for ShutdownTimeout after ctx is cancelled.
	grace, cancelGrace := context.WithCancel(context.WithoutCancel(ctx))
	stopAfter := context.AfterFunc(ctx, func() {
		t := time.AfterFunc(s.cfg.ShutdownTimeout, cancelGrace)
		<-grace.Done()
		t.Stop()
	})
	defer func() { stopAfter(); cancelGrace() }()

	backoff := s.cfg.RetryMin
	for attempt := 1; ; attempt++ {
		err := s.timedInsert(grace, l, p)
		if err == nil {
			break
		}
		l.insertFailures.Add(1)
		l.mu.Lock()
		l.retrying, l.lastError = true, err.Error()
		l.mu.Unlock()
		if ctx.Err() != nil {
			s.log.Warn().Err(err).Str("lane", l.name).Int("records", len(msgs)).Msg("sink: shutting down with an uninserted batch; nak'ing it for redelivery")
			s.nakAll(msgs)
			return
		}
		wait := backoff/2 + rand.N(backoff/2+1)
		s.log.Warn().Err(err).Str("lane", l.name).Int("attempt", attempt).Int("records", len(msgs)).Dur("retry_in", wait).
			Msg("sink: insert into ClickHouse failed; the messages stay unacked in " + l.stream + " and will be retried")
		if !sleep(ctx, wait) {
			s.nakAll(msgs)
			return
		}
		backoff = min(backoff*2, s.cfg.RetryMax)
	}

	l.inserted.Add(uint64(len(p.rows) - len(p.rejected)))
	l.deadLettered.Add(uint64(len(p.dead) + len(p.rejected)))
	l.rejected.Add(uint64(p.refused))
	l.batches.Add(1)
	s.observeInserted(ctx, l, msgs, p)
	l.mu.Lock()
	if l.retrying {
		s.log.Info().Str("lane", l.name).Msg("sink: ClickHouse inserts succeed again")
	}
	l.retrying, l.lastInsert = false, time.Now()
	l.mu.Unlock()
	if s.afterInsert != nil {
		s.afterInsert()
	}
	if err := s.ackAll(grace, msgs); err != nil {
		l.ackFailures.Add(1)
		s.log.Warn().Err(err).Str("lane", l.name).Int("records", len(msgs)).Msg("sink: ack failed after a successful insert; the messages will be redelivered and deduplicated")
	}
}

// insertOnce makes one attempt at the batch: its dead letters, its rows, then the rows
// ClickHouse rejected as data. A step that succeeded is not repeated by the next attempt.
func (s *Sink) insertOnce(ctx context.Context, l *lane, p *prepared) error {
	if !p.deadDone {
		if err := s.insertDeadLetters(ctx, l, p.dead, l.deadScope); err != nil {
			return fmt.Errorf("insert %d dead letters: %w", len(p.dead), err)
		}
		p.deadDone = true
	}
	if !p.rowsDone {
		rejected, err := s.insertIsolating(ctx, l, p.rows, p.rowSrc)
		if err != nil {
			return fmt.Errorf("insert %d %s: %w", len(p.rows), l.name, err)
		}
		p.rowsDone, p.rejected, p.rejectedDone = true, rejected, len(rejected) == 0
	}
	if !p.rejectedDone {
		if err := s.insertDeadLetters(ctx, l, p.rejected, l.rejectedScope); err != nil {
			return fmt.Errorf("insert %d rows ClickHouse rejected as dead letters: %w", len(p.rejected), err)
		}
		p.rejectedDone = true
	}
	return nil
}

func (s *Sink) insertDeadLetters(ctx context.Context, l *lane, dead []*deadLetter, tokenScope string) error {
	vals := make([][]any, len(dead))
	from := make([]origin, len(dead))
	for i, d := range dead {
		vals[i], from[i] = d.values(), d.from
	}
	return s.insert(ctx, s.insertDead, dedupToken(l.stream, tokenScope, from), vals)
}

// insertIsolating inserts rows. When ClickHouse rejects the data itself (a constraint, a
// value it cannot store; not a connection or capacity problem), it halves the batch until it
// finds the rows it rejects and returns them as dead letters, so one bad record cannot stall
// the stream. The halving is deterministic, so a retry sends the same sub-batches with the
// same deduplication tokens.
func (s *Sink) insertIsolating(ctx context.Context, l *lane, rows []insertable, src []source) ([]*deadLetter, error) {
	if len(rows) == 0 {
		return nil, nil
	}
	vals := make([][]any, len(rows))
	from := make([]origin, len(rows))
	for i, r := range rows {
		vals[i], from[i] = r.values(), src[i].from
	}
	err := s.insert(ctx, l.insertRows, dedupToken(l.stream, l.rowsScope, from), vals)
	if err == nil || !rejectedAsData(err) {
		return nil, err
	}
	if len(rows) == 1 {
		reason := "ClickHouse rejected the record: " + err.Error()
		s.log.Error().Str("run_id", src[0].runID).Str("subject", src[0].subject).Str("stream", src[0].from.stream).Uint64("runs_seq", src[0].from.seq).Str("reason", reason).
			Msg("sink: " + l.name + " message cannot be stored; parking it in the dead-letter table")
		d := newDeadLetter(src[0].data, src[0].from, src[0].subject, src[0].deliveries, reason, s.cfg.RecordState)
		d.kind = src[0].kind
		return []*deadLetter{d}, nil
	}
	mid := len(rows) / 2
	left, err := s.insertIsolating(ctx, l, rows[:mid], src[:mid])
	if err != nil {
		return nil, err
	}
	right, err := s.insertIsolating(ctx, l, rows[mid:], src[mid:])
	if err != nil {
		return nil, err
	}
	return append(left, right...), nil
}

// rejectedAsData reports whether ClickHouse refused an insert because of the rows' content,
// which no retry can fix. Everything else (network, timeouts, memory, missing tables before a
// migration) is retried.
func rejectedAsData(err error) bool {
	var ex *clickhouse.Exception
	if !errors.As(err, &ex) {
		return false
	}
	switch ex.Code {
	case 6, // CANNOT_PARSE_TEXT
		27,  // CANNOT_PARSE_INPUT_ASSERTION_FAILED
		38,  // CANNOT_PARSE_DATE
		41,  // CANNOT_PARSE_DATETIME
		53,  // TYPE_MISMATCH
		69,  // ARGUMENT_OUT_OF_BOUND
		70,  // CANNOT_CONVERT_TYPE
		72,  // CANNOT_PARSE_NUMBER
		117, // INCORRECT_DATA
		131, // TOO_LARGE_STRING_SIZE
		190, // SIZES_OF_ARRAYS_DONT_MATCH
		321, // VALUE_IS_OUT_OF_RANGE_OF_DATA_TYPE
		469: // VIOLATED_CONSTRAINT
		return true
	}
	return false
}

// insert sends rows with one PrepareBatch/Send under a deduplication token.
func (s *Sink) insert(ctx context.Context, query, token string, rows [][]any) error {
	ictx, cancel := context.WithTimeout(ctx, s.cfg.InsertTimeout)
	defer cancel()
	settings := clickhouse.Settings{
		"insert_deduplicate":         1,
		"insert_deduplication_token": token,
		// Without this a deduplicated retry would still be aggregated by the views.
		"deduplicate_blocks_in_dependent_materialized_views": 1,
	}
	if s.cfg.Cluster != "" {
		// Into a Distributed table: return only once every shard has its rows (by default
		// they would be queued on this node and sent later), so an ack means stored.
		settings["insert_distributed_sync"] = 1
	}
	ictx = clickhouse.Context(ictx, clickhouse.WithSettings(settings))
	batch, err := s.conn.PrepareBatch(ictx, query)
	if err != nil {
		return fmt.Errorf("prepare: %w", err)
	}
	for _, r := range rows {
		if err := batch.Append(r...); err != nil {
			_ = batch.Abort()
			return fmt.Errorf("append: %w", err)
		}
	}
	if err := batch.Send(); err != nil {
		return fmt.Errorf("send: %w", err)
	}
	return nil
}

// keepAlive sends InProgress for every message every AckWait/3 until stopped, so a batch held
// while ClickHouse is retried is not redelivered to another sink replica.
func (s *Sink) keepAlive(msgs []jetstream.Msg) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(s.cfg.AckWait / 3)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				for _, m := range msgs {
					if err := m.InProgress(); err != nil {
						s.log.Debug().Err(err).Msg("sink: InProgress failed")
						break
					}
				}
			}
		}
	}()
	return func() { close(done); wg.Wait() }
}

func (s *Sink) ackAll(ctx context.Context, msgs []jetstream.Msg) error {
	var firstErr error
	for _, m := range msgs[:len(msgs)-1] {
		if err := m.Ack(); err != nil && firstErr == nil {
			firstErr = err
		}
	}
	if err := msgs[len(msgs)-1].DoubleAck(ctx); err != nil && firstErr == nil {
		firstErr = err
	}
	return firstErr
}

func (s *Sink) nakAll(msgs []jetstream.Msg) {
	for _, m := range msgs {
		if err := m.Nak(); err != nil {
			// Not fatal: unacked messages are redelivered after AckWait anyway.
			s.log.Debug().Err(err).Msg("sink: nak failed")
			return
		}
	}
}

// watchLag reads a lane's consumer backlog every StatsInterval; the runs lane also logs the
// counters (of both lanes).
func (s *Sink) watchLag(ctx context.Context, l *lane, cons jetstream.Consumer) {
	t := time.NewTicker(s.cfg.StatsInterval)
	defer t.Stop()
	for {
		s.updateLag(ctx, l, cons)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if l == s.runs {
				s.logStats("sink stats")
			}
		}
	}
}

func (s *Sink) updateLag(ctx context.Context, l *lane, cons jetstream.Consumer) {
	ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	info, err := cons.Info(ictx)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn().Err(err).Str("stream", l.stream).Msg("sink: cannot read consumer lag")
		}
		return
	}
	l.mu.Lock()
	l.pending, l.ackPending, l.lagAt = info.NumPending, uint64(info.NumAckPending), time.Now()
	l.mu.Unlock()
}

func (s *Sink) logStats(msg string) {
	st := s.Stats()
	ev := s.log.Info()
	if st.Retrying || st.Labels.Retrying {
		ev = s.log.Warn().Str("last_error", st.LastError).Str("labels_last_error", st.Labels.LastError)
	}
	ev.Uint64("received", st.Received).Uint64("inserted", st.Inserted).Uint64("dead_lettered", st.DeadLettered).
		Uint64("batches", st.Batches).Uint64("insert_failures", st.InsertFailures).Uint64("ack_failures", st.AckFailures).
		Uint64("lag_pending", st.Pending).Uint64("lag_ack_pending", st.AckPending).Bool("retrying", st.Retrying).
		Bool("labels_running", st.Labels.Running).Uint64("labels_inserted", st.Labels.Inserted).
		Uint64("labels_rejected", st.Labels.Rejected).Uint64("labels_dead_lettered", st.Labels.DeadLettered).
		Uint64("labels_lag_pending", st.Labels.Pending).Uint64("labels_lag_ack_pending", st.Labels.AckPending).
		Bool("labels_retrying", st.Labels.Retrying).Msg(msg)
}

// sleep waits d or until ctx is done; it reports whether the full wait elapsed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
