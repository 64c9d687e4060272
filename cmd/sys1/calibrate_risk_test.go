package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/sink/chtest"
	"github.com/sys1hq/sys1/worker/calibration"
	"github.com/sys1hq/sys1/worker/calibration/synthetic"
	"github.com/sys1hq/sys1/worker/natsconn/natstest"
	"github.com/sys1hq/sys1/worker/policy"
)

// riskAnswersDDL is the stand-in view of labelledAnswersDDL with the columns risk fits read
// besides (verdict, audit_share; source and correct are there already).
const riskAnswersDDL = "CREATE TABLE `%s`.labelled_answers (" +
	"run_id String, caller String, provider String, model String, question String, type String, " +
	"finished_at DateTime64(3), labelled_at DateTime64(3), predicted String, label String, correct UInt8, " +
	"confidence Nullable(Float64), label_probability Float64, prob_keys Array(String), prob_values Array(Float64), " +
	"reviewer String, source String, verdict String, audit_share Float64) ENGINE = MergeTree ORDER BY (model, caller, question, labelled_at)"

// riskRow is one row for the risk stand-in.
type riskRow struct {
	labelRowIn
	source, verdict string
	auditShare      float64
}

// riskPolicyRows labels synthetic choice answers (calibrated, 4 options) as a policy with
// min_confidence minConf would have them labelled: every abstention reviewed, every
// 1/share-th decided answer audited (share recorded), the rest unlabelled. The first
// `producer` of the decided, unaudited answers get a producer's label instead.
func riskPolicyRows(model, caller, question string, n int, minConf, share float64, producer int, seed uint64, at time.Time) []riskRow {
	var rows []riskRow
	keys := []string{"billing", "bug", "account", "other"}
	every := int(math.Round(1 / share))
	decided := 0
	for i, a := range synthetic.Generate(contract.TypeChoice, n, 1, seed) {
		c := entropyConfidence(a.Reported)
		r := riskRow{labelRowIn: labelRowIn{runID: fmt.Sprintf("%s-%s-%d", caller, question, i), caller: caller, model: model, question: question,
			typ: contract.TypeChoice, labelledAt: at.Add(time.Duration(i) * time.Second), label: keys[a.Label], confidence: &c, keys: keys, values: a.Reported},
			source: "review", verdict: "abstained"}
		if c >= minConf {
			decided++
			switch {
			case decided%every == 0:
				r.verdict, r.auditShare = "decided", share
			case producer > 0:
				producer--
				r.verdict, r.source = "decided", "producer"
			default:
				continue
			}
		}
		rows = append(rows, r)
	}
	return rows
}

func insertRiskRows(t *testing.T, db *chtest.DB, rows []riskRow) {
	t.Helper()
	ctx := context.Background()
	batch, err := db.Conn.PrepareBatch(ctx, "INSERT INTO `"+db.Name+"`.labelled_answers")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		best := 0
		for i, v := range r.values {
			if v > r.values[best] {
				best = i
			}
		}
		correct, lp := uint8(0), 0.0
		if r.keys[best] == r.label {
			correct = 1
		}
		for i, k := range r.keys {
			if k == r.label {
				lp = r.values[i]
			}
		}
		if err := batch.Append(r.runID, r.caller, "simulator", r.model, r.question, string(r.typ), r.labelledAt.Add(-time.Minute), r.labelledAt,
			r.keys[best], r.label, correct, r.confidence, lp, r.keys, r.values, "ann", r.source, r.verdict, r.auditShare); err != nil {
			t.Fatal(err)
		}
	}
	if err := batch.Send(); err != nil {
		t.Fatal(err)
	}
}

