package worker

import (
	"errors"
	"strings"

	"fmt"
	"os"
	"time"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/provider/limit"
)

// Config is the worker pool's own configuration (the JetStream names live in topology.Config,
// the provider's in its package).
type Config struct {
	// Concurrency is the most provider calls in flight in this replica. Up to as many more
	// messages are in hand around them (claimed and waiting for a call, or storing and
	// publishing their outcome), so at most 2×Concurrency messages are unacknowledged.
	Concurrency int `env:"SYS1_CONCURRENCY"`
	// ConcurrencyMode is how each provider's calls are limited: adaptive (from the latency
	// the replica sees, between ConcurrencyMin and Concurrency; see provider/limit) or fixed
	// (exactly Concurrency).
	ConcurrencyMode string `env:"SYS1_CONCURRENCY_MODE"`
	// ConcurrencyMin and ConcurrencyInitial bound and start the adaptive limit (0: 1 and
	// the minimum); ConcurrencyTolerance is how much slower per unit of work than the best
	// it has seen a provider may get before the limit shrinks (0: 1.2).
	ConcurrencyMin       int     `env:"SYS1_CONCURRENCY_MIN"`
	ConcurrencyInitial   int     `env:"SYS1_CONCURRENCY_INITIAL"`
	ConcurrencyTolerance float64 `env:"SYS1_CONCURRENCY_TOLERANCE"`
	// MaxDeliver is how many deliveries a run may take before a transient error is final.
	MaxDeliver int `env:"SYS1_MAX_DELIVER"`
	// ShutdownGrace is how long in-flight runs may take to finish after SIGTERM.
	ShutdownGrace time.Duration `env:"SYS1_SHUTDOWN_GRACE"`
	// FetchBatch caps one pull request. Small on purpose: messages buffered client-side keep
	// ageing towards AckWait while they wait for a slot (nats.go issue #1929).
	FetchBatch int `env:"SYS1_FETCH_BATCH"`
	// RetryBase and RetryMax shape the redelivery delay of transient errors: base·2^(n−1),
	// capped, or the provider's Retry-After hint when it is longer.
	RetryBase time.Duration `env:"SYS1_RETRY_BASE"`
	RetryMax  time.Duration `env:"SYS1_RETRY_MAX"`
	// StoreRetry is how long a finished run retries storing its outcome in place (keeping its
	// delivery alive meanwhile) before giving up and being redelivered.
	StoreRetry time.Duration `env:"SYS1_STORE_RETRY"`
	// ProbeInterval is how often each provider is probed for health (/readyz, health).
	ProbeInterval time.Duration `env:"SYS1_PROBE_INTERVAL"`
	// StatusInterval is how often the replica reads the shared consumers' state (pending,
	// pause) for health and metrics.
	StatusInterval time.Duration `env:"SYS1_STATUS_INTERVAL"`
	// OrphanSweepInterval is how often the replica looks for requests their consumer moved
	// past without finishing them (worker/internal/orphans); one is answered when two sweeps
	// in a row find it.
	OrphanSweepInterval time.Duration `env:"SYS1_ORPHAN_SWEEP_INTERVAL"`
	// RecordState is what records keep of the caller's state and instructions: full, hash or
	// none (contract.RecordState); applied where the record is made, so SYS1_RUNS and
	// ClickHouse hold the same form (the gate never holds them).
	RecordState contract.RecordState `env:"SYS1_RECORD_STATE"`
	// ReviewState is what review items keep of the run's state: full (shown to reviewers)
	// or none.
	ReviewState string `env:"SYS1_REVIEW_STATE"`
	// BatchMaxShare caps the share of this replica's message slots batch requests may hold,
	// even while no interactive request is waiting (above 0, at most 1: all of them; at
	// least one slot). Zero means the default, 1.
	BatchMaxShare float64 `env:"SYS1_BATCH_MAX_SHARE"`
	// CacheMaxTTL bounds how long any answer stays in the exact result cache (and so the age
	// any caller's rule or Sys1-Cache can allow).
	CacheMaxTTL time.Duration `env:"SYS1_CACHE_MAX_TTL"`
	// ID names this replica in run records; default host-pid.
	ID string `env:"SYS1_WORKER_ID"`
	// AllowAnyInbox lets verified callers be answered on any _INBOX.… subject instead of only
	// their own _INBOX.<caller>.… (see auth.ReplyPolicy).
	AllowAnyInbox bool `env:"SYS1_ALLOW_ANY_INBOX"`
}

