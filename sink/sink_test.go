package sink

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/worker/natsconn/natstest"
	"github.com/sys1hq/sys1/worker/topology"
)

func TestSinkDrainsTenThousandRecordsExactly(t *testing.T) {
	e := newEnv(t, nil)
	const n = 10_000
	recs := makeRecords(0, n)
	e.publish(t, recs)
	s := e.startSink(t, e.cfg, nil)
	waitFor(t, 2*time.Minute, "10,000 rows inserted and acked", func() bool {
		return s.Stats().Inserted >= n && e.consumerDrained(t)
	})
	s.stop(t)

	var wantFailed, wantRetried, wantAnswers, wantInput uint64
	var wantLatency int64
	for _, r := range recs {
		if r.Status == contract.StatusFailed {
			wantFailed++
		}
		if len(r.Attempts) > 1 {
			wantRetried++
		}
		if r.Result != nil {
			wantAnswers += uint64(len(r.Result.Answers))
			wantInput += uint64(r.Result.Usage.InputTokens)
		}
		wantLatency += r.LatencyMS
	}
	for _, c := range []struct {
		what, query string
		want        uint64
	}{
		{"rows under FINAL", "SELECT count() FROM %s.runs FINAL", n},
		{"distinct run ids", "SELECT uniqExact(run_id) FROM %s.runs", n},
		{"failed runs", "SELECT count() FROM %s.runs FINAL WHERE status = 'failed'", wantFailed},
		{"retried runs", "SELECT count() FROM %s.runs FINAL WHERE length(attempts.outcome) > 1", wantRetried},
		{"answers", "SELECT sum(length(answers.name)) FROM %s.runs FINAL", wantAnswers},
		{"input tokens", "SELECT sum(input_tokens) FROM %s.runs FINAL", wantInput},
		{"latency sum", "SELECT toUInt64(sum(latency_ms)) FROM %s.runs FINAL", uint64(wantLatency)},
		{"images", "SELECT sum(length(images.sha256)) FROM %s.runs FINAL", n},
		{"dead letters", "SELECT count() FROM %s.runs_dead_letter", 0},
	} {
		if got := e.count(t, c.query); got != c.want {
			t.Errorf("%s: got %d, want %d", c.what, got, c.want)
		}
	}
	st := s.Stats()
	if st.Inserted != n || st.DeadLettered != 0 || st.Received != n {
		t.Errorf("stats = %+v, want %d received and inserted", st, n)
	}

	t.Run("materialized view totals match the table", func(t *testing.T) {
		for _, c := range []struct{ table, view string }{
			{"SELECT count() FROM %s.runs", "SELECT sum(runs) FROM %s.runs_per_minute"},
			{"SELECT countIf(status = 'failed') FROM %s.runs", "SELECT sum(errors) FROM %s.runs_per_minute"},
			{"SELECT countIf(length(attempts.outcome) > 1) FROM %s.runs", "SELECT sum(retried) FROM %s.runs_per_minute"},
			{"SELECT sum(length(attempts.outcome)) FROM %s.runs", "SELECT sum(attempts) FROM %s.runs_per_minute"},
			{"SELECT sum(input_tokens) FROM %s.runs", "SELECT sum(input_tokens) FROM %s.runs_per_minute"},
			{"SELECT sum(output_tokens) FROM %s.runs", "SELECT sum(output_tokens) FROM %s.runs_per_minute"},
			{"SELECT toUInt64(sum(latency_ms)) FROM %s.runs", "SELECT toUInt64(sum(latency_ms_sum)) FROM %s.runs_per_minute"},
			{"SELECT uniqExact((toStartOfMinute(finished_at), model, caller, status)) FROM %s.runs",
				"SELECT uniqExact((minute, model, caller, status)) FROM %s.runs_per_minute"},
			// Per group, not only in total.
			{"SELECT count() FROM %s.runs WHERE model = 'brisk' AND caller = 'search' AND status = 'success'",
				"SELECT sum(runs) FROM %s.runs_per_minute WHERE model = 'brisk' AND caller = 'search' AND status = 'success'"},
		} {
			if tv, vv := e.count(t, c.table), e.count(t, c.view); tv != vv {
				t.Errorf("table %q = %d but view %q = %d", c.table, tv, c.view, vv)
			}
		}
		// Quantile states merge to the same figure the table gives for a group small enough
		// for ClickHouse's exact reservoir (8192 values).
		var fromView, fromTable []float64
		q := "SELECT quantilesMerge(0.5, 0.9, 0.95, 0.99)(latency_ms_q) FROM %s.runs_per_minute WHERE model = 'deep'"
		if err := e.db.Conn.QueryRow(context.Background(), strings.ReplaceAll(q, "%s", "`"+e.db.Name+"`")).Scan(&fromView); err != nil {
			t.Fatal(err)
		}
		q = "SELECT quantiles(0.5, 0.9, 0.95, 0.99)(latency_ms) FROM %s.runs WHERE model = 'deep'"
		if err := e.db.Conn.QueryRow(context.Background(), strings.ReplaceAll(q, "%s", "`"+e.db.Name+"`")).Scan(&fromTable); err != nil {
			t.Fatal(err)
		}
		if len(fromView) != 4 || len(fromTable) != 4 || fromView[0] < 20 || fromView[3] > 420 {
			t.Errorf("latency quantiles from the view %v / table %v out of range", fromView, fromTable)
		}
		for i := range fromView {
			if d := fromView[i] - fromTable[i]; d > 1 || d < -1 {
				t.Errorf("quantile %d: view %v vs table %v", i, fromView, fromTable)
			}
		}
	})

	t.Run("flattened answers", func(t *testing.T) {
		for _, c := range []struct {
			what, query string
			want        uint64
		}{
			{"choice answers", "SELECT count() FROM %s.runs FINAL ARRAY JOIN answers WHERE answers.name = 'label' AND answers.choice IN ('spam', 'ham') AND isNotNull(answers.confidence)", n - wantFailed},
			{"noul answers", "SELECT count() FROM %s.runs FINAL ARRAY JOIN answers WHERE answers.type = 'noul' AND isNotNull(answers.noul) AND isNull(answers.score) AND answers.choice = ''", n - wantFailed},
			{"score answers", "SELECT count() FROM %s.runs FINAL ARRAY JOIN answers WHERE answers.type = 'score' AND answers.score <= 2", n - wantFailed},
			{"probabilities", "SELECT count() FROM %s.runs FINAL ARRAY JOIN answers WHERE answers.probabilities['spam'] + answers.probabilities['ham'] BETWEEN 0.999 AND 1.001", n - wantFailed},
		} {
			if got := e.count(t, c.query); got != c.want {
				t.Errorf("%s: got %d, want %d", c.what, got, c.want)
			}
		}
	})
}

