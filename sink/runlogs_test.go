package sink

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/sys1hq/sys1/worker/natsconn/natstest"
	"github.com/sys1hq/sys1/worker/topology"
)

// fakeMsg is a SYS1_RUNS delivery as prepare sees it; only what prepare reads is implemented.
type fakeMsg struct {
	jetstream.Msg
	subject string
	data    []byte
	header  nats.Header
	seq     uint64
}

func (m *fakeMsg) Subject() string      { return m.subject }
func (m *fakeMsg) Data() []byte         { return m.data }
func (m *fakeMsg) Headers() nats.Header { return m.header }
func (m *fakeMsg) Metadata() (*jetstream.MsgMetadata, error) {
	return &jetstream.MsgMetadata{
		Sequence: jetstream.SequencePair{Stream: m.seq}, NumDelivered: 1,
		Stream: "SYS1_RUNS", Timestamp: time.Now(),
	}, nil
}

// TestDeadLetterLogLineCarriesTheRunID: the line logged when a record is parked is about one
// run, so it carries that run's run_id (from the record's Sys1-Run-Id header: the body may not
// decode), and never the record's content.
func TestDeadLetterLogLineCarriesTheRunID(t *testing.T) {
	var logs natstest.Buffer
	s := &Sink{log: zerolog.New(&logs), topo: topology.Default(), cfg: DefaultConfig()}
	bad := `{"run_id": "", "status": "failed", "request": {"state": {"secret": "customer text"}}}`
	p := s.prepare([]jetstream.Msg{&fakeMsg{
		subject: "sys1.runs.failed", data: []byte(bad), seq: 7,
		header: nats.Header{"Sys1-Run-Id": []string{"run-parked-1"}},
	}})
	if len(p.dead) != 1 {
		t.Fatalf("dead letters = %d, want 1", len(p.dead))
	}
	var line map[string]any
	if err := json.Unmarshal([]byte(logs.String()), &line); err != nil {
		t.Fatalf("want one JSON log line: %v: %s", err, logs.String())
	}
	if line["run_id"] != "run-parked-1" || line["runs_seq"] != float64(7) {
		t.Errorf("dead-letter line lacks the run_id or runs_seq: %s", logs.String())
	}
	if strings.Contains(logs.String(), "customer text") {
		t.Errorf("dead-letter line carries record content: %s", logs.String())
	}
}
