package sink

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/sys1hq/sys1/contract"
)

// viewRecord is a successful run with one answer of each type, distributions chosen so that
// the view's derived columns are known exactly: the score's probabilities arrive out of level
// order on purpose.
func viewRecord(runID, caller string, finished time.Time) contract.RunRecord {
	conf := 0.6
	return contract.RunRecord{
		SchemaVersion: contract.RecordSchemaVersion, RunID: runID, Caller: caller, CallerKind: contract.CallerKindSubject,
		Subject: "sys1.decide." + caller, PublishedAt: finished.Add(-time.Second), StartedAt: finished.Add(-time.Second), FinishedAt: finished,
		Status: contract.StatusSuccess, Provider: "ollama", Model: "nimble",
		Result: &contract.Result{Provider: "ollama", Model: "nimble", Answers: []contract.Answer{
			{Name: "label", Type: contract.TypeChoice, Choice: "spam", Confidence: &conf,
				Probabilities: []contract.Probability{{Key: "spam", P: 0.8}, {Key: "ham", P: 0.2}}},
			{Name: "urgent", Type: contract.TypeNoul, Noul: 0.3},
			{Name: "severity", Type: contract.TypeScore, Score: 1.3, Confidence: &conf,
				Probabilities: []contract.Probability{{Key: "2", P: 0.5}, {Key: "0", P: 0.2}, {Key: "1", P: 0.3}}},
		}},
		Verdicts: contract.Verdicts{
			{Question: "label", Status: contract.VerdictAbstained, Rule: "labels", Reason: "confidence 0.60 < 0.70"},
			{Question: "urgent", Status: contract.VerdictDecided, Rule: "urgency", AuditShare: 0.02},
			{Question: "severity", Status: contract.VerdictDecided},
		},
	}
}

