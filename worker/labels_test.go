package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/contract/wire"
	"github.com/sys1hq/sys1/sink"
	"github.com/sys1hq/sys1/sink/chtest"
	"github.com/sys1hq/sys1/worker/auth"
	"github.com/sys1hq/sys1/worker/client"
	"github.com/sys1hq/sys1/worker/topology"
)

// subjectAuth is a replica option: callers from the subject (SYS1_AUTH_MODE=subject).
func subjectAuth(t *testing.T) func(*replicaOpts) {
	t.Helper()
	a, err := auth.New(context.Background(), auth.Config{Mode: auth.ModeSubject}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	return func(o *replicaOpts) { o.auth = a }
}

// labelInbox is a subscription to a fresh inbox in caller's namespace.
type labelInbox struct {
	t       *testing.T
	subject string
	sub     *nats.Subscription
}

func (h *harness) labelInbox(caller string) *labelInbox {
	h.t.Helper()
	subject := "_INBOX." + caller + "." + nats.NewInbox()[len("_INBOX."):]
	sub, err := h.nc.SubscribeSync(subject)
	if err != nil {
		h.t.Fatal(err)
	}
	if err := h.nc.Flush(); err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { _ = sub.Unsubscribe() })
	return &labelInbox{t: h.t, subject: subject, sub: sub}
}

// next waits for the reply to a label submission.
func (in *labelInbox) next() (contract.LabelReply, nats.Header) {
	in.t.Helper()
	m, err := in.sub.NextMsg(20 * time.Second)
	if err != nil {
		in.t.Fatalf("no label reply on %s: %v", in.subject, err)
	}
	var r contract.LabelReply
	if err := json.Unmarshal(m.Data, &r); err != nil {
		in.t.Fatalf("label reply does not decode: %v\n%s", err, m.Data)
	}
	return r, m.Header
}

// none asserts that nothing arrives (absence can only be waited for).
func (in *labelInbox) none(what string) {
	in.t.Helper()
	if m, err := in.sub.NextMsg(300 * time.Millisecond); err == nil {
		in.t.Errorf("%s was answered: %s", what, m.Data)
	}
}

