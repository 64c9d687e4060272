package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"image/png"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/sink/chtest"
	"github.com/sys1hq/sys1/worker/calibration"
	"github.com/sys1hq/sys1/worker/calibration/synthetic"
	"github.com/sys1hq/sys1/worker/natsconn/natstest"
	"github.com/sys1hq/sys1/worker/topology"
)

// labelledAnswersDDL is a stand-in for the view sys1.labelled_answers (issue 12) with the
// columns BRIEF.md lists, in a test database of its own so it never meets the real view.
// sys1 calibrate reads only columns of that list.
const labelledAnswersDDL = "CREATE TABLE `%s`.labelled_answers (" +
	"run_id String, caller String, provider String, model String, question String, type String, " +
	"finished_at DateTime64(3), labelled_at DateTime64(3), predicted String, label String, correct UInt8, " +
	"confidence Nullable(Float64), label_probability Float64, prob_keys Array(String), prob_values Array(Float64), " +
	"reviewer String, source String) ENGINE = MergeTree ORDER BY (model, caller, question, labelled_at)"

// labelRowIn is one row to insert.
type labelRowIn struct {
	runID, caller, model, question string
	typ                            contract.QuestionType
	labelledAt                     time.Time
	label                          string
	confidence                     *float64
	keys                           []string
	values                         []float64
}

func insertLabels(t *testing.T, db *chtest.DB, rows []labelRowIn) {
	t.Helper()
	ctx := context.Background()
	batch, err := db.Conn.PrepareBatch(ctx, "INSERT INTO `"+db.Name+"`.labelled_answers")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		predicted, correct, lp := "", uint8(0), 0.0
		if len(r.values) > 0 && len(r.values) == len(r.keys) {
			best := 0
			for i, v := range r.values {
				if v > r.values[best] {
					best = i
				}
				if r.keys[i] == r.label {
					lp = v
				}
			}
			predicted = r.keys[best]
			if predicted == r.label {
				correct = 1
			}
		}
		if err := batch.Append(r.runID, r.caller, "simulator", r.model, r.question, string(r.typ), r.labelledAt.Add(-time.Minute), r.labelledAt,
			predicted, r.label, correct, r.confidence, lp, r.keys, r.values, "ann", "review"); err != nil {
			t.Fatal(err)
		}
	}
	if err := batch.Send(); err != nil {
		t.Fatal(err)
	}
}

// syntheticRows turns synthetic answers into rows of labelled_answers.
func syntheticRows(model, caller, question string, typ contract.QuestionType, n int, distort float64, seed uint64, at time.Time) []labelRowIn {
	var rows []labelRowIn
	for i, a := range synthetic.Generate(typ, n, distort, seed) {
		r := labelRowIn{runID: fmt.Sprintf("%s-%s-%d", caller, question, i), caller: caller, model: model, question: question, typ: typ, labelledAt: at.Add(time.Duration(i) * time.Second), values: a.Reported}
		switch typ {
		case contract.TypeNoul:
			r.keys = []string{"false", "true"}
			r.label = strconv.FormatBool(a.Label == 1)
		case contract.TypeScore:
			for j := range a.Reported {
				r.keys = append(r.keys, strconv.Itoa(j))
			}
			r.label = strconv.Itoa(a.Label)
		default:
			r.keys = []string{"billing", "bug", "account", "other"}[:len(a.Reported)]
			r.label = r.keys[a.Label]
		}
		if typ != contract.TypeNoul {
			c := entropyConfidence(a.Reported)
			r.confidence = &c
		}
		rows = append(rows, r)
	}
	return rows
}

func entropyConfidence(p []float64) float64 {
	h := 0.0
	for _, v := range p {
		if v > 0 {
			h -= v * math.Log(v)
		}
	}
	return 1 - h/math.Log(float64(len(p)))
}

