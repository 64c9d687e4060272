// Package migrate creates and upgrades sys1's ClickHouse schema with versioned migrations
// embedded in the binary.
//
// Migrations are the files sql/NNNN_name.sql, applied in version order. A table
// <db>.schema_migrations records each applied version with a checksum of its text, so running
// Migrate again is a no-op, and a database migrated by a newer sys1 (a version this binary
// does not know) is refused with an error rather than written to with an older schema in mind.
// Every statement is written to be idempotent (IF NOT EXISTS), so two migrators racing or a
// migration interrupted half-way converge when run again.
//
// Retention is configuration, not history: after the versioned migrations, Migrate brings the
// TTL of every table in line with the configured retention (ALTER ... MODIFY TTL when it
// differs), so changing SYS1_RETENTION_DAYS takes effect on the next migrate.
//
// On a cluster (Options.Cluster, SYS1_CLICKHOUSE_CLUSTER) the same migrations render
// differently: every statement runs ON CLUSTER, each table is stored as <table>_local with a
// Replicated*MergeTree engine, and <table> is a Distributed table over it, sharded by run id,
// that inserts and reads go through. So the sink, the views and analysts' queries name the
// same tables either way. Render shows the DDL without running it.
package migrate

import (
	"bytes"
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"text/template"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

//go:embed sql/*.sql
var files embed.FS

// Migration is one embedded schema version.
type Migration struct {
	Version  uint32
	Name     string
	Checksum string // sha256 hex of the template text
	text     string
}

// Options parameterise the schema.
type Options struct {
	// Database is the ClickHouse database; it must be a plain identifier.
	Database string
	// RetentionDays is the TTL of run records, labels, dead letters and aggregates.
	RetentionDays int
	// Cluster is the name of a ClickHouse cluster (a remote_servers entry) to create the
	// schema on; empty for a single server (or ClickHouse Cloud, which replicates by itself).
	// The cluster needs ClickHouse Keeper (or ZooKeeper) and the macros {shard} and {replica}
	// on every node.
	Cluster string
}

// Applied is one row of schema_migrations.
type Applied struct {
	Version   uint32
	Name      string
	Checksum  string
	AppliedAt time.Time
}

var (
	fileName    = regexp.MustCompile(`^(\d{4})_([a-z0-9_]+)\.sql$`)
	identifier  = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)
	clusterName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_-]{0,62}$`)
)

// Migrations returns the embedded migrations in version order.
func Migrations() ([]Migration, error) {
	entries, err := fs.ReadDir(files, "sql")
	if err != nil {
		return nil, fmt.Errorf("read embedded migrations: %w", err)
	}
	var out []Migration
	for _, e := range entries {
		m := fileName.FindStringSubmatch(e.Name())
		if m == nil {
			return nil, fmt.Errorf("embedded migration %q: name must be NNNN_name.sql", e.Name())
		}
		v, _ := strconv.ParseUint(m[1], 10, 32)
		b, err := files.ReadFile("sql/" + e.Name())
		if err != nil {
			return nil, fmt.Errorf("read embedded migration %s: %w", e.Name(), err)
		}
		sum := sha256.Sum256(b)
		out = append(out, Migration{Version: uint32(v), Name: m[2], Checksum: hex.EncodeToString(sum[:]), text: string(b)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	for i := range out {
		if out[i].Version != uint32(i+1) {
			return nil, fmt.Errorf("embedded migrations must be numbered 1, 2, 3, …; found %04d at position %d", out[i].Version, i+1)
		}
	}
	return out, nil
}

// Latest is the newest schema version this binary knows.
func Latest() uint32 {
	ms, err := Migrations()
	if err != nil || len(ms) == 0 {
		return 0
	}
	return ms[len(ms)-1].Version
}

// Validate checks the options.
func (o Options) Validate() error {
	if !identifier.MatchString(o.Database) {
		return fmt.Errorf("database %q is not a plain ClickHouse identifier (letters, digits, _; not starting with a digit)", o.Database)
	}
	if o.RetentionDays < 1 {
		return fmt.Errorf("retention must be at least 1 day, got %d", o.RetentionDays)
	}
	if o.Cluster != "" && !clusterName.MatchString(o.Cluster) {
		return fmt.Errorf("cluster %q is not a ClickHouse cluster name (letters, digits, _ and -, starting with a letter or _, at most 63)", o.Cluster)
	}
	return nil
}

// ValidCluster reports whether name can be a cluster name (empty means no cluster).
func ValidCluster(name string) bool { return name == "" || clusterName.MatchString(name) }

// replicaPath is where a replicated table keeps its state in Keeper: per shard, database
// and table ({database} and {table} are expanded by ClickHouse itself).
const replicaPath = "'/clickhouse/tables/{shard}/{database}/{table}', '{replica}'"

// schema renders the parts of a statement that differ between one server and a cluster.
type schema struct {
	opts Options
	db   string // the quoted database
}

func (s schema) onCluster() string {
	if s.opts.Cluster == "" {
		return ""
	}
	return " ON CLUSTER `" + s.opts.Cluster + "`"
}

// local names the table that stores rows: <table> on one server, <table>_local on a cluster.
func (s schema) local(table string) string {
	if s.opts.Cluster == "" {
		return s.db + "." + table
	}
	return s.db + "." + table + "_local"
}

// engine turns a MergeTree engine into its replicated form on a cluster:
// ReplacingMergeTree(v) → ReplicatedReplacingMergeTree('<path>', '{replica}', v).
func (s schema) engine(e string) string {
	if s.opts.Cluster == "" {
		return e
	}
	name, args, _ := strings.Cut(e, "(")
	args = strings.TrimSuffix(args, ")")
	if args != "" {
		args = ", " + args
	}
	return "Replicated" + name + "(" + replicaPath + args + ")"
}

// settings writes a table's SETTINGS clause. On one server it adds the deduplication window
// that makes a retried insert with the same insert_deduplication_token a no-op (replicated
// tables deduplicate through Keeper by themselves).
func (s schema) settings(extra ...string) string {
	var all []string
	if s.opts.Cluster == "" {
		all = append(all, "non_replicated_deduplication_window = 1000")
	}
	all = append(all, extra...)
	if len(all) == 0 {
		return ""
	}
	return "SETTINGS " + strings.Join(all, ", ")
}

// distributed is, on a cluster, the statement (re)creating <table> as a Distributed table over
// <table>_local with its structure; on one server nothing. shardingKey may be empty for a
// table nobody inserts into through it.
func (s schema) distributed(table, shardingKey string) string {
	if s.opts.Cluster == "" {
		return ""
	}
	key := ""
	if shardingKey != "" {
		key = ", " + shardingKey
	}
	return fmt.Sprintf("CREATE OR REPLACE TABLE %s.%s%s AS %s\nENGINE = Distributed('%s', '%s', '%s_local'%s)",
		s.db, table, s.onCluster(), s.local(table), s.opts.Cluster, s.opts.Database, table, key)
}

// render executes a migration template for opts.
func render(name, text string, opts Options) (string, error) {
	sc := schema{opts: opts, db: "`" + opts.Database + "`"}
	tmpl, err := template.New(name).Option("missingkey=error").Funcs(template.FuncMap{
		"local": sc.local, "engine": sc.engine, "settings": sc.settings, "distributed": sc.distributed,
	}).Parse(text)
	if err != nil {
		return "", fmt.Errorf("parse template: %w", err)
	}
	var buf bytes.Buffer
	if err := tmpl.Execute(&buf, struct {
		DB            string
		RetentionDays int
		OnCluster     string
		Cluster       string
	}{sc.db, opts.RetentionDays, sc.onCluster(), opts.Cluster}); err != nil {
		return "", fmt.Errorf("render: %w", err)
	}
	return buf.String(), nil
}

// bootstrap creates the database and the table that records applied migrations. On a
// cluster that table is replicated across every node (its Keeper path has no {shard}), so
// each node sees which versions ran.
func bootstrap(opts Options) []string {
	sc := schema{opts: opts, db: "`" + opts.Database + "`"}
	engine := "ReplacingMergeTree(applied_at)"
	if opts.Cluster != "" {
		engine = "ReplicatedReplacingMergeTree('/clickhouse/tables/all/{database}/{table}', '{replica}', applied_at)"
	}
	return []string{
		"CREATE DATABASE IF NOT EXISTS " + sc.db + sc.onCluster(),
		"CREATE TABLE IF NOT EXISTS " + sc.db + ".schema_migrations" + sc.onCluster() + ` (
		version UInt32, name String, checksum String, applied_at DateTime64(3, 'UTC')
	) ENGINE = ` + engine + ` ORDER BY version`,
	}
}

// Render returns the whole schema's DDL for opts, statement by statement, without running it:
// what Migrate runs on an empty database (the TTL is already the configured one). `sys1
// migrate -print` shows it; operators can review or apply it by hand.
func Render(opts Options) (string, error) {
	if err := opts.Validate(); err != nil {
		return "", err
	}
	ms, err := Migrations()
	if err != nil {
		return "", err
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "-- sys1 ClickHouse schema version %d, database %s", ms[len(ms)-1].Version, opts.Database)
	if opts.Cluster != "" {
		fmt.Fprintf(&sb, ", cluster %s", opts.Cluster)
	}
	fmt.Fprintf(&sb, ", retention %d days.\n", opts.RetentionDays)
	write := func(stmts []string) {
		for _, st := range stmts {
			sb.WriteString("\n")
			sb.WriteString(st)
			// A statement may end in a comment line; its ';' must not be part of it.
			if last := st[strings.LastIndexByte(st, '\n')+1:]; strings.Contains(last, "--") {
				sb.WriteString("\n")
			}
			sb.WriteString(";\n")
		}
	}
	sb.WriteString("\n-- bootstrap\n")
	write(bootstrap(opts))
	for _, m := range ms {
		stmts, err := m.Statements(opts)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(&sb, "\n-- %04d_%s\n", m.Version, m.Name)
		write(stmts)
	}
	return sb.String(), nil
}

