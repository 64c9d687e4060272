package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sys1hq/sys1/cmd/sys1/internal/batch"
	"github.com/sys1hq/sys1/contract/wire"
	"github.com/sys1hq/sys1/worker/natsconn"
	"github.com/sys1hq/sys1/worker/topology"
)

func init() {
	register(command{name: "batch", summary: "run a dataset as a batch (run), and follow or stop it (status, cancel)", run: runBatch})
}

const batchUsage = `usage: sys1 batch run FILE [-o OUT] [flags]
       sys1 batch status ID [--caller CALLER] [--json]
       sys1 batch cancel ID [--caller CALLER] [--json]

run: publishes every line of FILE to sys1.batch.<caller>.<batch id>, at most --in-flight at a
time, and writes OUT (default FILE.results.jsonl): one line per input line, in input order,
{"custom_id", "line", "run_id", "status", "result" | "error", "verdicts"?}, status success,
failed, invalid (refused here, never sent) or cancelled. OUT.errors.jsonl holds every line that
did not succeed. Both are written as .partial files and renamed when complete.

FILE is JSONL, optionally gzip-compressed: each line a System One request or
{"custom_id": "…", "body": {request}}; a line without a custom id is named by its line number.
With --template, FILE holds rows (CSV or TSV with a header, or JSONL objects) and each row fills
the template's "state": the --state-field columns as an object, or the whole row.
Every line is checked with the contract first; a bad line is reported and skipped. Duplicate
custom ids stop the batch before anything is sent.

Resume: the batch id is --id or derived from FILE's bytes, the caller and the options that
shape requests, so the same command on the same file is the same batch. Run it again after any
interruption (even kill -9): finished items are answered from the run-id gate's stored
outcomes without calling the model, and the output is the same, byte for byte.

status and cancel read the run-id gate and the request stream: they need an operator's NATS
permissions (gate bucket and stream API). cancel removes the batch's queued requests and marks
it cancelled: finished items keep their results, the rest are reported cancelled, now and by
every later run of the batch.

Exit status: 0 every item succeeded; 1 some failed, were invalid or were cancelled (status:
the batch is unknown); 2 usage, input, configuration or connection errors, or interrupted
(run the same command again to resume).

Connection: as 'sys1 decide' (SYS1_NATS_URL, SYS1_NATS_*). Replies come to an inbox under
SYS1_NATS_INBOX_PREFIX, by default _INBOX.<caller>, the inbox a producer may read under
deploy/nats. A bearer JWT for auth mode jwt comes from --token or SYS1_TOKEN.
`

func runBatch(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stderr, batchUsage)
		if len(args) == 0 {
			return exitUsage
		}
		return exitOK
	}
	switch args[0] {
	case "run":
		return batchRun(ctx, args[1:], stdout, stderr)
	case "status":
		return batchStatus(ctx, args[1:], stdout, stderr)
	case "cancel":
		return batchCancel(ctx, args[1:], stdout, stderr)
	}
	fmt.Fprintf(stderr, "sys1 batch: unknown subcommand %q (run, status or cancel)\n\n%s", args[0], batchUsage)
	return exitUsage
}

// listFlag is a repeatable string flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

// parseInterleaved parses flags that may come before or after the positional arguments (like
// 'sys1 decide'); after "--" everything is positional.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for rest := args; ; {
		if err := fs.Parse(rest); err != nil {
			return nil, err
		}
		if used := len(rest) - fs.NArg(); used > 0 && rest[used-1] == "--" {
			return append(pos, fs.Args()...), nil
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos, rest = append(pos, fs.Arg(0)), fs.Args()[1:]
	}
}

// lockedWriter serialises writes from the run's goroutines (progress, warnings).
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// maxListedInvalid bounds the invalid lines printed while validating; all are in the errors
// file.
const maxListedInvalid = 20

