package worker

import (
	"strings"
	"testing"
	"time"
)

func TestConfigValidateNamesEveryBadVariable(t *testing.T) {
	bad := Config{Concurrency: 0, MaxDeliver: 0, ShutdownGrace: -time.Second, FetchBatch: 0, RetryBase: 0, RetryMax: -1}
	var joined strings.Builder
	for _, err := range bad.Validate() {
		joined.WriteString(err.Error() + "\n")
	}
	for _, v := range []string{"SYS1_CONCURRENCY", "SYS1_MAX_DELIVER", "SYS1_SHUTDOWN_GRACE", "SYS1_FETCH_BATCH", "SYS1_RETRY_BASE", "SYS1_RETRY_MAX"} {
		if !strings.Contains(joined.String(), v) {
			t.Errorf("no error names %s:\n%s", v, joined.String())
		}
	}
	good := Config{Concurrency: 8, MaxDeliver: 5, ShutdownGrace: 30 * time.Second, FetchBatch: 16, RetryBase: time.Second, RetryMax: time.Minute}
	if errs := good.Validate(); len(errs) != 0 {
		t.Errorf("defaults refused: %v", errs)
	}
	d := good.withDefaults()
	if d.ID == "" || d.FetchBatch != 8 {
		t.Errorf("withDefaults: id %q, fetch batch %d (capped at the concurrency)", d.ID, d.FetchBatch)
	}
}

func TestRetryDelayGrowsIsCappedAndHonoursHints(t *testing.T) {
	c := Config{RetryBase: time.Second, RetryMax: 10 * time.Second}
	for _, tt := range []struct {
		deliveries int
		hint, want time.Duration
	}{
		{1, 0, time.Second},
		{2, 0, 2 * time.Second},
		{3, 0, 4 * time.Second},
		{4, 0, 8 * time.Second},
		{5, 0, 10 * time.Second},              // capped
		{50, 0, 10 * time.Second},             // still capped
		{1, 3 * time.Second, 3 * time.Second}, // a longer Retry-After wins
		{3, 2 * time.Second, 4 * time.Second}, // a shorter one does not
		{1, time.Hour, 10 * time.Second},      // but never past the cap
	} {
		if got := c.retry().Delay(tt.deliveries, tt.hint); got != tt.want {
			t.Errorf("Delay(%d, %s) = %s, want %s", tt.deliveries, tt.hint, got, tt.want)
		}
	}
}
