package batch_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/sys1hq/sys1/cmd/sys1/internal/batch"
)

// TestBatchScanStreams100kLines: validating a 100,000-line input (45 MiB) holds one line at a time (and
// a 24-byte key per item to find duplicates), never the file: the heap stays far below the
// file's size throughout.
func TestBatchScanStreams100kLines(t *testing.T) {
	const n = 100000
	path := filepath.Join(t.TempDir(), "big.jsonl")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	w := bufio.NewWriter(f)
	pad := strings.Repeat("lorem ipsum ", 30)
	for i := range n {
		fmt.Fprintf(w, `{"custom_id":"t-%d","body":{"state":"%d %s","questions":%s}}`+"\n", i, i, pad, oneQuestion)
	}
	w.Flush()
	f.Close()
	st, _ := os.Stat(path)

	defer debug.SetGCPercent(debug.SetGCPercent(10)) // little garbage slack: the heap tracks what is live
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	base, peak := m.HeapAlloc, uint64(0)
	p, err := batch.Scan(context.Background(), batch.Input{Path: path}, func(e *batch.Entry) {
		if e.Ord%10000 == 0 {
			runtime.ReadMemStats(&m)
			peak = max(peak, m.HeapAlloc-min(base, m.HeapAlloc))
		}
	})
	if err != nil || p.Valid != n {
		t.Fatalf("%v %+v", err, p)
	}
	if limit := uint64(st.Size()) / 5; peak > limit {
		t.Errorf("the heap grew by %d MiB while validating a %d MiB file; want under %d MiB", peak>>20, st.Size()>>20, limit>>20)
	}
	t.Logf("file %d MiB, heap growth at most %d MiB", st.Size()>>20, peak>>20)
}