// TestLabelledAnswersView: one row per labelled question with the latest label, the columns
// `sys1 calibrate` reads, of the types it reads them as, and their values derived as
// documented.
func TestLabelledAnswersView(t *testing.T) {
	e := newEnv(t, nil)
	finished := time.Now().UTC().Add(-time.Hour).Truncate(time.Millisecond)
	e.publish(t, []contract.RunRecord{viewRecord("va-1", "billing", finished), viewRecord("va-2", "billing", finished)})
	labelled := time.Now().UTC().Truncate(time.Millisecond)
	mk := func(run, q, v, reviewer string) contract.Label {
		return contract.Label{RunID: run, Question: q, Value: json.RawMessage(v), Reviewer: reviewer, LabelledAt: labelled,
			Source: contract.LabelSourceReview, Caller: "billing", Item: contract.ReviewItemID(run, q)}
	}
	e.publishLabels(t, []contract.Label{
		mk("va-1", "label", `"ham"`, "ana"), mk("va-1", "urgent", `false`, "ana"), mk("va-1", "severity", `2`, "ana"),
		mk("va-2", "label", `"spam"`, "ben"),
		mk("unknown-run", "label", `"spam"`, "ben"), // no such run: not in the view
	})
	// A later relabel of va-1's severity: the view shows it, not the first.
	e.publishLabels(t, []contract.Label{mk("va-1", "severity", `1`, "carla")})
	s := e.startSink(t, e.cfg, nil)
	waitFor(t, time.Minute, "runs and labels stored", func() bool {
		st := s.Stats()
		return st.Inserted == 2 && st.Labels.Inserted == 6 && e.consumerDrained(t) && e.labelsDrained(t)
	})
	s.stop(t)

	// The columns and types `sys1 calibrate` depends on (BRIEF: exactly these).
	want := map[string]string{
		"run_id": "String", "caller": "String", "provider": "String", "model": "String",
		"question": "String", "type": "String", "finished_at": "DateTime64(3, 'UTC')",
		"labelled_at": "DateTime64(3, 'UTC')", "predicted": "String", "label": "String", "correct": "UInt8",
		"confidence": "Nullable(Float64)", "label_probability": "Float64", "prob_keys": "Array(String)",
		"prob_values": "Array(Float64)", "reviewer": "String", "source": "String",
		"verdict": "String", "audit_share": "Float64",
	}
	ctx := context.Background()
	rows, err := e.db.Conn.Query(ctx, "SELECT name, type FROM system.columns WHERE database = ? AND table = 'labelled_answers'", e.db.Name)
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]string{}
	for rows.Next() {
		var name, typ string
		if err := rows.Scan(&name, &typ); err != nil {
			t.Fatal(err)
		}
		have[name] = typ
	}
	rows.Close()
	for name, typ := range want {
		if got := have[name]; got != typ {
			t.Errorf("labelled_answers.%s is %q, want %s", name, got, typ)
		}
	}

	type answerRow struct {
		run, question, typ, predicted, label, reviewer, source string
		verdict                                                string
		auditShare                                             float64
		correct                                                uint8
		confidence                                             *float64
		labelProb                                              float64
		keys                                                   []string
		values                                                 []float64
		labelledAt, finishedAt                                 time.Time
	}
	rows, err = e.db.Conn.Query(ctx, "SELECT run_id, question, type, predicted, label, reviewer, source, correct, confidence, label_probability, prob_keys, prob_values, labelled_at, finished_at, verdict, audit_share FROM `"+e.db.Name+"`.labelled_answers ORDER BY run_id, question")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var got []answerRow
	for rows.Next() {
		var r answerRow
		if err := rows.Scan(&r.run, &r.question, &r.typ, &r.predicted, &r.label, &r.reviewer, &r.source, &r.correct, &r.confidence, &r.labelProb, &r.keys, &r.values, &r.labelledAt, &r.finishedAt, &r.verdict, &r.auditShare); err != nil {
			t.Fatal(err)
		}
		got = append(got, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	summary := func(r answerRow) string {
		conf := "null"
		if r.confidence != nil {
			conf = fmt.Sprint(*r.confidence)
		}
		return fmt.Sprintf("%s/%s %s predicted=%s label=%s correct=%d p=%.2f conf=%s keys=%v values=%v by %s (%s) %s share %g",
			r.run, r.question, r.typ, r.predicted, r.label, r.correct, r.labelProb, conf, r.keys, r.values, r.reviewer, r.source, r.verdict, r.auditShare)
	}
	wantRows := []string{
		"va-1/label choice predicted=spam label=ham correct=0 p=0.20 conf=0.6 keys=[spam ham] values=[0.8 0.2] by ana (review) abstained share 0",
		"va-1/severity score predicted=2 label=1 correct=0 p=0.30 conf=0.6 keys=[0 1 2] values=[0.2 0.3 0.5] by carla (review) decided share 0",
		"va-1/urgent noul predicted=false label=false correct=1 p=0.70 conf=null keys=[false true] values=[0.7 0.3] by ana (review) decided share 0.02",
		"va-2/label choice predicted=spam label=spam correct=1 p=0.80 conf=0.6 keys=[spam ham] values=[0.8 0.2] by ben (review) abstained share 0",
	}
	if len(got) != len(wantRows) {
		var all []string
		for _, r := range got {
			all = append(all, summary(r))
		}
		t.Fatalf("labelled_answers rows:\n%s\nwant:\n%s", strings.Join(all, "\n"), strings.Join(wantRows, "\n"))
	}
	for i, r := range got {
		if s := summary(r); s != wantRows[i] {
			t.Errorf("row %d:\n got %s\nwant %s", i, s, wantRows[i])
		}
		if !r.labelledAt.Equal(labelled) || !r.finishedAt.Equal(finished) {
			t.Errorf("row %d: labelled_at %v finished_at %v", i, r.labelledAt, r.finishedAt)
		}
	}
}

// TestSpendAndBatchViews: spend sums only what was priced, stays NULL (never $0) when nothing
// was, and counts a cache hit as the real $0 it is; batch views count outcomes by status and
// error code per batch.
func TestSpendAndBatchViews(t *testing.T) {
	e := newEnv(t, nil)
	day := time.Now().UTC().Add(-time.Hour).Truncate(time.Millisecond)
	// The records' own day, not today(): an hour ago is yesterday just after midnight UTC.
	recordDay := day.Format(time.DateOnly)
	cost := func(v float64) *float64 { return &v }
	var recs []contract.RunRecord
	add := func(id, caller, model string, c *float64, cacheHit bool, batch string, code contract.Code) {
		r := viewRecord(id, caller, day)
		r.Model, r.Result.Model, r.CostUSD, r.CacheHit = model, model, c, cacheHit
		if batch != "" {
			r.BatchID, r.ItemID, r.RunID = batch, id, batch+":"+id
		}
		if code != "" {
			r.Status, r.Result, r.Verdicts, r.ErrorCode, r.ErrorStatus, r.ErrorMessage = contract.StatusFailed, nil, nil, code, code.Status(), "["+string(code)+"] x"
		}
		recs = append(recs, r)
	}
	add("p1", "priced", "nimble", cost(0.1), false, "", "")
	add("p2", "priced", "nimble", cost(0.2), false, "", "")
	add("p3", "priced", "deep", nil, false, "", "")
	add("u1", "unpriced", "deep", nil, false, "", "")
	add("c1", "cached", "nimble", cost(0), true, "", "")
	add("1", "batcher", "nimble", cost(0.1), false, "b1", "")
	add("2", "batcher", "nimble", cost(0.1), false, "b1", "")
	add("3", "batcher", "nimble", nil, false, "b1", contract.CodeTimeout)
	add("4", "batcher", "nimble", nil, false, "b1", contract.CodeBudgetExceeded)
	add("5", "batcher", "nimble", nil, false, "b1", contract.CodeTimeout)
	e.publish(t, recs)
	s := e.startSink(t, e.cfg, nil)
	waitFor(t, time.Minute, "the runs stored", func() bool { return s.Stats().Inserted == uint64(len(recs)) && e.consumerDrained(t) })
	s.stop(t)
	ctx := context.Background()
	spend := func(query string, args ...any) (runs, priced, unpriced, cache uint64, usd *float64) {
		t.Helper()
		if err := e.db.Conn.QueryRow(ctx, strings.ReplaceAll(query, "%s", "`"+e.db.Name+"`"), args...).Scan(&runs, &priced, &unpriced, &cache, &usd); err != nil {
			t.Fatal(err)
		}
		return
	}
	for _, c := range []struct {
		caller                        string
		runs, priced, unpriced, cache uint64
		usd                           *float64
	}{
		{"priced", 3, 2, 1, 0, cost(0.3)},
		{"unpriced", 1, 0, 1, 0, nil}, // NULL, never $0
		{"cached", 1, 1, 0, 1, cost(0)},
	} {
		runs, priced, unpriced, cache, usd := spend("SELECT runs, priced_runs, unpriced_runs, cache_hits, spend_usd FROM %s.spend_by_caller_day WHERE caller = ? AND day = toDate(?)", c.caller, recordDay)
		if runs != c.runs || priced != c.priced || unpriced != c.unpriced || cache != c.cache || (usd == nil) != (c.usd == nil) || usd != nil && math.Abs(*usd-*c.usd) > 1e-9 {
			t.Errorf("spend of %s: runs %d priced %d unpriced %d cache %d usd %v; want %+v", c.caller, runs, priced, unpriced, cache, usd, c)
		}
	}
	if runs, _, unpriced, _, usd := spend("SELECT runs, priced_runs, unpriced_runs, cache_hits, spend_usd FROM %s.spend_by_model_day WHERE model = 'deep' AND day = toDate(?)", recordDay); runs != 2 || unpriced != 2 || usd != nil {
		t.Errorf("deep (unpriced) spend: runs %d unpriced %d usd %v, want NULL", runs, unpriced, usd)
	}
	if _, _, _, _, usd := spend("SELECT runs, priced_runs, unpriced_runs, cache_hits, spend_usd FROM %s.spend_by_model_day WHERE model = 'nimble' AND day = toDate(?)", recordDay); usd == nil || math.Abs(*usd-0.5) > 1e-9 {
		t.Errorf("nimble spend %v, want 0.5", usd)
	}

	var runs, succeeded, failed, abstaining uint64
	var byCode map[string]uint64
	q := "SELECT runs, succeeded, failed, failed_by_code, runs_with_abstentions FROM `" + e.db.Name + "`.batch_progress WHERE batch_id = 'b1'"
	if err := e.db.Conn.QueryRow(ctx, q).Scan(&runs, &succeeded, &failed, &byCode, &abstaining); err != nil {
		t.Fatal(err)
	}
	if runs != 5 || succeeded != 2 || failed != 3 || byCode["SYS1_TIMEOUT"] != 2 || byCode["SYS1_BUDGET_EXCEEDED"] != 1 || len(byCode) != 2 || abstaining != 2 {
		t.Errorf("batch_progress b1: runs %d succeeded %d failed %d by code %v abstaining %d", runs, succeeded, failed, byCode, abstaining)
	}
	if n := e.count(t, "SELECT count() FROM %s.batch_progress WHERE batch_id = ''"); n != 0 {
		t.Errorf("interactive runs counted as a batch: %d", n)
	}
	if n := e.count(t, "SELECT runs FROM %s.batch_outcomes WHERE batch_id = 'b1' AND status = 'failed' AND error_code = 'SYS1_TIMEOUT'"); n != 2 {
		t.Errorf("batch_outcomes timeouts = %d, want 2", n)
	}
}
