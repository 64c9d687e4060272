package topology_test

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/sys1hq/sys1/worker/natsconn/natstest"
	"github.com/sys1hq/sys1/worker/topology"
)

func jetStream(t *testing.T) jetstream.JetStream {
	t.Helper()
	_, js := natstest.Connect(t, natstest.Start(t))
	return js
}

func TestEnsureIsIdempotentAndMatchesSpec(t *testing.T) {
	js := jetStream(t)
	ctx := context.Background()
	cfg := topology.Default()
	for range 2 {
		if _, err := topology.Ensure(ctx, js, cfg); err != nil {
			t.Fatalf("Ensure: %v", err)
		}
		if _, err := topology.EnsureWorkerConsumer(ctx, js, cfg); err != nil {
			t.Fatalf("EnsureWorkerConsumer: %v", err)
		}
	}
	want := map[string]struct {
		subjects  []string
		retention jetstream.RetentionPolicy
		maxAge    time.Duration
	}{
		"SYS1_REQUESTS":          {[]string{"sys1.decide.>", "sys1.batch.>"}, jetstream.WorkQueuePolicy, 24 * time.Hour},
		"SYS1_RUNS":              {[]string{"sys1.runs.>"}, jetstream.LimitsPolicy, 7 * 24 * time.Hour},
		"SYS1_REPLIES":           {[]string{"sys1.replies.>"}, jetstream.LimitsPolicy, 24 * time.Hour},
		"SYS1_REVIEW":            {[]string{"sys1.review.>"}, jetstream.LimitsPolicy, 30 * 24 * time.Hour},
		"SYS1_LABELS":            {[]string{"sys1.labels.*.accepted", "sys1.labels.*.rejected"}, jetstream.LimitsPolicy, 30 * 24 * time.Hour},
		"SYS1_LABEL_SUBMISSIONS": {[]string{"sys1.labels.*"}, jetstream.WorkQueuePolicy, 30 * 24 * time.Hour},
	}
	for name, w := range want {
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		c := s.CachedInfo().Config
		if !slices.Equal(c.Subjects, w.subjects) || c.Retention != w.retention || c.MaxAge != w.maxAge || c.Storage != jetstream.FileStorage {
			t.Errorf("%s: %+v", name, c)
		}
	}
	req, _ := js.Stream(ctx, "SYS1_REQUESTS")
	if d := req.CachedInfo().Config.Duplicates; d != 2*time.Minute {
		t.Errorf("dedupe window %s", d)
	}
	cons, err := js.Consumer(ctx, "SYS1_REQUESTS", "sys1-worker")
	if err != nil {
		t.Fatal(err)
	}
	cc := cons.CachedInfo().Config
	if cc.AckPolicy != jetstream.AckExplicitPolicy || cc.Durable != "sys1-worker" || cc.MaxAckPending != 1024 || cc.MaxDeliver != 100 || cc.FilterSubject != "sys1.decide.>" {
		t.Errorf("consumer %+v", cc)
	}
	if _, err := js.KeyValue(ctx, "sys1-runs"); err != nil {
		t.Errorf("run-id bucket: %v", err)
	}
}

func TestEnsureUpdatesWhatItCan(t *testing.T) {
	js := jetStream(t)
	ctx := context.Background()
	cfg := topology.Default()
	if _, err := topology.Ensure(ctx, js, cfg); err != nil {
		t.Fatal(err)
	}
	cfg.RequestsMaxAge = 48 * time.Hour
	cfg.MaxAckPending = 4096
	if _, err := topology.Ensure(ctx, js, cfg); err != nil {
		t.Fatalf("update: %v", err)
	}
	if _, err := topology.EnsureWorkerConsumer(ctx, js, cfg); err != nil {
		t.Fatalf("consumer update: %v", err)
	}
	s, _ := js.Stream(ctx, "SYS1_REQUESTS")
	if got := s.CachedInfo().Config.MaxAge; got != 48*time.Hour {
		t.Errorf("max age not updated: %s", got)
	}
	c, _ := js.Consumer(ctx, "SYS1_REQUESTS", "sys1-worker")
	if got := c.CachedInfo().Config.MaxAckPending; got != 4096 {
		t.Errorf("max ack pending not updated: %d", got)
	}
}