// A crash after the insert and before the ack redelivers the batch: a restarted sink inserts
// it again and the table still holds each run once under FINAL.
func TestSinkCrashAfterInsertBeforeAck(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.AckWait = 2 * time.Second })
	const n = 3000
	e.publish(t, makeRecords(0, n))

	var crashed atomic.Bool
	first := e.startSink(t, e.cfg, func(s *Sink) {
		s.afterInsert = func() {
			if crashed.CompareAndSwap(false, true) {
				// The process dies here: its NATS connection goes away with every ack unsent.
				s.js.Conn().Close()
			}
		}
	})
	waitFor(t, time.Minute, "a batch inserted and the crash", crashed.Load)
	first.stop(t)
	insertedBeforeCrash := e.count(t, "SELECT count() FROM %s.runs")
	if insertedBeforeCrash == 0 || e.consumerDrained(t) {
		t.Fatalf("the crash should leave rows inserted (%d) and messages unacked", insertedBeforeCrash)
	}

	second := e.startSink(t, e.cfg, nil)
	waitFor(t, 2*time.Minute, "the restarted sink to drain SYS1_RUNS", func() bool {
		return e.consumerDrained(t) && e.count(t, "SELECT count() FROM %s.runs FINAL") == n
	})
	second.stop(t)
	if got := e.count(t, "SELECT count() FROM %s.runs FINAL"); got != n {
		t.Fatalf("rows under FINAL after crash and restart = %d, want %d", got, n)
	}
	if got := e.count(t, "SELECT uniqExact(run_id) FROM %s.runs"); got != n {
		t.Fatalf("distinct run ids = %d, want %d", got, n)
	}
}