// riskDB holds: a question with the realistic mix (abstentions below 0.7 reviewed, 5% of
// the rest audited, 40 producer labels), one whose labels are all reviewed abstentions (no
// audits), one with too few labels, one whose every label is wrong and one whose every label
// is right.
func riskDB(t *testing.T, now time.Time) *chtest.DB {
	t.Helper()
	db := chtest.New(t)
	ctx := context.Background()
	if err := db.Conn.Exec(ctx, "CREATE DATABASE `"+db.Name+"`"); err != nil {
		t.Fatal(err)
	}
	if err := db.Conn.Exec(ctx, fmt.Sprintf(riskAnswersDDL, db.Name)); err != nil {
		t.Fatal(err)
	}
	start := now.Add(-20 * 24 * time.Hour)
	rows := riskPolicyRows("nimble", "billing", "label", 12000, 0.7, 0.05, 40, 7, start)
	var noAudits, few, wrong, right []riskRow
	for _, r := range riskPolicyRows("nimble", "billing", "unaudited", 3000, 0.7, 0.05, 0, 8, start) {
		if r.verdict == "abstained" {
			noAudits = append(noAudits, r)
		}
	}
	few = riskPolicyRows("nimble", "billing", "few", 200, 0.7, 0.05, 0, 9, start)[:30]
	for _, r := range riskPolicyRows("nimble", "billing", "wrong", 3000, 0.7, 0.05, 0, 10, start) {
		r.label = r.keys[(argmaxOf(r.values)+1)%len(r.keys)]
		wrong = append(wrong, r)
	}
	for _, r := range riskPolicyRows("nimble", "billing", "right", 6000, 0.7, 0.05, 0, 11, start) {
		r.label = r.keys[argmaxOf(r.values)]
		right = append(right, r)
	}
	for _, set := range [][]riskRow{rows, noAudits, few, wrong, right} {
		insertRiskRows(t, db, set)
	}
	return db
}

func argmaxOf(v []float64) int {
	best := 0
	for i, x := range v {
		if x > v[best] {
			best = i
		}
	}
	return best
}

