package main

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/sys1hq/sys1/cmd/sys1/internal/soak"
	"github.com/sys1hq/sys1/worker/natsconn"
)

func init() {
	register(command{name: "soak", summary: "chaos run: a whole fleet killed and cut off under mixed load, then checked", run: runSoak})
}

const soakUsage = `usage: sys1 soak --clickhouse DSN [--duration 10m] [--seed N] [flags]

Runs a whole fleet on this machine — 3 NATS nodes as processes (R3 streams and buckets),
--workers worker processes, the sink writing to ClickHouse, the review page — under a mixed load
(interactive callers with a day budget, with the exact cache, held for review; sys1 batch runs,
some killed and resumed; producers' labels; an automatic reviewer working the review page), while
a seeded fault plan SIGKILLs and restarts workers and NATS nodes (sometimes the leader of the
request stream, of the run-id gate's bucket or of the budgets' bucket; sometimes every node at
once), cuts ClickHouse off, pauses the fleet and makes the model slow or failing. The plan and
every fault print as they happen; --seed replays the plan.

At the end it checks, from outside the workers: every request JetStream acknowledged got exactly
one final answer; no run was scored twice; every held reply was released once, after its label;
each budget admitted exactly its limit; every batch item has one result line; ClickHouse holds
one record per run and one row per label under FINAL; no consumer is left with pending or
unacknowledged messages; every process still runs. Each violation prints its runs and the
fault timeline around them. See deploy/reliability.md.

Exit status: 0 no violations, 1 violations, 2 usage or set-up errors.

flags:
`

func runSoak(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("soak", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, soakUsage); fs.PrintDefaults() }
	var o soak.Options
	fs.DurationVar(&o.Duration, "duration", 10*time.Minute, "how long the load runs (faults stop by 85% of it)")
	fs.DurationVar(&o.Drain, "drain", 3*time.Minute, "how long to wait after the load for the fleet to answer everything")
	seed := fs.Uint64("seed", 0, "the fault plan's seed (default: a random one, printed)")
	fs.StringVar(&o.ClickHouseDSN, "clickhouse", os.Getenv("SYS1_CLICKHOUSE_DSN"), "ClickHouse for the sink (a fresh database is made and dropped) [$SYS1_CLICKHOUSE_DSN]")
	fs.IntVar(&o.Workers, "workers", 3, "worker processes")
	fs.Float64Var(&o.Rate, "rate", 15, "interactive requests per second, over every caller")
	fs.IntVar(&o.BatchItems, "batch-items", 500, "items of each sys1 batch run beside the load, one after another (0: none)")
	faults := fs.String("faults", "all", "faults to inject: all, none, or a comma list of worker, nats, nats+worker, cluster, clickhouse, pause, slow, fail")
	fs.StringVar(&o.SyncInterval, "sync", soak.DefaultSyncInterval, "the NATS nodes' JetStream sync_interval (always, or a duration such as 2m)")
	fs.StringVar(&o.NATSServer, "nats-server", "", "a nats-server binary for the NATS nodes (default: go.mod's nats-server, built into this binary)")
	fs.StringVar(&o.Sys1, "sys1", "", "the sys1 binary the fleet runs (default: this one)")
	fs.StringVar(&o.Dir, "dir", "", "directory for stores, configuration and logs (default: a temporary one, removed unless --keep)")
	fs.BoolVar(&o.Keep, "keep", false, "keep the directory and the ClickHouse database")
	jsonOut := fs.String("json", "", "also write the verdict as JSON to this file")
	natsNode := fs.String("nats-node", "", "internal: run one NATS node from this configuration file (the soak and bench --fairness start their nodes so)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "sys1 soak: unexpected argument %q\n", fs.Arg(0))
		return exitUsage
	}
	if *natsNode != "" {
		if err := natsconn.RunServer(ctx, *natsNode); err != nil {
			fmt.Fprintln(stderr, "sys1 soak --nats-node:", err)
			return exitFailed
		}
		return exitOK
	}
	kinds, err := soak.ParseKinds(*faults)
	if err != nil {
		fmt.Fprintln(stderr, "sys1 soak: --faults:", err)
		return exitUsage
	}
	o.Kinds = kinds
	if o.ClickHouseDSN == "" {
		fmt.Fprintln(stderr, "sys1 soak: --clickhouse DSN is required (for a local one: DSN=$(../shared/tools/chshim/start.sh PORT))")
		return exitUsage
	}
	if o.Sys1 == "" {
		if o.Sys1, err = os.Executable(); err != nil {
			fmt.Fprintln(stderr, "sys1 soak: cannot find this binary; give --sys1:", err)
			return exitUsage
		}
	}
	o.Seed = *seed
	if o.Seed == 0 {
		var b [8]byte
		_, _ = rand.Read(b[:])
		o.Seed = binary.LittleEndian.Uint64(b[:])>>1 | 1
	}
	o.Out = stderr
	res, err := soak.Run(ctx, o)
	if err != nil {
		fmt.Fprintln(stderr, "sys1 soak:", err)
		return exitUsage
	}
	res.Print(stdout)
	if *jsonOut != "" {
		b, err := res.JSON()
		if err == nil {
			err = os.WriteFile(*jsonOut, append(b, '\n'), 0o644)
		}
		if err != nil {
			fmt.Fprintln(stderr, "sys1 soak: --json:", err)
		}
	}
	if len(res.Report.Violations()) > 0 {
		return exitFailed
	}
	return exitOK
}
