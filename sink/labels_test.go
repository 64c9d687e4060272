package sink

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/contract/wire"
	"github.com/sys1hq/sys1/worker/topology"
)

// labelsDrained reports whether the sink's label consumer has nothing pending or unacked.
func (e *testEnv) labelsDrained(tb testing.TB) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cons, err := e.js.Consumer(ctx, e.topo.LabelsStream, e.topo.SinkLabelsConsumer)
	if err != nil {
		return false
	}
	info, err := cons.Info(ctx)
	return err == nil && info.NumPending == 0 && info.NumAckPending == 0
}

// TestLabelSinkStoresLabelsAndParksTheRest: accepted labels land in sys1.labels (the latest per
// run and question under FINAL), rejected ones and everything that cannot be a label are
// parked in the dead-letter table with their reason, submissions awaiting their check (on
// SYS1_LABEL_SUBMISSIONS) are left to the workers, and nothing is lost or stalls the lane.
func TestLabelSinkStoresLabelsAndParksTheRest(t *testing.T) {
	e := newEnv(t, nil)
	labels := makeLabels(60)
	e.publishLabels(t, labels)
	// A relabel of the first label, accepted later: it replaces the first under FINAL.
	relabel := labels[0]
	relabel.Value, relabel.Reviewer, relabel.Source, relabel.Item = json.RawMessage(`"ham"`), "carla", contract.LabelSourceProducer, ""
	if string(labels[0].Value) == `"ham"` {
		relabel.Value = json.RawMessage(`"spam"`)
	}
	e.publishLabels(t, []contract.Label{relabel})

	at := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	rejection, _ := contract.NewLabelRejection([]byte(`{"run_id":"run-0000001","question":"label","label":"eggs","state":"customer text"}`),
		"billing", "sys1.labels.billing", 3, contract.Errorf(contract.CodeInvalidInput, `invalid label: label: "eggs" is not one of the options (spam, ham)`), at).MarshalJSON()
	noCaller := makeLabel(0, "urgent")
	noCaller.Caller = ""
	noCallerJSON, _ := noCaller.MarshalJSON()
	e.publishRaw(t,
		[]string{"sys1.labels.billing.rejected", "sys1.labels.billing.accepted", "sys1.labels.billing.accepted", "sys1.labels.billing.rejected", "sys1.labels.billing"},
		[][]byte{rejection, []byte("not a label"), noCallerJSON, []byte(`{"caller":7}`),
			[]byte(`{"run_id":"run-0000001","question":"label","label":"spam"}`)}) // a submission: the workers' to check

	s := e.startSink(t, e.cfg, nil)
	waitFor(t, time.Minute, "every checked label handled", func() bool {
		st := s.Stats().Labels
		return st.Running && st.Inserted == uint64(len(labels)+1) && st.DeadLettered == 4 && e.labelsDrained(t)
	})
	s.stop(t)
	st := s.Stats().Labels
	if st.Rejected != 1 || st.Received != uint64(len(labels)+5) {
		t.Errorf("label stats %+v, want 1 rejected of %d received", st, len(labels)+5)
	}

	if got := e.count(t, "SELECT count() FROM %s.labels FINAL"); got != uint64(len(labels)) {
		t.Errorf("labels under FINAL = %d, want %d (one per run and question)", got, len(labels))
	}
	var label, reviewer, source, caller, value string
	q := "SELECT label, value, reviewer, source, caller FROM `" + e.db.Name + "`.labels FINAL WHERE run_id = ? AND question = ?"
	if err := e.db.Conn.QueryRow(context.Background(), q, relabel.RunID, relabel.Question).Scan(&label, &value, &reviewer, &source, &caller); err != nil {
		t.Fatal(err)
	}
	want, _ := contract.LabelText(relabel.Value)
	if label != want || value != string(relabel.Value) || reviewer != "carla" || source != "producer" || caller != relabel.Caller {
		t.Errorf("relabelled row = %q %s %q %q %q, want the later label %q by carla", label, value, reviewer, source, caller, want)
	}
	// Canonical text per type: an option key, true/false, a level index.
	for _, c := range []struct{ question, want string }{{"urgent", "^(true|false)$"}, {"severity", "^[012]$"}, {"label", "^(spam|ham)$"}} {
		n := e.count(t, "SELECT countIf(NOT match(label, '"+c.want+"')) FROM %s.labels FINAL WHERE question = ?", c.question)
		if n != 0 {
			t.Errorf("%d %s labels not in canonical form %s", n, c.question, c.want)
		}
	}

	rows, err := e.db.Conn.Query(context.Background(), "SELECT kind, subject, error, payload FROM `"+e.db.Name+"`.runs_dead_letter FINAL ORDER BY runs_seq")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var got []string
	for rows.Next() {
		var kind, subject, reason, payload string
		if err := rows.Scan(&kind, &subject, &reason, &payload); err != nil {
			t.Fatal(err)
		}
		got = append(got, kind+" "+subject+": "+reason)
		if kind == deadRejectedLabel && strings.Contains(reason, "eggs") && !strings.Contains(payload, `"submission":{"run_id":"run-0000001"`) {
			t.Errorf("the rejection's payload lost its submission: %s", payload)
		}
	}
	for i, want := range []string{
		`rejected_label sys1.labels.billing.rejected: label rejected: [SYS1_INVALID_INPUT] invalid label: label: "eggs" is not one of the options (spam, ham)`,
		`label sys1.labels.billing.accepted: accepted label cannot be stored: [SYS1_INVALID_INPUT] invalid label: body: invalid JSON at byte 0`,
		`label sys1.labels.billing.accepted: accepted label cannot be stored: invalid label: an accepted label must carry the run's caller`,
		`rejected_label sys1.labels.billing.rejected: a rejected label that is not a label rejection: json: cannot unmarshal number`,
	} {
		if i >= len(got) || !strings.HasPrefix(got[i], want) {
			t.Errorf("dead letter %d = %q, want it to start with %q", i, nth(got, i), want)
		}
	}
	if len(got) != 4 {
		t.Errorf("dead letters %q, want 4", got)
	}
	// The submission still waits on SYS1_LABEL_SUBMISSIONS for the workers: the sink never
	// took it.
	ctx := context.Background()
	stream, err := e.js.Stream(ctx, e.topo.LabelSubmissionsStream)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.GetLastMsgForSubject(ctx, "sys1.labels.billing"); err != nil {
		t.Errorf("the unchecked submission is gone from SYS1_LABEL_SUBMISSIONS: %v", err)
	}
	cons, err := e.js.Consumer(ctx, e.topo.LabelsStream, e.topo.SinkLabelsConsumer)
	if err != nil {
		t.Fatal(err)
	}
	if fs := cons.CachedInfo().Config.FilterSubjects; strings.Join(fs, ",") != wire.LabelsAccepted+","+wire.LabelsRejected {
		t.Errorf("label consumer filters %v", fs)
	}
}

