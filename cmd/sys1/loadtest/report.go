package loadtest

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
)

// WriteText prints the report for a person.
func (r *Report) WriteText(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "sent          %d", r.Sent)
	if r.PublishErrors > 0 {
		fmt.Fprintf(&b, "   (%d publishes failed and are not counted; the first: %s)", r.PublishErrors, r.FirstPublishError)
	}
	fmt.Fprintf(&b, "\nsucceeded     %d\nfailed        %d\n", r.Succeeded, r.Failed)
	for _, code := range slices.Sorted(maps.Keys(r.FailedBy)) {
		fmt.Fprintf(&b, "  %-26s %d\n", code, r.FailedBy[code])
	}
	if r.DuplicateReplies > 0 {
		fmt.Fprintf(&b, "duplicate replies %d (replies are at least once)\n", r.DuplicateReplies)
	}
	if r.LateReplies > 0 {
		fmt.Fprintf(&b, "late replies  %d (after the wait ended; counted as %s)\n", r.LateReplies, CodeNoReply)
	}
	if r.UnmatchedReplies > 0 {
		fmt.Fprintf(&b, "unmatched replies %d (for no run awaited: a publish that failed yet was stored, or another generator's)\n", r.UnmatchedReplies)
	}
	fmt.Fprintf(&b, "throughput    %.1f decisions/s over %.3fs\n", r.Throughput, r.ElapsedMS/1000)
	if r.CPUPerDecisionMS > 0 {
		fmt.Fprintf(&b, "process CPU   %.3f ms per decision (%.2fs in all)\n", r.CPUPerDecisionMS, r.CPUMS/1000)
	}
	fmt.Fprintf(&b, "publish rate  %.1f requests/s over %.3fs", r.PublishRate, r.PublishMS/1000)
	if r.TargetRate > 0 {
		fmt.Fprintf(&b, " (target %g/s)", r.TargetRate)
		if r.Behind() {
			fmt.Fprintf(&b, "\n  BEHIND SCHEDULE: publishes started up to %s late; the target was not reached (raise -c or lower --rate)", fmtMS(r.ScheduleLag.MaxMS))
		}
	}
	b.WriteString("\n")
	line := func(name string, s Summary) {
		if s.Count == 0 {
			fmt.Fprintf(&b, "%-13s -\n", name)
			return
		}
		fmt.Fprintf(&b, "%-13s p50 %s  p90 %s  p99 %s  max %s  (n=%d)\n", name, fmtMS(s.P50MS), fmtMS(s.P90MS), fmtMS(s.P99MS), fmtMS(s.MaxMS), s.Count)
	}
	if r.TargetRate > 0 {
		line("sched. lag", r.ScheduleLag)
	}
	line("latency", r.Latency)
	line("queue wait", r.QueueWait)
	line("provider", r.ProviderTime)
	if r.Peak != nil {
		fmt.Fprintf(&b, "provider peak %d concurrent calls (%s)", r.Peak.Calls, r.Peak.Source)
		if len(r.Peak.PerReplica) > 1 {
			fmt.Fprintf(&b, "; per replica %v", r.Peak.PerReplica)
		}
		b.WriteString("\n")
	} else {
		b.WriteString("provider peak unknown (pass --metrics-url of the workers' /metrics)\n")
	}
	if m := r.Memory; m != nil {
		fmt.Fprintf(&b, "memory        RSS start %s  peak %s  end %s  (Go heap peak %s; %s)\n",
			fmtBytes(m.StartRSS), fmtBytes(m.PeakRSS), fmtBytes(m.EndRSS), fmtBytes(m.PeakHeap), m.Source)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func fmtMS(v float64) string {
	switch {
	case v >= 1000:
		return fmt.Sprintf("%.2fs", v/1000)
	case v >= 10:
		return fmt.Sprintf("%.1fms", v)
	default:
		return fmt.Sprintf("%.2fms", v)
	}
}

func fmtBytes(n uint64) string {
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}

// Behind reports whether, with a target rate, the producers fell behind the schedule: some
// publish started more than 100 ms and more than ten intervals (10 ÷ rate) after it was due.
// Timer slack is far below either; a generator that cannot keep up drifts past both.
func (r *Report) Behind() bool {
	if r.TargetRate <= 0 || r.ScheduleLag.Count == 0 {
		return false
	}
	return r.ScheduleLag.MaxMS > 100 && r.ScheduleLag.MaxMS > 10*1000/r.TargetRate
}
