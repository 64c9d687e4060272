//go:build unix

package policy

import (
	"syscall"
	"testing"
	"time"
)

// cpuTimer reports a benchmark's CPU time per operation (user and system, every thread, the
// garbage collector's included) beside its wall time: on a machine shared with other work the
// wall time per op grows with the load, the CPU time hardly.
type cpuTimer struct{ start time.Duration }

func cpuNow() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func startCPU() cpuTimer { return cpuTimer{cpuNow()} }

func (c cpuTimer) report(b *testing.B) {
	if b.N > 0 {
		b.ReportMetric(float64(cpuNow()-c.start)/float64(b.N), "cpu-ns/op")
	}
}