// submitLabel publishes a label submission on subject through JetStream, as producers do.
func (h *harness) submitLabel(subject string, body []byte, hdr nats.Header) uint64 {
	h.t.Helper()
	m := &nats.Msg{Subject: subject, Data: body, Header: nats.Header{}}
	for k, v := range hdr {
		m.Header[k] = v
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ack, err := h.js.PublishMsg(ctx, m)
	if err != nil {
		h.t.Fatalf("publish label to %s: %v", subject, err)
	}
	return ack.Sequence
}

func replyTo(subject string) nats.Header { return nats.Header{wire.HeaderReplyTo: {subject}} }

// checked returns the checked labels on SYS1_LABELS whose subject ends in suffix
// ("accepted" or "rejected").
func (h *harness) checked(suffix string) []*jetstream.RawStreamMsg {
	h.t.Helper()
	var out []*jetstream.RawStreamMsg
	for _, m := range h.streamMsgs(h.topo.LabelsStream) {
		if strings.HasSuffix(m.Subject, "."+suffix) {
			out = append(out, m)
		}
	}
	return out
}

// rejectionFor finds the rejection of the submission at seq.
func (h *harness) rejectionFor(seq uint64) *contract.LabelRejection {
	h.t.Helper()
	for _, m := range h.checked("rejected") {
		var rj contract.LabelRejection
		if err := json.Unmarshal(m.Data, &rj); err != nil {
			h.t.Fatalf("rejection does not decode: %v\n%s", err, m.Data)
		}
		if rj.Seq == seq {
			return &rj
		}
	}
	return nil
}

// labelSink runs the sink (run records and labels into ClickHouse) against h's NATS when a
// test ClickHouse is configured (SYS1_TEST_CLICKHOUSE_DSN), and returns its database; nil
// without one (unless SYS1_TEST_REQUIRE_CLICKHOUSE=1, which fails instead).
func (h *harness) labelSink() *chtest.DB {
	h.t.Helper()
	if os.Getenv(chtest.DSNVar) == "" && os.Getenv(chtest.RequireVar) != "1" {
		h.t.Logf("%s unset: the ClickHouse half of this test is skipped", chtest.DSNVar)
		return nil
	}
	db := chtest.New(h.t)
	cfg := sink.DefaultConfig()
	cfg.DSN, cfg.Database = db.DSN, db.Name
	cfg.BatchAge, cfg.StatsInterval = 50*time.Millisecond, time.Second
	cfg.RetryMin, cfg.RetryMax = 20*time.Millisecond, 200*time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	conn, err := sink.Open(ctx, cfg)
	if err != nil {
		cancel()
		h.t.Fatal(err)
	}
	if err := sink.Migrate(ctx, conn, cfg); err != nil {
		cancel()
		h.t.Fatal(err)
	}
	js, err := jetstream.New(h.connect())
	if err != nil {
		cancel()
		h.t.Fatal(err)
	}
	s, err := sink.New(cfg, sink.Deps{JS: js, ClickHouse: conn, Topology: h.topo, Log: zerolog.New(h.logs).Level(zerolog.WarnLevel)})
	if err != nil {
		cancel()
		h.t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := s.Run(ctx); err != nil {
			h.t.Errorf("sink: %v", err)
		}
	}()
	h.t.Cleanup(func() {
		cancel()
		<-done
		_ = conn.Close()
	})
	return db
}

func (h *harness) runTicket(caller, runID string) {
	h.t.Helper()
	if rep := h.decide(caller, []byte(ticket), func(r *client.Request) { r.RunID = runID }); rep.Status != contract.StatusSuccess {
		h.t.Fatalf("run %s: %s", runID, rep.Raw)
	}
}

// TestProducerLabelsAreCheckedAndAccepted: a producer's labels for its own run are checked
// against the run's answers and published to sys1.labels.<caller>.accepted in canonical form
// (Caller the run's, Source producer, Reviewer and labelled_at defaulted to the verified
// caller and the submission's time), and each submitter is answered with the stored label.
func TestProducerLabelsAreCheckedAndAccepted(t *testing.T) {
	h := newHarness(t)
	h.start(subjectAuth(t))
	h.runTicket("svc-a", "ticket-L1")

	in := h.labelInbox("svc-a")
	cases := []struct {
		body, canonical, reviewer string
	}{
		{`{"run_id":"ticket-L1","question":"label","label":"billing","reviewer":"backoffice","labelled_at":"2026-12-02T09:15:00Z"}`, `"billing"`, "backoffice"},
		{`{"run_id":"ticket-L1","question":"urgent","label":true}`, `true`, "svc-a"},
		{`{"run_id":"ticket-L1","question":"anger","label":2.0,"source":"producer","caller":"svc-b"}`, `2`, "svc-a"},
		{`{"run_id":"ticket-L1","question":"  label ","label":null}`, `null`, "svc-a"},
	}
	before := time.Now().Add(-time.Second)
	for _, c := range cases {
		h.submitLabel("sys1.labels.svc-a", []byte(c.body), replyTo(in.subject))
		rep, hdr := in.next()
		if rep.Status != contract.LabelAccepted || string(rep.Label) != c.canonical || rep.Error != nil || rep.RunID != "ticket-L1" ||
			hdr.Get(wire.HeaderStatus) != "accepted" || hdr.Get(wire.HeaderRunID) != "ticket-L1" {
			t.Errorf("%s: reply %+v (label %s), headers %v", c.body, rep, rep.Label, hdr)
		}
	}
	accepted := h.checked("accepted")
	if len(accepted) != len(cases) {
		t.Fatalf("%d accepted labels, want %d", len(accepted), len(cases))
	}
	for i, m := range accepted {
		l, err := contract.DecodeLabel(m.Data)
		if err != nil {
			t.Fatalf("accepted label %d does not decode: %v", i, err)
		}
		if m.Subject != "sys1.labels.svc-a.accepted" || l.Caller != "svc-a" || l.Source != contract.LabelSourceProducer ||
			string(l.Value) != cases[i].canonical || l.Reviewer != cases[i].reviewer || l.Item != "" || l.LabelledAt.Before(before) && i > 0 {
			t.Errorf("accepted label on %s: %s", m.Subject, m.Data)
		}
	}
	if l, _ := contract.DecodeLabel(accepted[0].Data); !l.LabelledAt.Equal(time.Date(2026, 12, 2, 9, 15, 0, 0, time.UTC)) {
		t.Errorf("labelled_at given was not kept: %s", accepted[0].Data)
	}
	if l, _ := contract.DecodeLabel(accepted[3].Data); l.Question != "label" {
		t.Errorf("question name not trimmed: %s", accepted[3].Data)
	}
	if n := len(h.checked("rejected")); n != 0 {
		t.Errorf("%d rejections", n)
	}
}

// TestBadLabelsAreRejectedWithAClearError: every kind of bad submission is answered with a
// clear error, published as a rejection (which the sink parks in the dead-letter table), never
// stored as a label; another caller's run reads exactly like no run; the loop keeps going.
func TestBadLabelsAreRejectedWithAClearError(t *testing.T) {
	t.Parallel() // waits out failovers and retries, not the CPU: runs beside the others
	h := newHarness(t)
	db := h.labelSink()
	h.start(subjectAuth(t))
	h.runTicket("svc-a", "ticket-L2")
	h.runTicket("svc-b", "theirs-1")
	failed := h.decide("svc-a", []byte(strings.Replace(ticket, `"nimble"`, `"nope"`, 1)), func(r *client.Request) { r.RunID = "failed-1" })
	if failed.Status != contract.StatusFailed {
		t.Fatalf("a run meant to fail: %s", failed.Raw)
	}

	huge := `{"run_id":"ticket-L2","question":"label","label":"billing","reviewer":"` + strings.Repeat("x", contract.MaxLabelBytes) + `"}`
	nested := `{"run_id":"ticket-L2","question":"label","label":` + strings.Repeat("[", 50) + strings.Repeat("]", 50) + `}`
	cases := []struct {
		name, body string
		code       contract.Code
		want       string
	}{
		{"malformed JSON", `{"run_id":"ticket-L2","question":`, contract.CodeInvalidInput, "body: invalid JSON at byte 33: unexpected end of input"},
		{"not an object", `["ticket-L2"]`, contract.CodeInvalidInput, "a label must be a JSON object"},
		{"missing fields", `{"run_id":"ticket-L2"}`, contract.CodeInvalidInput, "question: required; label: required"},
		{"wrong type", `{"run_id":"ticket-L2","question":"label","label":{"key":"billing"}}`, contract.CodeInvalidInput, "label: must be an option key"},
		{"unknown field", `{"run_id":"ticket-L2","question":"label","label":"bug","weight":1}`, contract.CodeInvalidInput, "weight: unknown field"},
		{"unknown run", `{"run_id":"nope-1","question":"label","label":"bug"}`, contract.CodeInvalidInput, `run_id: no run "nope-1" of yours is known`},
		{"another caller's run", `{"run_id":"theirs-1","question":"label","label":"bug"}`, contract.CodeInvalidInput, `run_id: no run "theirs-1" of yours is known`},
		{"unknown question", `{"run_id":"ticket-L2","question":"colour","label":"bug"}`, contract.CodeInvalidInput, `question: run "ticket-L2" has no question "colour" (its questions: label, urgent, anger)`},
		{"unknown option", `{"run_id":"ticket-L2","question":"label","label":"eggs"}`, contract.CodeInvalidInput, `"eggs" is not one of the options (zeta, billing, bug)`},
		{"noul not boolean", `{"run_id":"ticket-L2","question":"urgent","label":"yes"}`, contract.CodeInvalidInput, "a noul question takes true or false"},
		{"score out of range", `{"run_id":"ticket-L2","question":"anger","label":3}`, contract.CodeInvalidInput, "an integer in [0, 2], got 3"},
		{"score not an index", `{"run_id":"ticket-L2","question":"anger","label":1.5}`, contract.CodeInvalidInput, "an integer in [0, 2], got 1.5"},
		{"failed run", `{"run_id":"failed-1","question":"label","label":"bug"}`, contract.CodeInvalidInput, `run "failed-1" failed (SYS1_MODEL_NOT_ALLOWED): it has no answers to label`},
		{"claims the review page", `{"run_id":"ticket-L2","question":"label","label":"bug","source":"review"}`, contract.CodeInvalidInput, `source: producers submit labels with source "producer"`},
		{"invalid UTF-8", "{\"run_id\":\"ticket-L2\",\"question\":\"la\xffbel\",\"label\":\"bug\"}", contract.CodeInvalidInput, "invalid label: body: invalid UTF-8 at byte 36"},
		{"deeply nested", nested, contract.CodeInvalidInput, "nesting deeper than 4 levels"},
		{"huge body", huge, contract.CodeRequestTooLarge, fmt.Sprintf("label is %d bytes; the limit is %d", len(huge), contract.MaxLabelBytes)},
		{"hostile run id", `{"run_id":"<script>x</script>","question":"label","label":"bug"}`, contract.CodeInvalidInput, "run_id: byte 0 is '<'"},
	}
	in := h.labelInbox("svc-a")
	seqs := make([]uint64, len(cases))
	for i, c := range cases {
		seqs[i] = h.submitLabel("sys1.labels.svc-a", []byte(c.body), replyTo(in.subject))
		rep, hdr := in.next()
		if rep.Status != contract.LabelRejected || rep.Error == nil || rep.Error.Code != c.code || !strings.Contains(rep.Error.Message, c.want) ||
			string(rep.Label) != "null" || hdr.Get(wire.HeaderStatus) != "rejected" || hdr.Get(wire.HeaderErrorCode) != string(c.code) {
			t.Errorf("%s: reply %+v, headers %v; want %s containing %q", c.name, rep, hdr, c.code, c.want)
		}
	}
	// Unknown and another caller's run are worded alike: nothing tells svc-a that theirs-1 exists.
	unknown, theirs := h.rejectionFor(seqs[5]), h.rejectionFor(seqs[6])
	if unknown == nil || theirs == nil || strings.ReplaceAll(theirs.Error.Message, "theirs-1", "X") != strings.ReplaceAll(unknown.Error.Message, "nope-1", "X") {
		t.Errorf("another caller's run is told apart from an unknown one:\n%+v\n%+v", unknown, theirs)
	}

	// A reply subject the caller may not use: rejected for it, and answered nowhere.
	foreign := h.labelInbox("svc-b")
	fseq := h.submitLabel("sys1.labels.svc-a", []byte(`{"run_id":"ticket-L2","question":"label","label":"bug"}`), replyTo(foreign.subject))

	// And the loop keeps going: a good label after all of them is accepted.
	h.submitLabel("sys1.labels.svc-a", []byte(`{"run_id":"ticket-L2","question":"label","label":"bug"}`), replyTo(in.subject))
	if rep, _ := in.next(); rep.Status != contract.LabelAccepted || string(rep.Label) != `"bug"` {
		t.Fatalf("the good label after the bad ones: %+v", rep)
	}
	foreign.none("a label asking for a reply in another caller's inbox")
	if rj := h.rejectionFor(fseq); rj == nil || rj.Error.Code != contract.CodeForbidden || !strings.Contains(rj.Error.Message, "Sys1-Reply-To") || rj.Caller != "svc-a" {
		t.Errorf("the foreign reply subject's rejection: %+v", rj)
	}

	rejected := h.checked("rejected")
	if len(rejected) != len(cases)+1 || len(h.checked("accepted")) != 1 {
		t.Fatalf("%d rejections, %d accepted; want %d and 1", len(rejected), len(h.checked("accepted")), len(cases)+1)
	}
	for i, c := range cases {
		rj := h.rejectionFor(seqs[i])
		if rj == nil || rj.Caller != "svc-a" || rj.Subject != "sys1.labels.svc-a" || rj.Bytes != len(c.body) || rj.Error == nil || !strings.Contains(rj.Error.Message, c.want) {
			t.Errorf("%s: rejection %+v", c.name, rj)
			continue
		}
		// The submission travels with its rejection when it is valid JSON of a bounded size.
		switch c.name {
		case "huge body", "malformed JSON", "invalid UTF-8":
			if string(rj.Submission) != "null" {
				t.Errorf("%s: the rejection carries its submission", c.name)
			}
		case "unknown option":
			if !strings.Contains(string(rj.Submission), `"eggs"`) {
				t.Errorf("%s: submission %s", c.name, rj.Submission)
			}
		}
	}

	if db == nil {
		return
	}
	// Each rejection is a dead-letter row with its reason; none became a label row.
	want := uint64(len(cases) + 1)
	natstestWait(t, "the rejections parked in ClickHouse", func() bool {
		return db.Count(t, "SELECT count() FROM `"+db.Name+"`.runs_dead_letter FINAL WHERE kind = 'rejected_label'") == want
	})
	for _, c := range cases {
		if n := db.Count(t, "SELECT count() FROM `"+db.Name+"`.runs_dead_letter FINAL WHERE kind = 'rejected_label' AND position(error, ?) > 0", c.want); n != 1 {
			t.Errorf("%s: %d dead letters give its reason %q", c.name, n, c.want)
		}
	}
	natstestWait(t, "the accepted label in ClickHouse", func() bool {
		return db.Count(t, "SELECT count() FROM `"+db.Name+"`.labels FINAL") == 1
	})
}

func natstestWait(t *testing.T, what string, cond func() bool) {
	t.Helper()
	waitFor(t, what, time.Minute, cond)
}

// TestLabelFromAnUnverifiedSenderIsRecordedNotAnswered: in mode jwt a submission without a
// valid token is never answered (anyone could make the worker publish), but it is recorded as
// rejected with no caller; with a valid token the same label is accepted.
func TestLabelFromAnUnverifiedSenderIsRecordedNotAnswered(t *testing.T) {
	h := newHarness(t)
	a := h.hsJWTAuth()
	h.start(func(o *replicaOpts) { o.auth = a })
	tok := mint(t, "svc-a", map[string]any{"roles": []string{"administrator"}}, time.Now().Add(time.Hour))
	if rep := h.decide("svc-a", []byte(ticket), func(r *client.Request) { r.RunID = "jwt-run-1"; r.Token = tok }); rep.Status != contract.StatusSuccess {
		t.Fatalf("run: %s", rep.Raw)
	}
	in := h.labelInbox("svc-a")
	body := []byte(`{"run_id":"jwt-run-1","question":"urgent","label":false}`)
	seq := h.submitLabel("sys1.labels.svc-a", body, replyTo(in.subject))
	forged := replyTo(in.subject)
	forged.Set("Authorization", "Bearer "+tok[:len(tok)-4]+"AAAA")
	forgedSeq := h.submitLabel("sys1.labels.svc-a", body, forged)
	good := replyTo(in.subject)
	good.Set("Authorization", "Bearer "+tok)
	h.submitLabel("sys1.labels.svc-a", body, good)
	rep, _ := in.next()
	if rep.Status != contract.LabelAccepted {
		t.Fatalf("the signed label: %+v", rep)
	}
	in.none("an unverified label")
	for _, s := range []uint64{seq, forgedSeq} {
		rj := h.rejectionFor(s)
		if rj == nil || rj.Caller != "" || rj.Error.Code != contract.CodeUnauthenticated {
			t.Errorf("unverified submission %d: rejection %+v", s, rj)
		}
	}
	if l, _ := contract.DecodeLabel(h.checked("accepted")[0].Data); l.Caller != "svc-a" || l.Reviewer != "svc-a" {
		t.Errorf("accepted %+v", l)
	}
}

// TestLabelCheckRetriesThenAnswersOnItsLastDelivery: a label that cannot be checked (the
// run-id gate unreachable) is redelivered with a growing delay, and its last delivery (the
// consumer's max deliver) is answered and recorded with the error instead of waiting forever.
func TestLabelCheckRetriesThenAnswersOnItsLastDelivery(t *testing.T) {
	h := newHarness(t)
	topo := h.topo
	topo.ConsumerMaxDeliver = 4
	h.start(subjectAuth(t), func(o *replicaOpts) { o.topo = &topo })
	h.runTicket("svc-a", "gone-1")
	if err := h.js.DeleteKeyValue(context.Background(), h.topo.RunsBucket); err != nil {
		t.Fatal(err)
	}
	in := h.labelInbox("svc-a")
	seq := h.submitLabel("sys1.labels.svc-a", []byte(`{"run_id":"gone-1","question":"urgent","label":true}`), replyTo(in.subject))
	rep, hdr := in.next()
	if rep.Status != contract.LabelRejected || rep.Error == nil || rep.Error.Code != contract.CodeInternal ||
		!strings.Contains(rep.Error.Message, "could not be read in 4 deliveries") || hdr.Get(wire.HeaderErrorCode) != "SYS1_INTERNAL" {
		t.Fatalf("reply %+v", rep)
	}
	if rj := h.rejectionFor(seq); rj == nil || rj.Error.Code != contract.CodeInternal {
		t.Errorf("rejection %+v", rj)
	}
	if !strings.Contains(h.logs.String(), "could not check a label; redelivering") {
		t.Error("no redelivery was logged")
	}
}

// TestRejectedLabelsExpireAndAcceptedOnesAreKept: a rejection on SYS1_LABELS carries the
// per-message TTL of SYS1_LABELS_REJECTED_MAX_AGE (Nats-TTL), so rejected submissions are not
// kept for the labels' 30 days; an accepted label carries none and lives as long as the stream
// keeps labels.
func TestRejectedLabelsExpireAndAcceptedOnesAreKept(t *testing.T) {
	h := newHarness(t)
	h.topo.RejectedLabelsMaxAge = 36 * time.Hour
	h.start(subjectAuth(t))
	h.runTicket("svc-a", "ttl-1")
	in := h.labelInbox("svc-a")
	h.submitLabel("sys1.labels.svc-a", []byte(`{"run_id":"ttl-1","question":"urgent","label":true}`), replyTo(in.subject))
	if rep, _ := in.next(); rep.Status != contract.LabelAccepted {
		t.Fatalf("the good label: %+v", rep)
	}
	seq := h.submitLabel("sys1.labels.svc-a", []byte(`{"run_id":"ttl-1","question":"urgent","label":"maybe"}`), replyTo(in.subject))
	if rep, _ := in.next(); rep.Status != contract.LabelRejected {
		t.Fatalf("the bad label: %+v", rep)
	}
	if h.rejectionFor(seq) == nil {
		t.Fatal("no rejection stored")
	}
	rejected, accepted := h.checked("rejected"), h.checked("accepted")
	if len(rejected) != 1 || len(accepted) != 1 {
		t.Fatalf("%d rejected and %d accepted on %s, want 1 and 1", len(rejected), len(accepted), h.topo.LabelsStream)
	}
	ttl, err := time.ParseDuration(rejected[0].Header.Get(jetstream.MsgTTLHeader))
	if err != nil || ttl != h.topo.RejectedLabelsMaxAge {
		t.Errorf("the rejection's %s is %q (%v), want %s (SYS1_LABELS_REJECTED_MAX_AGE)", jetstream.MsgTTLHeader, rejected[0].Header.Get(jetstream.MsgTTLHeader), err, h.topo.RejectedLabelsMaxAge)
	}
	if v := accepted[0].Header.Get(jetstream.MsgTTLHeader); v != "" {
		t.Errorf("the accepted label carries %s %q: it would expire before the stream's SYS1_LABELS_MAX_AGE", jetstream.MsgTTLHeader, v)
	}
}

// TestLabelsWaitWhileTheLabelsStreamIsFull: with SYS1_LABELS full a submitted label is
// neither lost nor rejected, nor does it spend its deliveries (back-pressure: nothing is pulled
// while a checked label could not be stored); once there is room again, and the fleet watcher
// has seen it, the label is checked, accepted and answered. Both ways of reading
// submissions hold back: a consumer per sender (fair share) and the one shared consumer.
func TestLabelsWaitWhileTheLabelsStreamIsFull(t *testing.T) {
	for _, fair := range []bool{true, false} {
		t.Run(fmt.Sprintf("fair share %t", fair), func(t *testing.T) { labelsWaitWhileFull(t, fair) })
	}
}

func labelsWaitWhileFull(t *testing.T, fair bool) {
	h := newHarness(t)
	h.topo.FairShare = fair
	h.topo.LabelsMaxBytes = topology.MiB // the least SYS1_LABELS_MAX_BYTES takes
	// Few deliveries: without back-pressure the submission would reach its last within a
	// few retry delays and be dropped unchecked.
	h.topo.ConsumerMaxDeliver = 4
	if _, err := topology.Ensure(context.Background(), h.js, h.topo); err != nil {
		t.Fatal(err)
	}
	cfg := defaultWorkerConfig()
	cfg.StatusInterval = 20 * time.Millisecond
	r := h.start(subjectAuth(t), func(o *replicaOpts) { o.cfg = cfg })
	h.runTicket("svc-a", "full-L1")
	fillStream(t, h.js, "sys1.labels.filler.accepted", 60<<10)

	in := h.labelInbox("svc-a")
	h.submitLabel("sys1.labels.svc-a", []byte(`{"run_id":"full-L1","question":"urgent","label":true}`), replyTo(in.subject))
	waitFor(t, "health to name SYS1_LABELS", 10*time.Second, func() bool {
		full := r.w.Health().Full
		return len(full) == 1 && full[0] == h.topo.LabelsStream
	})
	// Absence can only be waited for: many fleet-watcher readings, and far longer than the
	// submission's deliveries would take without back-pressure.
	in.none("a label while SYS1_LABELS is full")
	if n := len(h.checked("rejected")); n != 0 {
		t.Fatalf("%d rejections while SYS1_LABELS is full", n)
	}
	if n := len(h.streamMsgs(h.topo.LabelSubmissionsStream)); n != 1 {
		t.Fatalf("%d submissions waiting while SYS1_LABELS is full, want 1\n%s", n, h.logs.String())
	}
	if logs := h.logs.String(); strings.Contains(logs, "dropped unchecked") || strings.Contains(logs, "retrying in place") {
		t.Fatalf("logs: %s", logs)
	}

	s, _ := h.js.Stream(context.Background(), h.topo.LabelsStream)
	if err := s.Purge(context.Background(), jetstream.WithPurgeSubject("sys1.labels.filler.accepted")); err != nil {
		t.Fatal(err)
	}
	rep, _ := in.next()
	if rep.Status != contract.LabelAccepted || rep.RunID != "full-L1" || string(rep.Label) != "true" {
		t.Fatalf("the label once there is room: %+v", rep)
	}
	if a, rj := h.checked("accepted"), h.checked("rejected"); len(a) != 1 || len(rj) != 0 {
		t.Errorf("%d accepted and %d rejected, want 1 and 0", len(a), len(rj))
	}
	waitFor(t, "the submission acknowledged", 10*time.Second, func() bool { return len(h.streamMsgs(h.topo.LabelSubmissionsStream)) == 0 })
	waitFor(t, "health to clear SYS1_LABELS", 10*time.Second, func() bool { return len(r.w.Health().Full) == 0 })
}