// Statements renders migration m for opts and splits it into statements.
func (m Migration) Statements(opts Options) ([]string, error) {
	text, err := render(m.Name, m.text, opts)
	if err != nil {
		return nil, fmt.Errorf("migration %04d_%s: %w", m.Version, m.Name, err)
	}
	return Statements(text), nil
}

// Result says what a Migrate call did.
type Result struct {
	From, To uint32   // schema version before and after
	Applied  []string // "0001_init", … applied by this call
	// TTLChanged lists the tables whose TTL was brought in line with RetentionDays.
	TTLChanged []string
}

// Migrate creates the database if needed, applies every embedded migration not yet recorded,
// and reconciles the TTLs with opts.RetentionDays.
func Migrate(ctx context.Context, conn driver.Conn, opts Options) (Result, error) {
	var res Result
	if err := opts.Validate(); err != nil {
		return res, err
	}
	ms, err := Migrations()
	if err != nil {
		return res, err
	}
	db := "`" + opts.Database + "`"
	boot := bootstrap(opts)
	if err := conn.Exec(ctx, boot[0]); err != nil {
		return res, fmt.Errorf("create database %s: %w", opts.Database, err)
	}
	if err := conn.Exec(ctx, boot[1]); err != nil {
		return res, fmt.Errorf("create %s.schema_migrations: %w", opts.Database, err)
	}
	applied, err := AppliedMigrations(ctx, conn, opts.Database)
	if err != nil {
		return res, err
	}
	done := make(map[uint32]Applied, len(applied))
	for _, a := range applied {
		done[a.Version] = a
		if a.Version > res.From {
			res.From = a.Version
		}
	}
	latest := ms[len(ms)-1].Version
	if res.From > latest {
		return res, fmt.Errorf("database %s has schema version %d but this sys1 knows only up to %d: it was migrated by a newer sys1; run that version (or newer) instead of downgrading", opts.Database, res.From, latest)
	}
	for _, m := range ms {
		// A recorded version is done even if its text changed since (a comment fix changes
		// the checksum); schema changes always go into a new version.
		if _, ok := done[m.Version]; ok {
			continue
		}
		stmts, err := m.Statements(opts)
		if err != nil {
			return res, err
		}
		for i, s := range stmts {
			if err := conn.Exec(ctx, s); err != nil {
				return res, fmt.Errorf("migration %04d_%s, statement %d of %d: %w", m.Version, m.Name, i+1, len(stmts), err)
			}
		}
		if err := conn.Exec(ctx, "INSERT INTO "+db+".schema_migrations (version, name, checksum, applied_at) VALUES (?, ?, ?, ?)",
			m.Version, m.Name, m.Checksum, time.Now().UTC()); err != nil {
			return res, fmt.Errorf("record migration %04d_%s: %w", m.Version, m.Name, err)
		}
		res.Applied = append(res.Applied, fmt.Sprintf("%04d_%s", m.Version, m.Name))
	}
	res.To = latest
	changed, err := reconcileTTL(ctx, conn, opts)
	if err != nil {
		return res, err
	}
	res.TTLChanged = changed
	return res, nil
}

