package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/contract/wire"
	"github.com/sys1hq/sys1/sink/chtest"
	"github.com/sys1hq/sys1/worker"
	"github.com/sys1hq/sys1/worker/client"
	"github.com/sys1hq/sys1/worker/fleet"
	"github.com/sys1hq/sys1/worker/natsconn/natstest"
)

// TestCalibrationLoopEndToEnd is issue 13's loop through the real parts: runs decided by a
// worker, producers' labels checked and sunk into ClickHouse, `sys1 calibrate --apply` fitting
// them from sys1.labelled_answers, and the next reply carrying calibrated values that match
// the formula p' = 1 / (1 + ((1-p)/p)^(1/T)) — judged by a rule with use: calibrated.
func TestCalibrationLoopEndToEnd(t *testing.T) {
	db := chtest.New(t)
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(policy, []byte("rules:\n  - name: yes-no\n    noul_abstain_between: [0.0, 0.0]\n    use: calibrated\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	startEmbeddedWorker(t,
		"SYS1_CLICKHOUSE_DSN", db.DSN, "SYS1_CLICKHOUSE_DATABASE", db.Name, "SYS1_SINK_BATCH_AGE", "100ms",
		"SYS1_POLICY_FILE", policy)
	nc, err := nats.Connect(os.Getenv("SYS1_NATS_URL"))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	cl, _ := client.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// 80 runs; each labelled with an outcome drawn with the model's own P(yes), so the fit
	// converges (to about 1) rather than running into a bound.
	rng := rand.New(rand.NewPCG(13, 13))
	const n = 80
	for i := range n {
		body := fmt.Sprintf(`{"state":"ticket %d","questions":{"urgent":{"type":"noul","instructions":"Is it urgent?"}}}`, i)
		rep, err := cl.Decide(ctx, client.Request{Caller: "cli", Body: []byte(body), RunID: fmt.Sprint("cal-", i)})
		if err != nil || rep.Status != contract.StatusSuccess {
			t.Fatalf("run %d: %v %+v", i, err, rep)
		}
		label := rng.Float64() < rep.Result.Answers[0].Noul
		lb, _ := json.Marshal(map[string]any{"run_id": rep.RunID, "question": "urgent", "label": label})
		if _, err := js.Publish(ctx, "sys1.labels.cli", lb); err != nil {
			t.Fatal(err)
		}
	}
	natstest.WaitFor(t, time.Minute, "the labels joined with their answers in ClickHouse", func() bool {
		return db.Count(t, "SELECT count() FROM "+db.Name+".labelled_answers") == n
	})

	code, out, errOut := runCmd(t, "calibrate", "--apply", "--since", "1d", "--min-labels", "50", "--json")
	if code != exitOK {
		t.Fatalf("calibrate: exit %d\n%s\n%s\nview rows now %d, labels %d, with labelled_at < now() %d", code, out, errOut,
			db.Count(t, "SELECT count() FROM "+db.Name+".labelled_answers"), db.Count(t, "SELECT count() FROM "+db.Name+".labels FINAL"),
			db.Count(t, "SELECT count() FROM "+db.Name+".labelled_answers WHERE labelled_at < now64(3)"))
	}
	var fit struct {
		Temperature float64 `json:"temperature"`
	}
	natstest.WaitFor(t, 20*time.Second, "the fit on the replica", func() bool {
		caps, err := fleet.Ask(ctx, nc, wire.CapabilitiesSubject, time.Second)
		var c worker.Capabilities
		if err != nil || len(caps) != 1 || json.Unmarshal(caps[0], &c) != nil || len(c.Calibration) != 1 {
			return false
		}
		fit.Temperature = c.Calibration[0].Temperature
		return true
	})
	if fit.Temperature <= 0.05 || fit.Temperature >= 20 {
		t.Fatalf("fit T %v on a bound", fit.Temperature)
	}
	rep, err := cl.Decide(ctx, client.Request{Caller: "cli", Body: []byte(`{"state":"a new ticket","questions":{"urgent":{"type":"noul","instructions":"Is it urgent?"}}}`)})
	if err != nil || rep.Status != contract.StatusSuccess {
		t.Fatalf("after the fit: %v %+v", err, rep)
	}
	v, _ := rep.Verdicts.Get("urgent")
	if v.Calibrated == nil || v.Calibrated.Noul == nil || v.Calibrated.Temperature != fit.Temperature {
		t.Fatalf("verdict %+v (fit T %v)", v, fit.Temperature)
	}
	p := rep.Result.Answers[0].Noul
	eps := 1e-6
	want := 1 / (1 + math.Pow(math.Max(1-p, eps)/math.Max(p, eps), 1/fit.Temperature))
	if math.Abs(*v.Calibrated.Noul-want) > 1e-9 {
		t.Errorf("calibrated P(yes) %v, want %v (raw %v, T %v)", *v.Calibrated.Noul, want, p, fit.Temperature)
	}
}
