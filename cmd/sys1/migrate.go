package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/url"
	"strings"
	"time"

	"github.com/sys1hq/sys1/sink"
	"github.com/sys1hq/sys1/sink/migrate"
)

// defaultMigrateWait is how long `sys1 migrate` retries a ClickHouse that does not answer.
const defaultMigrateWait = time.Minute

func init() {
	register(command{name: "migrate", summary: "create or upgrade the ClickHouse schema (SYS1_CLICKHOUSE_DSN)", run: runMigrate})
}

// runMigrate applies the embedded migrations and reconciles the TTL with
// SYS1_RETENTION_DAYS. With -status it only reports the schema version; with -print it only
// prints the DDL it would run on an empty database (SYS1_CLICKHOUSE_DATABASE,
// SYS1_CLICKHOUSE_CLUSTER, SYS1_RETENTION_DAYS), without connecting.
func runMigrate(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	status := fs.Bool("status", false, "report the applied migrations and change nothing")
	printDDL := fs.Bool("print", false, "print the schema's DDL for this configuration and change nothing (needs no ClickHouse)")
	wait := fs.Duration("wait", defaultMigrateWait, "how long to keep retrying while ClickHouse does not answer (backoff: SYS1_SINK_RETRY_MIN to SYS1_SINK_RETRY_MAX)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: sys1 migrate [-status | -print] [-wait DURATION]\n\nCreates or upgrades the sys1 schema in ClickHouse (SYS1_CLICKHOUSE_DSN,\nSYS1_CLICKHOUSE_DATABASE, SYS1_CLICKHOUSE_CLUSTER, SYS1_RETENTION_DAYS). Running it again\nis a no-op. While ClickHouse does not answer it retries with backoff for up to -wait.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return exitOK
		}
		return exitUsage
	}
	if fs.NArg() > 0 || *status && *printDDL {
		fs.Usage()
		return exitUsage
	}
	cfg := sink.DefaultConfig()
	var logCfg LogConfig
	if *printDDL {
		if err := loadConfig(&logCfg, &cfg); err != nil {
			fmt.Fprintln(stderr, "sys1 migrate:", err)
			return exitUsage
		}
		ddl, err := migrate.Render(cfg.MigrateOptions())
		if err != nil {
			fmt.Fprintln(stderr, "sys1 migrate:", err)
			return exitUsage
		}
		if _, err := io.WriteString(stdout, ddl); err != nil {
			fmt.Fprintf(stderr, "sys1 migrate: write: %v\n", err)
			return exitFailed
		}
		return exitOK
	}
	waitPositive := check(func() []error {
		if *wait <= 0 {
			return []error{fmt.Errorf("-wait: must be positive, got %s", *wait)}
		}
		return nil
	})
	if err := loadConfig(&logCfg, &cfg, requireDSN(&cfg), waitPositive); err != nil {
		fmt.Fprintln(stderr, "sys1 migrate:", err)
		return exitUsage
	}
	// ClickHouse may still be starting (a migrate job started with it): retry, within -wait.
	log := newLogger(stderr, logCfg, "migrate")
	wctx, cancel := context.WithTimeout(ctx, *wait)
	conn, tries, err := connectClickHouse(wctx, cfg, log, "ClickHouse does not answer yet; retrying")
	cancel()
	if err != nil {
		host := "(unparseable DSN)"
		if u, perr := url.Parse(cfg.DSN); perr == nil {
			host = u.Host // never the user info
		}
		if ctx.Err() != nil {
			// Stopped (SIGINT/SIGTERM) while waiting: nothing was migrated, so not a success.
			fmt.Fprintf(stderr, "sys1 migrate: stopped while waiting for ClickHouse at %s; nothing was migrated\n", host)
			return exitFailed
		}
		fmt.Fprintf(stderr, "sys1 migrate: ClickHouse at %s did not answer within %s (%d tries); last error: %v\n", host, *wait, tries, err)
		return exitUsage
	}
	defer conn.Close()

	if *status {
		applied, err := migrate.AppliedMigrations(ctx, conn, cfg.Database)
		if err != nil {
			fmt.Fprintf(stderr, "sys1 migrate: %v (has `sys1 migrate` run on database %s?)\n", err, cfg.Database)
			return exitFailed
		}
		var current uint32
		for _, a := range applied {
			fmt.Fprintf(stdout, "%04d_%s\tapplied %s\n", a.Version, a.Name, a.AppliedAt.UTC().Format(time.RFC3339))
			current = max(current, a.Version)
		}
		fmt.Fprintf(stdout, "database %s: schema version %d; this sys1 knows up to %d\n", cfg.Database, current, migrate.Latest())
		return exitOK
	}

	res, err := migrate.Migrate(ctx, conn, cfg.MigrateOptions())
	if err != nil {
		fmt.Fprintln(stderr, "sys1 migrate:", err)
		return exitFailed
	}
	if len(res.Applied) == 0 {
		fmt.Fprintf(stdout, "database %s: schema is up to date (version %d)\n", cfg.Database, res.To)
	} else {
		fmt.Fprintf(stdout, "database %s: schema version %d -> %d (applied %s)\n", cfg.Database, res.From, res.To, strings.Join(res.Applied, ", "))
	}
	if len(res.TTLChanged) > 0 && res.From > 0 {
		fmt.Fprintf(stdout, "database %s: retention set to %d days on %s\n", cfg.Database, cfg.RetentionDays, strings.Join(res.TTLChanged, ", "))
	}
	return exitOK
}
