// Package topology names and creates the JetStream objects of sys1 (SPEC §2): the request,
// run-record and reply streams, the shared worker and sink consumers, and the run-id bucket.
//
// Every object is created or updated idempotently at start-up. A difference JetStream cannot
// reconcile in place (a stream's retention or storage, say) is a start-up error that names the
// object and the field, never silent drift.
package topology

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/contract/wire"
)

// Config names every JetStream object and its limits. Defaults are SPEC §2's.
type Config struct {
	RequestsStream string `env:"SYS1_REQUESTS_STREAM"`
	RunsStream     string `env:"SYS1_RUNS_STREAM"`
	RepliesStream  string `env:"SYS1_REPLIES_STREAM"`
	ReviewStream   string `env:"SYS1_REVIEW_STREAM"`
	// LabelsStream keeps the checked labels (accepted and rejected), for the sink;
	// LabelSubmissionsStream the labels producers submit until a worker has checked them.
	LabelsStream           string `env:"SYS1_LABELS_STREAM"`
	LabelSubmissionsStream string `env:"SYS1_LABEL_SUBMISSIONS_STREAM"`
	WorkerConsumer         string `env:"SYS1_WORKER_CONSUMER"`
	BatchConsumer          string `env:"SYS1_BATCH_CONSUMER"`
	SinkConsumer           string `env:"SYS1_SINK_CONSUMER"`
	// LabelsConsumer is the workers' consumer of submitted labels (they check each against its
	// run); SinkLabelsConsumer drains the checked ones into ClickHouse.
	LabelsConsumer     string `env:"SYS1_LABELS_CONSUMER"`
	SinkLabelsConsumer string `env:"SYS1_SINK_LABELS_CONSUMER"`
	RunsBucket         string `env:"SYS1_RUNS_BUCKET"`
	// ReviewBucket holds who labelled each review item (the first label wins);
	// CalibrationBucket the temperature fits; CacheBucket the exact result cache.
	ReviewBucket      string `env:"SYS1_REVIEW_BUCKET"`
	CalibrationBucket string `env:"SYS1_CALIBRATION_BUCKET"`
	CacheBucket       string `env:"SYS1_CACHE_BUCKET"`
	// ReviewSessionsBucket holds the review page's sessions (sys1 review); the workers only
	// read its size.
	ReviewSessionsBucket string `env:"SYS1_REVIEW_SESSIONS_BUCKET"`
	// FleetBucket holds what an operator switches for the whole fleet at run time: the
	// lanes' pauses (sys1 pause, worker/pause).
	FleetBucket string `env:"SYS1_FLEET_BUCKET"`
	// DeadLetterStream keeps JetStream's max-deliveries advisories for the request consumers,
	// so a request that ran out of deliveries is answered by a worker (DeadLetterConsumer)
	// even when no worker was listening at that moment.
	DeadLetterStream   string `env:"SYS1_DEAD_LETTER_STREAM"`
	DeadLetterConsumer string `env:"SYS1_DEAD_LETTER_CONSUMER"`
	// HoldsConsumer is the workers' consumer of accepted labels: a reviewer's label releases
	// the reply of a run held for it (review: hold).
	HoldsConsumer string `env:"SYS1_HOLDS_CONSUMER"`
	// ConsumerMaxDeliver bounds the deliveries of one request message on the request
	// consumers. It must exceed SYS1_MAX_DELIVER: the worker answers a run whose provider
	// keeps failing after SYS1_MAX_DELIVER deliveries itself; this is the backstop for
	// deliveries that could not even do that (NATS or KV trouble, crashed replicas, a duplicate
	// waiting for its run, a run waiting for its caller's rate limit or in-flight slot), after
	// which the run is dead-lettered and answered with an error. With the retry schedule
	// capped at SYS1_RETRY_MAX (60s), 100 deliveries ride out well over an hour of trouble.
	ConsumerMaxDeliver int `env:"SYS1_CONSUMER_MAX_DELIVER"`
	// LimitsBucket holds the per-caller budget and rate-limit counters.
	LimitsBucket   string        `env:"SYS1_LIMITS_BUCKET"`
	Replicas       int           `env:"SYS1_STREAM_REPLICAS"`
	RequestsMaxAge time.Duration `env:"SYS1_REQUESTS_MAX_AGE"`
	RunsMaxAge     time.Duration `env:"SYS1_RUNS_MAX_AGE"`
	RepliesMaxAge  time.Duration `env:"SYS1_REPLIES_MAX_AGE"`
	ReviewMaxAge   time.Duration `env:"SYS1_REVIEW_MAX_AGE"`
	LabelsMaxAge   time.Duration `env:"SYS1_LABELS_MAX_AGE"`
	// RunIDTTL is how long the run-id gate remembers a run (ownership and stored outcome). It
	// must outlive the request stream's max age so every redelivery finds its run.
	RunIDTTL time.Duration `env:"SYS1_RUN_ID_TTL"`
	// DedupeWindow is the JetStream Nats-Msg-Id window of the request stream (at most its max
	// age); the run and reply streams use it too, capped at their own max age.
	DedupeWindow time.Duration `env:"SYS1_DEDUPE_WINDOW"`
	// AckWait is how long a delivery may run without an ack or InProgress before redelivery.
	AckWait time.Duration `env:"SYS1_ACK_WAIT"`
	// MaxAckPending caps unacknowledged messages across ALL replicas of the shared consumer; it
	// must be at least 2 × replicas × SYS1_CONCURRENCY (a replica holds up to twice its
	// concurrency in messages) or replicas starve each other.
	MaxAckPending int `env:"SYS1_MAX_ACK_PENDING"`
	// MaxPayload is the largest request accepted by the stream (bytes).
	MaxMsgSize int32 `env:"SYS1_MAX_MSG_SIZE"`

	// Byte limits: every stream and bucket is bounded, and the defaults together are the
	// storage budget README's "Storage budget" explains (about 23.7 GiB of file storage and
	// 256 MiB of memory on each NATS server). What happens at a limit is each stream's
	// discard policy: see the stream configs below.
	RequestsMaxBytes         Bytes `env:"SYS1_REQUESTS_MAX_BYTES"`
	RunsMaxBytes             Bytes `env:"SYS1_RUNS_MAX_BYTES"`
	RepliesMaxBytes          Bytes `env:"SYS1_REPLIES_MAX_BYTES"`
	ReviewMaxBytes           Bytes `env:"SYS1_REVIEW_MAX_BYTES"`
	LabelsMaxBytes           Bytes `env:"SYS1_LABELS_MAX_BYTES"`
	LabelSubmissionsMaxBytes Bytes `env:"SYS1_LABEL_SUBMISSIONS_MAX_BYTES"`
	DeadLettersMaxBytes      Bytes `env:"SYS1_DEAD_LETTERS_MAX_BYTES"`
	RunsBucketMaxBytes       Bytes `env:"SYS1_RUNS_BUCKET_MAX_BYTES"`
	ReviewBucketMaxBytes     Bytes `env:"SYS1_REVIEW_BUCKET_MAX_BYTES"`
	CalibrationMaxBytes      Bytes `env:"SYS1_CALIBRATION_BUCKET_MAX_BYTES"`
	CacheMaxBytes            Bytes `env:"SYS1_CACHE_BUCKET_MAX_BYTES"`
	LimitsMaxBytes           Bytes `env:"SYS1_LIMITS_BUCKET_MAX_BYTES"`
	ReviewSessionsMaxBytes   Bytes `env:"SYS1_REVIEW_SESSIONS_MAX_BYTES"`
	FleetMaxBytes            Bytes `env:"SYS1_FLEET_BUCKET_MAX_BYTES"`

	// Per-caller quotas, so that no caller takes the shared budget. JetStream enforces each
	// at publish time on the caller's subject (a per-subject limit that refuses new messages):
	// requests waiting on sys1.decide.<caller> (and on each sys1.batch.<caller>.<batch>),
	// review items on sys1.review.<caller>, label submissions waiting on sys1.labels.<caller>.
	// Only that caller's publish is refused; everyone else's goes on.
	RequestsPerCaller int `env:"SYS1_REQUESTS_MAX_PER_CALLER"`
	ReviewPerCaller   int `env:"SYS1_REVIEW_MAX_PER_CALLER"`
	LabelsPerCaller   int `env:"SYS1_LABELS_MAX_PER_CALLER"`
	// RejectedLabelsMaxAge is how long a rejected label submission is kept on SYS1_LABELS
	// for the sink's dead-letter table (as long as run records wait for the sink).
	RejectedLabelsMaxAge time.Duration `env:"SYS1_LABELS_REJECTED_MAX_AGE"`

	// FairShare reads each flow (a caller's requests, a batch, a caller's label submissions)
	// through a consumer of its own and shares every replica's slots between callers by
	// weighted round robin (worker/fair); off, the lanes' shared consumers deliver in arrival
	// order. Every replica of a fleet must run the same way: each removes the other way's
	// consumers at start-up.
	FairShare bool `env:"SYS1_FAIR_SHARE"`
	// FlowInactiveThreshold is how long a flow's consumer may go without a pull (and without
	// a message in hand) before JetStream removes it; it is created again with the flow's
	// next message.
	FlowInactiveThreshold time.Duration `env:"SYS1_FLOW_INACTIVE_THRESHOLD"`
}