// labelsDB makes a test database with the stand-in view, filled with: an overconfident choice
// question (2,000 labels, T = 2.5), an underconfident noul one (300, T = 0.6), a score question
// with too few labels, a noul question whose labels are all true, a question renamed after 20
// labels, another model's labels for the same question, labels outside the window, and
// unusable rows (NaN, missing probabilities, a label that is no option, an old label of a run
// labelled again).
func labelsDB(t *testing.T, now time.Time) *chtest.DB {
	t.Helper()
	db := chtest.New(t)
	ctx := context.Background()
	if err := db.Conn.Exec(ctx, "CREATE DATABASE `"+db.Name+"`"); err != nil {
		t.Fatal(err)
	}
	if err := db.Conn.Exec(ctx, fmt.Sprintf(labelledAnswersDDL, db.Name)); err != nil {
		t.Fatal(err)
	}
	start := now.Add(-20 * 24 * time.Hour)
	var rows []labelRowIn
	rows = append(rows, syntheticRows("nimble", "billing", "label", contract.TypeChoice, 2000, 2.5, 2, start)...)
	rows = append(rows, syntheticRows("nimble", "billing", "refund_requested", contract.TypeNoul, 300, 0.6, 2, start)...)
	rows = append(rows, syntheticRows("nimble", "billing", "urgency", contract.TypeScore, 30, 1, 2, start)...)
	rows = append(rows, syntheticRows("nimble", "billing", "label_v1", contract.TypeChoice, 20, 1, 3, start)...) // renamed to label
	rows = append(rows, syntheticRows("gemma", "billing", "label", contract.TypeChoice, 200, 1, 4, start)...)
	rows = append(rows, syntheticRows("nimble", "billing", "label", contract.TypeChoice, 100, 5, 5, now.Add(-60*24*time.Hour))...) // outside 30d
	for i := range 60 {
		rows = append(rows, labelRowIn{runID: fmt.Sprintf("flag-%d", i), caller: "ops", model: "nimble", question: "flag", typ: contract.TypeNoul,
			labelledAt: start.Add(time.Duration(i) * time.Minute), label: "true", keys: []string{"false", "true"}, values: []float64{0.3, 0.7}})
	}
	// Always right, never more than 60% sure: the fit runs into the lower bound of T.
	for i := range 60 {
		r := labelRowIn{runID: fmt.Sprintf("sure-%d", i), caller: "billing", model: "nimble", question: "sure", typ: contract.TypeNoul,
			labelledAt: start.Add(time.Duration(i) * time.Minute), label: "true", keys: []string{"false", "true"}, values: []float64{0.4, 0.6}}
		if i%3 == 0 {
			r.label, r.values = "false", []float64{0.6, 0.4}
		}
		rows = append(rows, r)
	}
	bad := func(id string, keys []string, values []float64, label string) labelRowIn {
		return labelRowIn{runID: id, caller: "billing", model: "nimble", question: "label", typ: contract.TypeChoice, labelledAt: start.Add(time.Hour), label: label, keys: keys, values: values}
	}
	rows = append(rows,
		bad("nan-1", []string{"billing", "bug"}, []float64{math.NaN(), 0.5}, "bug"),
		bad("nan-2", []string{"billing", "bug"}, []float64{0.5, math.NaN()}, "bug"),
		bad("nan-3", []string{"billing", "bug"}, []float64{math.Inf(1), 0}, "bug"),
		bad("missing-1", nil, nil, "bug"),
		bad("missing-2", nil, nil, "bug"),
		bad("not-an-option", []string{"billing", "bug"}, []float64{0.5, 0.5}, "refund"),
	)
	// A run labelled twice: the older label is superseded (the view should hide it; if it
	// does not, the command still counts each run once).
	again := syntheticRows("nimble", "billing", "label", contract.TypeChoice, 1, 2.5, 2, start.Add(-time.Hour))[0]
	rows = append(rows, again)
	insertLabels(t, db, rows)
	return db
}

func calibrate(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), append([]string{"calibrate"}, args...), &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