func TestEnsureRefusesWhatItCannotReconcile(t *testing.T) {
	js := jetStream(t)
	ctx := context.Background()
	// Someone created SYS1_REQUESTS as a limits stream: JetStream cannot turn it into a work
	// queue in place, and silently consuming a limits stream would never delete requests.
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "SYS1_REQUESTS", Subjects: []string{"sys1.decide.>"}, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	_, err := topology.Ensure(ctx, js, topology.Default())
	if err == nil || !strings.Contains(err.Error(), "SYS1_REQUESTS") || !strings.Contains(err.Error(), "retention") {
		t.Fatalf("want a retention mismatch naming the stream, got %v", err)
	}
}

func TestConfigValidateNamesEveryBadVariable(t *testing.T) {
	cfg := topology.Default()
	cfg.RequestsStream = "bad name"
	cfg.Replicas = 9
	cfg.AckWait = 0
	cfg.RunIDTTL = time.Hour
	cfg.MaxAckPending = 0
	errs := cfg.Validate()
	joined := ""
	for _, e := range errs {
		joined += e.Error() + "\n"
	}
	for _, v := range []string{"SYS1_REQUESTS_STREAM", "SYS1_STREAM_REPLICAS", "SYS1_ACK_WAIT", "SYS1_RUN_ID_TTL", "SYS1_MAX_ACK_PENDING"} {
		if !strings.Contains(joined, v) {
			t.Errorf("no error names %s:\n%s", v, joined)
		}
	}
	def := topology.Default()
	if errs := def.Validate(); len(errs) != 0 {
		t.Errorf("defaults invalid: %v", errs)
	}
}

// TestShortReplyOrRunRetention: SYS1_DEDUPE_WINDOW is the request stream's window; a reply or
// run stream kept for less than it (replies for one minute, say) is a valid configuration,
// not a start-up failure with JetStream's "duplicates window can not be larger then max age".
func TestShortReplyOrRunRetention(t *testing.T) {
	js := jetStream(t)
	ctx := context.Background()
	cfg := topology.Default()
	cfg.RepliesMaxAge = time.Minute
	cfg.RunsMaxAge = 90 * time.Second
	if errs := cfg.Validate(); len(errs) != 0 {
		t.Fatalf("valid config rejected: %v", errs)
	}
	if _, err := topology.Ensure(ctx, js, cfg); err != nil {
		t.Fatalf("Ensure: %v", err)
	}
	for name, want := range map[string]time.Duration{"SYS1_REPLIES": time.Minute, "SYS1_RUNS": 90 * time.Second, "SYS1_REQUESTS": 2 * time.Minute} {
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if got := s.CachedInfo().Config.Duplicates; got != want {
			t.Errorf("%s: duplicates window %s, want %s", name, got, want)
		}
	}
}

// An operator's own settings survive a worker's start (here a message count limit on
// SYS1_RUNS); the settings sys1 owns go back to its configuration, and a log line says which
// changed.
func TestEnsureKeepsOperatorSettingsAndLogsWhatItChanges(t *testing.T) {
	js := jetStream(t)
	ctx := context.Background()
	cfg := topology.Default()
	sc := cfg.RunsStreamConfig()
	sc.MaxMsgs = 1 << 30
	sc.MaxAge = time.Hour
	if _, err := js.CreateStream(ctx, sc); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	if _, err := topology.Ensure(ctx, js, cfg, topology.WithLogger(zerolog.New(&logs))); err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, cfg.RunsStream)
	if err != nil {
		t.Fatal(err)
	}
	got := s.CachedInfo().Config
	if got.MaxMsgs != 1<<30 || got.MaxAge != cfg.RunsMaxAge {
		t.Fatalf("max_msgs %d (want the operator's %d kept), max_age %s (want sys1's %s)", got.MaxMsgs, 1<<30, got.MaxAge, cfg.RunsMaxAge)
	}
	if !strings.Contains(logs.String(), `"stream":"SYS1_RUNS"`) || !strings.Contains(logs.String(), "max_age 1h0m0s → 168h0m0s") {
		t.Errorf("no log line names the change: %s", logs.String())
	}
	// Nothing differs now: a second start changes and logs nothing.
	logs.Reset()
	if _, err := topology.Ensure(ctx, js, cfg, topology.WithLogger(zerolog.New(&logs))); err != nil {
		t.Fatal(err)
	}
	if logs.Len() != 0 {
		t.Errorf("a second Ensure logged changes: %s", logs.String())
	}
}