// A batch inserted twice with the same stream sequences is deduplicated by ClickHouse itself
// (insert_deduplication_token), not only under FINAL.
func TestInsertRetryIsDeduplicated(t *testing.T) {
	e := newEnv(t, nil)
	s, err := New(e.cfg, Deps{JS: e.js, ClickHouse: e.db.Conn, Topology: e.topo, Log: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	p := prepared{deadDone: true}
	for i, rec := range makeRecords(0, 50) {
		from := origin{stream: e.topo.RunsStream, seq: uint64(i + 1), published: time.Now()}
		r, err := toRow(&rec, from, RecordFull)
		if err != nil {
			t.Fatal(err)
		}
		p.rows = append(p.rows, r)
		p.rowSrc = append(p.rowSrc, source{from: from})
	}
	ctx := context.Background()
	for range 3 {
		if err := s.insertOnce(ctx, s.runs, &p); err != nil {
			t.Fatal(err)
		}
		p.rowsDone = false // as if the insert's success had been lost on the way back
	}
	if got := e.count(t, "SELECT count() FROM %s.runs"); got != 50 {
		t.Fatalf("rows after inserting the same batch 3 times = %d, want 50 (no FINAL)", got)
	}
	if got := e.count(t, "SELECT sum(runs) FROM %s.runs_per_minute"); got != 50 {
		t.Fatalf("the view counted %d runs, want 50: a deduplicated insert must not reach it", got)
	}
}

// A SYS1_RUNS deleted and recreated numbers its messages from 1 again. Their batches must not
// reuse the deduplication tokens of the old stream's batches, or ClickHouse would silently drop
// the new records as repeats of ones it already holds.
func TestRecreatedStreamIsNotDeduplicatedAway(t *testing.T) {
	// One record per batch, so both streams' batches are seqs [1], [2], … whatever the timing.
	e := newEnv(t, func(c *Config) { c.BatchSize = 1 })
	const n = 20
	drain := func(want uint64) {
		t.Helper()
		s := e.startSink(t, e.cfg, nil)
		waitFor(t, time.Minute, "the sink to drain SYS1_RUNS", func() bool {
			return e.consumerDrained(t) && s.Stats().Batches >= n
		})
		s.stop(t)
		if got := e.count(t, "SELECT count() FROM %s.runs FINAL"); got != want {
			t.Fatalf("rows under FINAL = %d, want %d", got, want)
		}
	}
	e.publish(t, makeRecords(0, n))
	drain(n)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := e.js.DeleteStream(ctx, e.topo.RunsStream); err != nil {
		t.Fatal(err)
	}
	if err := topology.EnsureRunsStream(ctx, e.js, e.topo); err != nil {
		t.Fatal(err)
	}
	e.publish(t, makeRecords(n, n))
	drain(2 * n)
}

// ClickHouse unreachable: records (and labels) stay in their streams, the sink retries and
// reports lag, a sink stopped during the outage gives its batch back, and once ClickHouse
// returns nothing is lost.
func TestSinkSurvivesClickHouseOutage(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.InsertTimeout = 2 * time.Second })
	u, err := url.Parse(e.cfg.DSN)
	if err != nil {
		t.Fatal(err)
	}
	px := newProxy(t, u.Host)
	px.setUp(false)
	cfg := e.cfg
	u.Host = px.addr()
	cfg.DSN = u.String()

	const n = 1500
	e.publish(t, makeRecords(0, n))
	labels := makeLabels(300)
	e.publishLabels(t, labels)
	first := e.startSink(t, cfg, nil)
	waitFor(t, time.Minute, "inserts to fail while ClickHouse is down", func() bool {
		st := first.Stats()
		return st.Retrying && st.InsertFailures >= 3 && st.AckPending > 0
	})
	if st := first.Stats(); st.Inserted != 0 || st.LastError == "" || st.AckPending+st.Pending != n {
		t.Fatalf("during the outage: %+v, want nothing inserted and the whole backlog (%d) as lag", st, n)
	}
	// Stopping during the outage returns promptly and naks the batch.
	first.stop(t)

	second := e.startSink(t, cfg, nil)
	waitFor(t, time.Minute, "the second sink to hit the outage", func() bool { return second.Stats().InsertFailures >= 1 })
	px.setUp(true)
	waitFor(t, 2*time.Minute, "the backlog to drain once ClickHouse is back", func() bool {
		return e.consumerDrained(t) && second.Stats().Inserted >= n && e.labelsDrained(t)
	})
	second.stop(t)
	if got := e.count(t, "SELECT count() FROM %s.runs FINAL"); got != n {
		t.Fatalf("rows under FINAL after the outage = %d, want %d", got, n)
	}
	// The labels waited in SYS1_LABELS the same way.
	if got := e.count(t, "SELECT count() FROM %s.labels FINAL"); got != uint64(len(labels)) {
		t.Fatalf("labels under FINAL after the outage = %d, want %d", got, len(labels))
	}
	if st := second.Stats(); st.Retrying {
		t.Errorf("still retrying after recovery: %+v", st)
	}
}

