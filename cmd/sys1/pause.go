package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sys1hq/sys1/worker"
	"github.com/sys1hq/sys1/worker/natsconn"
	"github.com/sys1hq/sys1/worker/pause"
	"github.com/sys1hq/sys1/worker/topology"
)

func init() {
	register(command{name: "pause", summary: "pause every replica (JetStream consumer pause); queued requests wait", run: runPause})
	register(command{name: "resume", summary: "end a pause early", run: runResume})
}

const pauseUsage = `usage: sys1 pause [--for 10m | --until RFC3339] [--reason TEXT] [--batch]

Pauses the fleet: every replica stops taking interactive and batch requests at once (the
pause is an entry of the KV bucket sys1-fleet, which every replica follows). Runs in flight
finish; queued requests wait in the stream, nothing is lost; after the pause a request whose
Sys1-Deadline passed is answered SYS1_EXPIRED as usual. Without --for or --until the pause
lasts until sys1 resume. --batch pauses batch requests only. Health says "paused" on every
replica at once.
`

const resumeUsage = `usage: sys1 resume [--batch]

Ends a pause at once (interactive and batch requests, or with --batch batch requests only).
`

func runPause(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("pause", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, pauseUsage); fs.PrintDefaults() }
	forD := fs.Duration("for", 0, "pause for this long (e.g. 10m)")
	until := fs.String("until", "", "pause until this RFC 3339 time")
	reason := fs.String("reason", "", "why (shown by sys1 status and health)")
	batchOnly := fs.Bool("batch", false, "pause batch requests only")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	now := time.Now()
	end := now.Add(worker.UntilResumed)
	switch {
	case fs.NArg() > 0:
		fmt.Fprintf(stderr, "sys1 pause: unexpected argument %q\n", fs.Arg(0))
		return exitUsage
	case *forD != 0 && *until != "":
		fmt.Fprintln(stderr, "sys1 pause: give --for or --until, not both")
		return exitUsage
	case *forD < 0:
		fmt.Fprintf(stderr, "sys1 pause: --for must be positive, got %s\n", *forD)
		return exitUsage
	case *forD > 0:
		end = now.Add(*forD)
	case *until != "":
		t, err := time.Parse(time.RFC3339Nano, *until)
		if err != nil {
			fmt.Fprintf(stderr, "sys1 pause: --until %q is not an RFC 3339 time\n", *until)
			return exitUsage
		}
		if !t.After(now) {
			fmt.Fprintf(stderr, "sys1 pause: --until %s is not in the future\n", t.Format(time.RFC3339))
			return exitUsage
		}
		end = t
	}
	if len(*reason) > 512 {
		fmt.Fprintln(stderr, "sys1 pause: --reason is limited to 512 bytes")
		return exitUsage
	}
	topo, conn, code := openTopology(ctx, "sys1 pause", stderr)
	if conn == nil {
		return code
	}
	defer conn.Close()
	kv, err := fleetBucket(ctx, conn, topo)
	if err != nil {
		fmt.Fprintf(stderr, "sys1 pause: %s\n", fleetAPIError(conn.NC, err, "pause"))
		return exitFailed
	}
	state := pause.State{Until: end, Reason: *reason, At: now.UTC()}
	for _, lane := range pausedLanes(*batchOnly) {
		if err := pause.Set(ctx, kv, lane, state); err != nil {
			fmt.Fprintf(stderr, "sys1 pause: %s\n", fleetAPIError(conn.NC, err, "pause"))
			return exitFailed
		}
		if *forD == 0 && *until == "" {
			fmt.Fprintf(stdout, "paused %s requests until sys1 resume\n", lane)
		} else {
			fmt.Fprintf(stdout, "paused %s requests until %s\n", lane, end.UTC().Format(time.RFC3339))
		}
	}
	return exitOK
}

func runResume(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("resume", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, resumeUsage); fs.PrintDefaults() }
	batchOnly := fs.Bool("batch", false, "resume batch requests only")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "sys1 resume: unexpected argument %q\n", fs.Arg(0))
		return exitUsage
	}
	topo, conn, code := openTopology(ctx, "sys1 resume", stderr)
	if conn == nil {
		return code
	}
	defer conn.Close()
	kv, err := fleetBucket(ctx, conn, topo)
	if err != nil {
		fmt.Fprintf(stderr, "sys1 resume: %s\n", fleetAPIError(conn.NC, err, "resume"))
		return exitFailed
	}
	for _, lane := range pausedLanes(*batchOnly) {
		if err := pause.Clear(ctx, kv, lane); err != nil {
			fmt.Fprintf(stderr, "sys1 resume: %s\n", fleetAPIError(conn.NC, err, "resume"))
			return exitFailed
		}
		fmt.Fprintf(stdout, "resumed %s requests\n", lane)
	}
	return exitOK
}

func pausedLanes(batchOnly bool) []topology.Lane {
	if batchOnly {
		return []topology.Lane{topology.LaneBatch}
	}
	return pause.Lanes
}

// fleetBucket opens the fleet's bucket (KV sys1-fleet), creating it when no worker has yet.
func fleetBucket(ctx context.Context, conn *natsconn.Conn, topo topology.Config) (jetstream.KeyValue, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	kv, err := conn.JS.KeyValue(ctx, topo.FleetBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = topology.EnsureKeyValue(ctx, conn.JS, topo.FleetBucketConfig())
	}
	if err != nil {
		return nil, fmt.Errorf("fleet bucket %s: %w", topo.FleetBucket, err)
	}
	return kv, nil
}

// readPauses is every lane's pause now (none when the bucket does not exist yet).
func readPauses(ctx context.Context, conn *natsconn.Conn, topo topology.Config) (map[topology.Lane]pause.State, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	kv, err := conn.JS.KeyValue(ctx, topo.FleetBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("fleet bucket %s: %w", topo.FleetBucket, err)
	}
	return pause.Read(ctx, kv)
}

// describedPause is a lane's pause as health and sys1 status --json show it.
func describedPause(s pause.State) *worker.PauseState {
	p := &worker.PauseState{Reason: s.Reason, Since: s.At.UTC().Format(time.RFC3339)}
	if !s.Open() {
		until := s.Until.UTC()
		p.Until = &until
	}
	return p
}

// fleetAPIError says why pausing or resuming failed, in an operator's words. A NATS user
// without the permission gets no answer at all — the server refuses the request with an
// asynchronous "Permissions Violation" and the call times out — so the connection's last error
// is what tells a refusal from a server that is not answering.
func fleetAPIError(nc *nats.Conn, err error, what string) string {
	_ = nc.FlushTimeout(time.Second) // the refusal, if any, arrives before the flush's answer
	if last := nc.LastError(); errors.Is(last, nats.ErrPermissionViolation) && (strings.Contains(last.Error(), "$JS.API.") || strings.Contains(last.Error(), "$KV.")) {
		return fmt.Sprintf("permission denied: this NATS user may not %s the fleet (%v); sys1 pause and sys1 resume need an operator's NATS user, allowed to read and write the KV bucket %s ($KV.%s.>, $JS.API.STREAM.INFO.KV_%s; README, Security)",
			what, last, topology.Default().FleetBucket, topology.Default().FleetBucket, topology.Default().FleetBucket)
	}
	if errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse) {
		return fmt.Sprintf("%v (nothing answered: is JetStream enabled on this NATS server, and the fleet bucket's leader up?)", err)
	}
	return err.Error()
}
