package main

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sys1hq/sys1/cmd/sys1/internal/batch"
	"github.com/sys1hq/sys1/cmd/sys1/internal/batch/batchtest"
	"github.com/sys1hq/sys1/worker/natsconn/natstest"
	"github.com/sys1hq/sys1/worker/topology"
)

const batchQuestions = `{"label":{"type":"choice","instructions":"Which team?","criteria":{"billing":"Payments","bug":"Errors","account":"Access"}},` +
	`"refund":{"type":"noul","instructions":"Money back?"}}`

func batchRequest(i int) string {
	return fmt.Sprintf(`{"state":{"ticket":%d,"text":"ticket number %d"},"questions":%s}`, i, i, batchQuestions)
}

// batchDeployment is a real nats-server whose batch requests a worker double answers (or
// nobody, with responder false: the streams exist, nothing consumes).
type batchDeployment struct {
	srv  *server.Server
	js   jetstream.JetStream
	resp *batchtest.Responder
}

func startBatchDeployment(t *testing.T, responder bool, opts batchtest.Options) *batchDeployment {
	t.Helper()
	srv := natstest.Start(t, func(o *server.Options) { o.MaxPayload = 8 << 20 })
	nc, js := natstest.Connect(t, srv)
	d := &batchDeployment{srv: srv, js: js}
	if responder {
		d.resp = batchtest.Start(t, nc, js, opts)
	} else if _, err := topology.Ensure(context.Background(), js, topology.Default()); err != nil {
		t.Fatal(err)
	}
	t.Setenv("SYS1_NATS_URL", srv.ClientURL())
	t.Setenv("SYS1_NATS_INBOX_PREFIX", "")
	return d
}

// batchMessages is how many batch requests the stream has stored so far.
func (d *batchDeployment) batchMessages(t *testing.T) uint64 {
	t.Helper()
	s, err := d.js.Stream(context.Background(), "SYS1_REQUESTS")
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(context.Background(), jetstream.WithSubjectFilter("sys1.batch.>"))
	if err != nil {
		t.Fatal(err)
	}
	return info.State.LastSeq
}

func sys1Batch(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), append([]string{"batch"}, args...), &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

type resultLine struct {
	CustomID string          `json:"custom_id"`
	Line     int             `json:"line"`
	RunID    string          `json:"run_id"`
	Status   string          `json:"status"`
	Result   json.RawMessage `json:"result"`
	Error    *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

func readResults(t *testing.T, path string) []resultLine {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []resultLine
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var l resultLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("%s line %d: %v", path, len(out)+1, err)
		}
		out = append(out, l)
	}
	return out
}