// The command's risk fit is the one FitRisk makes of the same labels in process (nothing
// lost or bent through ClickHouse), it says what it weighed and why, each bad input gets its
// message, and --apply stores the threshold beside the temperature.
func TestCalibrateRiskCommand(t *testing.T) {
	now := time.Now().UTC()
	db := riskDB(t, now)
	srv := natstest.Start(t)
	_, js := natstest.Connect(t, srv)
	t.Setenv("SYS1_CLICKHOUSE_DSN", db.DSN)
	t.Setenv("SYS1_CLICKHOUSE_DATABASE", db.Name)
	t.Setenv("SYS1_NATS_URL", srv.ClientURL())

	code, out, errOut := calibrate(t, "--target-error", "0.1", "--json")
	if code != exitOK {
		t.Fatalf("exit %d\n%s\n%s", code, out, errOut)
	}
	var rep calibrateReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatal(err)
	}
	fits := map[string]fitReport{}
	for _, f := range rep.Fits {
		fits[f.Fit.Question] = f
	}
	if rep.TargetError != 0.1 || rep.Delta != 0.1 || rep.Labels != "review" {
		t.Errorf("report header %+v", rep)
	}
	label := fits["label"]
	if label.Fit == nil || label.Fit.Risk == nil {
		t.Fatalf("no risk fit for label: %s", out)
	}
	k := label.Fit.Risk
	if k.AbstainAll || !k.Calibrated || k.Bound > 0.1 || k.Labels["audit"] == 0 || k.Labels["abstention"] == 0 || k.Labels["producer"] != 0 ||
		k.Skips[string(calibration.RiskSkipProducer)] != 40 || len(k.Strata) != 2 || k.Strata[0].Weight != 20 {
		t.Errorf("label risk %+v", k)
	}
	// In process, from the same rows.
	var samples []calibration.RiskSample
	for _, r := range riskPolicyRows("nimble", "billing", "label", 12000, 0.7, 0.05, 40, 7, now) {
		if r.source != "review" {
			continue
		}
		kind, w, _ := calibration.RiskLabel(calibration.Sources{Review: true}, r.source, r.verdict, r.auditShare)
		y := 0
		for i, key := range r.keys {
			if key == r.label {
				y = i
			}
		}
		samples = append(samples, calibration.RiskSample{Sample: calibration.Sample{Probs: r.values, Label: y, Confidence: *r.confidence},
			Wrong: argmaxOf(r.values) != y, Kind: kind, Weight: w})
	}
	direct, err := calibration.FitRisk(contract.TypeChoice, samples, nil, label.Fit.Temperature, calibration.RiskOptions{TargetError: 0.1, Delta: 0.1, Sources: calibration.Sources{Review: true}, ThresholdOn: calibration.OnConfidence})
	if err != nil || direct.Threshold != k.Threshold || direct.Bound != k.Bound || direct.N != k.N {
		t.Errorf("through ClickHouse: threshold %v bound %v n %d; in process %+v %v", k.Threshold, k.Bound, k.N, direct, err)
	}

	for q, want := range map[string]string{
		"unaudited": "no audit samples among the",
		"few":       "30 usable labels",
	} {
		f, ok := fits[q]
		var msg string
		if ok && f.RiskNoFit != nil {
			msg = f.RiskNoFit.Message
		}
		for _, n := range rep.NoFit {
			if n.Question == q {
				msg = n.Message
			}
		}
		if !strings.Contains(msg, want) {
			t.Errorf("%s: %q, want %q (%+v)", q, msg, want, f)
		}
	}
	if w := fits["wrong"].Fit; w == nil || w.Risk == nil || !w.Risk.AbstainAll || len(w.Risk.Notes) == 0 || !strings.Contains(w.Risk.Notes[0], "disagree") {
		t.Errorf("all wrong: %+v", fits["wrong"])
	}
	if r := fits["right"].Fit; r == nil || r.Risk == nil || r.Risk.AbstainAll || !strings.Contains(strings.Join(r.Risk.Notes, " "), "agree with the answers") {
		t.Errorf("all right: %+v", fits["right"])
	} else if r.Converged || r.Temperature != 1 || r.Risk.Calibrated {
		// Always right: T runs into its lower bound, so the threshold is on raw values and
		// the fit is stored with T = 1, not applied.
		t.Errorf("all right: T %v converged %v calibrated %v", r.Temperature, r.Converged, r.Risk.Calibrated)
	}

	// The table says it in words.
	code, out, _ = calibrate(t, "--target-error", "0.1", "--question", "label")
	for _, want := range []string{
		"risk: target error 10% with probability ≥ 90% (δ 0.1), threshold on calibrated confidence",
		"reviewed abstentions × 1", "audit samples × 20", "left out: 40 producer label (--labels producer uses them)",
		"threshold " + fmtThreshold(k.Threshold) + ": decides ", "upper bound", "would store under nimble.billing.label:",
		"risk threshold " + fmtThreshold(k.Threshold) + " (max_error 0.1)",
	} {
		if code != exitOK || !strings.Contains(out, want) {
			t.Errorf("table lacks %q (exit %d):\n%s", want, code, out)
		}
	}
	code, out, _ = calibrate(t, "--target-error", "0.1", "--question", "wrong")
	if !strings.Contains(out, `no threshold meets 10%`) || !strings.Contains(out, `"abstain all": a rule with max_error 0.1 abstains on every answer`) {
		t.Errorf("all wrong (exit %d):\n%s", code, out)
	}
	// Producer labels join only when asked, and the output says what that assumes.
	code, out, _ = calibrate(t, "--target-error", "0.1", "--question", "label", "--labels", "review,producer")
	if code != exitOK || !strings.Contains(out, "40 producer labels × 1 (sampling unknown)") || !strings.Contains(out, "their sampling is unknown") {
		t.Errorf("--labels review,producer (exit %d):\n%s", code, out)
	}
	// Only groups without a risk fit: exit 1, said.
	if code, _, errOut = calibrate(t, "--target-error", "0.1", "--question", "unaudited"); code != exitFailed || !strings.Contains(errOut, "no risk fit made for --target-error 0.1") {
		t.Errorf("no risk fit: exit %d %s", code, errOut)
	}

	// Bad flags: each named.
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--target-error", "1.5"}, "--target-error: 1.5 is not in (0, 1)"},
		{[]string{"--target-error", "0"}, "--target-error: 0 is not in (0, 1)"},
		{[]string{"--target-error", "-0.05"}, "--target-error: -0.05 is not in (0, 1)"},
		{[]string{"--target-error", "0.05", "--delta", "1"}, "--delta: 1 is not in (0, 1)"},
		{[]string{"--target-error", "0.05", "--labels", "everything"}, `--labels: "everything" is not review or producer`},
		{[]string{"--delta", "0.2"}, "--delta and --labels go with --target-error or --report"},
		{[]string{"--report", "--target-error", "0.05"}, "--target-error is for fitting"},
		{[]string{"--report", "--list"}, "separate modes"},
	} {
		if code, _, errOut := calibrate(t, c.args...); code != exitUsage || !strings.Contains(errOut, c.want) {
			t.Errorf("%v: exit %d, want 2 and %q:\n%s", c.args, code, c.want, errOut)
		}
	}

	// --apply stores the threshold beside the temperature.
	if code, out, errOut = calibrate(t, "--target-error", "0.1", "--apply", "--question", "label"); code != exitOK || !strings.Contains(out, "stored: sys1-calibration revision") {
		t.Fatalf("--apply: exit %d\n%s\n%s", code, out, errOut)
	}
	kv, err := js.KeyValue(context.Background(), "sys1-calibration")
	if err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(context.Background(), "nimble.billing.label")
	if err != nil {
		t.Fatal(err)
	}
	stored, err := calibration.Decode(e.Key(), e.Value())
	if err != nil || stored.Risk == nil || stored.Risk.Threshold != k.Threshold || stored.Risk.TargetError != 0.1 {
		t.Fatalf("stored %+v %v", stored, err)
	}
	if th, ok := stored.Risk.RiskThreshold(0.1); !ok || th != k.Threshold || !strings.HasPrefix(stored.Risk.RiskLabel(), "fit of "+now.Format("2006-01-02")+", n "+thousandsInt(k.N)) {
		t.Errorf("stored risk answers %v %v %q", th, ok, stored.Risk.RiskLabel())
	}
	// An all-correct group: stored for its threshold, with T = 1.
	if code, _, errOut = calibrate(t, "--target-error", "0.1", "--apply", "--question", "right"); code != exitOK {
		t.Errorf("--apply right: exit %d %s", code, errOut)
	}
	if e, err := kv.Get(context.Background(), "nimble.billing.right"); err != nil {
		t.Errorf("all-right fit not stored: %v", err)
	} else if f, err := calibration.Decode(e.Key(), e.Value()); err != nil || f.AppliesTemperature() || f.Temperature != 1 || f.Risk == nil {
		t.Errorf("all-right fit %+v %v", f, err)
	}
	// A temperature-only refit replaces the risk threshold: said, not silent.
	if code, _, errOut = calibrate(t, "--apply", "--question", "label"); code != exitOK || !strings.Contains(errOut, "nimble.billing.label: the stored fit had a risk threshold (target error 0.1); this fit has none") {
		t.Errorf("refit without --target-error: exit %d %s", code, errOut)
	}
	// Listing still works, with the risk fits stored.
	if code, out, _ = calibrate(t, "--list"); code != exitOK || !strings.Contains(out, "nimble.billing.label") {
		t.Errorf("--list: %d\n%s", code, out)
	}
	// The RISK column names the all-right group's stored threshold and the label group's none.
	for _, line := range strings.Split(out, "\n") {
		switch {
		case strings.HasPrefix(line, "nimble.billing.right ") && !strings.Contains(line, "(ε 0.1"):
			t.Errorf("--list shows no risk threshold for the risk fit: %q", line)
		case strings.HasPrefix(line, "nimble.billing.label ") && strings.Contains(line, "(ε "):
			t.Errorf("--list shows a risk threshold for a temperature-only fit: %q", line)
		}
	}
}

