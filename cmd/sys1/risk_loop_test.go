package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/contract/wire"
	"github.com/sys1hq/sys1/sink/chtest"
	"github.com/sys1hq/sys1/worker"
	"github.com/sys1hq/sys1/worker/calibration"
	"github.com/sys1hq/sys1/worker/client"
	"github.com/sys1hq/sys1/worker/fleet"
	"github.com/sys1hq/sys1/worker/natsconn/natstest"
)

// writePolicy replaces the policy file by rename, as README asks.
func writePolicy(t *testing.T, path, body string) {
	t.Helper()
	tmp := path + ".new"
	if err := os.WriteFile(tmp, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// TestRiskControlEndToEnd is issue 25's loop through the real parts: a worker judges runs under
// a policy that reviews its abstentions and audits half of its decided answers; reviewers'
// labels reach ClickHouse through the sink; `sys1 calibrate --target-error 0.2 --apply` fits
// the threshold from sys1.labelled_answers (audit labels weighted by their recorded share);
// then a rule with max_error 0.2 decides exactly the answers at or above that threshold,
// naming the fit, and abstains on a question without a fit ("no risk fit"). Finally the
// scheduled evaluation (--report --apply) stores its figures, and the worker exports them.
func TestRiskControlEndToEnd(t *testing.T) {
	db := chtest.New(t)
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	writePolicy(t, policy, "rules:\n  - name: labelling\n    min_confidence: 0.3\n    audit_sample: 0.5\n")
	httpAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	startEmbeddedWorker(t,
		"SYS1_CLICKHOUSE_DSN", db.DSN, "SYS1_CLICKHOUSE_DATABASE", db.Name, "SYS1_SINK_BATCH_AGE", "100ms",
		"SYS1_POLICY_FILE", policy, "SYS1_HTTP_ADDR", httpAddr,
		// The caller from the request subject (sys1.decide.cli): fits are per caller.
		"SYS1_AUTH_MODE", "subject")
	nc, err := nats.Connect(os.Getenv("SYS1_NATS_URL"))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	cl, _ := client.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	body := func(i int) []byte {
		return fmt.Appendf(nil, `{"state":"ticket %d","questions":{"label":{"type":"choice","instructions":"Spam?","criteria":{"spam":null,"ham":null}},"other":{"type":"choice","instructions":"Other?","criteria":{"x":null,"y":null}}}}`, i)
	}

	// Labels as reviewers give them: the answer is wrong with a chance that falls with its
	// confidence; every abstention and every audit sample is labelled.
	rng := rand.New(rand.NewPCG(25, 25))
	const n = 400
	labels, audits := 0, 0
	for i := range n {
		rep, err := cl.Decide(ctx, client.Request{Caller: "cli", Body: body(i), RunID: fmt.Sprint("risk-", i)})
		if err != nil || rep.Status != contract.StatusSuccess {
			t.Fatalf("run %d: %v %+v", i, err, rep)
		}
		v, _ := rep.Verdicts.Get("label")
		if v.Status == contract.VerdictDecided && !v.Audit {
			if v.AuditShare != 0.5 {
				t.Fatalf("a decided verdict without its audit share: %+v", v)
			}
			continue
		}
		if v.Audit {
			audits++
		}
		a := rep.Result.Answers[0]
		label := a.Choice
		if rng.Float64() < 0.5*(1-*a.Confidence) {
			label = map[string]string{"spam": "ham", "ham": "spam"}[a.Choice]
		}
		lb, _ := json.Marshal(contract.Label{RunID: rep.RunID, Question: "label", Value: json.RawMessage(`"` + label + `"`), Reviewer: "ann",
			LabelledAt: time.Now().UTC(), Source: contract.LabelSourceReview, Caller: "cli", Item: contract.ReviewItemID(rep.RunID, "label")})
		if _, err := js.Publish(ctx, "sys1.labels.cli.accepted", lb); err != nil {
			t.Fatal(err)
		}
		labels++
	}
	t.Logf("%d runs: %d labelled, %d of them audit samples", n, labels, audits)
	if audits < 20 || labels-audits < 20 {
		t.Fatalf("the simulator's confidences gave %d abstentions and %d audits: not the mix this test needs", labels-audits, audits)
	}
	natstest.WaitFor(t, time.Minute, "the labels joined with their answers in ClickHouse", func() bool {
		return db.Count(t, "SELECT count() FROM "+db.Name+".labelled_answers") == uint64(labels)
	})
	if got := db.Count(t, "SELECT count() FROM "+db.Name+".labelled_answers WHERE verdict = 'decided' AND audit_share = 0.5"); got != uint64(audits) {
		t.Fatalf("%d audit labels with their share in the view, want %d", got, audits)
	}

	code, out, errOut := runCmd(t, "calibrate", "--target-error", "0.2", "--apply", "--since", "1d", "--question", "label", "--json")
	if code != exitOK {
		t.Fatalf("calibrate: exit %d\n%s\n%s", code, out, errOut)
	}
	var made calibrateReport
	if err := json.Unmarshal([]byte(out), &made); err != nil || len(made.Fits) != 1 {
		t.Fatalf("calibrate --json: %v\n%s", err, out)
	}
	key := made.Fits[0].Key
	kv, err := js.KeyValue(ctx, "sys1-calibration")
	if err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(ctx, key)
	if err != nil {
		t.Fatalf("no fit stored: %v\n%s", err, out)
	}
	fit, err := calibration.Decode(e.Key(), e.Value())
	if err != nil || fit.Caller != "cli" || fit.Risk == nil || fit.Risk.AbstainAll || fit.Risk.Labels["audit"] != audits {
		t.Fatalf("stored %+v %v\n%s", fit, err, out)
	}
	t.Logf("fit: T %.3f (applied %v), threshold %.3f, coverage %.3f, bound %.3f", fit.Temperature, fit.AppliesTemperature(), fit.Risk.Threshold, fit.Risk.Coverage, fit.Risk.Bound)

	// The rule that uses it, for every question.
	writePolicy(t, policy, "rules:\n  - name: guaranteed\n    max_error: 0.2\n")
	natstest.WaitFor(t, 20*time.Second, "the max_error policy and the fit in effect", func() bool {
		rep, err := cl.Decide(ctx, client.Request{Caller: "cli", Body: body(n)})
		if err != nil || rep.Status != contract.StatusSuccess {
			return false
		}
		v, _ := rep.Verdicts.Get("label")
		return v.Rule == "guaranteed" && !strings.HasPrefix(v.Reason, "no risk fit")
	})
	// Capabilities show the threshold the replica decides by.
	natstest.WaitFor(t, 20*time.Second, "the risk threshold in the replica's capabilities", func() bool {
		caps, err := fleet.Ask(ctx, nc, wire.CapabilitiesSubject, time.Second)
		var c worker.Capabilities
		if err != nil || len(caps) != 1 || json.Unmarshal(caps[0], &c) != nil {
			return false
		}
		for _, f := range c.Calibration {
			if f.Question == "label" && f.Risk != nil {
				if f.Risk.Threshold != fit.Risk.Threshold || f.Risk.TargetError != 0.2 || f.Risk.N != fit.Risk.N {
					t.Fatalf("capabilities show risk %+v, stored %+v", f.Risk, fit.Risk)
				}
				return true
			}
		}
		return false
	})
	suffix := fmt.Sprintf("(max_error 0.2, fit of %s, n %s)", fit.FittedAt.Format("2006-01-02"), thousandsInt(fit.Risk.N))
	decided, abstained := 0, 0
	for i := n + 1; i < n+61; i++ {
		rep, err := cl.Decide(ctx, client.Request{Caller: "cli", Body: body(i)})
		if err != nil || rep.Status != contract.StatusSuccess {
			t.Fatalf("run %d: %v %+v", i, err, rep)
		}
		v, _ := rep.Verdicts.Get("label")
		value := *rep.Result.Answers[0].Confidence
		if fit.Risk.Calibrated {
			if v.Calibrated == nil || v.Calibrated.Confidence == nil {
				t.Fatalf("no calibrated confidence: %+v", v)
			}
			value = *v.Calibrated.Confidence
		}
		want := contract.VerdictAbstained
		if value >= fit.Risk.Threshold {
			want = contract.VerdictDecided
			decided++
		} else {
			abstained++
		}
		if v.Status != want || !strings.HasSuffix(v.Reason, suffix) {
			t.Errorf("confidence %v, threshold %v: verdict %s %q, want %s ending %q", value, fit.Risk.Threshold, v.Status, v.Reason, want, suffix)
		}
		// "other" has no fit: fail safe.
		if o, _ := rep.Verdicts.Get("other"); o.Status != contract.VerdictAbstained || o.Reason != "no risk fit (max_error 0.2)" {
			t.Errorf("question without a fit: %+v", o)
		}
	}
	if decided == 0 || abstained == 0 {
		t.Errorf("60 runs: %d decided, %d abstained; the threshold should split them", decided, abstained)
	}

	// The scheduled evaluation: figures from ClickHouse into the fit, out of the worker's
	// /metrics.
	code, out, errOut = runCmd(t, "calibrate", "--report", "--apply", "--since", "1d", "--question", "label")
	if code != exitOK || !strings.Contains(out, "error of decided answers (audit samples only)") || !strings.Contains(out, "abstention rate") ||
		!strings.Contains(out, "stored: sys1-calibration revision") {
		t.Fatalf("--report --apply: exit %d\n%s\n%s", code, out, errOut)
	}
	defer func() {
		if t.Failed() {
			for _, l := range strings.Split(httpGet(t, "http://"+httpAddr+"/metrics"), "\n") {
				if strings.Contains(l, "risk") || strings.Contains(l, "calibration") {
					t.Log(l)
				}
			}
			t.Log(out)
		}
	}()
	natstest.WaitFor(t, 20*time.Second, "the evaluation in the worker's metrics", func() bool {
		m := httpGet(t, "http://"+httpAddr+"/metrics")
		return strings.Contains(m, `sys1_worker_risk_decided_error{caller="cli",model="`+fit.Model+`",question="label"`) &&
			strings.Contains(m, `sys1_worker_risk_abstention_rate{caller="cli",model="`+fit.Model+`",question="label"`)
	})
	m := httpGet(t, "http://"+httpAddr+"/metrics")
	for _, want := range []string{"sys1_worker_risk_target_error{", "sys1_worker_risk_threshold{", "sys1_worker_risk_audits{", "sys1_worker_calibration_evaluated_timestamp_seconds{"} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	e, _ = kv.Get(ctx, key)
	ev, _ := calibration.Decode(e.Key(), e.Value())
	if ev.Evaluation == nil || ev.Evaluation.Audits != audits || ev.Evaluation.Coverage == nil || math.Abs(*ev.Evaluation.Coverage+*ev.Evaluation.AbstentionRate-1) > 1e-9 ||
		ev.Risk.Threshold != fit.Risk.Threshold {
		t.Errorf("stored evaluation %+v (risk %+v)", ev.Evaluation, ev.Risk)
	}
}
