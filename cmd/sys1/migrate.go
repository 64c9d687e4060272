package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/sys1hq/sys1/sink"
	"github.com/sys1hq/sys1/sink/migrate"
)

func init() {
	register(command{name: "migrate", summary: "create or upgrade the ClickHouse schema (SYS1_CLICKHOUSE_DSN)", run: runMigrate})
}

// runMigrate applies the embedded migrations and reconciles the TTL with
// SYS1_RETENTION_DAYS. With -status it only reports the schema version.
func runMigrate(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	status := fs.Bool("status", false, "report the applied migrations and change nothing")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: sys1 migrate [-status]\n\nCreates or upgrades the sys1 schema in ClickHouse (SYS1_CLICKHOUSE_DSN,\nSYS1_CLICKHOUSE_DATABASE, SYS1_RETENTION_DAYS). Running it again is a no-op.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return exitOK
		}
		return exitUsage
	}
	if fs.NArg() > 0 {
		fs.Usage()
		return exitUsage
	}
	cfg := sink.DefaultConfig()
	var logCfg LogConfig
	if err := loadConfig(&logCfg, &cfg); err != nil {
		fmt.Fprintln(stderr, "sys1 migrate:", err)
		return exitUsage
	}
	if cfg.DSN == "" {
		fmt.Fprintln(stderr, "sys1 migrate: SYS1_CLICKHOUSE_DSN is not set (e.g. clickhouse://localhost:9000 or http://localhost:8123)")
		return exitUsage
	}
	octx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := sink.Open(octx, cfg)
	if err != nil {
		fmt.Fprintln(stderr, "sys1 migrate:", err)
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