// --report compares each stored fit with the labels since: the decided answers' error from
// audit samples alone, and ECE on the labels newer than the fit's (here drifted: the model
// turned overconfident after the fit); --report --apply stores the figures in the fit.
func TestCalibrateReport(t *testing.T) {
	now := time.Now().UTC()
	db := riskDB(t, now)
	srv := natstest.Start(t)
	_, js := natstest.Connect(t, srv)
	t.Setenv("SYS1_CLICKHOUSE_DSN", db.DSN)
	t.Setenv("SYS1_CLICKHOUSE_DATABASE", db.Name)
	t.Setenv("SYS1_NATS_URL", srv.ClientURL())
	if code, _, errOut := calibrate(t, "--target-error", "0.1", "--apply", "--question", "label"); code != exitOK {
		t.Fatalf("fit: %s", errOut)
	}
	// Newer labels of a model that turned overconfident (distorted by T = 3).
	var newer []riskRow
	for i, a := range synthetic.Generate(contract.TypeChoice, 600, 3, 99) {
		keys := []string{"billing", "bug", "account", "other"}
		c := entropyConfidence(a.Reported)
		newer = append(newer, riskRow{labelRowIn: labelRowIn{runID: fmt.Sprintf("newer-%d", i), caller: "billing", model: "nimble", question: "label",
			typ: contract.TypeChoice, labelledAt: now.Add(-time.Hour).Add(time.Duration(i) * time.Second / 10), label: keys[a.Label], confidence: &c, keys: keys, values: a.Reported},
			source: "review", verdict: "abstained"})
	}
	insertRiskRows(t, db, newer)

	code, out, errOut := calibrate(t, "--report", "--json")
	if code != exitOK {
		t.Fatalf("--report: exit %d\n%s\n%s", code, out, errOut)
	}
	var rep calibrationReportOut
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatal(err)
	}
	byQ := map[string]reportEntry{}
	for _, e := range rep.Entries {
		byQ[e.Question] = e
	}
	label := byQ["label"]
	if label.Fit == nil || label.Fit.TargetError == nil || label.DecidedError == nil || label.Audits == 0 || label.ErrorStatus == "" ||
		label.RecentLabels != 600 || label.RecentECE == nil || !label.Drift {
		t.Errorf("label: %+v", label)
	}
	if !strings.Contains(rep.RunsNote, "runs does not exist") || label.Coverage != nil {
		t.Errorf("without run records: note %q, coverage %v", rep.RunsNote, label.Coverage)
	}
	if u := byQ["unaudited"]; u.Fit != nil || u.DecidedError != nil || u.Audits != 0 {
		t.Errorf("unaudited: %+v", u)
	}
	code, out, _ = calibrate(t, "--report", "--question", "label")
	for _, want := range []string{"error of decided answers (audit samples only):", "ECE on 600 labels newer than the fit:", "DRIFT", "report only"} {
		if code != exitOK || !strings.Contains(out, want) {
			t.Errorf("report lacks %q (exit %d):\n%s", want, code, out)
		}
	}

	// The scheduled evaluation stores the figures in the fit (and only in stored fits).
	code, out, errOut = calibrate(t, "--report", "--apply", "--json")
	if code != exitOK {
		t.Fatalf("--report --apply: exit %d\n%s\n%s", code, out, errOut)
	}
	kv, _ := js.KeyValue(context.Background(), "sys1-calibration")
	e, _ := kv.Get(context.Background(), "nimble.billing.label")
	f, err := calibration.Decode(e.Key(), e.Value())
	if err != nil || f.Evaluation == nil || f.Evaluation.Audits != label.Audits || f.Evaluation.RecentECE == nil || *f.Evaluation.RecentECE != *label.RecentECE ||
		f.Risk == nil || f.Evaluation.DecidedError == nil || f.Evaluation.DecidedError.Estimate != label.DecidedError.Estimate {
		t.Errorf("stored evaluation %+v (%v)", f.Evaluation, err)
	}
	rep = calibrationReportOut{}
	_ = json.Unmarshal([]byte(out), &rep)
	for _, e := range rep.Entries {
		if (e.Question == "label") != e.Stored {
			t.Errorf("%s: stored %v (%s)", e.Question, e.Stored, e.NotStored)
		}
	}
	// Nothing to report on: exit 1, said.
	if code, _, errOut = calibrate(t, "--report", "--model", "nobody"); code != exitFailed || !strings.Contains(errOut, "nothing to report") {
		t.Errorf("nothing to report: exit %d %s", code, errOut)
	}
}

