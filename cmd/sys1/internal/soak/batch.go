package soak

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// batches runs sys1 batch, one batch after another, beside the interactive load: the command
// as an operator runs it, against the cluster. Some runs are SIGKILLed midway and run again
// with the same command (same --id), which resumes: finished items are answered from the
// run-id gate, the rest sent again, and the result file must still have one line per item.
type batches struct {
	dir   string
	sys1  string
	env   func(gen int) []string
	items int
	rng   *rand.Rand
	tl    *Timeline

	mu   sync.Mutex
	done []BatchOutcome
	cur  *proc
}

// run starts batches until ctx ends, then lets the last one finish (or be stopped by stop).
func (b *batches) run(ctx, stop context.Context) {
	for n := 1; ctx.Err() == nil; n++ {
		out := b.one(ctx, stop, n)
		b.mu.Lock()
		b.done = append(b.done, out)
		b.mu.Unlock()
	}
}

func (b *batches) one(ctx, stop context.Context, n int) BatchOutcome {
	id := fmt.Sprintf("soak-batch-%d", n)
	o := BatchOutcome{ID: id, ExitCode: -1}
	in := filepath.Join(b.dir, id+".jsonl")
	resultPath := filepath.Join(b.dir, id+".results.jsonl")
	var lines strings.Builder
	for i := 1; i <= b.items; i++ {
		cid := fmt.Sprintf("i-%06d", i)
		key := "bt-" + fmt.Sprint(n) + "-" + cid
		o.Items = append(o.Items, BatchItem{CustomID: cid, Key: key})
		fmt.Fprintf(&lines, `{"custom_id":%q,"body":%s}`+"\n", cid, body(key, false))
	}
	if err := os.WriteFile(in, []byte(lines.String()), 0o644); err != nil {
		b.tl.Add(Event{What: "cannot write batch input", Target: id, Detail: err.Error()})
		return o
	}
	args := []string{"batch", "run", in, "-o", resultPath, "--caller", CallerBatch, "--id", id, "--progress", "never",
		"--in-flight", "64", "--resend-after", "20s"}
	p := newProc("batch-"+fmt.Sprint(n), n, b.sys1, args, b.env, b.dir, b.tl)
	p.restart, p.oneShot = false, true
	b.mu.Lock()
	b.cur = p
	b.mu.Unlock()
	// One batch in three is killed once, at a random moment of its first few seconds.
	killAfter := time.Duration(0)
	if b.rng.IntN(3) == 0 {
		killAfter = time.Duration(500+b.rng.IntN(4000)) * time.Millisecond
	}
	for {
		if err := p.start("sys1 batch run " + id); err != nil {
			b.tl.Add(Event{What: "cannot start", Target: p.name, Detail: err.Error()})
			return o
		}
		var kill <-chan time.Time
		if killAfter > 0 {
			kill = time.After(killAfter)
		}
		select {
		case <-p.done():
		case <-kill:
			if p.kill("a batch client killed midway; run again, it resumes") {
				o.Restarts++
			}
			killAfter = 0
			continue
		case <-stop.Done():
			p.stop(10 * time.Second)
		}
		break
	}
	incs := p.incarnations()
	last := incs[len(incs)-1]
	o.ExitCode = last.ExitCode
	o.Started, o.Ended = incs[0].Started, last.Ended
	if last.Stopped {
		o.ExitCode = -1
		return o
	}
	f, err := os.Open(resultPath)
	if err != nil {
		return o // no result file: Finished stays false
	}
	defer f.Close()
	o.Finished = true
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var l struct {
			CustomID string `json:"custom_id"`
			Line     int    `json:"line"`
			RunID    string `json:"run_id"`
			Status   string `json:"status"`
			Error    *struct {
				Code string `json:"code"`
			} `json:"error"`
		}
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			o.Lines = append(o.Lines, BatchLine{CustomID: "(unreadable line)", Status: err.Error()})
			continue
		}
		bl := BatchLine{CustomID: l.CustomID, RunID: l.RunID, Status: l.Status, Line: l.Line}
		if l.Error != nil {
			bl.ErrorCode = l.Error.Code
		}
		o.Lines = append(o.Lines, bl)
	}
	return o
}

func (b *batches) snapshot() []BatchOutcome {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]BatchOutcome(nil), b.done...)
}
