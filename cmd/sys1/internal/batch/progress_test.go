package batch_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sys1hq/sys1/cmd/sys1/internal/batch"
	"github.com/sys1hq/sys1/contract/wire"
)

func TestBatchProgressLiveBar(t *testing.T) {
	var buf bytes.Buffer
	w := &batch.ProgressWriter{W: &buf, Live: true, Width: 120}
	w.Update(batch.Progress{Total: 1000, Elapsed: 0})
	w.Update(batch.Progress{Total: 1000, Succeeded: 480, Failed: 10, Invalid: 10, Outstanding: 64, Elapsed: 5 * time.Second})
	got := buf.String()
	want := "\r\033[K[                                        ] 0/1000   0%  ok 0  failed 0  invalid 0  0/s  ETA -" +
		"\r\033[K[====================                    ] 500/1000  50%  ok 480  failed 10  invalid 10  98/s  ETA 5s"
	if got != want {
		t.Errorf("live bar:\n%q\nwant\n%q", got, want)
	}
	buf.Reset()
	w.Update(batch.Progress{Total: 1000, Succeeded: 980, Failed: 10, Invalid: 10, Elapsed: 10 * time.Second, Final: true})
	if got := buf.String(); !strings.HasSuffix(got, "ok 980  failed 10  invalid 10  99/s  done\n") {
		t.Errorf("final bar: %q", got)
	}
	// A narrow terminal gets the figures without the bar, never a wrapped line.
	buf.Reset()
	narrow := &batch.ProgressWriter{W: &buf, Live: true, Width: 40}
	narrow.Update(batch.Progress{Total: 1000, Succeeded: 1, Elapsed: time.Second})
	if line := strings.TrimPrefix(buf.String(), "\r\033[K"); len(line) >= 40 || strings.Contains(line, "[") {
		t.Errorf("narrow: %q", line)
	}
}

func TestBatchProgressPlainLines(t *testing.T) {
	var buf bytes.Buffer
	w := &batch.ProgressWriter{W: &buf, Every: 10 * time.Second, Label: "b-1"}
	for s := 0; s <= 25; s++ {
		w.Update(batch.Progress{Total: 100, Succeeded: 2 * s, Outstanding: 8, Elapsed: time.Duration(s) * time.Second})
	}
	w.Update(batch.Progress{Total: 100, Succeeded: 100, Elapsed: 26 * time.Second, Final: true})
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 4 { // at 0s, 10s, 20s, and the final one
		t.Fatalf("%d plain lines:\n%s", len(lines), buf.String())
	}
	if lines[2] != "batch b-1: 40/100 done (ok 40, failed 0, invalid 0), 8 in flight, 2.0/s, ETA 30s, 20s elapsed" {
		t.Errorf("plain line: %q", lines[2])
	}
	if strings.Contains(buf.String(), "\r") || strings.Contains(buf.String(), "\033") {
		t.Error("plain progress has terminal control characters")
	}
}

func TestBatchSummaryDistributions(t *testing.T) {
	d := newDeployment(t)
	d.responder(t, batch_testOpts())
	lines := []string{}
	for i := range 40 {
		lines = append(lines, request(i))
	}
	lines = append(lines, `{"state":"x","questions":{}}`)
	path := writeLines(t, "s.jsonl", lines)
	res := runBatch(context.Background(), t, d.client(t, "svc"), batch.Input{Path: path}, path+".out", batch.RunConfig{Caller: "svc"})
	if res.err != nil {
		t.Fatal(res.err)
	}
	s := res.summary
	if len(s.Questions) != 3 {
		t.Fatalf("questions: %+v", s.Questions)
	}
	label, refund, urgency := s.Questions[0], s.Questions[1], s.Questions[2]
	if label.Type != "choice" || label.Choices == nil || strings.Join(label.Choices.Keys, ",") != "billing,bug,account" {
		t.Errorf("label: %+v", label)
	}
	total := 0
	for _, c := range label.Choices.Counts {
		total += c
	}
	if total != 40 || label.Answered != 40 {
		t.Errorf("choice counts add to %d over %d answers", total, label.Answered)
	}
	if refund.MeanPYes == nil || *refund.MeanPYes <= 0 || *refund.MeanPYes >= 1 {
		t.Errorf("refund: %+v", refund)
	}
	if urgency.MeanScore == nil || *urgency.MeanScore < 0 || *urgency.MeanScore > 2 {
		t.Errorf("urgency: %+v", urgency)
	}
	if s.InputTokens == 0 || s.ErrorCodes["SYS1_INVALID_INPUT"] != 1 || s.Invalid != 1 {
		t.Errorf("tokens %d, codes %v", s.InputTokens, s.ErrorCodes)
	}
	var buf bytes.Buffer
	s.Print(&buf)
	for _, want := range []string{"41 lines: 40 succeeded, 0 failed, 1 invalid", "by error code: SYS1_INVALID_INPUT 1", "label (choice, 40 answers): billing", "mean P(yes)", "mean score", "decisions/s"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("printed summary lacks %q:\n%s", want, buf.String())
		}
	}
}

// TestBatchEstimate: no replica, a replica without the figures, and replicas with them.
func TestBatchEstimate(t *testing.T) {
	d := newDeployment(t)
	nc := d.client(t, "svc")
	if est := batch.EstimateDuration(context.Background(), nc, 1000, 300*time.Millisecond); est.Unavailable == "" || !strings.Contains(est.Unavailable, "no estimate is possible") {
		t.Errorf("no replica: %+v", est)
	}
	replica := func(id, caps string) {
		rnc := d.client(t, "sys1-worker")
		rnc.Subscribe("$SRV.PING.sys1", func(m *nats.Msg) { m.Respond([]byte(`{"name":"sys1","id":"` + id + `"}`)) })
		// A queue group, as NATS micro endpoints have by default: one replica answers.
		rnc.QueueSubscribe(wire.CapabilitiesSubject, "q", func(m *nats.Msg) { m.Respond([]byte(caps)) })
		rnc.Flush()
	}
	replica("r1", `{"replica":"r1","version":"dev"}`)
	if est := batch.EstimateDuration(context.Background(), nc, 1000, 300*time.Millisecond); !strings.Contains(est.Unavailable, "none reported") {
		t.Errorf("replica without figures: %+v", est)
	}
	d = newDeployment(t)
	nc = d.client(t, "svc")
	replica("r1", `{"replica":"r1","concurrency":8}`) // what capabilities carries today
	if est := batch.EstimateDuration(context.Background(), nc, 1000, 300*time.Millisecond); !strings.Contains(est.Unavailable, "not their recent provider latency") {
		t.Errorf("replica without latency: %+v", est)
	}
	d2 := newDeployment(t)
	d = d2
	nc = d.client(t, "svc")
	replica("r1", `{"replica":"r1","concurrency":8,"provider_latency_ms":400}`)
	replica("r2", `{"id":"r2","concurrency":8,"provider_latency_ms":{"p50":400}}`)
	est := batch.EstimateDuration(context.Background(), nc, 1000, 300*time.Millisecond)
	// Two replicas of 8 slots at 400 ms: 40 decisions/s, 1000 in 25 s (one answered the
	// queue-grouped capabilities; the ping found both).
	if est.Unavailable != "" || est.Replicas != 2 || est.Concurrency != 16 || est.PerSecond != 40 || est.DurationMS != 25000 {
		t.Errorf("estimate: %+v", est)
	}
}