// TestBatchCommandCSVTemplate: rows of a CSV fill a template's state; every row is answered,
// the summary is printed and written as JSON, and the exit status is 0.
func TestBatchCommandCSVTemplate(t *testing.T) {
	d := startBatchDeployment(t, true, batchtest.Options{Concurrency: 4})
	tpl := writeFile(t, "request.json", `{"model":"nimble","questions":`+batchQuestions+`}`)
	var csv strings.Builder
	csv.WriteString("ticket_id,subject,body\n")
	for i := range 30 {
		fmt.Fprintf(&csv, "T-%d,\"Order %d, late\",\"It has not arrived, day %d\"\n", i, i, i)
	}
	rows := writeFile(t, "tickets.csv", csv.String())
	summary := filepath.Join(t.TempDir(), "summary.json")
	code, out, errOut := sys1Batch(t, "run", rows, "--template", tpl, "--state-field", "subject", "--state-field", "body",
		"--id-field", "ticket_id", "--caller", "analytics", "--progress", "never", "--summary-json", summary)
	if code != exitOK {
		t.Fatalf("exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	lines := readResults(t, rows+".results.jsonl")
	if len(lines) != 30 || lines[7].CustomID != "T-7" || lines[7].Line != 9 || lines[7].Status != "success" {
		t.Fatalf("%d results; line 8: %+v", len(lines), lines[7])
	}
	if !strings.HasPrefix(lines[7].RunID, "b-") || !strings.HasSuffix(lines[7].RunID, ":T-7") {
		t.Errorf("run id %q", lines[7].RunID)
	}
	if subj := d.resp.Subjects(); len(subj) != 1 || !strings.HasPrefix(firstKey(subj), "sys1.batch.analytics.b-") {
		t.Errorf("published on %v", subj)
	}
	for _, want := range []string{"30 lines: 30 succeeded, 0 failed, 0 invalid, 0 cancelled", "label (choice, 30 answers)", "refund (noul, 30 answers): mean P(yes)"} {
		if !strings.Contains(out, want) {
			t.Errorf("summary lacks %q:\n%s", want, out)
		}
	}
	var s batch.Summary
	if err := json.Unmarshal([]byte(readFileString(t, summary)), &s); err != nil || s.Succeeded != 30 || len(s.Questions) != 2 || s.Questions[0].Choices == nil {
		t.Errorf("summary JSON: %v %+v", err, s)
	}
	if errs := readFileString(t, rows+".results.jsonl.errors.jsonl"); errs != "" {
		t.Errorf("errors file of a clean batch: %q", errs)
	}
}

func firstKey(m map[string]int) string {
	for k := range m {
		return k
	}
	return ""
}

func readFileString(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestBatchCommandGzipInvalidLinesAndRerun: a gzip input with bad lines: they are reported on
// stderr with their line numbers and in the errors file, the rest run, the exit status is 1; the
// same command again is the same batch (no provider call) with the same output.
func TestBatchCommandGzipInvalidLinesAndRerun(t *testing.T) {
	d := startBatchDeployment(t, true, batchtest.Options{Concurrency: 4})
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	for i := range 40 {
		switch i {
		case 5:
			zw.Write([]byte(`{"custom_id":"bad","body":{"state":"x","questions":{"q":{"type":"choice","instructions":"x","criteria":{"only":"one"}}}}}` + "\n"))
		case 9:
			zw.Write([]byte("not json at all\n"))
		default:
			zw.Write([]byte(batchRequest(i) + "\n"))
		}
	}
	zw.Close()
	in := writeFile(t, "tickets.jsonl.gz", buf.String())
	out := filepath.Join(t.TempDir(), "out.jsonl")
	code, stdout, stderr := sys1Batch(t, "run", in, "-o", out, "--progress", "never")
	if code != exitFailed {
		t.Fatalf("exit %d\n%s\n%s", code, stdout, stderr)
	}
	for _, want := range []string{`line 6 (custom id "bad"): [SYS1_INVALID_INPUT]`, "questions.q.criteria", `line 10 (custom id "10"): [SYS1_INVALID_INPUT] line: not a JSON object`} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr)
		}
	}
	errs := readResults(t, out+".errors.jsonl")
	if len(errs) != 2 || errs[0].Line != 6 || errs[1].Line != 10 || errs[0].Status != "invalid" {
		t.Fatalf("errors file: %+v", errs)
	}
	first := readFileString(t, out)
	calls := len(d.resp.AllCalls())
	if calls != 38 {
		t.Errorf("%d provider calls, want 38", calls)
	}
	code, _, stderr = sys1Batch(t, "run", "--progress", "never", in, "-o", out) // flags before and after FILE
	if code != exitFailed || readFileString(t, out) != first || len(d.resp.AllCalls()) != calls {
		t.Errorf("rerun: exit %d, same output %v, calls %d → %d\n%s", code, readFileString(t, out) == first, calls, len(d.resp.AllCalls()), stderr)
	}
	for id, n := range d.resp.AllCalls() {
		if n != 1 {
			t.Errorf("%s: %d provider calls across two runs", id, n)
		}
	}
}

