package review

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/sink"
	"github.com/sys1hq/sys1/sink/chtest"
	"github.com/sys1hq/sys1/worker/natsconn/natstest"
	"github.com/sys1hq/sys1/worker/topology"
)

// The browser test's label, all the way into ClickHouse: the sink runs against the test's
// NATS and a fresh chshim database, and the label row must appear in sys1.labels as pressed.
func init() {
	clickHouseLabelCheck = func(t *testing.T, natsURL string, want contract.Label) {
		t.Helper()
		if os.Getenv(chtest.DSNVar) == "" && os.Getenv(chtest.RequireVar) != "1" {
			// Skipping here would skip the rest of the browser test too.
			t.Logf("%s unset: not checking that the label reached ClickHouse", chtest.DSNVar)
			return
		}
		db := runSink(t, natsURL)
		row := waitLabelRow(t, db, want.RunID, want.Question)
		text, _ := contract.LabelText(want.Value)
		if row.label != text || row.reviewer != want.Reviewer || row.source != contract.LabelSourceReview || row.item != want.Item || row.caller != want.Caller {
			t.Errorf("ClickHouse label row %+v, want %s by %s for item %s", row, text, want.Reviewer, want.Item)
		}
	}
}

// runSink runs the sink (run records and checked labels into ClickHouse) on natsURL against
// a fresh, migrated database of the test ClickHouse (SYS1_TEST_CLICKHOUSE_DSN; the test skips
// without one), until the test ends.
func runSink(t *testing.T, natsURL string) *chtest.DB {
	t.Helper()
	db := chtest.New(t)
	cfg := sink.DefaultConfig()
	cfg.DSN, cfg.Database = db.DSN, db.Name
	cfg.BatchAge, cfg.StatsInterval = 50*time.Millisecond, time.Second
	cfg.RetryMin, cfg.RetryMax = 20*time.Millisecond, 200*time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	conn, err := sink.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := sink.Migrate(ctx, conn, cfg); err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(natsURL)
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	s, err := sink.New(cfg, sink.Deps{JS: js, ClickHouse: conn, Topology: topology.Default(), Log: zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel)})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := s.Run(ctx); err != nil {
			t.Errorf("sink: %v", err)
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		nc.Close()
		_ = conn.Close()
	})
	return db
}

type labelRow struct {
	label, value, reviewer, source, item, caller string
}

// waitLabelRow polls ClickHouse until the label of a run's question is stored, and returns it.
func waitLabelRow(t *testing.T, db *chtest.DB, runID, question string) labelRow {
	t.Helper()
	natstest.WaitFor(t, time.Minute, "the label row in ClickHouse", func() bool {
		return db.Count(t, "SELECT count() FROM `"+db.Name+"`.labels FINAL WHERE run_id = ? AND question = ?", runID, question) == 1
	})
	var r labelRow
	q := "SELECT label, value, reviewer, source, item, caller FROM `" + db.Name + "`.labels FINAL WHERE run_id = ? AND question = ?"
	if err := db.Conn.QueryRow(context.Background(), q, runID, question).Scan(&r.label, &r.value, &r.reviewer, &r.source, &r.item, &r.caller); err != nil {
		t.Fatal(err)
	}
	return r
}
