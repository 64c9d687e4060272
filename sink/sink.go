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

	"github.com/sys1hq/sys1/worker/topology"
)

// Sink drains SYS1_RUNS into ClickHouse. Create it with New and run it with Run.
type Sink struct {
	js   jetstream.JetStream
	conn driver.Conn
	topo topology.Config
	cfg  Config
	log  zerolog.Logger

	insertRuns, insertDead string

	received, inserted, deadLettered, batches atomic.Uint64
	insertFailures, ackFailures               atomic.Uint64

	mu         sync.Mutex
	pending    uint64
	ackPending uint64
	lagAt      time.Time
	lastInsert time.Time
	lastError  string
	retrying   bool

	// hooks for tests: called after a batch's insert succeeded and before it is acked.
	afterInsert func()
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
}

// New checks the configuration and returns a Sink; it does no I/O. conn must reach a
// database migrated with Migrate.
func New(js jetstream.JetStream, conn driver.Conn, topo topology.Config, cfg Config, logger zerolog.Logger) (*Sink, error) {
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
	return &Sink{
		js: js, conn: conn, topo: topo, cfg: cfg, log: logger,
		insertRuns: "INSERT INTO " + db + ".runs (" + strings.Join(runColumns, ", ") + ")",
		insertDead: "INSERT INTO " + db + ".runs_dead_letter (" + strings.Join(deadLetterColumns, ", ") + ")",
	}, nil
}

// Stats returns a snapshot of the counters and the last measured lag.
func (s *Sink) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return Stats{
		Received: s.received.Load(), Inserted: s.inserted.Load(), DeadLettered: s.deadLettered.Load(),
		Batches: s.batches.Load(), InsertFailures: s.insertFailures.Load(), AckFailures: s.ackFailures.Load(),
		Pending: s.pending, AckPending: s.ackPending, LagAt: s.lagAt, LastInsert: s.lastInsert,
		Retrying: s.retrying, LastError: s.lastError,
	}
}

// Run ensures SYS1_RUNS and the sink consumer exist, then drains the stream until ctx is
// cancelled. On cancellation the batches in hand are inserted and acked if that succeeds
// within ShutdownTimeout, otherwise nak'ed for prompt redelivery; then Run returns nil. It returns an
// error only when the stream or consumer cannot be set up.
func (s *Sink) Run(ctx context.Context) error {
	if err := topology.EnsureRunsStream(ctx, s.js, s.topo, topology.WithLogger(s.log)); err != nil {
		return fmt.Errorf("sink: %w", err)
	}
	cons, err := topology.EnsureSinkConsumer(ctx, s.js, s.topo, s.cfg.AckWait, s.cfg.MaxAckPending)
	if err != nil {
		return fmt.Errorf("sink: %w", err)
	}
	s.log.Info().Str("stream", s.topo.RunsStream).Str("consumer", s.topo.SinkConsumer).
		Str("database", s.cfg.Database).Str("record_state", string(s.cfg.RecordState)).
		Int("batch_size", s.cfg.BatchSize).Dur("batch_age", s.cfg.BatchAge).Msg("sink started")

	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); s.watchLag(ctx, cons) }()
	// Two stages, so decoding the next batch overlaps inserting this one: the fetcher pulls and
	// prepares batches, the flusher (this goroutine) inserts and acks them. The channel holds
	// one batch; every batch the fetcher took is flushed or nak'ed, even on shutdown.
	work := make(chan *pending, 1)
	go func() { defer wg.Done(); defer close(work); s.fetchLoop(ctx, cons, work) }()
	for p := range work {
		s.flush(ctx, p)
	}
	wg.Wait()
	s.logStats("sink stopped")
	return nil
}

// pending is a fetched batch on its way to ClickHouse, kept alive with InProgress until it
// is acked or nak'ed.
type pending struct {
	msgs          []jetstream.Msg
	prepared      prepared
	stopKeepAlive func()
}