// AppliedMigrations lists the recorded migrations of database, oldest first.
func AppliedMigrations(ctx context.Context, conn driver.Conn, database string) ([]Applied, error) {
	rows, err := conn.Query(ctx, "SELECT version, name, checksum, applied_at FROM `"+database+"`.schema_migrations FINAL ORDER BY version")
	if err != nil {
		return nil, fmt.Errorf("read %s.schema_migrations: %w", database, err)
	}
	defer rows.Close()
	var out []Applied
	for rows.Next() {
		var a Applied
		if err := rows.Scan(&a.Version, &a.Name, &a.Checksum, &a.AppliedAt); err != nil {
			return nil, fmt.Errorf("read %s.schema_migrations: %w", database, err)
		}
		out = append(out, a)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read %s.schema_migrations: %w", database, err)
	}
	return out, nil
}

// ttlTables are the tables whose TTL follows RetentionDays, with their TTL column expression.
var ttlTables = []struct{ table, expr string }{
	{"runs", "toDateTime(finished_at)"},
	{"runs_dead_letter", "toDateTime(received_at)"},
	{"runs_per_minute", "minute"},
	{"labels", "toDateTime(accepted_at)"},
}

var ttlDays = regexp.MustCompile(`TTL .*toIntervalDay\((\d+)\)`)