// Validate reports every bad variable.
func (c *Config) Validate() []error {
	var errs []error
	for _, f := range []struct{ name, v string }{
		{"SYS1_REQUESTS_STREAM", c.RequestsStream}, {"SYS1_RUNS_STREAM", c.RunsStream},
		{"SYS1_REPLIES_STREAM", c.RepliesStream}, {"SYS1_WORKER_CONSUMER", c.WorkerConsumer},
		{"SYS1_SINK_CONSUMER", c.SinkConsumer}, {"SYS1_RUNS_BUCKET", c.RunsBucket},
		{"SYS1_REVIEW_STREAM", c.ReviewStream}, {"SYS1_LABELS_STREAM", c.LabelsStream},
		{"SYS1_LABEL_SUBMISSIONS_STREAM", c.LabelSubmissionsStream},
		{"SYS1_BATCH_CONSUMER", c.BatchConsumer}, {"SYS1_LABELS_CONSUMER", c.LabelsConsumer},
		{"SYS1_SINK_LABELS_CONSUMER", c.SinkLabelsConsumer}, {"SYS1_REVIEW_BUCKET", c.ReviewBucket},
		{"SYS1_CALIBRATION_BUCKET", c.CalibrationBucket}, {"SYS1_CACHE_BUCKET", c.CacheBucket},
		{"SYS1_LIMITS_BUCKET", c.LimitsBucket}, {"SYS1_DEAD_LETTER_STREAM", c.DeadLetterStream},
		{"SYS1_DEAD_LETTER_CONSUMER", c.DeadLetterConsumer}, {"SYS1_HOLDS_CONSUMER", c.HoldsConsumer},
		{"SYS1_REVIEW_SESSIONS_BUCKET", c.ReviewSessionsBucket}, {"SYS1_FLEET_BUCKET", c.FleetBucket},
	} {
		if !validName(f.v) {
			errs = append(errs, fmt.Errorf("%s: %q is not a valid JetStream name (letters, digits, - and _ only)", f.name, f.v))
		}
	}
	if c.Replicas < 1 || c.Replicas > 5 {
		errs = append(errs, fmt.Errorf("SYS1_STREAM_REPLICAS: must be 1–5, got %d", c.Replicas))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"SYS1_REQUESTS_MAX_AGE", c.RequestsMaxAge}, {"SYS1_RUNS_MAX_AGE", c.RunsMaxAge}, {"SYS1_REPLIES_MAX_AGE", c.RepliesMaxAge}, {"SYS1_REVIEW_MAX_AGE", c.ReviewMaxAge}, {"SYS1_LABELS_MAX_AGE", c.LabelsMaxAge}, {"SYS1_RUN_ID_TTL", c.RunIDTTL}, {"SYS1_DEDUPE_WINDOW", c.DedupeWindow}, {"SYS1_ACK_WAIT", c.AckWait}} {
		if d.v <= 0 {
			errs = append(errs, fmt.Errorf("%s: must be a positive duration, got %s", d.name, d.v))
		}
	}
	if c.RunIDTTL > 0 && c.RequestsMaxAge > 0 && c.RunIDTTL < c.RequestsMaxAge {
		errs = append(errs, fmt.Errorf("SYS1_RUN_ID_TTL: %s is shorter than SYS1_REQUESTS_MAX_AGE %s; redeliveries could score a run twice", c.RunIDTTL, c.RequestsMaxAge))
	}
	if c.DedupeWindow > c.RequestsMaxAge && c.RequestsMaxAge > 0 {
		errs = append(errs, fmt.Errorf("SYS1_DEDUPE_WINDOW: %s exceeds SYS1_REQUESTS_MAX_AGE %s", c.DedupeWindow, c.RequestsMaxAge))
	}
	if c.ConsumerMaxDeliver < 2 || c.ConsumerMaxDeliver > 1000 {
		errs = append(errs, fmt.Errorf("SYS1_CONSUMER_MAX_DELIVER: must be 2–1000, got %d", c.ConsumerMaxDeliver))
	}
	if c.MaxAckPending < 1 {
		errs = append(errs, fmt.Errorf("SYS1_MAX_ACK_PENDING: must be positive, got %d", c.MaxAckPending))
	}
	if c.MaxMsgSize < 1024 {
		errs = append(errs, fmt.Errorf("SYS1_MAX_MSG_SIZE: must be at least 1024 bytes, got %d", c.MaxMsgSize))
	}
	for _, b := range c.byteLimits() {
		if b.v < b.min {
			errs = append(errs, fmt.Errorf("%s: must be at least %s, got %s", b.name, b.min, b.v))
		}
	}
	for _, q := range []struct {
		name string
		v    int
	}{{"SYS1_REQUESTS_MAX_PER_CALLER", c.RequestsPerCaller}, {"SYS1_REVIEW_MAX_PER_CALLER", c.ReviewPerCaller}, {"SYS1_LABELS_MAX_PER_CALLER", c.LabelsPerCaller}} {
		if q.v < 1 {
			errs = append(errs, fmt.Errorf("%s: must be at least 1, got %d", q.name, q.v))
		}
	}
	if c.FlowInactiveThreshold < time.Second {
		errs = append(errs, fmt.Errorf("SYS1_FLOW_INACTIVE_THRESHOLD: must be at least 1s, got %s", c.FlowInactiveThreshold))
	}
	if c.RejectedLabelsMaxAge <= 0 {
		errs = append(errs, fmt.Errorf("SYS1_LABELS_REJECTED_MAX_AGE: must be a positive duration, got %s", c.RejectedLabelsMaxAge))
	} else if c.LabelsMaxAge > 0 && c.RejectedLabelsMaxAge > c.LabelsMaxAge {
		errs = append(errs, fmt.Errorf("SYS1_LABELS_REJECTED_MAX_AGE: %s exceeds SYS1_LABELS_MAX_AGE %s", c.RejectedLabelsMaxAge, c.LabelsMaxAge))
	}
	return errs
}

