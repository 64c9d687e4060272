package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/trace"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/contract/wire"
	"github.com/sys1hq/sys1/worker/client"
	"github.com/sys1hq/sys1/worker/tracing"
)

func init() {
	register(command{name: "decide", summary: "publish one request and print the reply", run: runDecide})
}

const decideUsage = `usage: sys1 decide [flags] [FILE|-]

Publishes one System One request (FILE, or standard input for - or no argument) to
sys1.decide.<caller>, waits for the reply and prints it as JSON.

Exit status: 0 success, 1 failed (the reply's error is printed) or refused by JetStream
(nothing was stored: the caller already has SYS1_REQUESTS_MAX_PER_CALLER requests waiting,
or the request stream is full), 2 usage or connection error.

Connection: SYS1_NATS_URL (default nats://127.0.0.1:4222, the embedded server of
'sys1 worker'), with SYS1_NATS_CREDS, SYS1_NATS_NKEY, SYS1_NATS_USER/SYS1_NATS_PASSWORD,
SYS1_NATS_TOKEN and SYS1_NATS_TLS_* as for the worker. A user that may read only its own
inbox (deploy/nats) needs SYS1_NATS_INBOX_PREFIX=_INBOX.<user>. A bearer JWT for auth mode
jwt comes from --token or SYS1_TOKEN.

Tracing: the request carries a W3C traceparent, of the trace in TRACEPARENT (and
TRACESTATE) when set, else of a new trace; the run record's trace_id names it.

flags:
`

func runDecide(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("decide", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, decideUsage); fs.PrintDefaults() }
	caller := fs.String("caller", envOr("SYS1_CALLER", "cli"), "caller token: publishes to sys1.decide.<caller>")
	runID := fs.String("run-id", "", "run id (default: a fresh one)")
	deadline := fs.String("deadline", "", "deadline: a duration from now (30s) or an RFC 3339 time")
	model := fs.String("model", "", "override the request's model")
	timeout := fs.Duration("timeout", 60*time.Second, "how long to wait for the reply")
	noWait := fs.Bool("no-wait", false, "publish, print the run id and exit without waiting")
	token := fs.String("token", "", "bearer JWT for auth mode jwt (default $SYS1_TOKEN)")
	// Flags may come before or after FILE (sys1 decide ticket.json --caller billing): Go's
	// flag package stops at the first argument, so parse again after each one. After "--"
	// everything is an argument.
	var files []string
	for rest := args; ; {
		if err := fs.Parse(rest); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return exitOK
			}
			return exitUsage
		}
		if used := len(rest) - fs.NArg(); used > 0 && rest[used-1] == "--" {
			files = append(files, fs.Args()...)
			break
		}
		if fs.NArg() == 0 {
			break
		}
		files, rest = append(files, fs.Arg(0)), fs.Args()[1:]
	}
	if len(files) > 1 {
		fmt.Fprintf(stderr, "sys1 decide: at most one FILE, got %d (%s)\n", len(files), strings.Join(files, ", "))
		fs.Usage()
		return exitUsage
	}
	if *timeout <= 0 && !*noWait {
		fmt.Fprintf(stderr, "sys1 decide: --timeout must be positive, got %s (use --no-wait not to wait)\n", *timeout)
		return exitUsage
	}
	file := ""
	if len(files) == 1 {
		file = files[0]
	}
	if *token == "" {
		*token = os.Getenv("SYS1_TOKEN")
	}
	body, err := readRequest(file)
	if err != nil {
		fmt.Fprintf(stderr, "sys1 decide: %v\n", err)
		return exitUsage
	}
	if *model != "" {
		if body, err = withModel(body, *model); err != nil {
			fmt.Fprintf(stderr, "sys1 decide: --model: %v\n", err)
			return exitUsage
		}
	}
	req := client.Request{Caller: *caller, Body: body, RunID: *runID, Token: *token}
	if *deadline != "" {
		if req.Deadline, err = parseDeadlineFlag(*deadline, time.Now()); err != nil {
			fmt.Fprintf(stderr, "sys1 decide: --deadline: %v\n", err)
			return exitUsage
		}
	}

	// Replies and JetStream acks come to _INBOX.<caller>.…, the inbox deploy/nats lets producer
	// <caller> read and the worker answers (SYS1_NATS_INBOX_PREFIX overrides it).
	conn, err := dialClientInbox(ctx, "sys1 decide", stderr, wire.Inbox(strings.TrimSpace(*caller)))
	if err != nil {
		fmt.Fprintf(stderr, "sys1 decide: %v\n", err)
		return exitUsage
	}
	defer conn.Close()
	cl, err := client.New(conn.NC)
	if err != nil {
		fmt.Fprintf(stderr, "sys1 decide: %v\n", err)
		return exitUsage
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	ctx = traceFromEnv(ctx, stderr)
	if *noWait {
		id, err := cl.Publish(ctx, req)
		if err != nil {
			fmt.Fprintf(stderr, "sys1 decide: %v\n", err)
			return publishExit(err)
		}
		fmt.Fprintln(stdout, id)
		return exitOK
	}
	reply, err := cl.Decide(ctx, req)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			fmt.Fprintf(stderr, "sys1 decide: no reply within %s (is a worker running? the run may still complete; its record will show it)\n", *timeout)
		} else {
			fmt.Fprintf(stderr, "sys1 decide: %v\n", err)
		}
		return publishExit(err)
	}
	if err := printJSON(stdout, reply.Raw); err != nil {
		fmt.Fprintf(stderr, "sys1 decide: %v\n", err)
	}
	if reply.Status != contract.StatusSuccess {
		return exitFailed
	}
	return exitOK
}