func batchRun(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("batch run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, batchUsage+"\nflags of run:\n"); fs.PrintDefaults() }
	var stateFields listFlag
	out := fs.String("o", "", "output file (default FILE.results.jsonl; errors in OUT.errors.jsonl)")
	fs.StringVar(out, "output", "", "same as -o")
	caller := fs.String("caller", envOr("SYS1_CALLER", "cli"), "caller token: publishes to sys1.batch.<caller>.<batch id>")
	id := fs.String("id", "", "batch id, 1–64 of A-Za-z0-9_- (default: derived from the input, so a rerun resumes)")
	template := fs.String("template", "", "a System One request whose state each row of FILE fills")
	fs.Var(&stateFields, "state-field", "with --template: a row field that goes into the state object (repeatable; default: the whole row)")
	idField := fs.String("id-field", "", "with --template: the row field holding the custom id (default custom_id, if present)")
	format := fs.String("format", batch.FormatAuto, "input format: auto (by name: .csv, .tsv, else JSONL), jsonl, csv or tsv")
	inFlight := fs.Int("in-flight", batch.DefaultInFlight, "requests published and not yet answered, at most")
	deadline := fs.String("deadline", "", "Sys1-Deadline of every request: a duration from now (2h) or an RFC 3339 time")
	token := fs.String("token", "", "bearer JWT for auth mode jwt (default $SYS1_TOKEN)")
	resendAfter := fs.Duration("resend-after", batch.DefaultResendAfter, "publish an item again when its reply is this late while later items were answered (a lost reply)")
	progress := fs.String("progress", "auto", "progress on stderr: auto (a live bar on a terminal, else a line every 10s), always (the bar), never")
	summaryJSON := fs.String("summary-json", "", "also write the summary as JSON to this file")
	dryRun := fs.Bool("dry-run", false, "validate every line, print counts and a time estimate, send nothing")
	connectWait := fs.Duration("connect-wait", time.Minute, "how long to wait for NATS at start (a restart or failover); NATS lost later is waited out anyway")
	files, err := parseInterleaved(fs, args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	fail := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "sys1 batch run: "+format+"\n", a...)
		return exitUsage
	}
	if len(files) != 1 {
		fs.Usage()
		return fail("exactly one FILE, got %d", len(files))
	}
	path := files[0]
	var problems []string
	if err := batch.ValidCaller(*caller); err != nil {
		problems = append(problems, "--caller: "+err.Error())
	}
	if *id != "" {
		if err := batch.ValidBatchID(*id); err != nil {
			problems = append(problems, "--id: "+err.Error())
		}
	}
	if *inFlight < 1 || *inFlight > 100000 {
		problems = append(problems, fmt.Sprintf("--in-flight must be 1–100000, got %d", *inFlight))
	}
	if *resendAfter <= 0 {
		problems = append(problems, fmt.Sprintf("--resend-after must be positive, got %s", *resendAfter))
	}
	if *connectWait <= 0 {
		problems = append(problems, fmt.Sprintf("--connect-wait must be positive, got %s", *connectWait))
	}
	switch *progress {
	case "auto", "always", "never":
	default:
		problems = append(problems, fmt.Sprintf("--progress must be auto, always or never, got %q", *progress))
	}
	var dl time.Time
	if *deadline != "" {
		if dl, err = parseDeadlineFlag(*deadline, time.Now()); err != nil {
			problems = append(problems, "--deadline: "+err.Error())
		}
	}
	if *token == "" {
		*token = os.Getenv("SYS1_TOKEN")
	}
	in := batch.Input{Path: path, Format: *format, StateFields: stateFields, IDField: *idField}
	if *template != "" {
		b, err := os.ReadFile(*template)
		if err != nil {
			problems = append(problems, "--template: "+err.Error())
		} else if in.Template, err = batch.ParseTemplate(b); err != nil {
			problems = append(problems, fmt.Sprintf("--template %s: %v", *template, err))
		}
	} else if *idField != "" {
		problems = append(problems, "--id-field needs --template")
	}
	if *template == "" || in.Template != nil { // a template that did not parse is reported already
		if err := in.Check(); err != nil {
			problems = append(problems, err.Error())
		}
	}
	// The connection's settings are checked now, with the flags, not after a long validation
	// pass; dialClientInbox reads them again to connect.
	topo := topology.Default()
	ncfg := natsconn.DefaultConfig()
	ncfg.URL = defaultClientURL()
	if err := loadConfig(&topo, &ncfg); err != nil {
		problems = append(problems, err.Error())
	}
	if len(problems) > 0 {
		return fail("%s", strings.Join(problems, "\n  "))
	}
	if *out == "" {
		*out = path + ".results.jsonl"
	}
	if sameFile(*out, path) || sameFile(batch.ErrorsPath(*out), path) {
		return fail("the output %s would overwrite the input", *out)
	}

	// Pass 1: validate everything, find duplicates, hash the input. Nothing is sent yet.
	listed := 0
	plan, err := batch.Scan(ctx, in, func(e *batch.Entry) {
		if e.Valid() {
			return
		}
		if listed < maxListedInvalid {
			fmt.Fprintf(stderr, "line %d (custom id %s): %s\n", e.Line, strconv.Quote(e.CustomID), e.Err.Message)
		}
		listed++
	})
	if err != nil {
		if errors.Is(err, context.Canceled) {
			return fail("interrupted while validating the input")
		}
		return fail("%v", err)
	}
	if listed > maxListedInvalid {
		fmt.Fprintf(stderr, "… and %d more invalid lines (all of them in %s)\n", listed-maxListedInvalid, batch.ErrorsPath(*out))
	}
	if err := plan.DuplicatesError(); err != nil {
		return fail("%v", err)
	}
	batchID := *id
	if batchID == "" {
		batchID = batch.DeriveBatchID(plan.InputHash, *caller, in.Fingerprint())
	}
	if *dryRun {
		return dryRunReport(ctx, stdout, stderr, plan, batchID, *caller, *out)
	}
	if plan.Valid == 0 {
		fmt.Fprintf(stderr, "sys1 batch run: no line of %s is valid; nothing to send\n", path)
	}

	// stderr is shared by the progress line, warnings and the NATS connection's log, which
	// write from their own goroutines: errw serialises them.
	errw := &lockedWriter{w: stderr}
	conn, err := dialClientWait(ctx, "sys1 batch", errw, wire.Inbox(*caller), *connectWait)
	if err != nil {
		return fail("%v", err)
	}
	defer conn.Close()
	o, err := batch.CreateOutput(*out)
	if err != nil {
		return fail("%v", err)
	}
	pw := &batch.ProgressWriter{W: stderr, Live: showProgress(*progress, stderr), Width: terminalWidth(), Label: batchID}
	cfg := batch.RunConfig{
		Caller: *caller, BatchID: batchID, InFlight: *inFlight, Deadline: dl, Token: *token,
		ResendAfter: *resendAfter, RunsBucket: topo.RunsBucket,
		Warn: func(msg string) {
			errw.mu.Lock()
			defer errw.mu.Unlock()
			pw.Clear()
			fmt.Fprintf(stderr, "sys1 batch run: %s\n", msg)
		},
	}
	if *progress != "never" {
		cfg.Progress = func(p batch.Progress) {
			errw.mu.Lock()
			defer errw.mu.Unlock()
			pw.Update(p)
		}
		if !pw.Live {
			cfg.ProgressEvery = time.Second
		}
	}
	fmt.Fprintf(errw, "batch %s: %d lines (%d valid, %d invalid) to sys1.batch.%s.%s\n", batchID, plan.Entries, plan.Valid, plan.Invalid, *caller, batchID)
	sum, err := batch.Run(ctx, conn.NC, in, plan, o, cfg)
	errw.mu.Lock() // the run's goroutines are done with stderr
	defer errw.mu.Unlock()
	if err != nil {
		pw.Clear()
		switch {
		case errors.Is(err, context.Canceled):
			fmt.Fprintf(stderr, "sys1 batch run: %v; nothing complete was written (%s is partial); run the same command again to resume\n", err, *out+batch.PartialSuffix)
		default:
			fmt.Fprintf(stderr, "sys1 batch run: %v\n", err)
		}
		return exitUsage
	}
	sum.Print(stdout)
	if *summaryJSON != "" {
		b, _ := json.MarshalIndent(sum, "", "  ")
		if err := os.WriteFile(*summaryJSON, append(b, '\n'), 0o644); err != nil {
			return fail("--summary-json: %v", err)
		}
	}
	if sum.Failed+sum.Invalid+sum.Cancelled > 0 {
		return exitFailed
	}
	return exitOK
}