// byteLimit is one SYS1_*_MAX_BYTES variable and the least it may be.
type byteLimit struct {
	name   string
	v, min Bytes
}

// byteLimits lists every byte limit. A stream must hold at least its largest message (its
// max message size; JetStream refuses a smaller limit); a bucket at least a few entries.
func (c Config) byteLimits() []byteLimit {
	msg := Bytes(max(c.MaxMsgSize, 1024))
	return []byteLimit{
		{"SYS1_REQUESTS_MAX_BYTES", c.RequestsMaxBytes, msg}, {"SYS1_RUNS_MAX_BYTES", c.RunsMaxBytes, msg},
		{"SYS1_REPLIES_MAX_BYTES", c.RepliesMaxBytes, msg}, {"SYS1_REVIEW_MAX_BYTES", c.ReviewMaxBytes, msg},
		{"SYS1_LABELS_MAX_BYTES", c.LabelsMaxBytes, MiB}, {"SYS1_LABEL_SUBMISSIONS_MAX_BYTES", c.LabelSubmissionsMaxBytes, MiB},
		{"SYS1_DEAD_LETTERS_MAX_BYTES", c.DeadLettersMaxBytes, MiB}, {"SYS1_RUNS_BUCKET_MAX_BYTES", c.RunsBucketMaxBytes, msg},
		{"SYS1_REVIEW_BUCKET_MAX_BYTES", c.ReviewBucketMaxBytes, MiB}, {"SYS1_CALIBRATION_BUCKET_MAX_BYTES", c.CalibrationMaxBytes, MiB},
		{"SYS1_CACHE_BUCKET_MAX_BYTES", c.CacheMaxBytes, msg}, {"SYS1_LIMITS_BUCKET_MAX_BYTES", c.LimitsMaxBytes, MiB},
		{"SYS1_REVIEW_SESSIONS_MAX_BYTES", c.ReviewSessionsMaxBytes, MiB}, {"SYS1_FLEET_BUCKET_MAX_BYTES", c.FleetMaxBytes, MiB},
	}
}

// StorageBudget is what the byte limits add up to on each NATS server: file storage and
// memory (the cache bucket). With SYS1_STREAM_REPLICAS=3 each of the three servers holds it.
func (c Config) StorageBudget() (file, memory Bytes) {
	for _, b := range c.byteLimits() {
		if b.name == "SYS1_CACHE_BUCKET_MAX_BYTES" {
			memory += b.v
		} else {
			file += b.v
		}
	}
	return file, memory
}

// StreamVariables maps each stream's and bucket's name (a bucket's stream is KV_<bucket>) to
// the variable of its byte limit, for messages that tell an operator what to raise.
func (c Config) StreamVariables() map[string]string {
	return map[string]string{
		c.RequestsStream: "SYS1_REQUESTS_MAX_BYTES", c.RunsStream: "SYS1_RUNS_MAX_BYTES",
		c.RepliesStream: "SYS1_REPLIES_MAX_BYTES", c.ReviewStream: "SYS1_REVIEW_MAX_BYTES",
		c.LabelsStream: "SYS1_LABELS_MAX_BYTES", c.LabelSubmissionsStream: "SYS1_LABEL_SUBMISSIONS_MAX_BYTES",
		c.DeadLetterStream: "SYS1_DEAD_LETTERS_MAX_BYTES", KVStream(c.RunsBucket): "SYS1_RUNS_BUCKET_MAX_BYTES",
		KVStream(c.ReviewBucket): "SYS1_REVIEW_BUCKET_MAX_BYTES", KVStream(c.CalibrationBucket): "SYS1_CALIBRATION_BUCKET_MAX_BYTES",
		KVStream(c.CacheBucket): "SYS1_CACHE_BUCKET_MAX_BYTES", KVStream(c.LimitsBucket): "SYS1_LIMITS_BUCKET_MAX_BYTES",
		KVStream(c.ReviewSessionsBucket): "SYS1_REVIEW_SESSIONS_MAX_BYTES", KVStream(c.FleetBucket): "SYS1_FLEET_BUCKET_MAX_BYTES",
	}
}

// KVStream is the name of a KV bucket's stream.
func KVStream(bucket string) string { return "KV_" + bucket }

func validName(s string) bool {
	if s == "" || len(s) > 255 {
		return false
	}
	for _, r := range s {
		if !(r == '-' || r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
			return false
		}
	}
	return true
}

// Default is the configuration with nothing set: the defaults (SPEC §2 and README), stated
// here once. The command layer starts from it and lets SYS1_* variables override what they
// name.
func Default() Config {
	return Config{
		RequestsStream: wire.RequestsStream, RunsStream: wire.RunsStream, RepliesStream: wire.RepliesStream,
		ReviewStream: wire.ReviewStream, LabelsStream: wire.LabelsStream, LabelSubmissionsStream: wire.LabelSubmissionsStream,
		DeadLetterStream: wire.DeadLetterStream,
		WorkerConsumer:   wire.WorkerConsumer, BatchConsumer: wire.BatchConsumer, SinkConsumer: wire.SinkConsumer,
		LabelsConsumer: wire.LabelsConsumer, SinkLabelsConsumer: wire.SinkLabelsConsumer, HoldsConsumer: wire.HoldsConsumer,
		DeadLetterConsumer: wire.DeadLetterConsumer,
		RunsBucket:         wire.RunsBucket, ReviewBucket: wire.ReviewBucket, CalibrationBucket: wire.CalibrationBucket,
		CacheBucket: wire.CacheBucket, LimitsBucket: wire.LimitsBucket, ReviewSessionsBucket: wire.ReviewSessionsBucket,
		FleetBucket:        wire.FleetBucket,
		ConsumerMaxDeliver: 100, Replicas: 1, RequestsMaxAge: 24 * time.Hour, RunsMaxAge: 7 * 24 * time.Hour,
		RepliesMaxAge: 24 * time.Hour, ReviewMaxAge: 30 * 24 * time.Hour, LabelsMaxAge: 30 * 24 * time.Hour, RunIDTTL: 7 * 24 * time.Hour, DedupeWindow: 2 * time.Minute,
		AckWait: 30 * time.Second, MaxAckPending: 1024, MaxMsgSize: 8 << 20,
		RequestsMaxBytes: 4 * GiB, RunsMaxBytes: 8 * GiB, RepliesMaxBytes: 1 * GiB, ReviewMaxBytes: 4 * GiB,
		LabelsMaxBytes: 1 * GiB, LabelSubmissionsMaxBytes: 1 * GiB, DeadLettersMaxBytes: 64 * MiB,
		RunsBucketMaxBytes: 4 * GiB, ReviewBucketMaxBytes: 256 * MiB, CalibrationMaxBytes: 64 * MiB,
		CacheMaxBytes: 256 * MiB, LimitsMaxBytes: 256 * MiB, ReviewSessionsMaxBytes: 64 * MiB, FleetMaxBytes: 1 * MiB,
		RequestsPerCaller: 10000, ReviewPerCaller: 5000, LabelsPerCaller: 5000, RejectedLabelsMaxAge: 7 * 24 * time.Hour,
		FairShare: true, FlowInactiveThreshold: 10 * time.Minute,
	}
}