// TestEnsureKeepsAnOperatorsConsumerPause: a shared consumer an operator paused with nats
// consumer pause stays paused, with its reason, when a replica starts and ensures it.
func TestEnsureKeepsAnOperatorsConsumerPause(t *testing.T) {
	js := jetStream(t)
	ctx := context.Background()
	cfg := topology.Default()
	cfg.FairShare = false
	if _, err := topology.Ensure(ctx, js, cfg); err != nil {
		t.Fatal(err)
	}
	cons, err := topology.EnsureWorkerConsumer(ctx, js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	cc := cons.CachedInfo().Config
	cc.Metadata = map[string]string{topology.PauseMetadataPrefix + "reason": "maintenance"}
	if _, err := js.UpdateConsumer(ctx, cfg.RequestsStream, cc); err != nil {
		t.Fatal(err)
	}
	until := time.Now().Add(time.Hour)
	if _, err := js.PauseConsumer(ctx, cfg.RequestsStream, cfg.WorkerConsumer, until); err != nil {
		t.Fatal(err)
	}
	if _, err := topology.EnsureWorkerConsumer(ctx, js, cfg); err != nil {
		t.Fatal(err)
	}
	c, err := js.Consumer(ctx, cfg.RequestsStream, cfg.WorkerConsumer)
	if err != nil {
		t.Fatal(err)
	}
	if i := c.CachedInfo(); !i.Paused || i.Config.Metadata[topology.PauseMetadataPrefix+"reason"] != "maintenance" || i.Config.PauseUntil.Sub(until).Abs() > time.Second {
		t.Fatalf("ensure resumed the operator's pause: %+v", i)
	}
}

// TestLabelConsumersSeeTheirOwnLabels: the workers' label consumer gets submissions only
// (sys1.labels.<caller>, never the checked labels under it), the holds consumer accepted
// labels only; both are shared durables, ensured idempotently.
func TestLabelConsumersSeeTheirOwnLabels(t *testing.T) {
	js := jetStream(t)
	ctx := context.Background()
	cfg := topology.Default()
	if _, err := topology.Ensure(ctx, js, cfg); err != nil {
		t.Fatal(err)
	}
	var labels, holds jetstream.Consumer
	for range 2 {
		var err error
		if labels, err = topology.EnsureLabelsConsumer(ctx, js, cfg); err != nil {
			t.Fatalf("EnsureLabelsConsumer: %v", err)
		}
		if holds, err = topology.EnsureHoldsConsumer(ctx, js, cfg); err != nil {
			t.Fatalf("EnsureHoldsConsumer: %v", err)
		}
	}
	for _, subj := range []string{"sys1.labels.svc-a", "sys1.labels.svc-a.accepted", "sys1.labels.svc-a.rejected", "sys1.labels.svc-b", "sys1.labels.svc-b.accepted"} {
		if _, err := js.Publish(ctx, subj, []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
	got := func(c jetstream.Consumer) []string {
		t.Helper()
		var out []string
		batch, err := c.Fetch(10, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for m := range batch.Messages() {
			out = append(out, m.Subject())
			_ = m.Ack()
		}
		return out
	}
	if s := got(labels); !slices.Equal(s, []string{"sys1.labels.svc-a", "sys1.labels.svc-b"}) {
		t.Errorf("%s got %v, want the submissions only", cfg.LabelsConsumer, s)
	}
	if s := got(holds); !slices.Equal(s, []string{"sys1.labels.svc-a.accepted", "sys1.labels.svc-b.accepted"}) {
		t.Errorf("%s got %v, want the accepted labels only", cfg.HoldsConsumer, s)
	}
	lc, hc := labels.CachedInfo().Config, holds.CachedInfo().Config
	if lc.Durable != "sys1-labels" || lc.MaxDeliver != cfg.ConsumerMaxDeliver || lc.AckPolicy != jetstream.AckExplicitPolicy {
		t.Errorf("labels consumer %+v", lc)
	}
	if hc.Durable != "sys1-worker-holds" || hc.MaxDeliver != -1 || hc.AckPolicy != jetstream.AckExplicitPolicy {
		t.Errorf("holds consumer %+v", hc)
	}
	bad := cfg
	bad.HoldsConsumer = "no.dots"
	if errs := bad.Validate(); len(errs) != 1 || !strings.Contains(errs[0].Error(), "SYS1_HOLDS_CONSUMER") {
		t.Errorf("Validate: %v", errs)
	}
}
