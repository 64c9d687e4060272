package sink

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"

	"github.com/sys1hq/sys1/sink/migrate"
)

// Every query of the analyst kit runs against a populated database and returns rows.
func TestAnalystQueries(t *testing.T) {
	script, err := os.ReadFile("../deploy/clickhouse/queries.sql")
	if err != nil {
		t.Fatal(err)
	}
	stmts := migrate.Statements(string(script))
	if len(stmts) < 20 {
		t.Fatalf("queries.sql holds %d queries, want at least 20", len(stmts))
	}

	e := newEnv(t, nil)
	const n = 2000
	e.publish(t, makeRecords(0, n))
	e.publishRaw(t, []string{"sys1.runs.failed"}, [][]byte{[]byte("{not a record")})
	labels := makeLabels(n)
	e.publishLabels(t, labels)
	s := e.startSink(t, e.cfg, nil)
	// Generous: on a loaded 2-core CI machine chDB can be slow; the stats say where it stood.
	var last string
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("sink stats when the wait ended: %s", last)
		}
	})
	waitFor(t, 3*time.Minute, "the fixture to be stored", func() bool {
		st := s.Stats()
		last = fmt.Sprintf("%+v", st)
		return st.Inserted == n && st.DeadLettered == 1 && st.Labels.Inserted == uint64(len(labels)) && e.consumerDrained(t) && e.labelsDrained(t)
	})
	s.stop(t)
	// Queries about one batch take it as a query parameter.
	params := clickhouse.Parameters{"batch_id": fxBatch}

	qualifier := regexp.MustCompile(`\bsys1\.`)
	queryTitle := regexp.MustCompile(`(?m)^-- (\d+\. [^:(,]*)`)
	for i, stmt := range stmts {
		// The comment before a query says what it answers; the first line names it in failures.
		if !strings.HasPrefix(stmt, "--") {
			t.Errorf("query %d has no comment explaining it:\n%s", i+1, stmt)
		}
		q := qualifier.ReplaceAllString(stmt, "`"+e.db.Name+"`.")
		name := fmt.Sprintf("query_%d", i+1)
		if m := queryTitle.FindStringSubmatch(stmt); m != nil {
			name = m[1]
		}
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			ctx = clickhouse.Context(ctx, clickhouse.WithParameters(params))
			rows, err := e.db.Conn.Query(ctx, q)
			if err != nil {
				t.Fatalf("%v\n%s", err, q)
			}
			defer rows.Close()
			got := 0
			for rows.Next() {
				got++
			}
			if err := rows.Err(); err != nil {
				t.Fatal(err)
			}
			if got == 0 {
				t.Errorf("no rows from a populated database:\n%s", q)
			}
		})
	}
}