// RequestsStreamConfig is SYS1_REQUESTS: a file-backed work queue with publish de-duplication.
//
// Intake refuses rather than drops: at SYS1_REQUESTS_MAX_BYTES a new request is refused
// (the producer's publish fails with JetStream's "maximum bytes exceeded"), and a subject
// holding SYS1_REQUESTS_MAX_PER_CALLER requests refuses the next one ("maximum messages per
// subject exceeded"), so one caller's backlog never crowds out another's. Nothing accepted is
// ever discarded to make room.
func (c Config) RequestsStreamConfig() jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:                 c.RequestsStream,
		Description:          "sys1 decision requests (work queue): interactive and batch",
		Subjects:             []string{wire.DecideSubjects, wire.BatchSubjects},
		Retention:            jetstream.WorkQueuePolicy,
		Storage:              jetstream.FileStorage,
		Replicas:             c.Replicas,
		MaxAge:               c.RequestsMaxAge,
		Duplicates:           c.DedupeWindow,
		MaxMsgSize:           c.MaxMsgSize,
		MaxBytes:             int64(c.RequestsMaxBytes),
		Discard:              jetstream.DiscardNew,
		MaxMsgsPerSubject:    int64(c.RequestsPerCaller),
		DiscardNewPerSubject: true,
		RePublish:            arrivals(),
	}
}

// RunsStreamConfig is SYS1_RUNS: the durable outbox of run records. A record is never
// dropped to make room (the sink may not have copied it): at SYS1_RUNS_MAX_BYTES new records
// are refused, and workers hold their runs' acks until there is room again (back-pressure;
// health and sys1_worker_stream_bytes say so).
func (c Config) RunsStreamConfig() jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        c.RunsStream,
		Description: "sys1 run records (outbox for the sink)",
		Subjects:    []string{wire.RunsSubjects},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    c.Replicas,
		MaxAge:      c.RunsMaxAge,
		Duplicates:  min(c.DedupeWindow, c.RunsMaxAge), // JetStream refuses a window longer than the max age
		MaxMsgSize:  c.MaxMsgSize,
		MaxBytes:    int64(c.RunsMaxBytes),
		Discard:     jetstream.DiscardNew,
	}
}

// RepliesStreamConfig is SYS1_REPLIES: durable replies for producers that may be offline.
// A durable reply is a copy, not the only one: the run-id gate keeps every finished run's
// reply for SYS1_RUN_ID_TTL and answers a request sent again with its run id from it. So at
// SYS1_REPLIES_MAX_BYTES the oldest replies go first, as they would at SYS1_REPLIES_MAX_AGE,
// and a full replies stream never stops a run from being answered.
func (c Config) RepliesStreamConfig() jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        c.RepliesStream,
		Description: "sys1 durable replies",
		Subjects:    []string{wire.RepliesSubjects},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    c.Replicas,
		MaxAge:      c.RepliesMaxAge,
		Duplicates:  min(c.DedupeWindow, c.RepliesMaxAge), // JetStream refuses a window longer than the max age
		MaxMsgSize:  c.MaxMsgSize,
		MaxBytes:    int64(c.RepliesMaxBytes),
		Discard:     jetstream.DiscardOld,
	}
}

// ReviewStreamConfig is SYS1_REVIEW: questions sent to human review, one message per run
// (contract.ReviewRun). Full, or at a caller's SYS1_REVIEW_MAX_PER_CALLER, a new item is
// refused; the run is still answered, its reply saying the review was not queued.
func (c Config) ReviewStreamConfig() jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:                 c.ReviewStream,
		Description:          "sys1 review items (abstained and audited answers)",
		Subjects:             []string{wire.ReviewSubjects},
		Retention:            jetstream.LimitsPolicy,
		Storage:              jetstream.FileStorage,
		Replicas:             c.Replicas,
		MaxAge:               c.ReviewMaxAge,
		Duplicates:           min(c.DedupeWindow, c.ReviewMaxAge),
		MaxMsgSize:           c.MaxMsgSize,
		MaxBytes:             int64(c.ReviewMaxBytes),
		Discard:              jetstream.DiscardNew,
		MaxMsgsPerSubject:    int64(c.ReviewPerCaller),
		DiscardNewPerSubject: true,
	}
}

// LabelsStreamConfig is SYS1_LABELS: labels as checked by the workers (accepted, and the
// rejected submissions with their reasons) and as given on the review page, for the sink.
// Like run records they are never dropped to make room: full, new ones are refused and wait
// (back-pressure). A rejection carries a per-message TTL (SYS1_LABELS_REJECTED_MAX_AGE), so
// rejected submissions are not kept for the labels' 30 days.
func (c Config) LabelsStreamConfig() jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        c.LabelsStream,
		Description: "sys1 labels (accepted, rejected)",
		Subjects:    []string{wire.LabelsAccepted, wire.LabelsRejected},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    c.Replicas,
		MaxAge:      c.LabelsMaxAge,
		Duplicates:  min(c.DedupeWindow, c.LabelsMaxAge),
		MaxMsgSize:  int32(contract.MaxLabelMessageBytes),
		MaxBytes:    int64(c.LabelsMaxBytes),
		Discard:     jetstream.DiscardNew,
		AllowMsgTTL: true,
	}
}

// LabelSubmissionsStreamConfig is SYS1_LABEL_SUBMISSIONS: labels as producers submit them
// (sys1.labels.<caller>), a work queue the workers check and so empty. A submission larger
// than a label can be (contract.MaxLabelMessageBytes: a label and its headers) is refused at publish, and so is one from a
// caller with SYS1_LABELS_MAX_PER_CALLER submissions still waiting.
func (c Config) LabelSubmissionsStreamConfig() jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:                 c.LabelSubmissionsStream,
		Description:          "sys1 labels submitted by producers, until a worker has checked them",
		Subjects:             []string{wire.LabelsSubmitted},
		Retention:            jetstream.WorkQueuePolicy,
		Storage:              jetstream.FileStorage,
		Replicas:             c.Replicas,
		MaxAge:               c.LabelsMaxAge,
		Duplicates:           min(c.DedupeWindow, c.LabelsMaxAge),
		MaxMsgSize:           int32(contract.MaxLabelMessageBytes),
		MaxBytes:             int64(c.LabelSubmissionsMaxBytes),
		Discard:              jetstream.DiscardNew,
		MaxMsgsPerSubject:    int64(c.LabelsPerCaller),
		DiscardNewPerSubject: true,
		RePublish:            arrivals(),
	}
}

