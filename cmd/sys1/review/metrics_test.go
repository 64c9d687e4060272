package review

import (
	"net/http"
	"net/url"
	"path/filepath"
	"testing"
	"time"

	"github.com/sys1hq/sys1/worker/metricstest"
	"github.com/sys1hq/sys1/worker/natsconn/natstest"
)

// TestReviewMetrics: /metrics (no session needed) serves the queue's totals in strict text
// format, documented in deploy/README.md and promlint-clean: pending and labelled items, the
// oldest pending item's creation time, and readiness. Labelling the oldest item moves it from
// pending to labelled and the oldest pending time to the next item's.
func TestReviewMetrics(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	older, newer := ticketItem("run-m1"), ticketItem("run-m2")
	older.CreatedAt = time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC)
	newer.CreatedAt = time.Date(2026, 12, 1, 9, 30, 0, 0, time.UTC)
	h.publish(older)
	h.publish(newer)
	h.waitIndexed(older.ID)
	h.waitIndexed(newer.ID)

	scrape := func() map[string]float64 {
		t.Helper()
		res := h.client().get("/metrics")
		if res.status != http.StatusOK {
			t.Fatalf("/metrics: %d\n%s", res.status, res.body)
		}
		if err := metricstest.Check(h.rs.registry, res.body, filepath.Join("..", "..", "..", "deploy", "README.md"), "sys1_review_", MetricFamilies()); err != nil {
			t.Fatalf("%v\n%s", err, res.body)
		}
		fams, _ := metricstest.Parse(res.body)
		out := map[string]float64{}
		for _, f := range fams {
			for _, s := range f.Samples {
				out[s.Name] = s.Value
			}
		}
		return out
	}
	got := scrape()
	for name, want := range map[string]float64{
		"sys1_review_pending_items": 2, "sys1_review_labelled_items": 0, "sys1_review_ready": 1,
		"sys1_review_oldest_pending_timestamp_seconds": float64(older.CreatedAt.Unix()), "sys1_review_malformed_items_total": 0,
	} {
		if got[name] != want {
			t.Errorf("%s = %v, want %v", name, got[name], want)
		}
	}

	c := h.client()
	csrf := c.mustLogin("alice")
	if res := c.post("/items/"+older.ID+"/label", url.Values{"value": {"bug"}, "csrf": {csrf}}); res.status != http.StatusSeeOther {
		t.Fatalf("label: %d\n%s", res.status, res.body)
	}
	natstest.WaitFor(t, 10*time.Second, "the label in the index", func() bool { _, ok := h.rs.idx.label(older.ID); return ok })
	got = scrape()
	if got["sys1_review_pending_items"] != 1 || got["sys1_review_labelled_items"] != 1 ||
		got["sys1_review_oldest_pending_timestamp_seconds"] != float64(newer.CreatedAt.Unix()) {
		t.Errorf("after labelling the oldest item: %v", got)
	}
}
