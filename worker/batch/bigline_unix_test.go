//go:build unix

package batch_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/worker/batch"
)

// GiB is the length of the long line.
const GiB = 1 << 30

// bigLineFIFO makes a named pipe that serves, passes times, a file whose second line is 1 GiB
// long: the bytes are generated as they are read, so the test never stores 1 GiB anywhere.
func bigLineFIFO(t *testing.T, passes int, first, last string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "big.jsonl")
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	chunk := bytes.Repeat([]byte("x"), 1<<20)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range passes {
			f, err := os.OpenFile(path, os.O_WRONLY, 0) // blocks until a pass opens the file
			if err != nil {
				return
			}
			f.Write([]byte(first + "\n"))
			for written := 0; written < GiB; written += len(chunk) {
				if _, err := f.Write(chunk); err != nil {
					break
				}
			}
			f.Write([]byte("\n" + last + "\n"))
			f.Close()
		}
	}()
	t.Cleanup(func() {
		// Unblock a writer waiting for a pass that never came.
		if f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0); err == nil {
			f.Close()
		}
		<-done
	})
	return path
}

// TestBatchGigabyteLineIsRefusedWithoutBeingRead: a 1 GiB line is reported with its line
// number (SYS1_REQUEST_TOO_LARGE) and skipped; the lines around it are read, and memory stays
// bounded by the contract's largest request, not the line.
func TestBatchGigabyteLineIsRefusedWithoutBeingRead(t *testing.T) {
	path := bigLineFIFO(t, 1, request(1), request(3))
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
	if e.Valid() || e.Line != 2 || e.Err.Code != contract.CodeRequestTooLarge || !strings.Contains(e.Err.Message, "line 2 is 1073741824 bytes") {
		t.Fatalf("the long line: %+v", e)
	}
	if es[2].Line != 3 || !es[2].Valid() {
		t.Errorf("the line after the long one: %+v", es[2])
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 4*batch.MaxLineBytes {
		t.Errorf("reading a 1 GiB line allocated %d MiB; the bound is the contract's largest request (%d MiB)", grew>>20, batch.MaxLineBytes>>20)
	}
	_ = context.Background
}