// arrivals republishes the headers of each stored message on sys1.arrivals.<subject>
// (wire.ArrivalsPrefix): a hint that wakes idle replicas, never the queue itself.
func arrivals() *jetstream.RePublish {
	return &jetstream.RePublish{Source: ">", Destination: wire.ArrivalsSubjects, HeadersOnly: true}
}

// DeadLetterStreamConfig is SYS1_DEAD_LETTERS: JetStream's max-deliveries advisories of the
// request consumers. A request message that ran out of deliveries stays in SYS1_REQUESTS,
// no longer delivered; its advisory, kept here, is how a worker finds it, answers it with an
// error, records it and removes it (worker.deadLetters). Advisories are a few hundred bytes
// and there is one per such request, so the default 64 MiB holds about 200,000.
func (c Config) DeadLetterStreamConfig() jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        c.DeadLetterStream,
		Description: "sys1 request messages that ran out of deliveries (JetStream advisories)",
		Subjects:    []string{MaxDeliveriesAdvisories(c.RequestsStream)},
		Retention:   jetstream.WorkQueuePolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    c.Replicas,
		MaxAge:      c.RequestsMaxAge,
		Duplicates:  min(c.DedupeWindow, c.RequestsMaxAge),
		MaxMsgSize:  64 << 10, // an advisory is a few hundred bytes
		MaxBytes:    int64(c.DeadLettersMaxBytes),
		Discard:     jetstream.DiscardNew,
	}
}

// MaxDeliveriesAdvisories is the subject of JetStream's advisories for messages of stream
// that reached a consumer's max deliver.
func MaxDeliveriesAdvisories(stream string) string {
	return "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES." + stream + ".*"
}

// DeadLetterConsumerConfig is the workers' shared consumer of SYS1_DEAD_LETTERS.
func (c Config) DeadLetterConsumerConfig() jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       c.DeadLetterConsumer,
		Description:   "sys1 workers answering request messages that ran out of deliveries",
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       c.AckWait,
		MaxDeliver:    -1, // answering a dead letter can wait out NATS trouble: it is retried
		MaxAckPending: 64,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		Replicas:      c.Replicas,
	}
}

// WorkerConsumerConfig is the durable pull consumer every worker replica shares.
//
// MaxDeliver is bounded (ConsumerMaxDeliver) so that no message can be redelivered forever:
// the worker answers runs whose provider keeps failing after SYS1_MAX_DELIVER deliveries
// itself, and JetStream's advisory for a message past this bound leads a worker to answer it
// (DeadLetterStreamConfig), so nothing is dropped silently either.
func (c Config) WorkerConsumerConfig() jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       c.WorkerConsumer,
		Description:   "sys1 worker replicas (shared): interactive requests",
		FilterSubject: wire.DecideSubjects,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       c.AckWait,
		MaxDeliver:    c.ConsumerMaxDeliver,
		MaxAckPending: c.MaxAckPending,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		Replicas:      c.Replicas,
	}
}

// BatchConsumerConfig is the durable pull consumer of batch requests, shared like the
// interactive one; a replica serves it only with slots no interactive request is waiting for.
func (c Config) BatchConsumerConfig() jetstream.ConsumerConfig {
	cc := c.WorkerConsumerConfig()
	cc.Durable, cc.Description, cc.FilterSubject = c.BatchConsumer, "sys1 worker replicas (shared): batch requests", wire.BatchSubjects
	return cc
}

// SinkConsumerConfig is the durable pull consumer the sink drains SYS1_RUNS with.
func (c Config) SinkConsumerConfig(ackWait time.Duration, maxAckPending int) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       c.SinkConsumer,
		Description:   "sys1 sink into ClickHouse",
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       ackWait,
		MaxDeliver:    -1,
		MaxAckPending: maxAckPending,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		Replicas:      c.Replicas,
	}
}

// SinkLabelsConsumerConfig is the durable pull consumer the sink drains checked labels with:
// accepted ones into ClickHouse sys1.labels, rejected ones into the dead-letter table. The
// labels as submitted (sys1.labels.<caller>) are the workers' (LabelsConsumer).
func (c Config) SinkLabelsConsumerConfig(ackWait time.Duration, maxAckPending int) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:        c.SinkLabelsConsumer,
		Description:    "sys1 sink of checked labels into ClickHouse",
		FilterSubjects: []string{wire.LabelsAccepted, wire.LabelsRejected},
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        ackWait,
		MaxDeliver:     -1,
		MaxAckPending:  maxAckPending,
		DeliverPolicy:  jetstream.DeliverAllPolicy,
		Replicas:       c.Replicas,
	}
}

// LabelsConsumerConfig is the durable pull consumer every worker replica shares to check the
// labels producers submit (sys1.labels.<caller>: exactly one token, so neither the checked
// labels under it nor anything deeper) against their runs. MaxDeliver is bounded like the
// request consumers': a label that cannot be checked for NATS or KV trouble is retried with a
// growing delay, and its last delivery is answered with the error.
func (c Config) LabelsConsumerConfig() jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       c.LabelsConsumer,
		Description:   "sys1 worker replicas (shared): labels submitted by producers, checked against their runs",
		FilterSubject: wire.LabelsSubmitted,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       c.AckWait,
		MaxDeliver:    c.ConsumerMaxDeliver,
		MaxAckPending: c.MaxAckPending,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		Replicas:      c.Replicas,
	}
}

// HoldsConsumerConfig is the durable pull consumer every worker replica shares to release
// held replies (review: hold) as reviewers' labels are accepted (sys1.labels.*.accepted).
// Every label that cannot release anything is acked at once; only NATS or KV trouble, or a
// run still finishing, makes one come back, so deliveries are not bounded: giving up would
// withhold a producer's reply for good.
func (c Config) HoldsConsumerConfig() jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       c.HoldsConsumer,
		Description:   "sys1 worker replicas (shared): accepted labels that release held replies",
		FilterSubject: wire.LabelsAccepted,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       c.AckWait,
		MaxDeliver:    -1,
		MaxAckPending: c.MaxAckPending,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		Replicas:      c.Replicas,
	}
}

// RunsBucketConfig is the run-id gate: which caller owns each run id, its attempts so far and,
// once finished, its stored outcome.
func (c Config) RunsBucketConfig() jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket:      c.RunsBucket,
		Description: "sys1 run-id ownership and outcomes",
		History:     1,
		TTL:         c.RunIDTTL,
		Storage:     jetstream.FileStorage,
		Replicas:    c.Replicas,
		MaxBytes:    int64(c.RunsBucketMaxBytes),
	}
}

// ReviewBucketConfig holds one entry per labelled review item (who labelled it, with what):
// creating the entry is how the first label wins. It forgets items when the stream does.
func (c Config) ReviewBucketConfig() jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket: c.ReviewBucket, Description: "sys1 review items labelled (first label wins)",
		History: 1, TTL: c.ReviewMaxAge, Storage: jetstream.FileStorage, Replicas: c.Replicas,
		MaxBytes: int64(c.ReviewBucketMaxBytes),
	}
}