// publishExit is the exit status of a request that got no reply: 1 when JetStream refused it
// for the caller's quota or a full stream (the run was refused, as a failed run is), 2 for
// usage and connection trouble.
func publishExit(err error) int {
	if errors.Is(err, client.ErrQuotaExceeded) || errors.Is(err, client.ErrStreamFull) {
		return exitFailed
	}
	return exitUsage
}

// traceFromEnv joins the trace the environment names (TRACEPARENT, TRACESTATE: the
// OpenTelemetry convention for handing a trace to a command). A malformed TRACEPARENT is
// reported and ignored: the request starts a new trace.
func traceFromEnv(ctx context.Context, stderr io.Writer) context.Context {
	tp := strings.TrimSpace(os.Getenv("TRACEPARENT"))
	if tp == "" {
		return ctx
	}
	hdr := nats.Header{}
	hdr.Set(tracing.HeaderTraceParent, tp)
	if ts := os.Getenv("TRACESTATE"); ts != "" {
		hdr.Set(tracing.HeaderTraceState, ts)
	}
	out := tracing.Extract(ctx, hdr)
	if !trace.SpanContextFromContext(out).IsValid() {
		fmt.Fprintf(stderr, "sys1 decide: TRACEPARENT is not a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>); the request starts a new trace\n")
		return ctx
	}
	return out
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func readRequest(path string) ([]byte, error) {
	var (
		b   []byte
		err error
	)
	if path == "" || path == "-" {
		b, err = io.ReadAll(io.LimitReader(os.Stdin, 64<<20))
	} else {
		b, err = os.ReadFile(path)
	}
	if err != nil {
		return nil, fmt.Errorf("read request: %w", err)
	}
	if len(strings.TrimSpace(string(b))) == 0 {
		return nil, errors.New("empty request")
	}
	return b, nil
}

// withModel sets "model" while keeping every other member byte for byte where the caller put
// it (a request that was not there already gets model first). It is a splice, not a decode and
// re-encode: unknown fields and duplicate keys must still reach the worker, which reports
// them, rather than be dropped here silently.
func withModel(body []byte, model string) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, errors.New("the request is not a JSON object")
	}
	type member struct {
		key   string
		value json.RawMessage
	}
	modelJSON, _ := json.Marshal(model)
	var members []member
	set := false
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("the request is not valid JSON: %w", err)
		}
		key, _ := tok.(string)
		var value json.RawMessage
		if err := dec.Decode(&value); err != nil {
			return nil, fmt.Errorf("the request is not valid JSON: %w", err)
		}
		if key == "model" {
			if set {
				continue
			}
			value, set = modelJSON, true
		}
		members = append(members, member{key, value})
	}
	if _, err := dec.Token(); err != nil {
		return nil, fmt.Errorf("the request is not valid JSON: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("the request is not one JSON object")
	}
	if !set {
		members = append([]member{{"model", modelJSON}}, members...)
	}
	out := []byte{'{'}
	for i, m := range members {
		if i > 0 {
			out = append(out, ',')
		}
		k, _ := json.Marshal(m.key)
		out = append(append(append(out, k...), ':'), m.value...)
	}
	return append(out, '}'), nil
}

func parseDeadlineFlag(v string, now time.Time) (time.Time, error) {
	if d, err := time.ParseDuration(v); err == nil {
		if d <= 0 {
			return time.Time{}, fmt.Errorf("%q is not in the future", v)
		}
		return now.Add(d), nil
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Time{}, fmt.Errorf("%q is neither a duration (30s) nor an RFC 3339 time", v)
	}
	return t, nil
}

func printJSON(w io.Writer, raw []byte) error {
	var out strings.Builder
	var v json.RawMessage = raw
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		_, err = w.Write(append(raw, '\n'))
		return err
	}
	out.Write(b)
	out.WriteByte('\n')
	_, err = io.WriteString(w, out.String())
	return err
}