// TestBatchCommandRefusesBadInputBeforeSending: each bad input or flag is a clear message and
// exit status 2, and nothing reaches the stream.
func TestBatchCommandRefusesBadInputBeforeSending(t *testing.T) {
	d := startBatchDeployment(t, false, batchtest.Options{})
	good := writeFile(t, "good.jsonl", batchRequest(1)+"\n")
	dup := writeFile(t, "dup.jsonl", `{"custom_id":"a","body":`+batchRequest(1)+"}\n"+batchRequest(2)+"\n"+`{"custom_id":"a","body":`+batchRequest(3)+"}\n")
	empty := writeFile(t, "empty.jsonl", "")
	binary := writeFile(t, "photo.jpg", "\xff\xd8\xff\xe0\x00\x10JFIF\x00")
	badTpl := writeFile(t, "tpl.json", `{"model":"nimble","questions":{"q":{"type":"score","instructions":"x","criteria":["only one level"]}}}`)
	csvIn := writeFile(t, "rows.csv", "text\nhello\n")
	for name, tc := range map[string]struct {
		args []string
		want string
	}{
		"missing file":       {[]string{"run", filepath.Join(t.TempDir(), "absent.jsonl")}, "no such file or directory"},
		"empty file":         {[]string{"run", empty}, "the input is empty"},
		"binary file":        {[]string{"run", binary}, "is not text: a NUL byte at offset 4"},
		"duplicate ids":      {[]string{"run", dup}, `"a": lines 1, 3`},
		"invalid template":   {[]string{"run", csvIn, "--template", badTpl}, "the template does not make a valid request"},
		"csv, no template":   {[]string{"run", csvIn}, "add --template"},
		"template missing":   {[]string{"run", csvIn, "--template", filepath.Join(t.TempDir(), "nope.json")}, "--template"},
		"unknown column":     {[]string{"run", csvIn, "--template", writeFile(t, "t.json", `{"questions":`+batchQuestions+`}`), "--state-field", "body"}, `--state-field "body": no such column (the header has "text")`},
		"no file":            {[]string{"run"}, "exactly one FILE"},
		"two files":          {[]string{"run", good, good}, "exactly one FILE"},
		"bad in-flight":      {[]string{"run", good, "--in-flight", "0"}, "--in-flight must be 1–100000"},
		"bad batch id":       {[]string{"run", good, "--id", "q4.tickets"}, "--id: batch id"},
		"bad caller":         {[]string{"run", good, "--caller", "a.b"}, "--caller: caller"},
		"bad progress":       {[]string{"run", good, "--progress", "sometimes"}, "--progress must be"},
		"bad deadline":       {[]string{"run", good, "--deadline", "soon"}, "--deadline"},
		"id-field, no tpl":   {[]string{"run", good, "--id-field", "x"}, "--id-field needs --template"},
		"output is input":    {[]string{"run", good, "-o", good}, "would overwrite the input"},
		"unknown subcommand": {[]string{"start", good}, `unknown subcommand "start"`},
		"status, no id":      {[]string{"status"}, "exactly one batch ID"},
		"cancel, bad id":     {[]string{"cancel", "a:b"}, "batch id"},
	} {
		code, _, stderr := sys1Batch(t, tc.args...)
		if code != exitUsage || !strings.Contains(stderr, tc.want) {
			t.Errorf("%s: exit %d, stderr %q; want exit 2 and %q", name, code, stderr, tc.want)
		}
	}
	if n := d.batchMessages(t); n != 0 {
		t.Errorf("%d batch requests were published by refused commands", n)
	}
	// Several bad settings at once: one message names each of them.
	t.Setenv("SYS1_NATS_MAX_PAYLOAD", "big")
	t.Setenv("SYS1_RUNS_BUCKET", "bad.name")
	code, _, stderr := sys1Batch(t, "run", good, "--in-flight", "-3", "--caller", "a b")
	for _, want := range []string{"--in-flight", "--caller", "SYS1_NATS_MAX_PAYLOAD", "SYS1_RUNS_BUCKET"} {
		if code != exitUsage || !strings.Contains(stderr, want) {
			t.Errorf("exit %d: the message does not name %s:\n%s", code, want, stderr)
		}
	}
}

// TestBatchRunWaitsForNATSAtStart: a batch started while NATS is down (a whole-cluster
// restart; the 60-minute soak's soak-batch-31) waits for it, up to --connect-wait, instead of
// giving up after a few seconds like an interactive command.
func TestBatchRunWaitsForNATSAtStart(t *testing.T) {
	good := writeFile(t, "good.jsonl", batchRequest(1)+"\n")
	port := natstest.FreePorts(t, 1)[0]
	t.Setenv("SYS1_NATS_URL", fmt.Sprintf("nats://127.0.0.1:%d", port))
	var stderr natstest.Buffer
	done := make(chan int, 1)
	go func() {
		done <- run(context.Background(), []string{"batch", "run", good, "--progress", "never"}, io.Discard, &stderr)
	}()
	natstest.WaitFor(t, 20*time.Second, "the batch to say it waits for NATS", func() bool {
		return strings.Contains(stderr.String(), "cannot reach NATS yet")
	})
	natstest.Start(t, func(o *server.Options) { o.Port = port })
	select {
	case code := <-done:
		// Connected: with no worker ever run there, no stream stores its requests.
		if code != exitUsage || !strings.Contains(stderr.String(), "is a sys1 worker running") {
			t.Fatalf("exit %d: want the batch past its connection, refused for want of a worker:\n%s", code, stderr.String())
		}
	case <-time.After(90 * time.Second):
		t.Fatalf("the batch did not end:\n%s", stderr.String())
	}
}