// CalibrationBucketConfig holds the temperature fits workers apply; a few revisions are kept
// so an operator can see what a fit replaced.
func (c Config) CalibrationBucketConfig() jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket: c.CalibrationBucket, Description: "sys1 calibration fits (temperature per model, caller, question)",
		History: 5, Storage: jetstream.FileStorage, Replicas: c.Replicas,
		MaxBytes: int64(c.CalibrationMaxBytes),
	}
}

// CacheBucketConfig is the exact result cache: each entry carries its own TTL (per-key TTL
// needs the limit marker, nats-server 2.11+); maxTTL bounds every entry's life. It lives in
// memory: a cache may be lost (a restart only costs calls), and every lookup is on a run's
// path.
func (c Config) CacheBucketConfig(maxTTL time.Duration) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket: c.CacheBucket, Description: "sys1 exact result cache",
		History: 1, TTL: maxTTL, LimitMarkerTTL: time.Minute, Storage: jetstream.MemoryStorage, Replicas: c.Replicas,
		MaxBytes: int64(c.CacheMaxBytes),
	}
}

// LimitsBucketConfig holds the budget and rate counters, one key per caller, rule and window;
// day windows are the longest, so two days bound every counter's life.
func (c Config) LimitsBucketConfig() jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket: c.LimitsBucket, Description: "sys1 per-caller budget and rate counters",
		History: 1, TTL: 48 * time.Hour, LimitMarkerTTL: time.Minute, Storage: jetstream.FileStorage, Replicas: c.Replicas,
		MaxBytes: int64(c.LimitsMaxBytes),
	}
}

// FleetBucketConfig holds the fleet's run-time switches (the lanes' pauses): a few small
// entries that last until changed.
func (c Config) FleetBucketConfig() jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket: c.FleetBucket, Description: "sys1 fleet switches (sys1 pause)",
		History: 1, Storage: jetstream.FileStorage, Replicas: c.Replicas,
		MaxBytes: int64(c.FleetMaxBytes),
	}
}

// RecreateSettle is how long a stream, bucket or consumer must have been missing before a
// worker or sink recreates it. The wait is not caution for its own sake: a stream recreated
// within milliseconds of its deletion (a pull sees "consumer deleted" at once) can come up
// carrying the deleted stream's last sequence and then never acknowledge a publish
// (nats-server v2.15, seen under load); two seconds later it comes up sound.
const RecreateSettle = 2 * time.Second

// ConsumerGone reports whether a consumer, or the stream under it, no longer exists, as
// opposed to NATS being unreachable (which only needs patience). A pull from a consumer that
// is gone often fails only as "no responders", so callers ask this after a failed pull.
func ConsumerGone(ctx context.Context, js jetstream.JetStream, stream, consumer string) bool {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := js.Consumer(ctx, stream, consumer)
	return errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound)
}

// Option adjusts Ensure and EnsureRunsStream.
type Option func(*options)

type options struct{ log zerolog.Logger }

// WithLogger logs the stream settings Ensure changes back to sys1's configuration.
func WithLogger(log zerolog.Logger) Option { return func(o *options) { o.log = log } }

func newOptions(opts []Option) options {
	o := options{log: zerolog.Nop()}
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// Ensure creates or updates the streams and the run-id bucket. It does not create consumers:
// each component ensures its own (EnsureWorkerConsumer, EnsureSinkConsumer).
func Ensure(ctx context.Context, js jetstream.JetStream, c Config, opts ...Option) (jetstream.KeyValue, error) {
	o := newOptions(opts)
	// SYS1_LABELS before SYS1_LABEL_SUBMISSIONS: a SYS1_LABELS of an earlier version holds
	// sys1.labels.> and must give up the submissions' subjects first.
	for _, sc := range []jetstream.StreamConfig{c.RequestsStreamConfig(), c.RunsStreamConfig(), c.RepliesStreamConfig(), c.ReviewStreamConfig(), c.LabelsStreamConfig(), c.LabelSubmissionsStreamConfig(), c.DeadLetterStreamConfig()} {
		if err := ensureStream(ctx, js, sc, o); err != nil {
			return nil, err
		}
	}
	kv, err := EnsureKeyValue(ctx, js, c.RunsBucketConfig())
	if err != nil {
		return nil, fmt.Errorf("run-id bucket %q: cannot create or update: %w", c.RunsBucket, err)
	}
	return kv, nil
}

// EnsureKeyValue creates a bucket, or updates it to cfg when it exists with another
// configuration. It creates first: jetstream's CreateOrUpdateKeyValue updates first, and an
// update racing the bucket's creation by another client is never answered by nats-server
// 2.15.2 (three replicas starting together on a fresh R3 cluster all waited out the API
// timeout, again and again; a minimal reproduction is TestUpstreamConcurrentCreateOrUpdate
// in this package, and README's known limits say more). Creating the same bucket at once
// from several clients is answered for each.
func EnsureKeyValue(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	kv, err := js.CreateKeyValue(ctx, cfg)
	if errors.Is(err, jetstream.ErrBucketExists) {
		return js.UpdateKeyValue(ctx, cfg)
	}
	return kv, err
}

// EnsureRunsStream creates or updates only SYS1_RUNS (what the sink needs).
func EnsureRunsStream(ctx context.Context, js jetstream.JetStream, c Config, opts ...Option) error {
	return ensureStream(ctx, js, c.RunsStreamConfig(), newOptions(opts))
}

// EnsureLabelsStream creates or updates only SYS1_LABELS (what the sink's label lane needs).
func EnsureLabelsStream(ctx context.Context, js jetstream.JetStream, c Config, opts ...Option) error {
	return ensureStream(ctx, js, c.LabelsStreamConfig(), newOptions(opts))
}

// EnsureLabelSubmissionsStream creates or updates SYS1_LABELS and SYS1_LABEL_SUBMISSIONS,
// in that order (see Ensure): what the workers' label check needs.
func EnsureLabelSubmissionsStream(ctx context.Context, js jetstream.JetStream, c Config, opts ...Option) error {
	o := newOptions(opts)
	if err := ensureStream(ctx, js, c.LabelsStreamConfig(), o); err != nil {
		return err
	}
	return ensureStream(ctx, js, c.LabelSubmissionsStreamConfig(), o)
}

// ensureStream creates the stream, or brings the settings sys1 owns (those its StreamConfig
// sets) back to sc, leaving every other setting an operator chose (placement, compression,
// a message count limit, …) as it is. A stream already as configured is left alone.
func ensureStream(ctx context.Context, js jetstream.JetStream, sc jetstream.StreamConfig, o options) error {
	existing, err := js.Stream(ctx, sc.Name)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		if _, err := js.CreateStream(ctx, sc); err != nil {
			return fmt.Errorf("stream %s: cannot create: %w%s", sc.Name, err, reservationHint(err))
		}
		return nil
	case err != nil:
		return fmt.Errorf("stream %s: cannot look up: %w", sc.Name, err)
	}
	have := existing.CachedInfo().Config
	// JetStream cannot change these in place; say so precisely instead of failing obscurely.
	if have.Retention != sc.Retention {
		return fmt.Errorf("stream %s exists with retention %s, sys1 needs %s; it cannot be changed in place (migrate the stream or configure another name)", sc.Name, have.Retention, sc.Retention)
	}
	if have.Storage != sc.Storage {
		return fmt.Errorf("stream %s exists with %s storage, sys1 needs %s; it cannot be changed in place", sc.Name, have.Storage, sc.Storage)
	}
	want := have
	want.Description, want.Subjects, want.Replicas = sc.Description, sc.Subjects, sc.Replicas
	want.MaxAge, want.Duplicates, want.MaxMsgSize, want.Discard = sc.MaxAge, sc.Duplicates, sc.MaxMsgSize, sc.Discard
	want.MaxBytes = sc.MaxBytes
	if sc.MaxMsgsPerSubject > 0 { // a quota; streams without one leave the setting to the operator
		want.MaxMsgsPerSubject, want.DiscardNewPerSubject = sc.MaxMsgsPerSubject, sc.DiscardNewPerSubject
	}
	want.AllowMsgTTL = want.AllowMsgTTL || sc.AllowMsgTTL // JetStream cannot turn it off again
	if sc.RePublish != nil {                              // streams without one leave the setting to the operator
		want.RePublish = sc.RePublish
	}
	if keep := perSubjectFloor(ctx, existing, have, sc); keep > 0 && keep > want.MaxMsgsPerSubject {
		o.log.Warn().Str("stream", sc.Name).Int64("limit", sc.MaxMsgsPerSubject).Int64("kept", keep).
			Msg("a subject holds more messages than its new per-caller quota, and lowering the limit under them would delete the oldest; the limit stays at what it holds until the next start after it has drained")
		want.MaxMsgsPerSubject = keep
	}
	changes := streamChanges(have, want)
	if len(changes) == 0 {
		return nil
	}
	if _, err := js.UpdateStream(ctx, want); err != nil {
		return fmt.Errorf("stream %s: cannot update to sys1's configuration (%s): %w%s", sc.Name, strings.Join(changes, "; "), err, reservationHint(err))
	}
	o.log.Warn().Str("stream", sc.Name).Strs("changes", changes).
		Msg("stream settings differed from sys1's configuration (SYS1_* variables); updated them")
	return nil
}