// sameFile reports whether a and b name one file (b exists; a may not).
func sameFile(a, b string) bool {
	sa, errA := os.Stat(a)
	sb, errB := os.Stat(b)
	if errA != nil || errB != nil {
		return false
	}
	return os.SameFile(sa, sb)
}

// terminalWidth is $COLUMNS, or 80.
func terminalWidth() int {
	if n, err := strconv.Atoi(os.Getenv("COLUMNS")); err == nil && n > 20 {
		return n
	}
	return 80
}

// estimateWait is how long --dry-run waits for the replicas' capabilities.
var estimateWait = time.Second

func dryRunReport(ctx context.Context, stdout, stderr io.Writer, plan *batch.Plan, batchID, caller, out string) int {
	fmt.Fprintf(stdout, "batch %s (dry run: nothing sent)\n", batchID)
	fmt.Fprintf(stdout, "  lines: %d (%d valid, %d invalid)\n", plan.Entries, plan.Valid, plan.Invalid)
	if plan.Valid > 0 {
		qs := make([]int, 0, len(plan.QuestionsPerRequest))
		for q := range plan.QuestionsPerRequest {
			qs = append(qs, q)
		}
		sort.Ints(qs)
		var parts []string
		for _, q := range qs {
			parts = append(parts, fmt.Sprintf("%d with %d", plan.QuestionsPerRequest[q], q))
		}
		fmt.Fprintf(stdout, "  questions per request: %s (%d questions, %d request bytes)\n", strings.Join(parts, ", "), plan.Questions(), plan.BodyBytes)
	}
	fmt.Fprintf(stdout, "  subject: sys1.batch.%s.%s; output: %s\n", caller, batchID, out)
	// The estimate needs the replicas; without NATS it is simply not available.
	conn, err := dialClientInbox(ctx, "sys1 batch", io.Discard, wire.Inbox(caller))
	if err != nil {
		fmt.Fprintf(stdout, "  estimate: none: cannot reach NATS (%v)\n", err)
	} else {
		est := batch.EstimateDuration(ctx, conn.NC, plan.Valid, estimateWait)
		conn.Close()
		if est.Unavailable != "" {
			fmt.Fprintf(stdout, "  estimate: none: %s\n", est.Unavailable)
		} else {
			fmt.Fprintf(stdout, "  estimate: at least %s: %d replica(s), %d provider slots, recent provider latency %.0f ms, so at most %.1f decisions/s (interactive requests go first, so a busy fleet takes longer)\n",
				(time.Duration(est.DurationMS) * time.Millisecond).Round(time.Second), est.Replicas, est.Concurrency, est.LatencyMS, est.PerSecond)
		}
	}
	if plan.Invalid > 0 {
		return exitFailed
	}
	return exitOK
}

