package sink

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// grafanaMacros expands the ClickHouse data source's macros as the plugin does
// (grafana/clickhouse-datasource pkg/macros), for a time range and an interval.
func grafanaMacros(sql string, from, to time.Time, interval time.Duration) (string, error) {
	dt := func(t time.Time) string { return fmt.Sprintf("toDateTime(%d)", t.Unix()) }
	dt64 := func(t time.Time) string { return fmt.Sprintf("fromUnixTimestamp64Milli(%d)", t.UnixMilli()) }
	secs := max(int(interval.Seconds()), 1)
	withArg := regexp.MustCompile(`\$__(timeFilter_ms|timeFilter|timeInterval_ms|timeInterval|dateFilter)\(\s*([^)]+?)\s*\)`)
	sql = withArg.ReplaceAllStringFunc(sql, func(m string) string {
		sub := withArg.FindStringSubmatch(m)
		col := sub[2]
		switch sub[1] {
		case "timeFilter":
			return fmt.Sprintf("%s >= %s AND %s <= %s", col, dt(from), col, dt(to))
		case "timeFilter_ms":
			return fmt.Sprintf("%s >= %s AND %s <= %s", col, dt64(from), col, dt64(to))
		case "timeInterval":
			return fmt.Sprintf("toStartOfInterval(toDateTime(%s), INTERVAL %d second)", col, secs)
		case "timeInterval_ms":
			return fmt.Sprintf("toStartOfInterval(toDateTime64(%s, 3), INTERVAL %d millisecond)", col, max(interval.Milliseconds(), 1))
		default: // dateFilter
			d := func(t time.Time) string { return "toDate('" + t.UTC().Format("2006-01-02") + "')" }
			return fmt.Sprintf("%s >= %s AND %s <= %s", col, d(from), col, d(to))
		}
	})
	sql = strings.NewReplacer("$__fromTime_ms", dt64(from), "$__toTime_ms", dt64(to), "$__fromTime", dt(from), "$__toTime", dt(to),
		"$__interval_s", fmt.Sprint(secs)).Replace(sql)
	if i := strings.Index(sql, "$"); i >= 0 {
		return "", fmt.Errorf("unexpanded macro or variable at %q", sql[i:min(len(sql), i+30)])
	}
	return sql, nil
}

// Every SQL query of the Grafana dashboards (deploy/grafana/dashboards) runs on a populated
// database, with the data source's macros expanded, and returns rows.
func TestDashboardQueries(t *testing.T) {
	files, err := filepath.Glob("../deploy/grafana/dashboards/*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no dashboards: %v", err)
	}
	type query struct{ name, sql string }
	var queries []query
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var d struct {
			Panels []struct {
				Title   string
				Targets []struct {
					RawSQL string `json:"rawSql"`
				}
			}
		}
		if err := json.Unmarshal(b, &d); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, p := range d.Panels {
			for _, q := range p.Targets {
				if q.RawSQL != "" {
					queries = append(queries, query{filepath.Base(f) + "/" + p.Title, q.RawSQL})
				}
			}
		}
	}
	if len(queries) < 8 {
		t.Fatalf("%d dashboard queries, want at least 8", len(queries))
	}

	e := newEnv(t, nil)
	const n = 500
	e.publish(t, makeRecords(0, n))
	s := e.startSink(t, e.cfg, nil)
	waitFor(t, time.Minute, "the fixture to be stored", func() bool { return s.Stats().Inserted == n && e.consumerDrained(t) })
	s.stop(t)

	qualifier := regexp.MustCompile(`\bsys1\.`)
	from, to := time.Now().Add(-24*time.Hour), time.Now().Add(time.Hour)
	for _, q := range queries {
		t.Run(q.name, func(t *testing.T) {
			sql, err := grafanaMacros(q.sql, from, to, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			sql = qualifier.ReplaceAllString(sql, "`"+e.db.Name+"`.")
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			rows, err := e.db.Conn.Query(ctx, sql)
			if err != nil {
				t.Fatalf("%v\n%s", err, sql)
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
				t.Errorf("no rows from a populated database:\n%s", sql)
			}
		})
	}
}

func TestGrafanaMacros(t *testing.T) {
	from, to := time.Unix(1000, 0), time.Unix(2000, 0)
	got, err := grafanaMacros("SELECT $__timeInterval(minute) t WHERE $__timeFilter(finished_at) AND x < $__toTime LIMIT $__interval_s", from, to, 90*time.Second)
	want := "SELECT toStartOfInterval(toDateTime(minute), INTERVAL 90 second) t WHERE finished_at >= toDateTime(1000) AND finished_at <= toDateTime(2000) AND x < toDateTime(2000) LIMIT 90"
	if err != nil || got != want {
		t.Errorf("got %q, %v\nwant %q", got, err, want)
	}
	if _, err := grafanaMacros("WHERE caller IN ($caller)", from, to, time.Minute); err == nil {
		t.Error("an unknown variable passed")
	}
}
