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
	"github.com/sys1hq/sys1/worker/topology"
)

func init() {
	register(command{name: "pause", summary: "pause every replica (JetStream consumer pause); queued requests wait", run: runPause})
	register(command{name: "resume", summary: "end a pause early", run: runResume})
}

const pauseUsage = `usage: sys1 pause [--for 10m | --until RFC3339] [--reason TEXT] [--batch]

Pauses the shared consumers (sys1-worker and sys1-worker-batch), so every replica stops
receiving at once (JetStream consumer pause, nats-server 2.11+). Runs in flight finish;
queued requests wait in the stream, nothing is lost; after the pause a request whose
Sys1-Deadline passed is answered SYS1_EXPIRED as usual. Without --for or --until the pause
lasts until sys1 resume. --batch pauses batch requests only. Health says "paused" on every
replica within SYS1_STATUS_INTERVAL (1s).
`

const resumeUsage = `usage: sys1 resume [--batch]

Ends a pause at once (both consumers, or with --batch the batch consumer only).
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
	for _, name := range pausedConsumers(topo, *batchOnly) {
		err := topology.Pause(ctx, conn.JS, topo.RequestsStream, name, end, *reason)
		if errors.Is(err, jetstream.ErrConsumerNotFound) && name == topo.BatchConsumer {
			continue // no batch consumer yet: nothing to pause
		}
		if err != nil {
			fmt.Fprintf(stderr, "sys1 pause: %s\n", consumerAPIError(conn.NC, err, "pause"))
			return exitFailed
		}
		if *forD == 0 && *until == "" {
			fmt.Fprintf(stdout, "paused %s until sys1 resume\n", name)
		} else {
			fmt.Fprintf(stdout, "paused %s until %s\n", name, end.UTC().Format(time.RFC3339))
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
	for _, name := range pausedConsumers(topo, *batchOnly) {
		err := topology.Resume(ctx, conn.JS, topo.RequestsStream, name)
		if errors.Is(err, jetstream.ErrConsumerNotFound) && name == topo.BatchConsumer {
			continue
		}
		if err != nil {
			fmt.Fprintf(stderr, "sys1 resume: %s\n", consumerAPIError(conn.NC, err, "resume"))
			return exitFailed
		}
		fmt.Fprintf(stdout, "resumed %s\n", name)
	}
	return exitOK
}

func pausedConsumers(topo topology.Config, batchOnly bool) []string {
	if batchOnly {
		return []string{topo.BatchConsumer}
	}
	return []string{topo.WorkerConsumer, topo.BatchConsumer}
}

// consumerAPIError says why pausing or resuming a consumer failed, in an operator's words. A
// NATS user without the permission gets no answer at all — the server refuses the request
// with an asynchronous "Permissions Violation" and the call times out — so the connection's
// last error is what tells a refusal from a server too old for consumer pause (2.11+, which
// leaves the pause request unanswered: no responders).
func consumerAPIError(nc *nats.Conn, err error, what string) string {
	_ = nc.FlushTimeout(time.Second) // the refusal, if any, arrives before the flush's answer
	if last := nc.LastError(); errors.Is(last, nats.ErrPermissionViolation) && strings.Contains(last.Error(), "$JS.API.") {
		return fmt.Sprintf("permission denied: this NATS user may not %s the shared consumers (%v); sys1 pause and sys1 resume need an operator's NATS user, allowed $JS.API.CONSUMER.INFO, $JS.API.CONSUMER.UPDATE and $JS.API.CONSUMER.PAUSE on %s (README, Security)",
			what, last, topology.Default().RequestsStream)
	}
	if errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse) {
		return fmt.Sprintf("%v (nothing answered: consumer pause needs nats-server 2.11 or later)", err)
	}
	return err.Error()
}