func TestRecordStateModes(t *testing.T) {
	rec := makeRecord(0)
	stateSum := sha256.Sum256(rec.Request.State)
	instrSum := sha256.Sum256(rec.Request.Questions[0].Instructions)
	for _, tc := range []struct {
		mode        RecordState
		contains    []string
		notContains []string
	}{
		{RecordFull, []string{`secret customer text`, `Pick the best label`}, nil},
		{RecordHash, []string{hex.EncodeToString(stateSum[:]), hex.EncodeToString(instrSum[:])}, []string{"secret customer text", "Pick the best label", "How severe"}},
		{RecordNone, []string{`"state":null`, `"instructions":null`}, []string{"secret customer text", "Pick the best label", "How severe", hex.EncodeToString(stateSum[:])}},
	} {
		t.Run(string(tc.mode), func(t *testing.T) {
			e := newEnv(t, func(c *Config) { c.RecordState = tc.mode })
			e.publish(t, []contract.RunRecord{rec})
			s := e.startSink(t, e.cfg, nil)
			waitFor(t, time.Minute, "the record to be inserted", func() bool { return s.Stats().Inserted == 1 && e.consumerDrained(t) })
			s.stop(t)
			var stored, mode string
			q := "SELECT request, record_state FROM `" + e.db.Name + "`.runs FINAL WHERE run_id = ?"
			if err := e.db.Conn.QueryRow(context.Background(), q, rec.RunID).Scan(&stored, &mode); err != nil {
				t.Fatal(err)
			}
			if mode != string(tc.mode) {
				t.Errorf("record_state = %q, want %q", mode, tc.mode)
			}
			for _, want := range tc.contains {
				if !strings.Contains(stored, want) {
					t.Errorf("stored request lacks %q:\n%s", want, stored)
				}
			}
			for _, bad := range tc.notContains {
				if strings.Contains(stored, bad) {
					t.Errorf("stored request contains %q:\n%s", bad, stored)
				}
			}
			// The question structure survives redaction.
			if !strings.Contains(stored, `"label"`) || !strings.Contains(stored, `"severity"`) {
				t.Errorf("stored request lost its questions:\n%s", stored)
			}
		})
	}
}