// reconcileTTL sets each table's TTL to RetentionDays where it differs. ClickHouse stores
// "INTERVAL n DAY" as toIntervalDay(n), which is what is compared. On a cluster the storage
// tables (<table>_local) carry the TTL, and the definition read is this node's.
func reconcileTTL(ctx context.Context, conn driver.Conn, opts Options) ([]string, error) {
	var changed []string
	sc := schema{opts: opts, db: "`" + opts.Database + "`"}
	for _, t := range ttlTables {
		name := t.table
		if opts.Cluster != "" {
			name += "_local"
		}
		var create string
		if err := conn.QueryRow(ctx, "SELECT create_table_query FROM system.tables WHERE database = ? AND name = ?", opts.Database, name).Scan(&create); err != nil {
			return changed, fmt.Errorf("read the definition of %s.%s: %w", opts.Database, name, err)
		}
		if m := ttlDays.FindStringSubmatch(create); m != nil && m[1] == strconv.Itoa(opts.RetentionDays) {
			continue
		}
		q := fmt.Sprintf("ALTER TABLE %s%s MODIFY TTL %s + INTERVAL %d DAY", sc.local(t.table), sc.onCluster(), t.expr, opts.RetentionDays)
		if err := conn.Exec(ctx, q); err != nil {
			return changed, fmt.Errorf("set the TTL of %s.%s to %d days: %w", opts.Database, t.table, opts.RetentionDays, err)
		}
		changed = append(changed, t.table)
	}
	return changed, nil
}
