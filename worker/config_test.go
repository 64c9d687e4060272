package worker

import (
	"reflect"
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

// TestConcurrencySettingsAreValidatedByTheirNames: the adaptive limiter's bad settings are
// reported under the variables an operator sets (min > max, zero or negative values, a
// tolerance at or below 1, an unknown mode).
func TestConcurrencySettingsAreValidatedByTheirNames(t *testing.T) {
	base := Config{Concurrency: 8, MaxDeliver: 5, FetchBatch: 8, RetryBase: time.Second, RetryMax: time.Minute}
	for _, tt := range []struct {
		name string
		mod  func(*Config)
		want []string
	}{
		{"min above max", func(c *Config) { c.ConcurrencyMin = 9 }, []string{"SYS1_CONCURRENCY_MIN", "9"}},
		{"negative min", func(c *Config) { c.ConcurrencyMin = -1 }, []string{"SYS1_CONCURRENCY_MIN"}},
		{"initial outside", func(c *Config) { c.ConcurrencyInitial = 12 }, []string{"SYS1_CONCURRENCY_INITIAL", "12"}},
		{"tolerance at 1", func(c *Config) { c.ConcurrencyTolerance = 1 }, []string{"SYS1_CONCURRENCY_TOLERANCE"}},
		{"negative tolerance", func(c *Config) { c.ConcurrencyTolerance = -2 }, []string{"SYS1_CONCURRENCY_TOLERANCE"}},
		{"unknown mode", func(c *Config) { c.ConcurrencyMode = "turbo" }, []string{"SYS1_CONCURRENCY_MODE", "turbo"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := base
			tt.mod(&c)
			var joined strings.Builder
			for _, err := range c.Validate() {
				joined.WriteString(err.Error() + "\n")
			}
			for _, w := range tt.want {
				if !strings.Contains(joined.String(), w) {
					t.Errorf("errors lack %q:\n%s", w, joined.String())
				}
			}
		})
	}
	for _, mode := range []string{"", "fixed", "adaptive", "Adaptive"} {
		c := base
		c.ConcurrencyMode = mode
		if errs := c.Validate(); len(errs) != 0 {
			t.Errorf("mode %q refused: %v", mode, errs)
		}
	}
}

// TestWorkerDefaultsAreStatedOnce: DefaultConfig is the one place a replica's defaults live
// (no env tag states a second), it passes its own validation, and a Config built by hand
// takes the defaults New fills from it.
func TestWorkerDefaultsAreStatedOnce(t *testing.T) {
	typ := reflect.TypeOf(Config{})
	for i := range typ.NumField() {
		if f := typ.Field(i); f.Tag.Get("envDefault") != "" {
			t.Errorf("%s states a default in its env tag too: DefaultConfig is the one place", f.Name)
		}
	}
	def := DefaultConfig()
	if errs := def.Validate(); len(errs) > 0 {
		t.Fatalf("the defaults do not validate: %v", errs)
	}
	filled := (&Config{Concurrency: 4}).withDefaults()
	if filled.StatusInterval != def.StatusInterval || filled.CacheMaxTTL != def.CacheMaxTTL || filled.RecordState != def.RecordState {
		t.Errorf("withDefaults gave %+v, want DefaultConfig's values for the fields left zero", filled)
	}
}
