package topology_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/contract/wire"
	"github.com/sys1hq/sys1/worker/topology"
)

// TestEveryStreamAndBucketHasAByteLimit: after start-up nothing sys1 keeps can grow without
// bound, each limit is its variable's default, and each stream's discard policy is the one
// that loses nothing acknowledged: intake, records, labels and review items refuse new
// messages; durable replies (copies of what the run-id gate keeps) age out oldest first.
func TestEveryStreamAndBucketHasAByteLimit(t *testing.T) {
	js := jetStream(t)
	ctx := context.Background()
	cfg := topology.Default()
	if _, err := topology.Ensure(ctx, js, cfg); err != nil {
		t.Fatal(err)
	}
	for _, kc := range []jetstream.KeyValueConfig{cfg.ReviewBucketConfig(), cfg.CalibrationBucketConfig(), cfg.CacheBucketConfig(time.Hour), cfg.LimitsBucketConfig(), cfg.FleetBucketConfig()} {
		if _, err := js.CreateOrUpdateKeyValue(ctx, kc); err != nil {
			t.Fatalf("bucket %s: %v", kc.Bucket, err)
		}
	}
	want := map[string]struct {
		bytes   topology.Bytes
		discard jetstream.DiscardPolicy
	}{
		"SYS1_REQUESTS": {4 * topology.GiB, jetstream.DiscardNew}, "SYS1_RUNS": {8 * topology.GiB, jetstream.DiscardNew},
		"SYS1_REPLIES": {1 * topology.GiB, jetstream.DiscardOld}, "SYS1_REVIEW": {4 * topology.GiB, jetstream.DiscardNew},
		"SYS1_LABELS": {1 * topology.GiB, jetstream.DiscardNew}, "SYS1_LABEL_SUBMISSIONS": {1 * topology.GiB, jetstream.DiscardNew},
		"SYS1_DEAD_LETTERS": {64 * topology.MiB, jetstream.DiscardNew},
		"KV_sys1-runs":      {4 * topology.GiB, jetstream.DiscardNew}, "KV_sys1-review": {256 * topology.MiB, jetstream.DiscardNew},
		"KV_sys1-calibration": {64 * topology.MiB, jetstream.DiscardNew}, "KV_sys1-cache": {256 * topology.MiB, jetstream.DiscardNew},
		"KV_sys1-limits": {256 * topology.MiB, jetstream.DiscardNew}, "KV_sys1-fleet": {1 * topology.MiB, jetstream.DiscardNew},
	}
	vars := cfg.StreamVariables()
	seen := 0
	for name := range js.StreamNames(ctx).Name() {
		seen++
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		c := s.CachedInfo().Config
		w, ok := want[name]
		if !ok {
			t.Errorf("stream %s is not in the storage budget", name)
			continue
		}
		if c.MaxBytes != int64(w.bytes) || c.Discard != w.discard {
			t.Errorf("%s: max_bytes %d discard %s, want %d (%s default) and %s", name, c.MaxBytes, c.Discard, w.bytes, vars[name], w.discard)
		}
		if vars[name] == "" {
			t.Errorf("%s has no byte-limit variable", name)
		}
	}
	if seen != len(want) {
		t.Errorf("%d streams, want %d", seen, len(want))
	}
	// The per-caller quotas: each caller's own subject holds at most its quota, and the next
	// publish is refused (discard new per subject) rather than dropping the oldest.
	for name, quota := range map[string]int{"SYS1_REQUESTS": 10000, "SYS1_REVIEW": 5000, "SYS1_LABEL_SUBMISSIONS": 5000} {
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if c := s.CachedInfo().Config; c.MaxMsgsPerSubject != int64(quota) || !c.DiscardNewPerSubject {
			t.Errorf("%s: max_msgs_per_subject %d, discard_new_per_subject %t; want %d and true", name, c.MaxMsgsPerSubject, c.DiscardNewPerSubject, quota)
		}
	}
	file, mem := cfg.StorageBudget()
	if file != 23*topology.GiB+705*topology.MiB || mem != 256*topology.MiB {
		t.Errorf("budget %s of files and %s of memory: README's Storage budget says 23.7 GiB and 256 MiB", file, mem)
	}
}

// TestAQuotaRefusesOnlyItsCaller: a caller with SYS1_REQUESTS_MAX_PER_CALLER requests
// waiting is refused at publish, with an error that says why; another caller's publish, and
// a batch of the first caller's own, go on.
func TestAQuotaRefusesOnlyItsCaller(t *testing.T) {
	js := jetStream(t)
	ctx := context.Background()
	cfg := topology.Default()
	cfg.RequestsPerCaller = 3
	if _, err := topology.Ensure(ctx, js, cfg); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := js.Publish(ctx, "sys1.decide.svc-a", []byte(`{}`)); err != nil {
			t.Fatalf("publish %d within the quota: %v", i+1, err)
		}
	}
	_, err := js.Publish(ctx, "sys1.decide.svc-a", []byte(`{}`))
	if topology.Refused(err) != topology.RefusedQuota || !strings.Contains(err.Error(), "maximum messages per subject exceeded") {
		t.Fatalf("the fourth request of svc-a: got %v, want a per-subject refusal", err)
	}
	for _, subj := range []string{"sys1.decide.svc-b", "sys1.batch.svc-a.b-1"} {
		if _, err := js.Publish(ctx, subj, []byte(`{}`)); err != nil {
			t.Errorf("%s refused because svc-a is over its quota: %v", subj, err)
		}
	}
	s, _ := js.Stream(ctx, cfg.RequestsStream)
	info, _ := s.Info(ctx)
	if info.State.Msgs != 5 {
		t.Errorf("%d messages stored, want 5", info.State.Msgs)
	}
}