// trafficRows labels n answers of synthetic traffic m as the acceptance scenario of issue 25
// has them labelled (worker/calibration/risk: a policy min_confidence minConf that reviews
// every abstention and audits share of the decided answers). Each answer is a choice of two
// options reported with that confidence (binaryWithConfidence); its label is the other option
// when the traffic says the answer is wrong.
func trafficRows(m synthetic.Traffic, question string, n int, minConf, share float64, seed uint64, at time.Time) []riskRow {
	answers, _ := m.Labels(n, minConf, share, seed)
	keys := []string{"spam", "ham"}
	rows := make([]riskRow, len(answers))
	for i, a := range answers {
		c := a.Confidence
		label := keys[0]
		if a.Wrong {
			label = keys[1]
		}
		r := riskRow{labelRowIn: labelRowIn{runID: fmt.Sprintf("%s-%d", question, i), caller: "billing", model: "nimble", question: question,
			typ: contract.TypeChoice, labelledAt: at.Add(time.Duration(i) * time.Second), label: label, confidence: &c, keys: keys, values: binaryWithConfidence(c)},
			source: "review", verdict: "abstained"}
		if a.Audit {
			r.verdict, r.auditShare = "decided", share
		}
		rows[i] = r
	}
	return rows
}

// binaryWithConfidence is the distribution [p, 1 − p], p ≥ ½, whose normalised-entropy
// confidence (what a model reports, entropyConfidence) is c.
func binaryWithConfidence(c float64) []float64 {
	lo, hi := 0.5, 1.0
	for range 60 {
		mid := (lo + hi) / 2
		if entropyConfidence([]float64{mid, 1 - mid}) < c {
			lo = mid
		} else {
			hi = mid
		}
	}
	return []float64{hi, 1 - hi}
}

