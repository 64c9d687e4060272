package sink

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// The analysts' side of the labels: the queries that read what the sink wrote. sys1 calibrate
// fits temperatures and risk thresholds from the view labelled_answers (each label beside the
// answer it judges) and reports coverage from the runs table; the queries live here, beside
// the schema they read (sink/migrate), so a change to one is a change to the other.

// LabelledQuery chooses the labelled answers to read: those labelled in [Since, Until), of
// one model, caller or question when set.
type LabelledQuery struct {
	Database                string
	Since, Until            time.Time
	Model, Caller, Question string
	// Risk also reads what a risk fit weighs labels by: Source, Verdict, AuditShare, Correct.
	Risk bool
}

// LabelledAnswer is one row of labelled_answers, as far as fits read it.
type LabelledAnswer struct {
	RunID, Caller, Model, Question, Type string
	LabelledAt                           time.Time
	Label                                string
	Confidence                           *float64
	ProbKeys                             []string
	ProbValues                           []float64
	// With LabelledQuery.Risk only.
	Source, Verdict string
	AuditShare      float64
	Correct         uint8
}

// Errors of ReadLabelledAnswers that an operator fixes by migrating.
var (
	// ErrNoLabelsSchema: the database has no labelled_answers (the labels schema, issue 12).
	ErrNoLabelsSchema = errors.New("no labels schema")
	// ErrNoRiskColumns: labelled_answers predates the columns risk fits read (audit_share,
	// schema version 5).
	ErrNoRiskColumns = errors.New("no risk columns")
)

// timeArg is how the window's bounds go to ClickHouse: as millisecond text, since a time.Time
// argument is sent in whole seconds, which would drop every label of the last second before
// Until.
const timeArg = "2006-01-02 15:04:05.000"

// ReadLabelledAnswers calls each for every row of the window, ordered by model, caller,
// question, labelled_at and run id (so a caller can group as it goes). An error from each
// stops the read and is returned.
func ReadLabelledAnswers(ctx context.Context, conn driver.Conn, q LabelledQuery, each func(LabelledAnswer) error) error {
	cols := "run_id, caller, model, question, type, labelled_at, label, confidence, prob_keys, prob_values"
	if q.Risk {
		cols += ", source, verdict, audit_share, correct"
	}
	sql := "SELECT " + cols + " FROM `" + q.Database + "`.labelled_answers" +
		" WHERE labelled_at >= toDateTime64(?, 3, 'UTC') AND labelled_at < toDateTime64(?, 3, 'UTC')"
	args := []any{q.Since.UTC().Format(timeArg), q.Until.UTC().Format(timeArg)}
	for _, c := range []struct{ col, v string }{{"model", q.Model}, {"caller", q.Caller}, {"question", q.Question}} {
		if c.v != "" {
			sql += " AND " + c.col + " = ?"
			args = append(args, c.v)
		}
	}
	sql += " ORDER BY model, caller, question, labelled_at, run_id"
	res, err := conn.Query(ctx, sql, args...)
	if err != nil {
		// UNKNOWN_TABLE (60), UNKNOWN_DATABASE (81): the labels schema is not there yet;
		// UNKNOWN_IDENTIFIER (47): a view from before audit_share (migration 0005).
		if ex, ok := errors.AsType[*clickhouse.Exception](err); ok && (ex.Code == 60 || ex.Code == 81) {
			return fmt.Errorf("%s.labelled_answers: %w: %w", q.Database, ErrNoLabelsSchema, err)
		}
		if ex, ok := errors.AsType[*clickhouse.Exception](err); ok && ex.Code == 47 && q.Risk {
			return fmt.Errorf("%s.labelled_answers: %w: %w", q.Database, ErrNoRiskColumns, err)
		}
		return fmt.Errorf("read %s.labelled_answers: %w", q.Database, err)
	}
	defer res.Close()
	for res.Next() {
		var r LabelledAnswer
		dest := []any{&r.RunID, &r.Caller, &r.Model, &r.Question, &r.Type, &r.LabelledAt, &r.Label, &r.Confidence, &r.ProbKeys, &r.ProbValues}
		if q.Risk {
			dest = append(dest, &r.Source, &r.Verdict, &r.AuditShare, &r.Correct)
		}
		if err := res.Scan(dest...); err != nil {
			return fmt.Errorf("read %s.labelled_answers: %w", q.Database, err)
		}
		if err := each(r); err != nil {
			return err
		}
	}
	if err := res.Err(); err != nil {
		return fmt.Errorf("read %s.labelled_answers: %w", q.Database, err)
	}
	return nil
}

// VerdictCount is one question's judged answers in the run records of a window.
type VerdictCount struct {
	Model, Caller, Question string
	Decided, Abstained      int64 // abstained includes reviewed
}

// ReadVerdictCounts reads, from the run records finished in [Since, Until) (and of the
// query's model, caller or question when set), each question's decided and abstained (or
// reviewed) answers. ErrNoRunsSchema when the runs table does not exist.
func ReadVerdictCounts(ctx context.Context, conn driver.Conn, q LabelledQuery) ([]VerdictCount, error) {
	sql := "SELECT CAST(model AS String), CAST(caller AS String), CAST(answers.name AS String) AS question," +
		" countIf(answers.verdict = 'decided'), countIf(answers.verdict IN ('abstained', 'reviewed'))" +
		" FROM `" + q.Database + "`.runs FINAL ARRAY JOIN answers" +
		" WHERE finished_at >= toDateTime64(?, 3, 'UTC') AND finished_at < toDateTime64(?, 3, 'UTC')"
	args := []any{q.Since.UTC().Format(timeArg), q.Until.UTC().Format(timeArg)}
	for _, c := range []struct{ col, v string }{{"model", q.Model}, {"caller", q.Caller}, {"answers.name", q.Question}} {
		if c.v != "" {
			sql += " AND " + c.col + " = ?"
			args = append(args, c.v)
		}
	}
	sql += " GROUP BY 1, 2, 3"
	rows, err := conn.Query(ctx, sql, args...)
	if err != nil {
		if ex, ok := errors.AsType[*clickhouse.Exception](err); ok && (ex.Code == 60 || ex.Code == 81) {
			return nil, fmt.Errorf("%s.runs: %w: %w", q.Database, ErrNoRunsSchema, err)
		}
		return nil, fmt.Errorf("read %s.runs: %w", q.Database, err)
	}
	defer rows.Close()
	var out []VerdictCount
	for rows.Next() {
		var c VerdictCount
		var decided, abstained uint64
		if err := rows.Scan(&c.Model, &c.Caller, &c.Question, &decided, &abstained); err != nil {
			return nil, fmt.Errorf("read %s.runs: %w", q.Database, err)
		}
		c.Decided, c.Abstained = int64(decided), int64(abstained)
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read %s.runs: %w", q.Database, err)
	}
	return out, nil
}

// ErrNoRunsSchema: the database has no runs table.
var ErrNoRunsSchema = errors.New("no runs schema")