// TestALabelQuotaRefusesOnlyItsCaller: a caller with SYS1_LABELS_MAX_PER_CALLER label
// submissions waiting on SYS1_LABEL_SUBMISSIONS is refused at publish, with JetStream's
// per-subject error; another caller's submission is stored.
func TestALabelQuotaRefusesOnlyItsCaller(t *testing.T) {
	js := jetStream(t)
	ctx := context.Background()
	cfg := topology.Default()
	cfg.LabelsPerCaller = 3
	if _, err := topology.Ensure(ctx, js, cfg); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := js.Publish(ctx, "sys1.labels.svc-a", []byte(`{}`)); err != nil {
			t.Fatalf("submission %d within the quota: %v", i+1, err)
		}
	}
	_, err := js.Publish(ctx, "sys1.labels.svc-a", []byte(`{}`))
	if topology.Refused(err) != topology.RefusedQuota || !strings.Contains(err.Error(), "maximum messages per subject exceeded") {
		t.Fatalf("svc-a's fourth submission: got %v, want a per-subject refusal", err)
	}
	if _, err := js.Publish(ctx, "sys1.labels.svc-b", []byte(`{}`)); err != nil {
		t.Errorf("svc-b's submission refused because svc-a is over its quota: %v", err)
	}
	s, _ := js.Stream(ctx, cfg.LabelSubmissionsStream)
	info, _ := s.Info(ctx, jetstream.WithSubjectFilter(wire.LabelsSubmitted))
	if a, b := info.State.Subjects["sys1.labels.svc-a"], info.State.Subjects["sys1.labels.svc-b"]; a != 3 || b != 1 {
		t.Errorf("waiting: svc-a %d, svc-b %d; want 3 and 1", a, b)
	}
}

// TestAFullStreamRefusesNewMessagesAndKeepsTheOld: at its byte limit a stream whose
// messages must not be lost refuses the next one; nothing stored is discarded.
func TestAFullStreamRefusesNewMessagesAndKeepsTheOld(t *testing.T) {
	js := jetStream(t)
	ctx := context.Background()
	cfg := topology.Default()
	cfg.MaxMsgSize = 1024
	cfg.RunsMaxBytes = 4 * topology.KiB
	if errs := cfg.Validate(); len(errs) > 0 {
		t.Fatal(errs)
	}
	if _, err := topology.Ensure(ctx, js, cfg); err != nil {
		t.Fatal(err)
	}
	body := bytes.Repeat([]byte("r"), 900)
	var stored int
	var err error
	for stored = 0; stored < 100; stored++ {
		if _, err = js.Publish(ctx, "sys1.runs.success", body); err != nil {
			break
		}
	}
	if topology.Refused(err) != topology.RefusedFull || stored == 0 || stored == 100 {
		t.Fatalf("after %d records: %v, want a full-stream refusal", stored, err)
	}
	s, _ := js.Stream(ctx, cfg.RunsStream)
	info, _ := s.Info(ctx)
	if info.State.Msgs != uint64(stored) || info.State.FirstSeq != 1 {
		t.Errorf("stream holds %d from seq %d, want all %d from 1", info.State.Msgs, info.State.FirstSeq, stored)
	}
}

// TestALabelSubmissionOverTheLabelLimitIsRefused: SYS1_LABEL_SUBMISSIONS (and SYS1_LABELS)
// take no message larger than a label can be; 300 KiB to sys1.labels.<caller> is refused at
// publish, the largest valid label is stored.
func TestALabelSubmissionOverTheLabelLimitIsRefused(t *testing.T) {
	js := jetStream(t)
	ctx := context.Background()
	cfg := topology.Default()
	if _, err := topology.Ensure(ctx, js, cfg); err != nil {
		t.Fatal(err)
	}
	_, err := js.Publish(ctx, "sys1.labels.svc-a", bytes.Repeat([]byte("x"), 300<<10))
	if !errors.Is(err, jetstream.ErrStreamMessageExceedsMaximum) {
		t.Fatalf("300 KiB label: %v, want %v", err, jetstream.ErrStreamMessageExceedsMaximum)
	}
	if _, err := js.Publish(ctx, "sys1.labels.svc-a", bytes.Repeat([]byte("x"), contract.MaxLabelBytes-512)); err != nil {
		t.Errorf("a label within the limit: %v", err)
	}
	for _, name := range []string{cfg.LabelsStream, cfg.LabelSubmissionsStream} {
		s, _ := js.Stream(ctx, name)
		if got := s.CachedInfo().Config.MaxMsgSize; got != int32(contract.MaxLabelMessageBytes) {
			t.Errorf("%s: max message size %d, want the label limit with its headers, %d", name, got, contract.MaxLabelMessageBytes)
		}
	}
}

