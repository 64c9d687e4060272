package batch_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sys1hq/sys1/cmd/sys1/internal/batch"
)

// BenchmarkScan is the validation pass over a JSONL input of wrapped ticket requests; it
// reports lines per second (each run also reads the file and hashes it).
func BenchmarkScan(b *testing.B) {
	const n = 20000
	var sb strings.Builder
	for i := range n {
		fmt.Fprintf(&sb, `{"custom_id":"t-%d","body":%s}`+"\n", i, request(i))
	}
	path := filepath.Join(b.TempDir(), "in.jsonl")
	if err := os.WriteFile(path, []byte(sb.String()), 0o600); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(sb.Len()))
	b.ResetTimer()
	for range b.N {
		p, err := batch.Scan(context.Background(), batch.Input{Path: path}, nil)
		if err != nil || p.Valid != n {
			b.Fatal(err, p)
		}
	}
	b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "lines/s")
}