// fetchLoop pulls and prepares batches until ctx is cancelled.
func (s *Sink) fetchLoop(ctx context.Context, cons jetstream.Consumer, work chan<- *pending) {
	backoff := s.cfg.RetryMin
	var goneSince time.Time // when the consumer was first found missing (recreateIfGone)
	for ctx.Err() == nil {
		msgs, err := s.fetch(ctx, cons)
		if len(msgs) > 0 {
			// Kept alive from now on: the batch may wait behind a flush that is retrying.
			p := &pending{msgs: msgs, stopKeepAlive: s.keepAlive(msgs)}
			p.prepared = s.prepare(msgs)
			work <- p // never dropped: the flusher drains the channel until it is closed
		}
		if err != nil && ctx.Err() == nil {
			// NATS trouble: the messages are safe in the stream; wait and pull again.
			s.log.Warn().Err(err).Dur("retry_in", backoff).Msg("sink: fetch from SYS1_RUNS failed")
			if !sleep(ctx, backoff) {
				return
			}
			if c, ok := s.recreateIfGone(ctx, err, &goneSince); ok {
				cons = c
			}
			backoff = min(backoff*2, s.cfg.RetryMax)
			continue
		}
		backoff = s.cfg.RetryMin
		goneSince = time.Time{}
	}
}

// recreateIfGone recreates the consumer, and SYS1_RUNS under it, when a failed pull was
// because they no longer exist (deleted by someone, or NATS came back without its data) rather
// than because NATS is unreachable, and have been missing for topology.RecreateSettle
// (*goneSince tracks that). A recreated consumer starts again from the beginning of the
// stream, and the copies it re-inserts fold away under FINAL.
func (s *Sink) recreateIfGone(ctx context.Context, fetchErr error, goneSince *time.Time) (jetstream.Consumer, bool) {
	gone := errors.Is(fetchErr, jetstream.ErrConsumerDeleted) || errors.Is(fetchErr, jetstream.ErrConsumerNotFound) ||
		topology.ConsumerGone(ctx, s.js, s.topo.RunsStream, s.topo.SinkConsumer)
	if !gone {
		return nil, false
	}
	if goneSince.IsZero() {
		*goneSince = time.Now()
		s.log.Warn().Dur("recreate_in", topology.RecreateSettle).Msg("sink: the consumer (or its stream) is gone; recreating it")
	}
	if time.Since(*goneSince) < topology.RecreateSettle {
		return nil, false
	}
	if err := topology.EnsureRunsStream(ctx, s.js, s.topo, topology.WithLogger(s.log)); err != nil {
		s.log.Warn().Err(err).Msg("sink: the consumer is gone and SYS1_RUNS could not be recreated; trying again")
		return nil, false
	}
	c, err := topology.EnsureSinkConsumer(ctx, s.js, s.topo, s.cfg.AckWait, s.cfg.MaxAckPending)
	if err != nil {
		s.log.Warn().Err(err).Msg("sink: the consumer is gone and could not be recreated; trying again")
		return nil, false
	}
	*goneSince = time.Time{}
	s.log.Warn().Str("stream", s.topo.RunsStream).Str("consumer", s.topo.SinkConsumer).Msg("sink: the consumer (or its stream) was gone; recreated it")
	return c, true
}

// fetch pulls one batch: up to BatchSize messages, waiting at most BatchAge. Bounding the pull
// itself (not the time since the first message) keeps exactly one pull request outstanding,
// so no message is ever delivered to a sink that stopped listening.
func (s *Sink) fetch(ctx context.Context, cons jetstream.Consumer) ([]jetstream.Msg, error) {
	fctx, cancel := context.WithTimeout(ctx, s.cfg.BatchAge)
	defer cancel()
	batch, err := cons.Fetch(s.cfg.BatchSize, jetstream.FetchContext(fctx))
	if err != nil {
		return nil, fmt.Errorf("pull from %s/%s: %w", s.topo.RunsStream, s.topo.SinkConsumer, err)
	}
	msgs := make([]jetstream.Msg, 0, min(s.cfg.BatchSize, 1024))
	for m := range batch.Messages() {
		msgs = append(msgs, m)
	}
	s.received.Add(uint64(len(msgs)))
	if err := batch.Error(); err != nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
		return msgs, fmt.Errorf("pull from %s/%s: %w", s.topo.RunsStream, s.topo.SinkConsumer, err)
	}
	return msgs, nil
}

