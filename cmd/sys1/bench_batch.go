package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sys1hq/sys1/cmd/sys1/internal/batch"
	"github.com/sys1hq/sys1/contract/wire"
)

// benchBatch is a batch run beside the interactive load (bench --self --batch N): the real
// batch client (what 'sys1 batch run' does) publishes N copies of the template to
// sys1.batch.<caller>.<batch id> and reads their replies, so the bench can report the
// interactive latency while a batch drains, or, with -n 0, the batch's own throughput.
type benchBatch struct {
	items  int
	dir    string
	nc     *nats.Conn
	cancel context.CancelFunc
	done   chan struct{}
	warm   chan struct{} // closed once warmAt items are concluded: the batch is draining
	warmAt int

	mu       sync.Mutex
	progress batch.Progress
	warmed   bool
	sum      *batch.Summary
	err      error
}

// startBenchBatch writes the input, connects with the caller's inbox prefix (the worker
// answers verified callers only under _INBOX.<caller>) and starts the run.
func startBenchBatch(ctx context.Context, url, caller string, body []byte, items int) (_ *benchBatch, err error) {
	var line bytes.Buffer
	if err := json.Compact(&line, body); err != nil {
		return nil, fmt.Errorf("--batch: the template is not one JSON value: %w", err)
	}
	b := &benchBatch{items: items, done: make(chan struct{}), warm: make(chan struct{}), warmAt: min(200, max(1, items/10))}
	if b.dir, err = os.MkdirTemp("", "sys1-bench-batch-"); err != nil {
		return nil, fmt.Errorf("--batch: %w", err)
	}
	defer func() {
		if err != nil {
			b.cleanup()
		}
	}()
	in := batch.Input{Path: filepath.Join(b.dir, "input.jsonl")}
	if err := writeCopies(in.Path, line.Bytes(), items); err != nil {
		return nil, fmt.Errorf("--batch: write the input: %w", err)
	}
	plan, err := batch.Scan(ctx, in, func(*batch.Entry) {})
	if err != nil {
		return nil, fmt.Errorf("--batch: %w", err)
	}
	if plan.Invalid > 0 {
		return nil, fmt.Errorf("--batch: the template is not a valid request for a batch (%d of %d items invalid)", plan.Invalid, plan.Entries)
	}
	out, err := batch.CreateOutput(filepath.Join(b.dir, "output.jsonl"))
	if err != nil {
		return nil, fmt.Errorf("--batch: %w", err)
	}
	if b.nc, err = nats.Connect(url, nats.Name("sys1-bench-batch"), nats.CustomInboxPrefix(wire.Inbox(caller)), nats.MaxReconnects(-1)); err != nil {
		return nil, fmt.Errorf("--batch: connect: %w", err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	b.cancel = cancel
	cfg := batch.RunConfig{
		Caller: caller, BatchID: "bench-" + strconv.FormatInt(time.Now().UnixNano(), 36),
		Progress: b.observe, ProgressEvery: 50 * time.Millisecond,
	}
	go func() {
		defer close(b.done)
		sum, err := batch.Run(runCtx, b.nc, in, plan, out, cfg)
		b.mu.Lock()
		b.sum, b.err = sum, err
		b.mu.Unlock()
	}()
	return b, nil
}

func writeCopies(path string, line []byte, n int) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	for range n {
		_, _ = w.Write(line)
		_ = w.WriteByte('\n')
	}
	if err := w.Flush(); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

func (b *benchBatch) observe(p batch.Progress) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.progress = p
	if !b.warmed && p.Done() >= b.warmAt {
		b.warmed = true
		close(b.warm)
	}
}

func (b *benchBatch) snapshot() batch.Progress {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.progress
}

// waitDraining returns once the batch is draining (its first items concluded), or with an
// error when it ended before that.
func (b *benchBatch) waitDraining(ctx context.Context) error {
	select {
	case <-b.warm:
		return nil
	case <-b.done:
		select {
		case <-b.warm:
			return nil
		default:
		}
		return fmt.Errorf("--batch: the batch ended before it was draining: %v", b.err)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// stop cancels the run (the bench's own client: what was published and not yet taken stays
// queued until the deployment is torn down) and waits for it to return.
func (b *benchBatch) stop() {
	b.cancel()
	<-b.done
}

func (b *benchBatch) wait(ctx context.Context) error {
	select {
	case <-b.done:
		return nil
	case <-ctx.Done():
		b.stop()
		return ctx.Err()
	}
}

func (b *benchBatch) cleanup() {
	if b.cancel != nil {
		b.stop()
	}
	if b.nc != nil {
		b.nc.Close()
	}
	_ = os.RemoveAll(b.dir)
}

// benchBatchReport is the batch's part of the report.
type benchBatchReport struct {
	Items     int     `json:"items"`
	Concluded int     `json:"concluded"`
	Succeeded int     `json:"succeeded"`
	Failed    int     `json:"failed"`
	ElapsedMS float64 `json:"elapsed_ms"`
	// Throughput is concluded items per second over ElapsedMS; Efficiency is it over the
	// provider bound (batch alone, with -n 0).
	Throughput float64 `json:"throughput_per_s"`
	Efficiency float64 `json:"efficiency,omitempty"`
	// DuringInteractive is how many items concluded while the interactive load ran, and
	// UnfinishedAfter how many were still unanswered when it ended (the batch was then stopped).
	DuringInteractive int    `json:"during_interactive,omitempty"`
	UnfinishedAfter   int    `json:"unfinished_after_interactive,omitempty"`
	Complete          bool   `json:"complete"`
	Error             string `json:"error,omitempty"`
}

func (b *benchBatch) report() *benchBatchReport {
	b.mu.Lock()
	defer b.mu.Unlock()
	p := b.progress
	r := &benchBatchReport{Items: b.items, Concluded: p.Done(), Succeeded: p.Succeeded, Failed: p.Failed + p.Invalid + p.Cancelled,
		ElapsedMS: float64(p.Elapsed.Microseconds()) / 1000}
	if b.sum != nil && b.err == nil {
		r.Complete = true
		r.Concluded, r.Succeeded = b.sum.Succeeded+b.sum.Failed+b.sum.Invalid+b.sum.Cancelled, b.sum.Succeeded
		r.Failed = b.sum.Failed + b.sum.Invalid + b.sum.Cancelled
		r.ElapsedMS = float64(b.sum.WallMS)
	}
	if b.err != nil && !errors.Is(b.err, context.Canceled) {
		r.Error = b.err.Error()
	}
	if r.ElapsedMS > 0 {
		r.Throughput = float64(r.Concluded) / (r.ElapsedMS / 1000)
	}
	return r
}

func (r *benchBatchReport) write(w io.Writer) {
	state := "complete"
	if !r.Complete {
		state = "stopped when the interactive load ended"
	}
	fmt.Fprintf(w, "batch         %d items, %d concluded (%d succeeded, %d failed) in %.1fs = %.1f/s; %s\n",
		r.Items, r.Concluded, r.Succeeded, r.Failed, r.ElapsedMS/1000, r.Throughput, state)
	if r.DuringInteractive > 0 || r.UnfinishedAfter > 0 {
		fmt.Fprintf(w, "              %d concluded while the interactive load ran, %d still unanswered when it ended\n", r.DuringInteractive, r.UnfinishedAfter)
	}
	if r.Error != "" {
		fmt.Fprintf(w, "              error: %s\n", r.Error)
	}
}