func nth(list []string, i int) string {
	if i < len(list) {
		return list[i]
	}
	return "(none)"
}

// TestRejectedLabelPayloadHonoursRecordState: under hash or none a refused submission (which
// may hold anything its producer sent) is parked without its body; its size, hash and reason
// stay.
func TestRejectedLabelPayloadHonoursRecordState(t *testing.T) {
	s := &Sink{cfg: DefaultConfig(), topo: topology.Default(), log: testLogger(t)}
	s.cfg.RecordState = RecordHash
	body := []byte(`{"run_id":"r","question":"q","label":"x","state":"customer text"}`)
	rj, _ := contract.NewLabelRejection(body, "svc", "sys1.labels.svc", 1, contract.Errorf(contract.CodeInvalidInput, "invalid label: state: unknown field"), time.Now()).MarshalJSON()
	p := s.prepareLabels([]jetstream.Msg{
		&fakeMsg{subject: "sys1.labels.svc.rejected", data: rj, seq: 1},
		&fakeMsg{subject: "sys1.labels.svc.rejected", data: []byte("customer text, not JSON"), seq: 2},
	})
	if len(p.dead) != 2 || p.refused != 1 {
		t.Fatalf("dead letters %d, refused %d", len(p.dead), p.refused)
	}
	for _, d := range p.dead {
		if strings.Contains(d.payload, "customer text") {
			t.Errorf("payload keeps the submission under hash: %s", d.payload)
		}
		if d.kind != deadRejectedLabel || d.payloadBytes == 0 || d.payloadSHA == "" {
			t.Errorf("dead letter %+v", d)
		}
	}
	if !strings.Contains(p.dead[0].payload, `"submission":null`) || !strings.Contains(p.dead[0].payload, `"bytes":65`) {
		t.Errorf("rejection payload %s", p.dead[0].payload)
	}
}

// TestLabelLaneSetUpFailureDoesNotHoldUpRuns: while the label lane cannot be set up (here
// SYS1_LABELS exists with a retention sys1 cannot use), run records still drain; once the
// stream is fixed the lane comes up by itself and its labels arrive.
func TestLabelLaneSetUpFailureDoesNotHoldUpRuns(t *testing.T) {
	e := newEnv(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := e.js.DeleteStream(ctx, e.topo.LabelsStream); err != nil {
		t.Fatal(err)
	}
	bad := e.topo.LabelsStreamConfig()
	bad.Retention = jetstream.WorkQueuePolicy
	if _, err := e.js.CreateStream(ctx, bad); err != nil {
		t.Fatal(err)
	}
	e.publish(t, makeRecords(0, 50))
	s := e.startSink(t, e.cfg, nil)
	waitFor(t, time.Minute, "the runs to drain while the label lane is down", func() bool {
		return s.Stats().Inserted == 50 && e.consumerDrained(t)
	})
	if st := s.Stats().Labels; st.Running || st.Received != 0 {
		t.Fatalf("label lane running on a stream it cannot use: %+v", st)
	}
	if err := e.js.DeleteStream(ctx, e.topo.LabelsStream); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "the label lane to come up once the stream is gone", func() bool { return s.Stats().Labels.Running })
	e.publishLabels(t, makeLabels(10))
	waitFor(t, time.Minute, "the labels to arrive", func() bool {
		return e.count(t, "SELECT count() FROM %s.labels FINAL") == uint64(len(makeLabels(10))) && e.labelsDrained(t)
	})
	s.stop(t)
}