// headerRunID is the header the worker sets on every record it publishes (worker.HeaderRunID):
// the record's run id, readable even when its body is not.
const headerRunID = "Sys1-Run-Id"

// prepared is a batch split into insertable rows and dead letters, and how far its insert got
// (each step is done once; a retry resumes where the last attempt failed).
type prepared struct {
	rows   []*row
	rowSrc []source // the message of each row, should ClickHouse reject the row
	dead   []*deadLetter

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
}

func (s *Sink) prepare(msgs []jetstream.Msg) prepared {
	p := prepared{rows: make([]*row, 0, len(msgs))}
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
			if id := m.Headers().Get(headerRunID); id != "" {
				ev = ev.Str("run_id", id)
			}
			ev.Str("subject", m.Subject()).Uint64("runs_seq", from.seq).Int("bytes", len(m.Data())).
				Str("reason", err.Error()).Msg("sink: run record cannot be stored; parking it in the dead-letter table")
			p.dead = append(p.dead, newDeadLetter(m.Data(), from, m.Subject(), deliveries, err.Error(), s.cfg.RecordState))
			continue
		}
		p.rows = append(p.rows, r)
		p.rowSrc = append(p.rowSrc, source{data: m.Data(), subject: m.Subject(), runID: r.runID, deliveries: deliveries, from: from})
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
func (s *Sink) flush(ctx context.Context, work *pending) {
	defer work.stopKeepAlive()
	msgs, p := work.msgs, &work.prepared
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
		err := s.insertOnce(grace, p)
		if err == nil {
			break
		}
		s.insertFailures.Add(1)
		s.mu.Lock()
		s.retrying, s.lastError = true, err.Error()
		s.mu.Unlock()
		if ctx.Err() != nil {
			s.log.Warn().Err(err).Int("records", len(msgs)).Msg("sink: shutting down with an uninserted batch; nak'ing it for redelivery")
			s.nakAll(msgs)
			return
		}
		wait := backoff/2 + rand.N(backoff/2+1)
		s.log.Warn().Err(err).Int("attempt", attempt).Int("records", len(msgs)).Dur("retry_in", wait).
			Msg("sink: insert into ClickHouse failed; records stay unacked in SYS1_RUNS and will be retried")
		if !sleep(ctx, wait) {
			s.nakAll(msgs)
			return
		}
		backoff = min(backoff*2, s.cfg.RetryMax)
	}

	s.inserted.Add(uint64(len(p.rows) - len(p.rejected)))
	s.deadLettered.Add(uint64(len(p.dead) + len(p.rejected)))
	s.batches.Add(1)
	s.mu.Lock()
	if s.retrying {
		s.log.Info().Msg("sink: ClickHouse inserts succeed again")
	}
	s.retrying, s.lastInsert = false, time.Now()
	s.mu.Unlock()
	if s.afterInsert != nil {
		s.afterInsert()
	}
	if err := s.ackAll(grace, msgs); err != nil {
		s.ackFailures.Add(1)
		s.log.Warn().Err(err).Int("records", len(msgs)).Msg("sink: ack failed after a successful insert; the records will be redelivered and deduplicated")
	}
}

// insertOnce makes one attempt at the batch: its dead letters, its rows, then the rows
// ClickHouse rejected as data. A step that succeeded is not repeated by the next attempt.
func (s *Sink) insertOnce(ctx context.Context, p *prepared) error {
	if !p.deadDone {
		if err := s.insertDeadLetters(ctx, p.dead, "runs_dead_letter"); err != nil {
			return fmt.Errorf("insert %d dead letters: %w", len(p.dead), err)
		}
		p.deadDone = true
	}
	if !p.rowsDone {
		rejected, err := s.insertIsolating(ctx, p.rows, p.rowSrc)
		if err != nil {
			return fmt.Errorf("insert %d run records: %w", len(p.rows), err)
		}
		p.rowsDone, p.rejected, p.rejectedDone = true, rejected, len(rejected) == 0
	}
	if !p.rejectedDone {
		if err := s.insertDeadLetters(ctx, p.rejected, "runs_dead_letter/rejected"); err != nil {
			return fmt.Errorf("insert %d rejected records as dead letters: %w", len(p.rejected), err)
		}
		p.rejectedDone = true
	}
	return nil
}