func TestCalibrateCommand(t *testing.T) {
	now := time.Now().UTC()
	db := labelsDB(t, now)
	srv := natstest.Start(t)
	_, js := natstest.Connect(t, srv)
	t.Setenv("SYS1_CLICKHOUSE_DSN", db.DSN)
	t.Setenv("SYS1_CLICKHOUSE_DATABASE", db.Name)
	t.Setenv("SYS1_NATS_URL", srv.ClientURL())
	plots := t.TempDir()

	// The default is a dry run: a report, nothing stored.
	code, out, errOut := calibrate(t, "--since", "30d", "--json", "--thresholds", "0.7,0.5")
	if code != exitOK {
		t.Fatalf("dry run: exit %d\n%s", code, errOut)
	}
	var rep calibrateReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("--json: %v\n%s", err, out)
	}
	if !rep.DryRun || rep.Database != db.Name || rep.Bucket != "sys1-calibration" {
		t.Errorf("report header: %+v", rep)
	}
	if _, err := js.KeyValue(context.Background(), "sys1-calibration"); err == nil {
		t.Error("a dry run created the bucket")
	}
	fits := map[string]fitReport{}
	for _, f := range rep.Fits {
		fits[f.Key] = f
	}
	label, refund, gemma, sure := fits["nimble.billing.label"], fits["nimble.billing.refund_requested"], fits["gemma.billing.label"], fits["nimble.billing.sure"]
	if len(rep.Fits) != 4 || label.Fit == nil || refund.Fit == nil || gemma.Fit == nil || sure.Fit == nil {
		t.Fatalf("fits: %s", out)
	}
	// 2,000 + 1 superseded synthetic rows + 6 unusable ones, none outside the window.
	if label.Fit.N != 2000 || math.Abs(label.Fit.Temperature-2.5)/2.5 > 0.05 || label.Fit.After.ECE >= 0.02 || label.Fit.Type != contract.TypeChoice {
		t.Errorf("label fit: n %d T %.4f ECE after %.4f", label.Fit.N, label.Fit.Temperature, label.Fit.After.ECE)
	}
	wantSkipped := map[string]int{
		string(calibration.SkipBadProbability): 3, string(calibration.SkipNoProbabilities): 2,
		string(calibration.SkipUnknownLabel): 1, string(calibration.SkipSuperseded): 1,
	}
	for r, n := range wantSkipped {
		if label.Fit.Skipped[r] != n || rep.Skipped[r] != n {
			t.Errorf("skipped %q: fit %d, report %d, want %d", r, label.Fit.Skipped[r], rep.Skipped[r], n)
		}
	}
	if math.Abs(refund.Fit.Temperature-0.6)/0.6 > 0.1 || refund.Fit.Type != contract.TypeNoul || refund.Fit.N != 300 {
		t.Errorf("refund fit: %+v", refund.Fit)
	}
	// A fit on a bound is reported, and would not be stored.
	if sure.Fit.Converged || sure.Fit.Temperature != calibration.MinTemperature || !strings.Contains(sure.NotStore, "did not converge: T stopped at the lower bound") {
		t.Errorf("fit on a bound: %+v", sure)
	}
	// The thresholds come back sorted, on confidence by default.
	if c := label.Fit.After.Coverage; len(c) != 2 || c[0].Threshold != 0.5 || c[1].Threshold != 0.7 || label.Fit.ThresholdOn != calibration.OnConfidence {
		t.Errorf("coverage: %+v", c)
	}
	// Window: the query's bounds and the labels seen.
	if w := label.Fit.Window; w.Until.Sub(now).Abs() > time.Second || w.Until.Sub(w.Since) != 30*24*time.Hour || w.FirstLabel.Before(w.Since) || w.LastLabel.After(w.Until) {
		t.Errorf("window: %+v", w)
	}
	// The same labels fitted in-process give the same T: nothing was lost or bent on the way.
	var samples []calibration.Sample
	for _, a := range synthetic.Generate(contract.TypeChoice, 2000, 2.5, 2) {
		samples = append(samples, calibration.Sample{Probs: a.Reported, Label: a.Label})
	}
	direct, _ := calibration.FitTemperature(samples)
	if math.Abs(direct.T-label.Fit.Temperature) > 1e-6*direct.T {
		t.Errorf("T through ClickHouse %.9f, in process %.9f", label.Fit.Temperature, direct.T)
	}

	noFit := map[string]noFitReport{}
	for _, n := range rep.NoFit {
		noFit[n.Question] = n
	}
	for q, want := range map[string]string{
		"urgency":  "30 usable labels, at least 50 needed",
		"label_v1": "20 usable labels, at least 50 needed", // the renamed question is its own, small group
		"flag":     `all 60 labels are "true"`,
	} {
		if !strings.Contains(noFit[q].Message, want) {
			t.Errorf("no fit for %s: %+v, want %q", q, noFit[q], want)
		}
	}
	// The table says the same, readably, and --plot-dir draws the fit's reliability diagram.
	code, out, _ = calibrate(t, "--model", "nimble", "--caller", "billing", "--question", "label", "--thresholds", "0.5", "--plot-dir", plots)
	plot := filepath.Join(plots, "nimble.billing.label.png")
	if file, err := os.Open(plot); err != nil {
		t.Errorf("no plot: %v", err)
	} else {
		if _, err := png.Decode(file); err != nil {
			t.Errorf("plot: %v", err)
		}
		file.Close()
	}
	for _, want := range []string{"plot: " + plot, "nimble · caller billing · question label (choice)   key nimble.billing.label", "n 2000 · T 2.4", "ECE (15 bins)", "coverage, confidence ≥ 0.50", "accuracy of those decided", "would store under nimble.billing.label", "3 probability NaN, infinite or outside [0, 1]", "dry run"} {
		if code != exitOK || !strings.Contains(out, want) {
			t.Errorf("table lacks %q (exit %d):\n%s", want, code, out)
		}
	}

	// --apply stores the fits; each value is the fit, under its key.
	code, out, errOut = calibrate(t, "--apply", "--json")
	if code != exitOK {
		t.Fatalf("--apply: exit %d: %s", code, errOut)
	}
	rep = calibrateReport{}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(context.Background(), "sys1-calibration")
	if err != nil {
		t.Fatalf("--apply did not create the bucket: %v", err)
	}
	for _, f := range rep.Fits {
		if f.Key == "nimble.billing.sure" {
			if f.Stored {
				t.Error("a fit that did not converge was stored")
			}
			continue
		}
		e, err := kv.Get(context.Background(), f.Key)
		if err != nil {
			t.Fatalf("%s not stored: %v", f.Key, err)
		}
		got, err := calibration.Decode(e.Key(), e.Value())
		if err != nil {
			t.Fatal(err)
		}
		if !f.Stored || f.Revision != e.Revision() || got.Temperature != f.Fit.Temperature || got.N != f.Fit.N || !got.FittedAt.Equal(f.Fit.FittedAt) || got.Window != f.Fit.Window || got.Before.ECE != f.Fit.Before.ECE {
			t.Errorf("%s stored %+v, reported %+v", f.Key, got, f)
		}
	}

	// --list shows them; --delete removes by key and by filter.
	code, out, _ = calibrate(t, "--list")
	if code != exitOK || !strings.Contains(out, "nimble.billing.label") || !strings.Contains(out, "gemma.billing.label") || strings.Count(out, "\n") != 4 {
		t.Errorf("--list (exit %d):\n%s", code, out)
	}
	if code, out, errOut = calibrate(t, "--delete", "nimble.billing.refund_requested"); code != exitOK || !strings.Contains(out, "deleted nimble.billing.refund_requested") {
		t.Errorf("--delete KEY: exit %d %s %s", code, out, errOut)
	}
	if code, _, errOut = calibrate(t, "--apply", "--question", "sure"); code != exitFailed || !strings.Contains(errOut, "no fit stored (none converged") {
		t.Errorf("--apply of only an unconverged fit: exit %d %s", code, errOut)
	}
	if code, out, errOut = calibrate(t, "--delete", "--model", "gemma"); code != exitOK || !strings.Contains(out, "deleted gemma.billing.label") {
		t.Errorf("--delete --model: exit %d %s %s", code, out, errOut)
	}
	code, out, _ = calibrate(t, "--list", "--json")
	var listed []struct {
		Key string           `json:"key"`
		Fit *calibration.Fit `json:"fit"`
	}
	if err := json.Unmarshal([]byte(out), &listed); err != nil || code != exitOK || len(listed) != 1 || listed[0].Key != "nimble.billing.label" {
		t.Errorf("--list --json after deletes: %v %s", err, out)
	}
	if code, _, errOut = calibrate(t, "--delete", "nimble.billing.refund_requested"); code != exitFailed || !strings.Contains(errOut, "no fit under") {
		t.Errorf("deleting a missing fit: exit %d %s", code, errOut)
	}
	// A corrupt value in the bucket is listed as unusable, not a crash.
	if _, err := kv.Put(context.Background(), "nimble.billing.broken", []byte("{")); err != nil {
		t.Fatal(err)
	}
	if code, out, _ = calibrate(t, "--list"); code != exitOK || !strings.Contains(out, "nimble.billing.broken  (unusable: value is not a fit") {
		t.Errorf("--list with a corrupt value (exit %d):\n%s", code, out)
	}
}

