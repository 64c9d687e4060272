package topology

import (
	"testing"

	"github.com/sys1hq/sys1/contract/wire"
)

// TestReviewSubjectRule: a run's review items go to sys1.review.<token> of its request's
// subject, and reviewers' labels for them to sys1.labels.<token>.accepted, whatever the
// verified caller is.
func TestReviewSubjectRule(t *testing.T) {
	for request, want := range map[string]string{
		"sys1.decide.billing":         "sys1.review.billing",
		"sys1.decide.billing.tickets": "sys1.review.billing",
		"sys1.batch.analytics.b-1":    "sys1.review.analytics",
	} {
		got, err := ReviewSubject(request)
		if err != nil || got != want {
			t.Errorf("ReviewSubject(%q) = %q, %v; want %q", request, got, err, want)
		}
		label, err := ReviewLabelSubject(got)
		if wantLabel := "sys1.labels." + want[len(wire.ReviewPrefix):] + ".accepted"; err != nil || label != wantLabel {
			t.Errorf("ReviewLabelSubject(%q) = %q, %v; want %q", got, label, err, wantLabel)
		}
	}
	for _, bad := range []string{"", "sys1.decide.", "sys1.runs.success", "sys1.review.x", "other.billing"} {
		if got, err := ReviewSubject(bad); err == nil {
			t.Errorf("ReviewSubject(%q) = %q, want an error", bad, got)
		}
	}
	for _, bad := range []string{"sys1.review.", "sys1.review.a.b", "sys1.review.*", "sys1.labels.a"} {
		if got, err := ReviewLabelSubject(bad); err == nil {
			t.Errorf("ReviewLabelSubject(%q) = %q, want an error", bad, got)
		}
	}
}