// TestUpgradingToBoundsLosesNothing: streams made before the bounds (discard old, no byte
// or per-subject limit, SYS1_LABELS holding the submissions too) are brought to the new
// configuration without deleting a message: a subject already over its new quota keeps a
// limit as high as what it holds, until it has drained.
func TestUpgradingToBoundsLosesNothing(t *testing.T) {
	js := jetStream(t)
	ctx := context.Background()
	cfg := topology.Default()
	old := cfg.RequestsStreamConfig()
	old.MaxBytes, old.Discard, old.MaxMsgsPerSubject, old.DiscardNewPerSubject = 0, jetstream.DiscardOld, 0, false
	if _, err := js.CreateStream(ctx, old); err != nil {
		t.Fatal(err)
	}
	oldLabels := cfg.LabelsStreamConfig()
	oldLabels.Subjects, oldLabels.MaxBytes, oldLabels.MaxMsgSize, oldLabels.AllowMsgTTL, oldLabels.Discard = []string{"sys1.labels.>"}, 0, 1<<20, false, jetstream.DiscardOld
	if _, err := js.CreateStream(ctx, oldLabels); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		if _, err := js.Publish(ctx, "sys1.decide.svc-a", []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := js.Publish(ctx, "sys1.labels.svc-a", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	cfg.RequestsPerCaller = 2
	var logs bytes.Buffer
	if _, err := topology.Ensure(ctx, js, cfg, topology.WithLogger(zerolog.New(&logs))); err != nil {
		t.Fatal(err)
	}
	s, _ := js.Stream(ctx, cfg.RequestsStream)
	info, _ := s.Info(ctx)
	if info.State.Msgs != 5 || info.Config.MaxMsgsPerSubject != 5 || info.Config.Discard != jetstream.DiscardNew || info.Config.MaxBytes != int64(cfg.RequestsMaxBytes) {
		t.Fatalf("after the upgrade: %d messages, per-subject limit %d, discard %s, max bytes %d; want all 5 kept under a limit of 5",
			info.State.Msgs, info.Config.MaxMsgsPerSubject, info.Config.Discard, info.Config.MaxBytes)
	}
	if !strings.Contains(logs.String(), "per-caller quota") {
		t.Errorf("no warning says the quota was kept higher: %s", logs.String())
	}
	labels, _ := js.Stream(ctx, cfg.LabelsStream)
	if li, _ := labels.Info(ctx); li.State.Msgs != 1 {
		t.Errorf("SYS1_LABELS lost the submission it held: %d messages", li.State.Msgs)
	}
	if _, err := js.Publish(ctx, "sys1.labels.svc-b", []byte(`{}`)); err != nil {
		t.Errorf("a new submission after the upgrade: %v", err)
	}
	// Drained, the next start applies the quota.
	for seq := uint64(1); seq <= 4; seq++ {
		if err := s.DeleteMsg(ctx, seq); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := topology.Ensure(ctx, js, cfg); err != nil {
		t.Fatal(err)
	}
	info, _ = s.Info(ctx)
	if info.Config.MaxMsgsPerSubject != 2 || info.State.Msgs != 1 {
		t.Errorf("after draining: per-subject limit %d with %d messages, want 2 with 1", info.Config.MaxMsgsPerSubject, info.State.Msgs)
	}
}

func TestParseBytes(t *testing.T) {
	for in, want := range map[string]topology.Bytes{
		"1073741824": topology.GiB, "4GiB": 4 * topology.GiB, "512 MiB": 512 * topology.MiB, "64mib": 64 * topology.MiB,
		"10GB": 10_000_000_000, "1.5GiB": 3 * topology.GiB / 2, "2K": 2 * topology.KiB, "0": 0, "300B": 300,
	} {
		got, err := topology.ParseBytes(in)
		if err != nil || got != want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "-1", "GiB", "1.5", "ten GB", "1e300GB", "NaNGB"} {
		if _, err := topology.ParseBytes(bad); err == nil {
			t.Errorf("ParseBytes(%q) accepted", bad)
		}
	}
	if s := (8 * topology.GiB).String(); s != "8GiB" {
		t.Errorf("String: %s", s)
	}
}

func TestByteLimitsAreValidated(t *testing.T) {
	cfg := topology.Default()
	cfg.RunsMaxBytes = 1024
	cfg.ReviewPerCaller = 0
	cfg.RejectedLabelsMaxAge = 1000 * time.Hour
	var joined strings.Builder
	for _, e := range cfg.Validate() {
		joined.WriteString(e.Error() + "\n")
	}
	for _, v := range []string{"SYS1_RUNS_MAX_BYTES", "SYS1_REVIEW_MAX_PER_CALLER", "SYS1_LABELS_REJECTED_MAX_AGE"} {
		if !strings.Contains(joined.String(), v) {
			t.Errorf("no error names %s:\n%s", v, joined.String())
		}
	}
}