func (s *Sink) insertDeadLetters(ctx context.Context, dead []*deadLetter, tokenScope string) error {
	vals := make([][]any, len(dead))
	from := make([]origin, len(dead))
	for i, d := range dead {
		vals[i], from[i] = d.values(), d.from
	}
	return s.insert(ctx, s.insertDead, dedupToken(s.topo.RunsStream, tokenScope, from), vals)
}

// insertIsolating inserts rows. When ClickHouse rejects the data itself (a constraint, a
// value it cannot store; not a connection or capacity problem), it halves the batch until it
// finds the rows it rejects and returns them as dead letters, so one bad record cannot stall
// the stream. The halving is deterministic, so a retry sends the same sub-batches with the
// same deduplication tokens.
func (s *Sink) insertIsolating(ctx context.Context, rows []*row, src []source) ([]*deadLetter, error) {
	if len(rows) == 0 {
		return nil, nil
	}
	vals := make([][]any, len(rows))
	from := make([]origin, len(rows))
	for i, r := range rows {
		vals[i], from[i] = r.values(), src[i].from
	}
	err := s.insert(ctx, s.insertRuns, dedupToken(s.topo.RunsStream, "runs", from), vals)
	if err == nil || !rejectedAsData(err) {
		return nil, err
	}
	if len(rows) == 1 {
		reason := "ClickHouse rejected the record: " + err.Error()
		s.log.Error().Str("run_id", src[0].runID).Str("subject", src[0].subject).Uint64("runs_seq", src[0].from.seq).Str("reason", reason).
			Msg("sink: run record cannot be stored; parking it in the dead-letter table")
		return []*deadLetter{newDeadLetter(src[0].data, src[0].from, src[0].subject, src[0].deliveries, reason, s.cfg.RecordState)}, nil
	}
	mid := len(rows) / 2
	left, err := s.insertIsolating(ctx, rows[:mid], src[:mid])
	if err != nil {
		return nil, err
	}
	right, err := s.insertIsolating(ctx, rows[mid:], src[mid:])
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
	ictx = clickhouse.Context(ictx, clickhouse.WithSettings(clickhouse.Settings{
		"insert_deduplicate":         1,
		"insert_deduplication_token": token,
		// Without this a deduplicated retry would still be aggregated by the views.
		"deduplicate_blocks_in_dependent_materialized_views": 1,
	}))
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

// watchLag reads the consumer's backlog every StatsInterval and logs the counters.
func (s *Sink) watchLag(ctx context.Context, cons jetstream.Consumer) {
	t := time.NewTicker(s.cfg.StatsInterval)
	defer t.Stop()
	for {
		s.updateLag(ctx, cons)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.logStats("sink stats")
		}
	}
}

func (s *Sink) updateLag(ctx context.Context, cons jetstream.Consumer) {
	ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	info, err := cons.Info(ictx)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn().Err(err).Msg("sink: cannot read consumer lag")
		}
		return
	}
	s.mu.Lock()
	s.pending, s.ackPending, s.lagAt = info.NumPending, uint64(info.NumAckPending), time.Now()
	s.mu.Unlock()
}

func (s *Sink) logStats(msg string) {
	st := s.Stats()
	ev := s.log.Info()
	if st.Retrying {
		ev = s.log.Warn().Str("last_error", st.LastError)
	}
	ev.Uint64("received", st.Received).Uint64("inserted", st.Inserted).Uint64("dead_lettered", st.DeadLettered).
		Uint64("batches", st.Batches).Uint64("insert_failures", st.InsertFailures).Uint64("ack_failures", st.AckFailures).
		Uint64("lag_pending", st.Pending).Uint64("lag_ack_pending", st.AckPending).Bool("retrying", st.Retrying).Msg(msg)
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
