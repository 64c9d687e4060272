package sink

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/sys1hq/sys1/contract"
)

// BenchmarkSink measures records/s from SYS1_RUNS into ClickHouse through the sink (fetch,
// decode, row build, insert, ack) against the ceiling: a bare clickhouse-go PrepareBatch
// insert of the same rows, already built, in batches of the same size. One op is one record;
// run with e.g. -benchtime=20000x. Publishing the records and building the bare rows are
// outside the timer.
func BenchmarkSink(b *testing.B) {
	b.Run("through_sink", func(b *testing.B) {
		e := newEnv(b, func(c *Config) { c.BatchSize = 5000; c.BatchAge = time.Second })
		e.publish(b, makeRecords(0, b.N))
		b.ReportAllocs()
		b.ResetTimer()
		start := time.Now()
		s := e.startSink(b, e.cfg, nil)
		waitFor(b, 10*time.Minute, "every record inserted", func() bool { return s.Stats().Inserted >= uint64(b.N) })
		elapsed := time.Since(start)
		b.StopTimer()
		s.stop(b)
		b.ReportMetric(float64(b.N)/elapsed.Seconds(), "records/s")
	})
	b.Run("bare_insert", func(b *testing.B) {
		e := newEnv(b, nil)
		s, err := New(e.cfg, Deps{JS: e.js, ClickHouse: e.db.Conn, Topology: e.topo, Log: testLogger(b)})
		if err != nil {
			b.Fatal(err)
		}
		recs := makeRecords(0, b.N)
		rows := make([][]any, b.N)
		for i := range recs {
			r, err := toRow(&recs[i], origin{stream: "SYS1_RUNS", seq: uint64(i + 1), published: time.Now()}, RecordFull)
			if err != nil {
				b.Fatal(err)
			}
			rows[i] = r.values()
		}
		ctx := context.Background()
		b.ReportAllocs()
		b.ResetTimer()
		start := time.Now()
		for lo := 0; lo < len(rows); lo += 5000 {
			hi := min(lo+5000, len(rows))
			batch, err := e.db.Conn.PrepareBatch(ctx, s.insertRuns)
			if err != nil {
				b.Fatal(err)
			}
			for _, r := range rows[lo:hi] {
				if err := batch.Append(r...); err != nil {
					b.Fatal(err)
				}
			}
			if err := batch.Send(); err != nil {
				b.Fatal(err)
			}
		}
		elapsed := time.Since(start)
		b.StopTimer()
		b.ReportMetric(float64(b.N)/elapsed.Seconds(), "records/s")
	})
}

// BenchmarkToRow is the sink's CPU per record before the insert: decode and row building of a
// version 1 fixture record (comparable across versions) and of a version 2 one (verdicts,
// cost, batch), under SYS1_RECORD_STATE=hash.
func BenchmarkToRow(b *testing.B) {
	v1 := makeRecord(2)
	v1.SchemaVersion, v1.BatchID, v1.ItemID, v1.RunID, v1.CostUSD, v1.Verdicts, v1.Review, v1.TraceID = 1, "", "", "run-2", nil, nil, nil, ""
	for i := range v1.Attempts {
		v1.Attempts[i].Model = ""
	}
	for _, c := range []struct {
		name string
		rec  contract.RunRecord
	}{{"v1", v1}, {"v2", makeRecord(2)}} {
		data, err := json.Marshal(&c.rec)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := decodeRecord(data, origin{stream: "SYS1_RUNS", seq: 1}, RecordHash); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