// TestBatchCommandNoWorkerOrNoNATS: connection trouble is exit status 2 with a message that
// says what is missing.
func TestBatchCommandNoWorkerOrNoNATS(t *testing.T) {
	good := writeFile(t, "good.jsonl", batchRequest(1)+"\n")
	t.Setenv("SYS1_NATS_URL", "nats://127.0.0.1:1")
	if code, _, stderr := sys1Batch(t, "run", good, "--progress", "never", "--connect-wait", "500ms"); code != exitUsage || !strings.Contains(stderr, "connect to NATS") {
		t.Errorf("no NATS: exit %d, %s", code, stderr)
	}
	t.Setenv("SYS1_NATS_URL", natstest.Start(t).ClientURL())
	code, _, stderr := sys1Batch(t, "run", good, "--progress", "never")
	if code != exitUsage || !strings.Contains(stderr, "is a sys1 worker running") {
		t.Errorf("no stream: exit %d, %s", code, stderr)
	}
	if _, err := os.Stat(good + ".results.jsonl"); !os.IsNotExist(err) {
		t.Errorf("a failed run left a results file under its final name: %v", err)
	}
}

// TestBatchCommandDryRun: everything is validated and counted, nothing is sent, and without
// replicas reporting their capabilities no estimate is made up.
func TestBatchCommandDryRun(t *testing.T) {
	d := startBatchDeployment(t, false, batchtest.Options{})
	estimateWait = 200 * time.Millisecond
	t.Cleanup(func() { estimateWait = time.Second })
	lines := []string{batchRequest(1), batchRequest(2), `{"state":"x","questions":{"q":{"type":"noul","instructions":"y"}}}`}
	in := writeFile(t, "in.jsonl", strings.Join(lines, "\n"))
	code, out, stderr := sys1Batch(t, "run", in, "--dry-run")
	if code != exitOK {
		t.Fatalf("exit %d\n%s\n%s", code, out, stderr)
	}
	for _, want := range []string{"dry run: nothing sent", "lines: 3 (3 valid, 0 invalid)", "questions per request: 1 with 1, 2 with 2 (5 questions", "estimate: none: no replica answered sys1.svc.capabilities"} {
		if !strings.Contains(out, want) {
			t.Errorf("dry run lacks %q:\n%s", want, out)
		}
	}
	bad := writeFile(t, "bad.jsonl", batchRequest(1)+"\n{}\n")
	if code, out, _ := sys1Batch(t, "run", bad, "--dry-run"); code != exitFailed || !strings.Contains(out, "1 invalid") {
		t.Errorf("dry run with an invalid line: exit %d\n%s", code, out)
	}
	if n := d.batchMessages(t); n != 0 {
		t.Errorf("a dry run published %d requests", n)
	}
	if _, err := os.Stat(in + ".results.jsonl"); !os.IsNotExist(err) {
		t.Error("a dry run wrote output")
	}
}