func batchStatus(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("batch status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	caller := fs.String("caller", "", "count only queued requests of this caller (default: any)")
	asJSON := fs.Bool("json", false, "print JSON")
	ids, err := parseInterleaved(fs, args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if len(ids) != 1 {
		fmt.Fprintf(stderr, "sys1 batch status: exactly one batch ID, got %d\n", len(ids))
		return exitUsage
	}
	topo := topology.Default()
	if err := loadConfig(&topo); err != nil {
		fmt.Fprintf(stderr, "sys1 batch status: %v\n", err)
		return exitUsage
	}
	conn, err := dialClient(ctx, "sys1 batch status", stderr)
	if err != nil {
		fmt.Fprintf(stderr, "sys1 batch status: %v\n", err)
		return exitUsage
	}
	defer conn.Close()
	rep, err := batch.Status(ctx, conn.JS, batch.Names{RequestsStream: topo.RequestsStream, RunsBucket: topo.RunsBucket}, ids[0], *caller)
	if err != nil {
		fmt.Fprintf(stderr, "sys1 batch status: %v\n", err)
		return exitUsage
	}
	if *asJSON {
		b, _ := json.MarshalIndent(rep, "", "  ")
		fmt.Fprintln(stdout, string(b))
	} else {
		rep.Print(stdout)
	}
	if !rep.Known() {
		fmt.Fprintf(stderr, "sys1 batch status: no trace of batch %s: never run here, or its runs expired (SYS1_RUN_ID_TTL)\n", ids[0])
		return exitFailed
	}
	return exitOK
}

// cancelSettle is how long cancel waits before its second purge: longer than a running batch's
// cancel-marker poll (batch.DefaultCancelPoll), so what a run published before it noticed is
// purged too.
var cancelSettle = 2*batch.DefaultCancelPoll + time.Second

func batchCancel(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("batch cancel", flag.ContinueOnError)
	fs.SetOutput(stderr)
	caller := fs.String("caller", "", "purge only queued requests of this caller (default: any)")
	asJSON := fs.Bool("json", false, "print JSON")
	ids, err := parseInterleaved(fs, args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if len(ids) != 1 {
		fmt.Fprintf(stderr, "sys1 batch cancel: exactly one batch ID, got %d\n", len(ids))
		return exitUsage
	}
	topo := topology.Default()
	if err := loadConfig(&topo); err != nil {
		fmt.Fprintf(stderr, "sys1 batch cancel: %v\n", err)
		return exitUsage
	}
	conn, err := dialClient(ctx, "sys1 batch cancel", stderr)
	if err != nil {
		fmt.Fprintf(stderr, "sys1 batch cancel: %v\n", err)
		return exitUsage
	}
	defer conn.Close()
	rep, err := batch.Cancel(ctx, conn.NC, conn.JS, batch.Names{RequestsStream: topo.RequestsStream, RunsBucket: topo.RunsBucket}, ids[0], *caller, time.Now(), cancelSettle)
	if err != nil {
		fmt.Fprintf(stderr, "sys1 batch cancel: %v\n", err)
		return exitUsage
	}
	if *asJSON {
		b, _ := json.MarshalIndent(rep, "", "  ")
		fmt.Fprintln(stdout, string(b))
		return exitOK
	}
	if rep.AlreadyCancelled {
		fmt.Fprintf(stdout, "batch %s was already cancelled at %s; ", rep.BatchID, rep.CancelledAt.Format(time.RFC3339))
	} else {
		fmt.Fprintf(stdout, "batch %s cancelled at %s; ", rep.BatchID, rep.CancelledAt.Format(time.RFC3339))
	}
	fmt.Fprintf(stdout, "%d queued requests removed from the stream (reported cancelled); finished items keep their results\n", rep.Purged)
	rep.After.Print(stdout)
	return exitOK
}