func TestCalibrateCommandNothingToFit(t *testing.T) {
	now := time.Now().UTC()
	db := labelsDB(t, now)
	t.Setenv("SYS1_CLICKHOUSE_DSN", db.DSN)
	t.Setenv("SYS1_CLICKHOUSE_DATABASE", db.Name)

	code, out, errOut := calibrate(t, "--since", "2020-01-01", "--until", "2020-02-01")
	if code != exitFailed || !strings.Contains(errOut, "no labelled answers in "+db.Name+".labelled_answers labelled in [2020-01-01T00:00:00Z, 2020-02-01T00:00:00Z): nothing to fit") {
		t.Errorf("empty window: exit %d\n%s\n%s", code, out, errOut)
	}
	code, _, errOut = calibrate(t, "--model", "nobody")
	if code != exitFailed || !strings.Contains(errOut, `for model "nobody"`) {
		t.Errorf("no matching model: exit %d %s", code, errOut)
	}
	code, out, errOut = calibrate(t, "--question", "urgency")
	if code != exitFailed || !strings.Contains(out, "30 usable labels, at least 50 needed (--min-labels)") || !strings.Contains(errOut, "no fit made") {
		t.Errorf("too few labels: exit %d\n%s\n%s", code, out, errOut)
	}
	if code, out, _ = calibrate(t, "--question", "urgency", "--min-labels", "20"); code != exitOK || !strings.Contains(out, "n 30 ") {
		t.Errorf("--min-labels 20: exit %d\n%s", code, out)
	}

	// Without the view: says what to do.
	t.Setenv("SYS1_CLICKHOUSE_DATABASE", "sys1_test_no_such_db")
	if code, _, errOut = calibrate(t); code != exitFailed || !strings.Contains(errOut, "labelled_answers does not exist: run 'sys1 migrate'") {
		t.Errorf("no view: exit %d %s", code, errOut)
	}
}

