package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sys1hq/sys1/cmd/sys1/internal/batch/batchtest"
)

// sparseBigLine writes a file whose second line is over 1 GiB long as a sparse file: the long
// line's bulk is a hole (read back as zero bytes, stored as nothing), after a first stretch
// of text longer than the binary-file sniff.
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
	if _, err := f.Seek(1<<30, io.SeekCurrent); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(`"}}` + "\n" + last + "\n"); err != nil {
		t.Fatal(err)
	}
	return path
}

// bigLineLen is the length of sparseBigLine's long line.
const bigLineLen = len(`{"custom_id":"huge","body":{"state":"`) + 16<<10 + 1<<30 + len(`"}}`)

// TestBatchCommandGigabyteLine: a line over 1 GiB between two good ones is refused with its
// line number, without being read into memory, and the batch goes on: exit status 1, the line
// in the errors file, the others answered.
func TestBatchCommandGigabyteLine(t *testing.T) {
	startBatchDeployment(t, true, batchtest.Options{})
	path := sparseBigLine(t, batchRequest(1), batchRequest(3))
	out := filepath.Join(t.TempDir(), "out.jsonl")
	code, stdout, stderr := sys1Batch(t, "run", path, "-o", out, "--progress", "never")
	if code != exitFailed || !strings.Contains(stderr, fmt.Sprintf(`line 2 (custom id "2"): [SYS1_REQUEST_TOO_LARGE] line: line 2 is %d bytes`, bigLineLen)) {
		t.Fatalf("exit %d\n%s\n%s", code, stdout, stderr)
	}
	results := readResults(t, out)
	if len(results) != 3 || results[0].Status != "success" || results[1].Status != "invalid" || results[2].Status != "success" {
		t.Fatalf("results: %+v", results)
	}
	if errs := readResults(t, out+".errors.jsonl"); len(errs) != 1 || errs[0].Line != 2 || errs[0].Error.Code != "SYS1_REQUEST_TOO_LARGE" {
		t.Errorf("errors file: %+v", errs)
	}
}
