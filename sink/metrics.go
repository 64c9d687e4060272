package sink

import (
	"fmt"
	"io"
)

// WriteMetrics writes the sink's counters and lag in the Prometheus text format. The lag
// (records in SYS1_RUNS not yet in ClickHouse) is what to alert on: it grows while ClickHouse
// is down or slow, and falls back to about one batch when the sink keeps up.
func (s *Sink) WriteMetrics(w io.Writer) {
	st := s.Stats()
	retrying := 0
	if st.Retrying {
		retrying = 1
	}
	for _, m := range []struct {
		name, kind, help string
		v                uint64
	}{
		{"sys1_sink_lag_records", "gauge", "Records in SYS1_RUNS not yet acknowledged by the sink (pending + ack pending), as of the last lag reading.", st.Pending + st.AckPending},
		{"sys1_sink_received_total", "counter", "Records taken from SYS1_RUNS, redeliveries included.", st.Received},
		{"sys1_sink_inserted_total", "counter", "Rows inserted into the runs table.", st.Inserted},
		{"sys1_sink_dead_lettered_total", "counter", "Records parked in the dead-letter table.", st.DeadLettered},
		{"sys1_sink_batches_total", "counter", "Batches inserted and acknowledged.", st.Batches},
		{"sys1_sink_insert_failures_total", "counter", "Failed insert attempts (each is retried).", st.InsertFailures},
		{"sys1_sink_ack_failures_total", "counter", "Batches whose acks failed (they are redelivered and deduplicated).", st.AckFailures},
		{"sys1_sink_retrying", "gauge", "1 while inserts into ClickHouse are failing.", uint64(retrying)},
	} {
		fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s %s\n%s %d\n", m.name, m.help, m.name, m.kind, m.name, m.v)
	}
}
