package migrate_test

import (
	"context"
	"flag"
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sys1hq/sys1/sink/chtest"
	"github.com/sys1hq/sys1/sink/migrate"
)

var update = flag.Bool("update", false, "rewrite the golden DDL files")

func TestStatements(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     []string
	}{
		{"two statements", "SELECT 1;\nSELECT 2;", []string{"SELECT 1", "SELECT 2"}},
		{"no trailing semicolon", "SELECT 1", []string{"SELECT 1"}},
		{"semicolon in string", "SELECT 'a;b'; SELECT 2", []string{"SELECT 'a;b'", "SELECT 2"}},
		{"escaped quote", `SELECT 'it\'s;'; SELECT 2`, []string{`SELECT 'it\'s;'`, "SELECT 2"}},
		{"semicolon in identifier", "SELECT 1 AS `x;y`;", []string{"SELECT 1 AS `x;y`"}},
		{"semicolon in line comment", "-- a; b\nSELECT 1;", []string{"-- a; b\nSELECT 1"}},
		{"semicolon in block comment", "/* a; b */ SELECT 1;", []string{"/* a; b */ SELECT 1"}},
		{"comment-only tail dropped", "SELECT 1;\n-- the end\n", []string{"SELECT 1"}},
		{"empty", " ;; \n", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := migrate.Statements(tc.in); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("Statements(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

func TestMigrationsEmbedded(t *testing.T) {
	ms, err := migrate.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) == 0 || ms[0].Version != 1 || migrate.Latest() != ms[len(ms)-1].Version {
		t.Fatalf("migrations = %+v, Latest = %d", ms, migrate.Latest())
	}
	stmts, err := ms[0].Statements(migrate.Options{Database: "x", RetentionDays: 7})
	if err != nil {
		t.Fatal(err)
	}
	joined := strings.Join(stmts, "\n")
	if !strings.Contains(joined, "INTERVAL 7 DAY") || !strings.Contains(joined, "`x`.runs") || strings.Contains(joined, "{{") {
		t.Fatalf("rendered migration does not carry the options:\n%s", joined)
	}
}

func TestOptionsValidate(t *testing.T) {
	for _, o := range []migrate.Options{
		{Database: "", RetentionDays: 1}, {Database: "a-b", RetentionDays: 1}, {Database: "1a", RetentionDays: 1}, {Database: "ok", RetentionDays: 0},
		{Database: "ok", RetentionDays: 1, Cluster: "a b"}, {Database: "ok", RetentionDays: 1, Cluster: "c`; DROP DATABASE x; --"},
		{Database: "ok", RetentionDays: 1, Cluster: "it's"}, {Database: "ok", RetentionDays: 1, Cluster: "-lead"},
		{Database: "ok", RetentionDays: 1, Cluster: "a.b"}, {Database: "ok", RetentionDays: 1, Cluster: strings.Repeat("c", 64)},
	} {
		if err := o.Validate(); err == nil {
			t.Errorf("Validate(%+v) = nil, want an error", o)
		} else if o.Cluster != "" && !strings.Contains(err.Error(), "is not a ClickHouse cluster name") {
			t.Errorf("Validate(%+v) = %v, want it to name the cluster", o, err)
		}
		if _, err := migrate.Render(o); err == nil {
			t.Errorf("Render(%+v) = nil error", o)
		}
	}
	for _, o := range []migrate.Options{{Database: "sys1", RetentionDays: 90}, {Database: "sys1", RetentionDays: 90, Cluster: "prod-eu_1"}} {
		if err := o.Validate(); err != nil {
			t.Errorf("Validate(%+v) = %v", o, err)
		}
	}
}

func TestMigrateTwiceIsANoOp(t *testing.T) {
	db := chtest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	opts := migrate.Options{Database: db.Name, RetentionDays: 90}

	first, err := migrate.Migrate(ctx, db.Conn, opts)
	if err != nil {
		t.Fatalf("first migrate: %v", err)
	}
	if first.From != 0 || first.To != migrate.Latest() || len(first.Applied) != int(migrate.Latest()) || first.Applied[0] != "0001_init" {
		t.Fatalf("first migrate = %+v", first)
	}
	for _, table := range []string{"runs", "runs_dead_letter", "runs_per_minute", "runs_per_minute_mv", "schema_migrations",
		"labels", "labelled_answers", "spend_by_caller_day", "spend_by_model_day", "batch_progress", "batch_outcomes"} {
		if n := db.Count(t, "SELECT count() FROM system.tables WHERE database = ? AND name = ?", db.Name, table); n != 1 {
			t.Errorf("table %s missing after migrate", table)
		}
	}

	second, err := migrate.Migrate(ctx, db.Conn, opts)
	if err != nil {
		t.Fatalf("second migrate: %v", err)
	}
	if second.From != migrate.Latest() || second.To != migrate.Latest() || len(second.Applied) != 0 || len(second.TTLChanged) != 0 {
		t.Fatalf("second migrate did something: %+v", second)
	}
	if n := db.Count(t, "SELECT count() FROM `"+db.Name+"`.schema_migrations FINAL"); n != uint64(migrate.Latest()) {
		t.Fatalf("schema_migrations has %d rows, want %d", n, migrate.Latest())
	}
	applied, err := migrate.AppliedMigrations(ctx, db.Conn, db.Name)
	if err != nil {
		t.Fatal(err)
	}
	ms, _ := migrate.Migrations()
	if applied[0].Checksum != ms[0].Checksum || applied[0].Name != "init" {
		t.Fatalf("recorded migration %+v does not match the embedded one", applied[0])
	}
}

func TestMigrateRefusesNewerSchema(t *testing.T) {
	db := chtest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	opts := migrate.Options{Database: db.Name, RetentionDays: 90}
	if _, err := migrate.Migrate(ctx, db.Conn, opts); err != nil {
		t.Fatal(err)
	}
	future := migrate.Latest() + 1
	if err := db.Conn.Exec(ctx, "INSERT INTO `"+db.Name+"`.schema_migrations (version, name, checksum, applied_at) VALUES (?, 'from_the_future', '', now64(3))", future); err != nil {
		t.Fatal(err)
	}
	_, err := migrate.Migrate(ctx, db.Conn, opts)
	if err == nil || !strings.Contains(err.Error(), "newer sys1") || !strings.Contains(err.Error(), db.Name) {
		t.Fatalf("migrate over a newer schema: err = %v, want a clear 'newer sys1' error", err)
	}
}

func TestTTLFollowsRetention(t *testing.T) {
	db := chtest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	showCreate := func(table string) string {
		var s string
		if err := db.Conn.QueryRow(ctx, "SHOW CREATE TABLE `"+db.Name+"`."+table).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	if _, err := migrate.Migrate(ctx, db.Conn, migrate.Options{Database: db.Name, RetentionDays: 90}); err != nil {
		t.Fatal(err)
	}
	for _, table := range []string{"runs", "runs_dead_letter", "runs_per_minute", "labels"} {
		if s := showCreate(table); !strings.Contains(s, "TTL ") || !strings.Contains(s, "toIntervalDay(90)") {
			t.Errorf("%s has no 90-day TTL:\n%s", table, s)
		}
	}
	res, err := migrate.Migrate(ctx, db.Conn, migrate.Options{Database: db.Name, RetentionDays: 30})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.TTLChanged) != 4 || len(res.Applied) != 0 {
		t.Fatalf("retention change: %+v, want 4 TTLs changed and no migration", res)
	}
	for _, table := range []string{"runs", "runs_dead_letter", "runs_per_minute", "labels"} {
		if s := showCreate(table); !strings.Contains(s, "toIntervalDay(30)") {
			t.Errorf("%s TTL not updated to 30 days:\n%s", table, s)
		}
	}
}

// TestRenderGolden: the whole DDL, for one server and for a cluster, is the golden files'
// (go test ./sink/migrate -update rewrites them; review the diff). No cluster runs here, so
// this is what proves the cluster DDL; the single-server DDL also runs on chshim above.
func TestRenderGolden(t *testing.T) {
	for _, tc := range []struct {
		file string
		opts migrate.Options
	}{
		{"testdata/schema-single.sql", migrate.Options{Database: "sys1", RetentionDays: 90}},
		{"testdata/schema-cluster.sql", migrate.Options{Database: "sys1", RetentionDays: 90, Cluster: "analytics"}},
	} {
		t.Run(tc.file, func(t *testing.T) {
			got, err := migrate.Render(tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			if *update {
				if err := os.WriteFile(tc.file, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(tc.file)
			if err != nil {
				t.Fatal(err)
			}
			if got != string(want) {
				t.Fatalf("%s differs from the rendered DDL (run with -update and review the diff):\n%s", tc.file, got)
			}
		})
	}
}

// TestClusterDDL: on a cluster every statement runs ON CLUSTER, every table that stores rows is
// replicated, and every table the sink and the views use is a Distributed table over it.
func TestClusterDDL(t *testing.T) {
	ddl, err := migrate.Render(migrate.Options{Database: "sys1", RetentionDays: 30, Cluster: "analytics"})
	if err != nil {
		t.Fatal(err)
	}
	stmts := migrate.Statements(ddl)
	if len(stmts) < 15 {
		t.Fatalf("%d statements", len(stmts))
	}
	engine := regexp.MustCompile(`ENGINE = (\w+)`)
	for _, st := range stmts {
		if !strings.Contains(st, " ON CLUSTER `analytics`") {
			t.Errorf("statement without ON CLUSTER:\n%s", st)
		}
		for _, m := range engine.FindAllStringSubmatch(st, -1) {
			if e := m[1]; e != "Distributed" && !strings.HasPrefix(e, "Replicated") {
				t.Errorf("engine %s is neither replicated nor distributed:\n%s", e, st)
			}
		}
	}
	for _, table := range []string{"runs", "runs_dead_letter", "runs_per_minute", "labels"} {
		local := "CREATE TABLE IF NOT EXISTS `sys1`." + table + "_local ON CLUSTER `analytics`"
		dist := "CREATE OR REPLACE TABLE `sys1`." + table + " ON CLUSTER `analytics` AS `sys1`." + table + "_local\nENGINE = Distributed('analytics', 'sys1', '" + table + "_local'"
		if !strings.Contains(ddl, local) || !strings.Contains(ddl, dist) {
			t.Errorf("%s: no replicated local table or no Distributed table over it", table)
		}
	}
	for _, want := range []string{
		"Distributed('analytics', 'sys1', 'runs_local', cityHash64(run_id))",
		"Distributed('analytics', 'sys1', 'labels_local', cityHash64(run_id))",
		"TO `sys1`.runs_per_minute_local AS", "FROM `sys1`.runs_local\nGROUP BY",
		"ALTER TABLE `sys1`.runs_local ON CLUSTER `analytics`\n    ADD COLUMN IF NOT EXISTS batch_id",
		"GLOBAL INNER JOIN", "GLOBAL IN (SELECT run_id FROM `sys1`.labels)",
		"ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/{table}', '{replica}', finished_at)",
		"ReplicatedReplacingMergeTree('/clickhouse/tables/all/{database}/{table}', '{replica}', applied_at)",
		"TTL toDateTime(finished_at) + INTERVAL 30 DAY",
	} {
		if !strings.Contains(ddl, want) {
			t.Errorf("cluster DDL lacks %q", want)
		}
	}
	if strings.Contains(ddl, "non_replicated_deduplication_window") {
		t.Error("a replicated table carries the non-replicated deduplication window")
	}
	// One server: none of it.
	single, err := migrate.Render(migrate.Options{Database: "sys1", RetentionDays: 30})
	if err != nil {
		t.Fatal(err)
	}
	var code strings.Builder // the DDL without its comments
	for _, line := range strings.Split(single, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "--") {
			code.WriteString(line + "\n")
		}
	}
	for _, bad := range []string{"ON CLUSTER", "Replicated", "Distributed", "_local"} {
		if strings.Contains(code.String(), bad) {
			t.Errorf("single-server DDL holds %q", bad)
		}
	}
}

// TestMigrateFromVersion1: a database at schema version 1 holding version 1 rows upgrades in
// place; old rows read the new columns as their defaults and still ARRAY JOIN.
func TestMigrateFromVersion1(t *testing.T) {
	db := chtest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	opts := migrate.Options{Database: db.Name, RetentionDays: 90}
	ms, err := migrate.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	q := func(s string, args ...any) {
		t.Helper()
		if err := db.Conn.Exec(ctx, strings.ReplaceAll(s, "DB", "`"+db.Name+"`"), args...); err != nil {
			t.Fatalf("%v\n%s", err, s)
		}
	}
	q("CREATE DATABASE DB")
	q("CREATE TABLE DB.schema_migrations (version UInt32, name String, checksum String, applied_at DateTime64(3, 'UTC')) ENGINE = ReplacingMergeTree(applied_at) ORDER BY version")
	v1, err := ms[0].Statements(opts)
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range v1 {
		q(st)
	}
	q("INSERT INTO DB.schema_migrations VALUES (1, 'init', ?, now64(3))", ms[0].Checksum)
	q(`INSERT INTO DB.runs (run_id, finished_at, attempts.provider, attempts.outcome, attempts.latency_ms, attempts.detail, attempts.delivery, attempts.error_code, attempts.started_at,
		answers.name, answers.type, answers.choice, answers.noul, answers.score, answers.confidence, answers.probabilities, schema_version)
		VALUES ('old-1', now64(3), ['ollama'], ['ok'], [4], [''], [1], [''], [now64(3)], ['label', 'urgent'], ['choice', 'noul'], ['bug', ''], [NULL, 0.4], [NULL, NULL], [0.9, NULL], [map('bug', 0.95, 'ok', 0.05), map()], 1)`)

	res, err := migrate.Migrate(ctx, db.Conn, opts)
	if err != nil {
		t.Fatal(err)
	}
	if res.From != 1 || res.To != migrate.Latest() || len(res.Applied) != int(migrate.Latest())-1 {
		t.Fatalf("upgrade = %+v", res)
	}
	var n uint64
	if n = db.Count(t, "SELECT count() FROM `"+db.Name+"`.runs FINAL ARRAY JOIN answers WHERE answers.verdict = '' AND isNull(answers.calibrated_probability) AND isNull(answers.temperature) AND answers.rule = ''"); n != 2 {
		t.Errorf("old answers with default verdict columns = %d, want 2", n)
	}
	if n = db.Count(t, "SELECT count() FROM `"+db.Name+"`.runs FINAL ARRAY JOIN attempts WHERE attempts.model = ''"); n != 1 {
		t.Errorf("old attempts with an empty model = %d, want 1", n)
	}
	if n = db.Count(t, "SELECT count() FROM `"+db.Name+"`.runs FINAL WHERE batch_id = '' AND item_id = '' AND isNull(cost_usd) AND NOT cache_hit AND trace_id = '' AND review_status = ''"); n != 1 {
		t.Errorf("old run with default v2 columns = %d, want 1", n)
	}
	if n = db.Count(t, "SELECT count() FROM `"+db.Name+"`.runs_dead_letter WHERE kind != 'run'"); n != 0 {
		t.Errorf("dead letters of another kind = %d", n)
	}
}