// TestBatchCommandStatusAndCancel: status while a batch runs, cancel from another command, the
// run ends with the cancelled items reported, status says the same, and --json works.
func TestBatchCommandStatusAndCancel(t *testing.T) {
	d := startBatchDeployment(t, true, batchtest.Options{Concurrency: 2, Delay: func(string) time.Duration { return 5 * time.Millisecond }})
	var lines []string
	for i := range 400 {
		lines = append(lines, batchRequest(i))
	}
	in := writeFile(t, "in.jsonl", strings.Join(lines, "\n"))
	type result struct {
		code           int
		stdout, stderr string
	}
	done := make(chan result, 1)
	go func() {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), []string{"batch", "run", in, "--id", "q4-tickets", "--in-flight", "16", "--progress", "never"}, &stdout, &stderr)
		done <- result{code, stdout.String(), stderr.String()}
	}()
	natstest.WaitFor(t, 30*time.Second, "some items answered", func() bool { return len(d.resp.AllCalls()) >= 50 })
	code, out, stderr := sys1Batch(t, "status", "q4-tickets")
	if code != exitOK || !regexp.MustCompile(`finished +\d+ \(succeeded \d+, failed 0, cancelled 0\)`).MatchString(out) || !strings.Contains(out, "in stream") {
		t.Errorf("status while running: exit %d\n%s\n%s", code, out, stderr)
	}
	code, out, stderr = sys1Batch(t, "cancel", "q4-tickets")
	if code != exitOK || !strings.Contains(out, "batch q4-tickets cancelled at") || !strings.Contains(out, "finished items keep their results") {
		t.Errorf("cancel: exit %d\n%s\n%s", code, out, stderr)
	}
	r := <-done
	if r.code != exitFailed || !strings.Contains(r.stderr, "was cancelled at") || !regexp.MustCompile(`400 lines: \d+ succeeded, 0 failed, 0 invalid, [1-9]\d* cancelled`).MatchString(r.stdout) {
		t.Fatalf("the cancelled run: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	var st batch.StatusReport
	natstest.WaitFor(t, 10*time.Second, "the stream to drain", func() bool {
		code, out, _ := sys1Batch(t, "status", "q4-tickets", "--json")
		return code == exitOK && json.Unmarshal([]byte(out), &st) == nil && st.InStream == 0
	})
	results := readResults(t, in+".results.jsonl")
	var ok, cancelled int
	for _, l := range results {
		switch l.Status {
		case "success":
			ok++
		case "cancelled":
			cancelled++
		}
	}
	if st.Succeeded != ok || st.Cancelled != cancelled || ok+cancelled != 400 || st.CancelledAt == nil {
		t.Errorf("status %+v; output has %d succeeded, %d cancelled", st, ok, cancelled)
	}
	if code, _, stderr := sys1Batch(t, "status", "never-ran"); code != exitFailed || !strings.Contains(stderr, "no trace of batch never-ran") {
		t.Errorf("unknown batch: exit %d %s", code, stderr)
	}
}

// TestBatchCommandInboxPrefixDefaultsToTheCaller: a producer that may read only _INBOX.<user>.>
// and publish only its own batches (deploy/nats) runs a batch with no inbox setting at all.
func TestBatchCommandInboxPrefixDefaultsToTheCaller(t *testing.T) {
	srv := natstest.Start(t, func(o *server.Options) {
		o.Users = []*server.User{
			{Username: "ops", Password: "ops-pw"},
			{Username: "svc-a", Password: "svc-a-pw", Permissions: &server.Permissions{
				Publish:   &server.SubjectPermission{Allow: []string{"sys1.batch.svc-a.*", "$JS.API.INFO"}, Deny: []string{"$KV.>", "$JS.API.STREAM.>", "$JS.API.DIRECT.>"}},
				Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX.svc-a.>"}},
			}},
		}
	})
	opsNC, opsJS := natstest.Connect(t, srv, nats.UserInfo("ops", "ops-pw"))
	resp := batchtest.Start(t, opsNC, opsJS, batchtest.Options{})
	t.Setenv("SYS1_NATS_URL", srv.ClientURL())
	t.Setenv("SYS1_NATS_USER", "svc-a")
	t.Setenv("SYS1_NATS_PASSWORD", "svc-a-pw")
	t.Setenv("SYS1_NATS_INBOX_PREFIX", "")
	in := writeFile(t, "in.jsonl", batchRequest(1)+"\n"+batchRequest(2)+"\n")
	code, out, stderr := sys1Batch(t, "run", in, "--caller", "svc-a", "--progress", "never")
	if code != exitOK || len(resp.AllCalls()) != 2 {
		t.Fatalf("exit %d, %d calls\n%s\n%s", code, len(resp.AllCalls()), out, stderr)
	}
	// It may not read the cancel markers, and says so rather than failing.
	if !strings.Contains(stderr, "cannot read the batch's cancel marker") {
		t.Errorf("no word about the unreadable cancel marker:\n%s", stderr)
	}
	// An inbox it may not read is refused before anything is sent.
	t.Setenv("SYS1_NATS_INBOX_PREFIX", "_INBOX.other")
	code, _, stderr = sys1Batch(t, "run", in, "--caller", "svc-a", "--progress", "never", "--id", "other-inbox")
	if code != exitUsage || !strings.Contains(stderr, "may not subscribe to its reply inbox") {
		t.Errorf("foreign inbox: exit %d\n%s", code, stderr)
	}
}

// TestBatchCommandDeadline: --deadline goes on every request as Sys1-Deadline; items past it
// fail SYS1_EXPIRED (failed, not cancelled: the batch was not cancelled).
func TestBatchCommandDeadline(t *testing.T) {
	d := startBatchDeployment(t, true, batchtest.Options{})
	in := writeFile(t, "in.jsonl", batchRequest(1)+"\n"+batchRequest(2)+"\n")
	code, out, stderr := sys1Batch(t, "run", in, "--deadline", "2001-02-03T04:05:06Z", "--progress", "never")
	if code != exitFailed || !strings.Contains(out, "2 failed") || !strings.Contains(out, "SYS1_EXPIRED 2") {
		t.Fatalf("exit %d\n%s\n%s", code, out, stderr)
	}
	for _, l := range readResults(t, in+".results.jsonl") {
		if l.Status != "failed" || l.Error.Code != "SYS1_EXPIRED" || !strings.Contains(l.Error.Message, "2001-02-03T04:05:06Z") {
			t.Errorf("line %d: %s %+v", l.Line, l.Status, l.Error)
		}
	}
	if len(d.resp.AllCalls()) != 0 {
		t.Error("an expired item reached the provider")
	}
	// A relative deadline is from now, and goes on the requests too.
	in2 := writeFile(t, "in2.jsonl", batchRequest(3)+"\n")
	before := time.Now()
	if code, out, stderr := sys1Batch(t, "run", in2, "--deadline", "1h", "--progress", "never"); code != exitOK {
		t.Errorf("--deadline 1h: exit %d\n%s\n%s", code, out, stderr)
	}
	dl, err := time.Parse(time.RFC3339Nano, d.resp.Header(readResults(t, in2+".results.jsonl")[0].RunID).Get("Sys1-Deadline"))
	if err != nil || dl.Before(before.Add(time.Hour)) || dl.After(time.Now().Add(time.Hour)) {
		t.Errorf("Sys1-Deadline of --deadline 1h: %s %v", dl, err)
	}
}

// TestBatchCommandKeepsTheTokenToTheRequests: the bearer token goes in the requests'
// Authorization header and nowhere else: not on stdout or stderr, not in the output files.
func TestBatchCommandKeepsTheTokenToTheRequests(t *testing.T) {
	d := startBatchDeployment(t, true, batchtest.Options{})
	const token = "eyJhbGciOiJIUzI1NiJ9.c2VjcmV0LXRva2Vu.sekrit-signature"
	in := writeFile(t, "in.jsonl", batchRequest(1)+"\n{}\n")
	summary := filepath.Join(t.TempDir(), "s.json")
	code, out, stderr := sys1Batch(t, "run", in, "--token", token, "--progress", "always", "--summary-json", summary)
	if code != exitFailed {
		t.Fatalf("exit %d\n%s\n%s", code, out, stderr)
	}
	for name, text := range map[string]string{"stdout": out, "stderr": stderr, "results": readFileString(t, in+".results.jsonl"),
		"errors": readFileString(t, in+".results.jsonl.errors.jsonl"), "summary": readFileString(t, summary)} {
		if strings.Contains(text, "sekrit") || strings.Contains(text, "c2VjcmV0") {
			t.Errorf("%s carries the token:\n%s", name, text)
		}
	}
	// The request carries it, with the other SPEC §3 headers.
	runID := readResults(t, in+".results.jsonl")[0].RunID
	h := d.resp.Header(runID)
	if h.Get("Authorization") != "Bearer "+token || h.Get("Sys1-Run-Id") != runID ||
		!strings.HasPrefix(h.Get("Sys1-Reply-To"), "_INBOX.cli.") || !strings.HasPrefix(h.Get("Nats-Msg-Id"), runID+"/") {
		t.Errorf("request headers: %v", h)
	}
}