// DefaultConfig is the replica's configuration with nothing set: the defaults README's
// configuration table documents, stated here once. The command layer starts from it and lets
// SYS1_* variables override what they name; New fills a zero field of a Config built by hand
// from it too.
func DefaultConfig() Config {
	return Config{
		Concurrency: 8, ConcurrencyMode: string(limit.ModeAdaptive), ConcurrencyMin: 1, ConcurrencyTolerance: 1.2,
		MaxDeliver: 5, ShutdownGrace: 30 * time.Second, FetchBatch: 16,
		RetryBase: time.Second, RetryMax: time.Minute, StoreRetry: 2 * time.Minute,
		ProbeInterval: 10 * time.Second, StatusInterval: time.Second, OrphanSweepInterval: time.Minute,
		RecordState: contract.RecordFull, ReviewState: ReviewStateFull, BatchMaxShare: 1, CacheMaxTTL: 168 * time.Hour,
	}
}

// Validate reports every bad variable.
func (c *Config) Validate() []error {
	var errs []error
	if c.Concurrency < 1 || c.Concurrency > 4096 {
		errs = append(errs, fmt.Errorf("SYS1_CONCURRENCY: must be 1–4096, got %d", c.Concurrency))
	}
	if _, err := limit.ParseMode(c.mode()); err != nil {
		errs = append(errs, fmt.Errorf("SYS1_CONCURRENCY_MODE: %q is not one of fixed, adaptive", c.ConcurrencyMode))
	} else if c.Concurrency >= 1 && c.mode() == string(limit.ModeAdaptive) {
		names := map[string]string{"Min": "SYS1_CONCURRENCY_MIN", "Max": "SYS1_CONCURRENCY", "Initial": "SYS1_CONCURRENCY_INITIAL", "Tolerance": "SYS1_CONCURRENCY_TOLERANCE"}
		for _, e := range c.adaptive().Validate() {
			var fe *limit.FieldError
			if errors.As(e, &fe) && names[fe.Field] != "" {
				errs = append(errs, fmt.Errorf("%s: %v %s", names[fe.Field], fe.Value, strings.ReplaceAll(strings.ReplaceAll(fe.Reason, "Max", "SYS1_CONCURRENCY"), "Min", "SYS1_CONCURRENCY_MIN")))
			}
		}
	}
	if c.MaxDeliver < 1 || c.MaxDeliver > 100 {
		errs = append(errs, fmt.Errorf("SYS1_MAX_DELIVER: must be 1–100, got %d", c.MaxDeliver))
	}
	if c.ShutdownGrace < 0 {
		errs = append(errs, fmt.Errorf("SYS1_SHUTDOWN_GRACE: must not be negative, got %s", c.ShutdownGrace))
	}
	if c.FetchBatch < 1 || c.FetchBatch > 1024 {
		errs = append(errs, fmt.Errorf("SYS1_FETCH_BATCH: must be 1–1024, got %d", c.FetchBatch))
	}
	if c.RetryBase <= 0 {
		errs = append(errs, fmt.Errorf("SYS1_RETRY_BASE: must be positive, got %s", c.RetryBase))
	}
	if c.RecordState != "" && !c.RecordState.Valid() {
		errs = append(errs, fmt.Errorf("SYS1_RECORD_STATE: %q is not one of full, hash, none", c.RecordState))
	}
	if c.ReviewState != "" && c.ReviewState != ReviewStateFull && c.ReviewState != ReviewStateNone {
		errs = append(errs, fmt.Errorf("SYS1_REVIEW_STATE: %q is not one of full, none", c.ReviewState))
	}
	if c.BatchMaxShare < 0 || c.BatchMaxShare > 1 || c.BatchMaxShare != c.BatchMaxShare {
		errs = append(errs, fmt.Errorf("SYS1_BATCH_MAX_SHARE: must be above 0 and at most 1, got %v", c.BatchMaxShare))
	}
	if c.CacheMaxTTL < 0 {
		errs = append(errs, fmt.Errorf("SYS1_CACHE_MAX_TTL: must not be negative, got %s", c.CacheMaxTTL))
	}
	if c.StatusInterval < 0 {
		errs = append(errs, fmt.Errorf("SYS1_STATUS_INTERVAL: must not be negative, got %s", c.StatusInterval))
	}
	if c.ProbeInterval < 0 {
		errs = append(errs, fmt.Errorf("SYS1_PROBE_INTERVAL: must not be negative, got %s", c.ProbeInterval))
	}
	if c.OrphanSweepInterval < 0 {
		errs = append(errs, fmt.Errorf("SYS1_ORPHAN_SWEEP_INTERVAL: must not be negative, got %s", c.OrphanSweepInterval))
	}
	if c.StoreRetry < 0 {
		errs = append(errs, fmt.Errorf("SYS1_STORE_RETRY: must not be negative, got %s", c.StoreRetry))
	}
	if c.RetryMax < c.RetryBase {
		errs = append(errs, fmt.Errorf("SYS1_RETRY_MAX: %s is below SYS1_RETRY_BASE %s", c.RetryMax, c.RetryBase))
	}
	return errs
}

