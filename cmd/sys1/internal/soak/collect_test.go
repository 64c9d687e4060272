package soak

import "testing"

// TestDrainCountsAHeldRunThatFailedAsAnswered: the drain waits for each held run's release,
// but a held caller's run that failed before it had an answer to hold is answered by its error
// (the 60-minute soak waited out its whole drain for 21 of them).
func TestDrainCountsAHeldRunThatFailedAsAnswered(t *testing.T) {
	r := newReplies()
	r.byRun["h-pending"] = []Reply{{RunID: "h-pending", Status: "success", Review: "pending"}}
	r.byRun["h-released"] = []Reply{{RunID: "h-released", Status: "success", Review: "pending"}, {RunID: "h-released", Status: "success", Review: "reviewed"}}
	r.byRun["h-failed"] = []Reply{{RunID: "h-failed", Status: "failed", ErrorCode: "SYS1_UPSTREAM_ERROR"}}
	for run, want := range map[string]bool{"h-pending": false, "h-released": true, "h-failed": true, "h-none": false} {
		if got := r.answered(run, true); got != want {
			t.Errorf("held run %s answered = %v, want %v", run, got, want)
		}
	}
	if !r.answered("h-pending", false) {
		t.Error("a run that is not held is answered by any reply")
	}
}
