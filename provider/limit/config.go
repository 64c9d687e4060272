package limit

import (
	"errors"
	"fmt"
	"math"
	"strings"
)

// Mode names a kind of limiter.
type Mode string

// The modes.
const (
	// ModeFixed admits a constant number of calls: Max.
	ModeFixed Mode = "fixed"
	// ModeAdaptive moves the limit between Min and Max with the provider's latency.
	ModeAdaptive Mode = "adaptive"
)

// ParseMode reads a mode name (case and surrounding space do not matter).
func ParseMode(s string) (Mode, error) {
	switch m := Mode(strings.ToLower(strings.TrimSpace(s))); m {
	case ModeFixed, ModeAdaptive:
		return m, nil
	}
	return "", fmt.Errorf("%q is not a concurrency mode: want %s or %s", s, ModeFixed, ModeAdaptive)
}

// AdaptiveConfig configures an Adaptive limiter. Every field must be set: start from
// DefaultAdaptiveConfig and override what the operator chose, so that an explicit zero is an
// error rather than a silent default.
type AdaptiveConfig struct {
	// Min and Max bound the limit (1 ≤ Min ≤ Max). Max is the replica's concurrency.
	Min, Max int
	// Initial is the starting limit (Min ≤ Initial ≤ Max). Starting low costs a few rounds of
	// growth; starting high parks calls in a queue that may outlive the timeout.
	Initial int
	// Tolerance is how much slower per unit of size than the baseline a window may be
	// before the limit shrinks (> 1). 1.2 keeps the provider's queue within a fifth of a
	// call per call in service beyond the lowest the replicas can reach together.
	Tolerance float64
	// Increase is the additive step per window that ran at the limit without congestion
	// (> 0). Small steps probe gently: each probe queues calls for everyone.
	Increase float64
	// DropBackoff multiplies the limit on a drop: a 429/503 or a timeout (0 < DropBackoff < 1).
	DropBackoff float64
	// Window is the fewest results per round (≥ 1); a round is also at least the current
	// limit's worth of results, about one round trip of every slot.
	Window int
	// StaleWindows is how many windows in a row may be congested while the limit is at Min
	// before the baseline is relearnt (≥ 1): at Min this replica has shed all it can, so a
	// lasting queue is the provider's new normal (a slower model, other clients), not its
	// own doing. Congestion while a neighbour probes upward lasts a window or two.
	StaleWindows int
	// Seed seeds the draw of window lengths; 0 draws a random seed. Tests set it.
	Seed uint64
}

// DefaultAdaptiveConfig is the recommended configuration for a replica whose concurrency is
// maxConcurrency.
func DefaultAdaptiveConfig(maxConcurrency int) AdaptiveConfig {
	return AdaptiveConfig{
		Min: 1, Max: maxConcurrency, Initial: 1,
		Tolerance: 1.2, Increase: 0.25, DropBackoff: 0.5,
		Window: 6, StaleWindows: 64,
	}
}

// FieldError is one bad field of a configuration. Field is the Go field's name, so the
// command layer can name its own variable (SYS1_CONCURRENCY for Max, and so on).
type FieldError struct {
	Field  string
	Value  any
	Reason string
}

func (e *FieldError) Error() string {
	return fmt.Sprintf("%s: %v %s", e.Field, e.Value, e.Reason)
}

// Validate returns one *FieldError per bad field.
func (c AdaptiveConfig) Validate() []error {
	var errs []error
	bad := func(field string, v any, reason string) {
		errs = append(errs, &FieldError{Field: field, Value: v, Reason: reason})
	}
	if c.Min < 1 {
		bad("Min", c.Min, "must be at least 1")
	}
	if c.Max < 1 {
		bad("Max", c.Max, "must be at least 1")
	} else if c.Min >= 1 && c.Min > c.Max {
		bad("Min", c.Min, fmt.Sprintf("must not exceed Max (%d)", c.Max))
	}
	if c.Initial < 1 {
		bad("Initial", c.Initial, "must be at least 1")
	} else if c.Min >= 1 && c.Max >= c.Min && (c.Initial < c.Min || c.Initial > c.Max) {
		bad("Initial", c.Initial, fmt.Sprintf("must be between Min (%d) and Max (%d)", c.Min, c.Max))
	}
	if !(c.Tolerance > 1) || math.IsInf(c.Tolerance, 0) {
		bad("Tolerance", c.Tolerance, "must be a number above 1")
	}
	if !(c.Increase > 0) || math.IsInf(c.Increase, 0) {
		bad("Increase", c.Increase, "must be a positive number")
	}
	if !(c.DropBackoff > 0 && c.DropBackoff < 1) {
		bad("DropBackoff", c.DropBackoff, "must be between 0 and 1, exclusive")
	}
	if c.Window < 1 {
		bad("Window", c.Window, "must be at least 1")
	}
	if c.StaleWindows < 1 {
		bad("StaleWindows", c.StaleWindows, "must be at least 1")
	}
	return errs
}

func joinConfigErrors(errs []error) error {
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("adaptive limiter: %w", errors.Join(errs...))
}

// New builds the limiter for mode: Fixed at cfg.Max, or Adaptive with cfg. The fixed mode
// checks Max only.
func New(mode Mode, cfg AdaptiveConfig) (Limiter, error) {
	switch mode {
	case ModeFixed:
		if cfg.Max < 1 {
			return nil, fmt.Errorf("fixed limiter: %w", &FieldError{Field: "Max", Value: cfg.Max, Reason: "must be at least 1"})
		}
		return NewFixed(cfg.Max), nil
	case ModeAdaptive:
		return NewAdaptive(cfg)
	}
	return nil, fmt.Errorf("limiter: unknown mode %q", mode)
}