// TestCalibrateRiskAtFivePercent is issue 25's end-to-end acceptance at its own figures,
// through the command: 2,000 labels in ClickHouse from the acceptance scenario's traffic
// (synthetic.DefaultTraffic: every abstention of a min_confidence 0.6 policy reviewed, 5% of
// its decided answers audited); `sys1 calibrate --target-error 0.05 --apply` prints n, the
// threshold, coverage, error and bound, and stores them in sys1-calibration; a rule with
// max_error 0.05 then decides fresh answers whose (calibrated) confidence is at or above that
// threshold and abstains below it, as the worker evaluates them (stage_policy). A question
// whose answers are wrong too often for 5% at every threshold is stored as "abstain all",
// on which the rule abstains.
func TestCalibrateRiskAtFivePercent(t *testing.T) {
	now := time.Now().UTC()
	db := chtest.New(t)
	ctx := context.Background()
	if err := db.Conn.Exec(ctx, "CREATE DATABASE `"+db.Name+"`"); err != nil {
		t.Fatal(err)
	}
	if err := db.Conn.Exec(ctx, fmt.Sprintf(riskAnswersDDL, db.Name)); err != nil {
		t.Fatal(err)
	}
	start := now.Add(-10 * 24 * time.Hour)
	rows := trafficRows(synthetic.DefaultTraffic, "label", 2000, 0.6, 0.05, 2025, start)
	audits := 0
	for _, r := range rows {
		if r.verdict == "decided" {
			audits++
		}
	}
	// A worse model: wrong at least 17% of the time however sure it is.
	poor := synthetic.Traffic{ConfA: 6, ConfB: 2, Centre: 0.8, Slope: 8}
	insertRiskRows(t, db, rows)
	insertRiskRows(t, db, trafficRows(poor, "poor", 2000, 0.6, 0.05, 2026, start))
	srv := natstest.Start(t)
	_, js := natstest.Connect(t, srv)
	t.Setenv("SYS1_CLICKHOUSE_DSN", db.DSN)
	t.Setenv("SYS1_CLICKHOUSE_DATABASE", db.Name)
	t.Setenv("SYS1_NATS_URL", srv.ClientURL())

	code, out, errOut := calibrate(t, "--target-error", "0.05", "--question", "label", "--json")
	if code != exitOK {
		t.Fatalf("exit %d\n%s\n%s", code, out, errOut)
	}
	var rep calibrateReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil || len(rep.Fits) != 1 || rep.Fits[0].Fit.Risk == nil {
		t.Fatalf("%v\n%s", err, out)
	}
	k := rep.Fits[0].Fit.Risk
	if k.AbstainAll || k.N != 2000 || k.Labels["audit"] != audits || k.Labels["abstention"] != 2000-audits || k.TargetError != 0.05 || k.Delta != 0.1 ||
		!(k.Bound <= 0.05) || !(k.Error <= k.Bound) || !(k.Coverage > 0 && k.Coverage < 1) || !(k.Threshold > 0 && k.Threshold < 1) {
		t.Fatalf("risk fit at 5%%: %+v", k)
	}
	// What the threshold buys, by the traffic's known truth: at most 5% wrong among the
	// answers it decides (on raw confidence; a temperature is monotone in it for two options).
	raw := k.Threshold
	if k.Calibrated {
		raw = rawConfidenceAt(t, rep.Fits[0].Fit, k.Threshold)
	}
	risk, coverage := synthetic.DefaultTraffic.Risk(raw)
	t.Logf("n %d (%d audits): threshold %v (raw confidence %.3f), coverage %.3f (true %.3f), error %.4f, bound %.4f (true error %.4f), calibrated %v",
		k.N, audits, k.Threshold, raw, k.Coverage, coverage, k.Error, k.Bound, risk, k.Calibrated)
	if risk > 0.05 {
		t.Errorf("the fitted threshold's true error is %.4f, over 5%%", risk)
	}
	if _, oracle := synthetic.DefaultTraffic.Oracle(0.05); math.Abs(coverage-oracle) > 0.05 || math.Abs(k.Coverage-coverage) > 0.05 {
		t.Errorf("coverage %.3f estimated, %.3f true; the oracle threshold's is %.3f", k.Coverage, coverage, oracle)
	}

	// --apply: the same figures printed, and stored.
	code, out, errOut = calibrate(t, "--target-error", "0.05", "--apply")
	if code != exitOK {
		t.Fatalf("--apply: exit %d\n%s\n%s", code, out, errOut)
	}
	for _, want := range []string{
		"risk: target error 5% with probability ≥ 90% (δ 0.1)",
		fmt.Sprintf("n 2,000 labels (review): %s reviewed abstentions × 1, %d audit samples × 20", thousandsInt(2000-audits), audits),
		fmt.Sprintf("threshold %s: decides %s of answers (estimated), error among them %s, upper bound %s ≤ 5%%", fmtThreshold(k.Threshold), pct(k.Coverage), pct(k.Error), pct(k.Bound)),
		"no threshold meets 5%", `"abstain all": a rule with max_error 0.05 abstains on every answer of this question`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if n := strings.Count(out, "stored: sys1-calibration revision"); n != 2 {
		t.Errorf("%d fits stored, want 2 (label and poor):\n%s", n, out)
	}
	kv, err := js.KeyValue(ctx, "sys1-calibration")
	if err != nil {
		t.Fatal(err)
	}
	stored := map[string]*calibration.Fit{}
	for _, q := range []string{"label", "poor"} {
		e, err := kv.Get(ctx, "nimble.billing."+q)
		if err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		f, err := calibration.Decode(e.Key(), e.Value())
		if err != nil || f.Risk == nil {
			t.Fatalf("%s stored %+v %v", q, f, err)
		}
		stored[q] = f
	}
	if r := stored["label"].Risk; r.AbstainAll || r.Threshold != k.Threshold || r.TargetError != 0.05 || r.Bound != k.Bound || r.Coverage != k.Coverage || r.N != 2000 {
		t.Errorf("stored label risk %+v, printed %+v", r, k)
	}
	if th, ok := stored["label"].Risk.RiskThreshold(0.05); !ok || th != k.Threshold {
		t.Errorf("the stored fit certifies %v, %v for max_error 0.05", th, ok)
	}
	if r := stored["poor"].Risk; !r.AbstainAll || r.TargetError != 0.05 || r.N != 2000 {
		t.Errorf("stored poor risk %+v, want abstain all", r)
	}
	if _, ok := stored["poor"].Risk.RiskThreshold(0.05); ok {
		t.Error("an abstain-all fit certifies a threshold")
	}

	// The rule, as the worker evaluates it (stage_policy: the stored fit's temperature
	// applied when it converged, its risk part handed to the policy), on fresh answers of
	// the same traffic.
	p, err := policy.Parse([]byte("rules:\n  - name: guaranteed\n    max_error: 0.05\n"))
	if err != nil {
		t.Fatal(err)
	}
	suffix := fmt.Sprintf("(max_error 0.05, fit of %s, n 2,000)", now.Format("2006-01-02"))
	fresh, _ := synthetic.DefaultTraffic.Labels(400, 1, 0, 4242) // every answer, whatever its confidence
	decided, abstained := 0, 0
	for i, a := range fresh {
		c := a.Confidence
		probs := binaryWithConfidence(c)
		for _, q := range []string{"label", "poor"} {
			fit := stored[q]
			ans := contract.Answer{Name: q, Type: contract.TypeChoice, Choice: "spam", Confidence: &c,
				Probabilities: []contract.Probability{{Key: "spam", P: probs[0]}, {Key: "ham", P: probs[1]}}}
			in := &policy.Input{RunID: fmt.Sprint("fresh-", i), Caller: "billing", Model: "nimble",
				Questions: []contract.Question{{Name: q, Type: contract.TypeChoice}}, Answers: []contract.Answer{ans}, Risk: []policy.RiskFit{fit.Risk}}
			value := c
			if fit.AppliesTemperature() {
				cal, err := calibration.Apply(fit, &ans)
				if err != nil {
					t.Fatal(err)
				}
				in.Calibrated, value = []*contract.Calibrated{&cal}, *cal.Confidence
			}
			v := p.Evaluate(in).Verdicts[0]
			if q == "poor" {
				if v.Status != contract.VerdictAbstained || !strings.HasPrefix(v.Reason, "max_error 0.05 is met at no threshold") {
					t.Fatalf("abstain all: %+v", v)
				}
				continue
			}
			want := contract.VerdictAbstained
			if value >= k.Threshold {
				want = contract.VerdictDecided
				decided++
			} else {
				abstained++
			}
			if v.Status != want || v.Rule != "guaranteed" || !strings.HasSuffix(v.Reason, suffix) {
				t.Errorf("value %v, threshold %v: %s %q, want %s ending %q", value, k.Threshold, v.Status, v.Reason, want, suffix)
			}
		}
	}
	t.Logf("fresh answers: %d decided, %d abstained", decided, abstained)
	if decided == 0 || abstained == 0 {
		t.Errorf("400 fresh answers: %d decided, %d abstained; the threshold should split them", decided, abstained)
	}
}

// rawConfidenceAt is the raw confidence of a two-option answer whose calibrated confidence,
// with fit's temperature, is calibrated (monotone: found by bisection).
func rawConfidenceAt(t *testing.T, fit *calibration.Fit, calibrated float64) float64 {
	t.Helper()
	lo, hi := 0.0, 1.0
	for range 60 {
		mid := (lo + hi) / 2
		p := binaryWithConfidence(mid)
		cal, err := calibration.Apply(fit, &contract.Answer{Type: contract.TypeChoice, Probabilities: []contract.Probability{{Key: "spam", P: p[0]}, {Key: "ham", P: p[1]}}})
		if err != nil {
			t.Fatal(err)
		}
		if *cal.Confidence < calibrated {
			lo = mid
		} else {
			hi = mid
		}
	}
	return hi
}