// perSubjectFloor is the lowest per-subject limit the stream can take without losing
// messages. JetStream enforces a lowered MaxMsgsPerSubject on update by deleting each
// subject's oldest messages — whatever the discard policy — so a stream that already holds
// more on one subject (a stream from before the quotas, or a quota just lowered) keeps a
// limit as high as that subject's count. 0 when lowering is safe.
func perSubjectFloor(ctx context.Context, s jetstream.Stream, have, sc jetstream.StreamConfig) int64 {
	if sc.MaxMsgsPerSubject <= 0 || (have.MaxMsgsPerSubject > 0 && have.MaxMsgsPerSubject <= sc.MaxMsgsPerSubject) {
		return 0
	}
	if st := s.CachedInfo().State; st.Msgs <= uint64(sc.MaxMsgsPerSubject) {
		return 0 // no subject can hold more than the whole stream
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(">"))
	if err != nil {
		// Cannot tell: keep what the stream has (unlimited stays unlimited) rather than risk it.
		if have.MaxMsgsPerSubject > 0 {
			return have.MaxMsgsPerSubject
		}
		return math.MaxInt64
	}
	var most uint64
	for _, n := range info.State.Subjects {
		most = max(most, n)
	}
	if most <= uint64(sc.MaxMsgsPerSubject) {
		return 0
	}
	return int64(most)
}

// reservationHint explains JetStream's refusal to reserve a byte limit: the server (or the
// account) has less storage than the SYS1_*_MAX_BYTES limits add up to.
func reservationHint(err error) string {
	if Refused(err) == RefusedStorage {
		return " (the NATS server or account cannot reserve this stream's byte limit: lower its SYS1_*_MAX_BYTES, or give JetStream more storage: max_file_store / max_memory_store; README, Storage budget)"
	}
	return ""
}

// streamChanges lists the settings sys1 owns that differ between have and want.
func streamChanges(have, want jetstream.StreamConfig) []string {
	var out []string
	add := func(name string, from, to any) { out = append(out, fmt.Sprintf("%s %v → %v", name, from, to)) }
	if have.Description != want.Description {
		add("description", have.Description, want.Description)
	}
	if !slices.Equal(have.Subjects, want.Subjects) {
		add("subjects", have.Subjects, want.Subjects)
	}
	if have.Replicas != want.Replicas {
		add("replicas", have.Replicas, want.Replicas)
	}
	if have.MaxAge != want.MaxAge {
		add("max_age", have.MaxAge, want.MaxAge)
	}
	if have.Duplicates != want.Duplicates {
		add("duplicate_window", have.Duplicates, want.Duplicates)
	}
	if have.MaxMsgSize != want.MaxMsgSize {
		add("max_msg_size", have.MaxMsgSize, want.MaxMsgSize)
	}
	if have.Discard != want.Discard {
		add("discard", have.Discard, want.Discard)
	}
	if have.MaxBytes != want.MaxBytes {
		add("max_bytes", have.MaxBytes, want.MaxBytes)
	}
	if have.MaxMsgsPerSubject != want.MaxMsgsPerSubject {
		add("max_msgs_per_subject", have.MaxMsgsPerSubject, want.MaxMsgsPerSubject)
	}
	if have.DiscardNewPerSubject != want.DiscardNewPerSubject {
		add("discard_new_per_subject", have.DiscardNewPerSubject, want.DiscardNewPerSubject)
	}
	if have.AllowMsgTTL != want.AllowMsgTTL {
		add("allow_msg_ttl", have.AllowMsgTTL, want.AllowMsgTTL)
	}
	if !equalRePublish(have.RePublish, want.RePublish) {
		add("republish", describeRePublish(have.RePublish), describeRePublish(want.RePublish))
	}
	return out
}

// EnsureWorkerConsumer creates or updates the shared worker consumer.
func EnsureWorkerConsumer(ctx context.Context, js jetstream.JetStream, c Config) (jetstream.Consumer, error) {
	return ensureRequestConsumer(ctx, js, c.RequestsStream, c.WorkerConsumerConfig())
}

// ensureRequestConsumer creates or updates a request consumer, keeping a pause an operator
// set (sys1 pause): a replica starting while the fleet is paused must not resume it.
func ensureRequestConsumer(ctx context.Context, js jetstream.JetStream, stream string, want jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	if have, err := js.Consumer(ctx, stream, want.Durable); err == nil {
		info := have.CachedInfo()
		cfg := info.Config
		if info.Paused && cfg.PauseUntil != nil && cfg.PauseUntil.After(time.Now()) {
			want.PauseUntil = cfg.PauseUntil
			for k, v := range cfg.Metadata {
				if strings.HasPrefix(k, PauseMetadataPrefix) {
					if want.Metadata == nil {
						want.Metadata = map[string]string{}
					}
					want.Metadata[k] = v
				}
			}
		}
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, stream, want)
	if err != nil {
		return nil, fmt.Errorf("consumer %s on %s: cannot create or update: %w", want.Durable, stream, err)
	}
	return cons, nil
}