func TestUndecodableRecordsAreDeadLettered(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.RecordState = RecordHash })
	good := makeRecord(1)
	e.publish(t, []contract.RunRecord{good})
	e.publishRaw(t,
		[]string{"sys1.runs.success", "sys1.runs.failed", "sys1.runs.success"},
		[][]byte{
			[]byte("this is not JSON"),
			[]byte(`{"run_id": "", "status": "failed"}`),
			[]byte(`{"run_id": "r-future", "finished_at": "2400-01-01T00:00:00Z", "request": {"state": {"secret": "customer text"}, "questions": {"q": {"type": "noul", "instructions": "private"}}}}`),
		})
	s := e.startSink(t, e.cfg, nil)
	waitFor(t, time.Minute, "all four messages handled", func() bool {
		st := s.Stats()
		return st.Inserted == 1 && st.DeadLettered == 3 && e.consumerDrained(t)
	})
	s.stop(t)
	if got := e.count(t, "SELECT count() FROM %s.runs FINAL"); got != 1 {
		t.Fatalf("runs = %d, want 1", got)
	}
	rows, err := e.db.Conn.Query(context.Background(), "SELECT runs_seq, subject, error, payload, payload_bytes FROM `"+e.db.Name+"`.runs_dead_letter FINAL ORDER BY runs_seq")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	type dl struct {
		seq            uint64
		subject, error string
		payload        string
		bytes          uint64
	}
	var got []dl
	for rows.Next() {
		var d dl
		if err := rows.Scan(&d.seq, &d.subject, &d.error, &d.payload, &d.bytes); err != nil {
			t.Fatal(err)
		}
		got = append(got, d)
	}
	if len(got) != 3 {
		t.Fatalf("dead letters = %+v, want 3", got)
	}
	if got[0].seq != 2 || !strings.Contains(got[0].error, "decode run record") || got[0].payload != "" || got[0].bytes != 16 {
		t.Errorf("non-JSON dead letter = %+v (hash mode: payload withheld, size kept)", got[0])
	}
	if !strings.Contains(got[1].error, "run_id is empty") || !strings.Contains(got[1].payload, `"status":"failed"`) {
		t.Errorf("empty run id dead letter = %+v", got[1])
	}
	if !strings.Contains(got[2].error, "finished_at") || strings.Contains(got[2].payload, "customer text") || strings.Contains(got[2].payload, "private") || !strings.Contains(got[2].payload, "r-future") {
		t.Errorf("out-of-range dead letter = %+v (state and instructions must be redacted)", got[2])
	}
}

