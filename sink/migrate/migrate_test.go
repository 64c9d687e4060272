package migrate_test

import (
	"context"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/sys1hq/sys1/sink/chtest"
	"github.com/sys1hq/sys1/sink/migrate"
)

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
	for _, o := range []migrate.Options{{Database: "", RetentionDays: 1}, {Database: "a-b", RetentionDays: 1}, {Database: "1a", RetentionDays: 1}, {Database: "ok", RetentionDays: 0}} {
		if err := o.Validate(); err == nil {
			t.Errorf("Validate(%+v) = nil, want an error", o)
		}
	}
	if err := (migrate.Options{Database: "sys1", RetentionDays: 90}).Validate(); err != nil {
		t.Errorf("Validate(defaults) = %v", err)
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
	for _, table := range []string{"runs", "runs_dead_letter", "runs_per_minute", "runs_per_minute_mv", "schema_migrations"} {
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
	for _, table := range []string{"runs", "runs_dead_letter", "runs_per_minute"} {
		if s := showCreate(table); !strings.Contains(s, "TTL ") || !strings.Contains(s, "toIntervalDay(90)") {
			t.Errorf("%s has no 90-day TTL:\n%s", table, s)
		}
	}
	res, err := migrate.Migrate(ctx, db.Conn, migrate.Options{Database: db.Name, RetentionDays: 30})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.TTLChanged) != 3 || len(res.Applied) != 0 {
		t.Fatalf("retention change: %+v, want 3 TTLs changed and no migration", res)
	}
	for _, table := range []string{"runs", "runs_dead_letter", "runs_per_minute"} {
		if s := showCreate(table); !strings.Contains(s, "toIntervalDay(30)") {
			t.Errorf("%s TTL not updated to 30 days:\n%s", table, s)
		}
	}
}
