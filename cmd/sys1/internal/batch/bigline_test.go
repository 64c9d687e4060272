package batch_test

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/sys1hq/sys1/cmd/sys1/internal/batch"
	"github.com/sys1hq/sys1/contract"
)

// GiB is the length of the long line's hole.
const GiB = 1 << 30

// sparseBigLine writes a file whose second line is over 1 GiB long as a sparse file: the long
// line's bulk is a hole (read back as zero bytes, stored as nothing), after a first stretch of
// text longer than the binary-file sniff.
func sparseBigLine(t *testing.T, first, last string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "big.jsonl")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	head := first + "\n" + `{"custom_id":"huge","body":{"state":"` + strings.Repeat("x", 16<<10)
	if _, err := f.WriteString(head); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Seek(GiB, io.SeekCurrent); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(`"}}` + "\n" + last + "\n"); err != nil {
		t.Fatal(err)
	}
	return path
}

// bigLineLen is the length of sparseBigLine's long line.
const bigLineLen = len(`{"custom_id":"huge","body":{"state":"`) + 16<<10 + 1<<30 + len(`"}}`)

// TestBatchGigabyteLineIsRefusedWithoutBeingRead: a 1 GiB line is reported with its line
// number (SYS1_REQUEST_TOO_LARGE) and skipped; the lines around it are read, and memory stays
// bounded by the contract's largest request, not the line.
func TestBatchGigabyteLineIsRefusedWithoutBeingRead(t *testing.T) {
	path := sparseBigLine(t, request(1), request(3))
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	es, p, err := scanAll(t, batch.Input{Path: path})
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	if p.Entries != 3 || p.Valid != 2 {
		t.Fatalf("plan %+v", p)
	}
	e := es[1]
	if e.Valid() || e.Line != 2 || e.Err.Code != contract.CodeRequestTooLarge || !strings.Contains(e.Err.Message, fmt.Sprintf("line 2 is %d bytes", bigLineLen)) {
		t.Fatalf("the long line: %+v", e)
	}
	if es[2].Line != 3 || !es[2].Valid() {
		t.Errorf("the line after the long one: %+v", es[2])
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 4*batch.MaxLineBytes {
		t.Errorf("reading a 1 GiB line allocated %d MiB; the bound is the contract's largest request (%d MiB)", grew>>20, batch.MaxLineBytes>>20)
	}
}