// Cancelling the sink while a batch is in flight finishes that batch (insert and ack within
// ShutdownTimeout) instead of abandoning it; a restarted sink takes the rest.
func TestSinkCancelledMidBatchFinishesIt(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.BatchSize = 500; c.MaxAckPending = 500 })
	const n = 2000
	e.publish(t, makeRecords(0, n))

	inserted := make(chan struct{})
	resume := make(chan struct{})
	var once atomic.Bool
	first := e.startSink(t, e.cfg, func(s *Sink) {
		s.afterInsert = func() {
			if once.CompareAndSwap(false, true) {
				close(inserted)
				<-resume // the shutdown signal arrives between insert and ack
			}
		}
	})
	<-inserted
	first.cancel()
	close(resume)
	first.stop(t)

	st := first.Stats()
	if st.Batches == 0 || st.AckFailures != 0 {
		t.Fatalf("the in-flight batch was not finished on shutdown: %+v", st)
	}
	rows := e.count(t, "SELECT count() FROM %s.runs FINAL")
	if rows != st.Inserted || rows == 0 || rows == n {
		t.Fatalf("after shutdown: %d rows, stats %+v; want the finished batches only", rows, st)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cons, err := e.js.Consumer(ctx, e.topo.RunsStream, e.topo.SinkConsumer)
	if err != nil {
		t.Fatal(err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Finished batches are acked; anything else the sink held was nak'ed or never delivered.
	if info.AckFloor.Stream < st.Inserted {
		t.Fatalf("ack floor %d below the %d inserted records", info.AckFloor.Stream, st.Inserted)
	}

	second := e.startSink(t, e.cfg, nil)
	waitFor(t, time.Minute, "the restarted sink to drain", func() bool {
		return e.consumerDrained(t) && e.count(t, "SELECT count() FROM %s.runs FINAL") == n
	})
	second.stop(t)
}

// A record ClickHouse itself refuses (here: a CHECK constraint) is isolated by halving the
// batch and parked as a dead letter; the rest of its batch is stored and nothing stalls.
func TestRowsClickHouseRejectsAreIsolated(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.BatchSize = 300 })
	ctx := context.Background()
	if err := e.db.Conn.Exec(ctx, "ALTER TABLE `"+e.db.Name+"`.runs ADD CONSTRAINT no_poison CHECK NOT startsWith(run_id, 'poison')"); err != nil {
		t.Fatal(err)
	}
	recs := makeRecords(0, 300)
	recs[17].RunID, recs[230].RunID = "poison-1", "poison-2"
	e.publish(t, recs)
	var logs natstest.Buffer
	s := e.startSink(t, e.cfg, func(s *Sink) { s.log = zerolog.New(&logs) })
	waitFor(t, time.Minute, "the batch to be stored around the rejected rows", func() bool {
		st := s.Stats()
		return st.Inserted == 298 && st.DeadLettered == 2 && e.consumerDrained(t)
	})
	s.stop(t)
	// Each parked row is logged as a line about its run.
	for _, id := range []string{"poison-1", "poison-2"} {
		if !strings.Contains(logs.String(), `"run_id":"`+id+`"`) {
			t.Errorf("no dead-letter log line with run_id %s:\n%s", id, logs.String())
		}
	}
	if got := e.count(t, "SELECT count() FROM %s.runs FINAL"); got != 298 {
		t.Fatalf("rows = %d, want 298", got)
	}
	if got := e.count(t, "SELECT count() FROM %s.runs_dead_letter FINAL WHERE runs_seq IN (18, 231) AND error LIKE 'ClickHouse rejected the record:%%469%%' AND payload LIKE '%%poison%%'"); got != 2 {
		t.Fatalf("dead letters for the rejected rows = %d, want 2", got)
	}
}

// A durable consumer deleted under a running sink is recreated, and records published after
// that still arrive.
func TestSinkRecreatesADeletedConsumer(t *testing.T) {
	e := newEnv(t, nil)
	e.publish(t, makeRecords(0, 100))
	s := e.startSink(t, e.cfg, nil)
	waitFor(t, time.Minute, "the first records", func() bool { return s.Stats().Inserted >= 100 && e.consumerDrained(t) })

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.js.DeleteConsumer(ctx, e.topo.RunsStream, e.topo.SinkConsumer); err != nil {
		t.Fatal(err)
	}
	e.publish(t, makeRecords(100, 100))
	waitFor(t, time.Minute, "records after the consumer was deleted", func() bool {
		return e.count(t, "SELECT count() FROM %s.runs FINAL") == 200 && e.consumerDrained(t)
	})
	s.stop(t)
}

// The stream itself is deleted under a running sink (or NATS comes back without its data): the
// sink recreates SYS1_RUNS and its consumer and drains what producers write next.
func TestSinkRecreatesADeletedStream(t *testing.T) {
	e := newEnv(t, nil)
	e.publish(t, makeRecords(0, 100))
	s := e.startSink(t, e.cfg, nil)
	waitFor(t, time.Minute, "the first records", func() bool { return s.Stats().Inserted >= 100 && e.consumerDrained(t) })

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.js.DeleteStream(ctx, e.topo.RunsStream); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "the sink to recreate SYS1_RUNS and its consumer", func() bool {
		_, err := e.js.Consumer(ctx, e.topo.RunsStream, e.topo.SinkConsumer)
		return err == nil
	})
	e.publish(t, makeRecords(100, 100))
	waitFor(t, time.Minute, "records written after the stream was recreated", func() bool {
		return e.count(t, "SELECT count() FROM %s.runs FINAL") == 200 && e.consumerDrained(t)
	})
	s.stop(t)
}