// ReplicaID is the replica's id: SYS1_WORKER_ID, or host-pid when it is unset. It names the
// replica in run records, logs, /metrics and its NATS connection.
func (c *Config) ReplicaID() string {
	if c.ID != "" {
		return c.ID
	}
	host, _ := os.Hostname()
	if host == "" {
		host = "worker"
	}
	return fmt.Sprintf("%s-%d", host, os.Getpid())
}

// withDefaults fills what a Config built by hand leaves zero, from DefaultConfig.
func (c *Config) withDefaults() Config {
	def := DefaultConfig()
	out := *c
	out.ID = c.ReplicaID()
	if out.RecordState == "" {
		out.RecordState = def.RecordState
	}
	if out.ReviewState == "" {
		out.ReviewState = def.ReviewState
	}
	if out.BatchMaxShare == 0 {
		out.BatchMaxShare = def.BatchMaxShare
	}
	if out.CacheMaxTTL == 0 {
		out.CacheMaxTTL = def.CacheMaxTTL
	}
	if out.StatusInterval <= 0 {
		out.StatusInterval = def.StatusInterval
	}
	if out.ProbeInterval <= 0 {
		out.ProbeInterval = def.ProbeInterval
	}
	if out.OrphanSweepInterval <= 0 {
		out.OrphanSweepInterval = def.OrphanSweepInterval
	}
	if out.FetchBatch > out.Concurrency {
		out.FetchBatch = out.Concurrency
	}
	return out
}

func (c *Config) mode() string {
	if c.ConcurrencyMode == "" {
		return string(limit.ModeAdaptive)
	}
	return c.ConcurrencyMode
}

// adaptive is the adaptive limiter's configuration for one provider of this replica.
func (c *Config) adaptive() limit.AdaptiveConfig {
	a := limit.DefaultAdaptiveConfig(c.Concurrency)
	if c.ConcurrencyMin != 0 {
		a.Min = c.ConcurrencyMin
	}
	a.Initial = a.Min
	if c.ConcurrencyInitial != 0 {
		a.Initial = c.ConcurrencyInitial
	}
	if c.ConcurrencyTolerance != 0 {
		a.Tolerance = c.ConcurrencyTolerance
	}
	return a
}

// newLimiter is one provider's limiter.
func (c *Config) newLimiter() (limit.Limiter, error) {
	mode, err := limit.ParseMode(c.mode())
	if err != nil {
		return nil, err
	}
	return limit.New(mode, c.adaptive())
}

// SYS1_REVIEW_STATE values.
const (
	ReviewStateFull = "full"
	ReviewStateNone = "none"
)

// retry is the redelivery policy of transient failures.
func (c *Config) retry() RetryPolicy { return RetryPolicy{Base: c.RetryBase, Max: c.RetryMax} }
