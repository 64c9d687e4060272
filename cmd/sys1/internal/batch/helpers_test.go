package batch_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sys1hq/sys1/cmd/sys1/internal/batch"
	"github.com/sys1hq/sys1/cmd/sys1/internal/batch/batchtest"
	"github.com/sys1hq/sys1/worker/natsconn/natstest"
)

// ticketQuestions are the questions of every generated request: one of each type.
const ticketQuestions = `{"label":{"type":"choice","instructions":"Which team?","criteria":{"billing":"Payments","bug":"Errors","account":"Access"}},` +
	`"refund":{"type":"noul","instructions":"Money back?"},` +
	`"urgency":{"type":"score","instructions":"How urgent?","criteria":["calm","annoyed","blocked"]}}`

func request(i int) string {
	return fmt.Sprintf(`{"state":{"ticket":%d,"text":"ticket number %d"},"questions":%s}`, i, i, ticketQuestions)
}

// writeLines writes lines to a new file and returns its path.
func writeLines(t *testing.T, name string, lines []string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// invalidLines are the ways a line can be bad, one per kind (each cycles through a big input).
var invalidLines = []struct{ line, code, want string }{
	{`{"custom_id":"CID","body":{"state":"x",`, "SYS1_INVALID_INPUT", "invalid JSON"},
	{`{"state": 42, "questions": {}}`, "SYS1_INVALID_INPUT", "state"},
	{`{"custom_id":"CID","body":{"state":"x","questions":{"q":{"type":"noul","instructions":7}}}}`, "SYS1_INVALID_INPUT", "questions.q.instructions"},
	{`{"custom_id": 17, "body": {"state":"x","questions":{"q":{"type":"noul","instructions":"y"}}}}`, "SYS1_INVALID_INPUT", "custom_id: must be a string"},
	{`{"custom_id":"CID","body":{"state":"x","questions":{"q":{"type":"noul","instructions":"y"}}},"method":"POST"}`, "SYS1_INVALID_INPUT", "method: unknown field"},
	{`{"state":"` + strings.Repeat("x", 70000) + `","questions":{"q":{"type":"noul","instructions":"y"}}}`, "SYS1_REQUEST_TOO_LARGE", ""},
	{`[1,2,3]`, "SYS1_INVALID_INPUT", "not a JSON object"},
}

type deployment struct {
	srv *server.Server
	nc  *nats.Conn
	js  jetstream.JetStream
}

func newDeployment(t *testing.T) *deployment {
	t.Helper()
	srv := natstest.Start(t, func(o *server.Options) { o.MaxPayload = 8 << 20 })
	nc, js := natstest.Connect(t, srv)
	return &deployment{srv: srv, nc: nc, js: js}
}

func (d *deployment) responder(t *testing.T, opts batchtest.Options) *batchtest.Responder {
	t.Helper()
	nc, js := natstest.Connect(t, d.srv)
	return batchtest.Start(t, nc, js, opts)
}

// client is a producer connection with the inbox prefix sys1 batch uses by default.
func (d *deployment) client(t *testing.T, caller string) *nats.Conn {
	t.Helper()
	nc, _ := natstest.Connect(t, d.srv, nats.CustomInboxPrefix("_INBOX."+caller))
	return nc
}

type runResult struct {
	summary *batch.Summary
	plan    *batch.Plan
	out     string
	err     error
}

// runBatch scans and runs a batch end to end, as the command does.
func runBatch(ctx context.Context, t *testing.T, nc *nats.Conn, in batch.Input, out string, cfg batch.RunConfig) runResult {
	t.Helper()
	plan, err := batch.Scan(ctx, in, nil)
	if err != nil {
		return runResult{err: err}
	}
	if err := plan.DuplicatesError(); err != nil {
		return runResult{plan: plan, err: err}
	}
	if cfg.BatchID == "" {
		cfg.BatchID = batch.DeriveBatchID(plan.InputHash, cfg.Caller, in.Fingerprint())
	}
	o, err := batch.CreateOutput(out)
	if err != nil {
		t.Fatal(err)
	}
	sum, err := batch.Run(ctx, nc, in, plan, o, cfg)
	return runResult{summary: sum, plan: plan, out: out, err: err}
}

type outLine struct {
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

func readOut(t *testing.T, path string) []outLine {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []outLine
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var l outLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("output line %d is not JSON: %v\n%s", len(out)+1, err, sc.Bytes())
		}
		out = append(out, l)
	}
	return out
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	natstest.WaitFor(t, within, what, cond)
}

var _ = bytes.Equal

func batch_testOpts() batchtest.Options { return batchtest.Options{Concurrency: 4} }