// PauseMetadataPrefix starts the metadata keys a paused consumer's pause is described by
// (earlier versions paused the shared consumers themselves; an operator may still pause one
// with nats consumer pause). ensureRequestConsumer keeps them with the pause.
const PauseMetadataPrefix = "sys1.pause."

// EnsureDeadLetterConsumer creates or updates the workers' consumer of dead letters.
func EnsureDeadLetterConsumer(ctx context.Context, js jetstream.JetStream, c Config) (jetstream.Consumer, error) {
	cons, err := js.CreateOrUpdateConsumer(ctx, c.DeadLetterStream, c.DeadLetterConsumerConfig())
	if err != nil {
		return nil, fmt.Errorf("consumer %s on %s: cannot create or update: %w", c.DeadLetterConsumer, c.DeadLetterStream, err)
	}
	return cons, nil
}

// EnsureBatchConsumer creates or updates the shared batch consumer.
func EnsureBatchConsumer(ctx context.Context, js jetstream.JetStream, c Config) (jetstream.Consumer, error) {
	return ensureRequestConsumer(ctx, js, c.RequestsStream, c.BatchConsumerConfig())
}

// EnsureSinkLabelsConsumer creates or updates the sink's consumer of checked labels on
// SYS1_LABELS.
func EnsureSinkLabelsConsumer(ctx context.Context, js jetstream.JetStream, c Config, ackWait time.Duration, maxAckPending int) (jetstream.Consumer, error) {
	cons, err := js.CreateOrUpdateConsumer(ctx, c.LabelsStream, c.SinkLabelsConsumerConfig(ackWait, maxAckPending))
	if err != nil {
		return nil, fmt.Errorf("consumer %s on %s: cannot create or update: %w", c.SinkLabelsConsumer, c.LabelsStream, err)
	}
	return cons, nil
}

// EnsureLabelsConsumer creates or updates the workers' consumer of submitted labels, on
// SYS1_LABEL_SUBMISSIONS.
func EnsureLabelsConsumer(ctx context.Context, js jetstream.JetStream, c Config) (jetstream.Consumer, error) {
	cons, err := js.CreateOrUpdateConsumer(ctx, c.LabelSubmissionsStream, c.LabelsConsumerConfig())
	if err != nil {
		return nil, fmt.Errorf("consumer %s on %s: cannot create or update: %w", c.LabelsConsumer, c.LabelSubmissionsStream, err)
	}
	return cons, nil
}

// LegacyLabelsConsumer is the workers' consumer of submitted labels as versions before
// SYS1_LABEL_SUBMISSIONS had it, on SYS1_LABELS, when it still exists and still holds
// submissions to check (nil otherwise). A worker drains it once, so an upgrade loses none.
func LegacyLabelsConsumer(ctx context.Context, js jetstream.JetStream, c Config) jetstream.Consumer {
	cons, err := js.Consumer(ctx, c.LabelsStream, c.LabelsConsumer)
	if err != nil {
		return nil
	}
	if info := cons.CachedInfo(); info.NumPending == 0 && info.NumAckPending == 0 {
		return nil
	}
	return cons
}

// EnsureHoldsConsumer creates or updates the workers' consumer of accepted labels, which
// releases held replies.
func EnsureHoldsConsumer(ctx context.Context, js jetstream.JetStream, c Config) (jetstream.Consumer, error) {
	cons, err := js.CreateOrUpdateConsumer(ctx, c.LabelsStream, c.HoldsConsumerConfig())
	if err != nil {
		return nil, fmt.Errorf("consumer %s on %s: cannot create or update: %w", c.HoldsConsumer, c.LabelsStream, err)
	}
	return cons, nil
}

// EnsureSinkConsumer creates or updates the sink's consumer on SYS1_RUNS.
func EnsureSinkConsumer(ctx context.Context, js jetstream.JetStream, c Config, ackWait time.Duration, maxAckPending int) (jetstream.Consumer, error) {
	cons, err := js.CreateOrUpdateConsumer(ctx, c.RunsStream, c.SinkConsumerConfig(ackWait, maxAckPending))
	if err != nil {
		return nil, fmt.Errorf("consumer %s on %s: cannot create or update: %w", c.SinkConsumer, c.RunsStream, err)
	}
	return cons, nil
}

// LeaderGet reads the latest entry of key in a KV bucket from the leader of the bucket's
// stream, never from a follower. jetstream's KeyValue.Get uses direct gets, which any replica
// answers, and a follower answers them once it is within 90% of the leader (nats-server
// v2.15): a node catching up after a restart then says a key written while it was down does
// not exist, or hands out an older value. For the run-id gate that is a run "unknown" to its
// producer's label, a held reply never released, or a finished run read as still running —
// the soak saw the first (issue 24). JetStream offers no leader-only read for a bucket that
// allows direct gets, so this asks the stream's own message API, which the leader answers.
// A deleted or purged key reads as not found (found false).
func LeaderGet(ctx context.Context, js jetstream.JetStream, bucket, key string) (value []byte, revision uint64, found bool, err error) {
	prefix := "$JS.API."
	if o := js.Options(); o.Domain != "" {
		prefix = "$JS." + o.Domain + ".API."
	} else if o.APIPrefix != "" {
		prefix = strings.TrimSuffix(o.APIPrefix, ".") + "."
	}
	req, _ := json.Marshal(struct {
		LastFor string `json:"last_by_subj"`
	}{"$KV." + bucket + "." + key})
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 5*time.Second) // jetstream's own default
		defer cancel()
	}
	msg, err := js.Conn().RequestWithContext(ctx, prefix+"STREAM.MSG.GET.KV_"+bucket, req)
	if err != nil {
		return nil, 0, false, fmt.Errorf("get %s from the leader of KV_%s: %w", key, bucket, err)
	}
	var resp struct {
		Error   *jetstream.APIError `json:"error"`
		Message *struct {
			Seq    uint64 `json:"seq"`
			Header []byte `json:"hdrs"`
			Data   []byte `json:"data"`
		} `json:"message"`
	}
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return nil, 0, false, fmt.Errorf("get %s from the leader of KV_%s: %w", key, bucket, err)
	}
	switch {
	case resp.Error != nil && resp.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound:
		return nil, 0, false, nil
	case resp.Error != nil:
		return nil, 0, false, fmt.Errorf("get %s from the leader of KV_%s: %w", key, bucket, resp.Error)
	case resp.Message == nil:
		return nil, 0, false, fmt.Errorf("get %s from the leader of KV_%s: %w", key, bucket, jetstream.ErrInvalidJetStreamResponse)
	}
	if len(resp.Message.Header) > 0 {
		h, err := nats.DecodeHeadersMsg(resp.Message.Header)
		if err != nil {
			return nil, 0, false, fmt.Errorf("get %s from the leader of KV_%s: headers: %w", key, bucket, err)
		}
		if op := h.Get("KV-Operation"); op == "DEL" || op == "PURGE" {
			return nil, resp.Message.Seq, false, nil
		}
	}
	return resp.Message.Data, resp.Message.Seq, true, nil
}

func equalRePublish(a, b *jetstream.RePublish) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

func describeRePublish(r *jetstream.RePublish) string {
	if r == nil {
		return "none"
	}
	return fmt.Sprintf("%s → %s (headers only: %t)", r.Source, r.Destination, r.HeadersOnly)
}