func TestCalibrateCommandUsage(t *testing.T) {
	t.Setenv("SYS1_CLICKHOUSE_DSN", "")
	code, _, errOut := calibrate(t, "--since", "yesterday", "--thresholds", "0.5,2", "--threshold-on", "vibes", "--min-labels", "1")
	for _, want := range []string{"SYS1_CLICKHOUSE_DSN is not set", "--since: \"yesterday\" is not a duration", "--thresholds: threshold 2 is not in [0, 1]", "--threshold-on: \"vibes\"", "--min-labels: must be at least 2"} {
		if code != exitUsage || !strings.Contains(errOut, want) {
			t.Errorf("exit %d, stderr lacks %q:\n%s", code, want, errOut)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--apply", "--dry-run"}, "contradict"},
		{[]string{"--list", "--apply"}, "separate modes"},
		{[]string{"extra"}, "unexpected arguments"},
		{[]string{"--delete"}, "--delete needs KEYs"},
		{[]string{"--delete", "a.b.c", "--model", "m"}, "not both"},
		{[]string{"--delete", "not a key"}, "want model.caller.question"},
		{[]string{"--since", "1d", "--until", "2d"}, "is not before --until"},
	} {
		if code, _, errOut := calibrate(t, tc.args...); code != exitUsage || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, want 2 and %q:\n%s", tc.args, code, tc.want, errOut)
		}
	}
}

func TestCalibrateParseWindowTime(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	for in, want := range map[string]time.Time{
		"30d":                  now.Add(-30 * 24 * time.Hour),
		"1d12h":                now.Add(-36 * time.Hour),
		"90m":                  now.Add(-90 * time.Minute),
		"0d":                   now,
		"now":                  now,
		"2026-11-01":           time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC),
		"2026-11-01T10:00:00Z": time.Date(2026, 11, 1, 10, 0, 0, 0, time.UTC),
	} {
		got, err := parseWindowTime(in, now)
		if err != nil || !got.Equal(want) {
			t.Errorf("parseWindowTime(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "d", "30", "-5h", "30days", "1d-2h", "99999999999999999999d"} {
		if _, err := parseWindowTime(bad, now); err == nil {
			t.Errorf("parseWindowTime(%q) accepted", bad)
		}
	}
}

// Once as a built binary, as an operator runs it: `sys1 calibrate --apply` stores the fit.
func TestCalibrateBinary(t *testing.T) {
	now := time.Now().UTC()
	db := labelsDB(t, now)
	srv := natstest.Start(t)
	_, js := natstest.Connect(t, srv)
	bin := sys1Binary(t)
	cmd := exec.Command(bin, "calibrate", "--apply", "--question", "refund_requested")
	cmd.Env = append(os.Environ(), "SYS1_CLICKHOUSE_DSN="+db.DSN, "SYS1_CLICKHOUSE_DATABASE="+db.Name, "SYS1_NATS_URL="+srv.ClientURL())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("sys1 calibrate --apply: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "stored: sys1-calibration revision 1") {
		t.Errorf("output:\n%s", out)
	}
	kv, err := js.KeyValue(context.Background(), topology.Default().CalibrationBucket)
	if err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(context.Background(), calibration.Key("nimble", "billing", "refund_requested"))
	if err != nil {
		t.Fatal(err)
	}
	f, err := calibration.Decode(e.Key(), e.Value())
	if err != nil || f.Type != contract.TypeNoul || math.Abs(f.Temperature-0.6)/0.6 > 0.1 || f.N != 300 {
		t.Errorf("stored fit: %+v, %v", f, err)
	}
	if _, err := kv.Get(context.Background(), calibration.Key("nimble", "billing", "label")); err != jetstream.ErrKeyNotFound {
		t.Errorf("--question refund_requested stored another question too: %v", err)
	}
}
