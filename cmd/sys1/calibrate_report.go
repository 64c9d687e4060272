package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/sink"
	"github.com/sys1hq/sys1/worker/calibration"
	"github.com/sys1hq/sys1/worker/calibration/risk"
	"github.com/sys1hq/sys1/worker/topology"
)

// Drift limits of the report (and of deploy/prometheus/rules/risk.yml): ECE on the newest
// labels more than driftECE above the fit's, over at least driftMinLabels labels. Below that
// many, a 15-bin ECE is mostly noise.
const (
	driftECE       = 0.03
	driftMinLabels = 100
)

// reportEntry is one question's figures in the report.
type reportEntry struct {
	Key      string                `json:"key"`
	Model    string                `json:"model"`
	Caller   string                `json:"caller"`
	Question string                `json:"question"`
	Type     contract.QuestionType `json:"type,omitempty"`
	// Fit is the stored fit the figures are compared with (nil: none stored).
	Fit *reportFit `json:"fit,omitempty"`
	// Labels is the number of usable labels in the window; Audits the audit samples among
	// them, and DecidedError the decided answers' error estimated from those alone.
	Labels       int            `json:"labels"`
	Audits       int            `json:"audits"`
	DecidedError *risk.Interval `json:"decided_error,omitempty"`
	// ErrorStatus compares DecidedError with the fit's target: ok, above (the estimate is
	// above, the interval holds the target), ABOVE (the whole interval is above), or "" when
	// either is missing.
	ErrorStatus string `json:"error_status,omitempty"`
	// From the run records: the window's answers by verdict.
	Decided        int64    `json:"decided"`
	Abstained      int64    `json:"abstained"`
	Coverage       *float64 `json:"coverage,omitempty"`
	AbstentionRate *float64 `json:"abstention_rate,omitempty"`
	// ECE of the labels newer than the fit's last label (the fit applied), and the fit's own.
	RecentLabels int      `json:"recent_labels"`
	RecentECE    *float64 `json:"recent_ece,omitempty"`
	FitECE       *float64 `json:"fit_ece,omitempty"`
	Drift        bool     `json:"drift"`
	// --apply: whether the figures were stored in the fit.
	Stored    bool   `json:"stored"`
	Revision  uint64 `json:"revision,omitempty"`
	NotStored string `json:"not_stored,omitempty"`
}

// reportFit is what the report says about a stored fit.
type reportFit struct {
	Revision    uint64    `json:"revision"`
	FittedAt    time.Time `json:"fitted_at"`
	Temperature float64   `json:"temperature"`
	Applied     bool      `json:"temperature_applied"`
	TargetError *float64  `json:"target_error,omitempty"`
	Threshold   *float64  `json:"threshold,omitempty"`
	AbstainAll  bool      `json:"abstain_all,omitempty"`
	N           int       `json:"n"`
	LastLabel   time.Time `json:"last_label"`
}

// calibrationReportOut is the whole report (--json prints it).
type calibrationReportOut struct {
	Database string            `json:"database"`
	Since    time.Time         `json:"since"`
	Until    time.Time         `json:"until"`
	Filters  map[string]string `json:"filters,omitempty"`
	Delta    float64           `json:"delta"`
	Labels   string            `json:"labels"`
	Bucket   string            `json:"bucket"`
	Applied  bool              `json:"applied"`
	// RunsNote says why coverage and abstention rates are missing ("" when they are there).
	RunsNote string        `json:"runs_note,omitempty"`
	Entries  []reportEntry `json:"questions"`
}

// calibrateReportMode is --report: the figures per question, and with --apply the scheduled
// evaluation that stores them in each stored fit.
func calibrateReportMode(ctx context.Context, f calibrateFlags, now time.Time, stdout, stderr io.Writer) int {
	cfg := sink.DefaultConfig()
	topo := topology.Default()
	var since, until time.Time
	flags := check(func() []error {
		var errs []error
		var err error
		if since, err = parseWindowTime(f.since, now); err != nil {
			errs = append(errs, fmt.Errorf("--since: %w", err))
		}
		if until, err = parseWindowTime(f.until, now); err != nil {
			errs = append(errs, fmt.Errorf("--until: %w", err))
		}
		if len(errs) == 0 && !since.Before(until) {
			errs = append(errs, fmt.Errorf("--since %s is not before --until %s: the window is empty", since.UTC().Format(time.RFC3339), until.UTC().Format(time.RFC3339)))
		}
		return append(errs, riskFlagErrors(f)...)
	})
	if err := loadConfig(&cfg, requireDSN(&cfg), &topo, flags); err != nil {
		fmt.Fprintln(stderr, "sys1 calibrate:", err)
		return exitUsage
	}
	sources, _ := calibration.ParseSources(f.labels)

	// The stored fits first: without NATS there is nothing to compare with or store into.
	nc, err := dialClient(ctx, "sys1 calibrate", stderr)
	if err != nil {
		fmt.Fprintf(stderr, "sys1 calibrate: %v\n", err)
		return exitUsage
	}
	defer nc.Close()
	kv, err := calibrationBucket(ctx, nc.JS, topo, false)
	if err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) {
		fmt.Fprintf(stderr, "sys1 calibrate: %v\n", err)
		return exitUsage
	}
	stored := map[string]calibration.Entry{}
	if kv != nil {
		lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		entries, err := calibration.List(lctx, kv)
		cancel()
		if err != nil {
			fmt.Fprintf(stderr, "sys1 calibrate: %v\n", err)
			return exitFailed
		}
		for _, e := range entries {
			if e.Fit != nil && matches(e, f) {
				stored[e.Key] = e
			}
		}
	}

	octx, cancel := context.WithTimeout(ctx, 15*time.Second)
	conn, err := sink.Open(octx, cfg)
	cancel()
	if err != nil {
		fmt.Fprintf(stderr, "sys1 calibrate: %v\n", err)
		return exitUsage
	}
	defer conn.Close()
	q := labelQuery{database: cfg.Database, since: since, until: until, model: f.model, caller: f.caller, question: f.question, risk: true, sources: sources}
	groups, _, _, err := q.load(ctx, conn)
	if err != nil {
		fmt.Fprintf(stderr, "sys1 calibrate: %v\n", err)
		return exitFailed
	}
	counts, runsNote := q.verdictCounts(ctx, conn)

	out := calibrationReportOut{Database: cfg.Database, Since: since.UTC(), Until: until.UTC(), Filters: q.filters(), Delta: f.delta,
		Labels: sources.String(), Bucket: topo.CalibrationBucket, Applied: f.apply, RunsNote: runsNote, Entries: []reportEntry{}}
	byKey := map[string]*labelGroup{}
	for i := range groups {
		byKey[calibration.Key(groups[i].Model, groups[i].Caller, groups[i].Question)] = &groups[i]
	}
	keys := make([]string, 0, len(byKey)+len(stored))
	for k := range byKey {
		keys = append(keys, k)
	}
	for k := range stored {
		if _, ok := byKey[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		var fit *calibration.Entry
		if e, ok := stored[k]; ok {
			fit = &e
		}
		entry := evaluate(k, byKey[k], fit, counts, f.delta)
		out.Entries = append(out.Entries, entry)
	}

	code := exitOK
	if f.apply {
		for i := range out.Entries {
			e := &out.Entries[i]
			s, ok := stored[e.Key]
			if !ok {
				e.NotStored = "no stored fit to store the figures in"
				continue
			}
			rev, err := storeEvaluation(ctx, kv, s, e.evaluation(since, until, now))
			if err != nil {
				fmt.Fprintf(stderr, "sys1 calibrate: %s: %v\n", e.Key, err)
				e.NotStored = err.Error()
				code = exitFailed
				continue
			}
			e.Stored, e.Revision = true, rev
		}
	}
	if f.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(out); err != nil {
			fmt.Fprintf(stderr, "sys1 calibrate: %v\n", err)
			return exitFailed
		}
	} else {
		printEvaluationReport(stdout, &out)
	}
	if len(out.Entries) == 0 {
		fmt.Fprintf(stderr, "sys1 calibrate: nothing to report: no labels in %s.labelled_answers labelled in [%s, %s)%s and no stored fit\n",
			cfg.Database, since.UTC().Format(time.RFC3339), until.UTC().Format(time.RFC3339), describeFilters(q.filters()))
		return exitFailed
	}
	return code
}

// evaluate computes one question's figures from its labels (nil: none in the window), its
// stored fit (nil: none) and the window's verdict counts.
func evaluate(key string, g *labelGroup, stored *calibration.Entry, counts map[string][2]int64, delta float64) reportEntry {
	model, caller, question, _ := calibration.ParseKey(key)
	e := reportEntry{Key: key, Model: model, Caller: caller, Question: question}
	var fit *calibration.Fit
	if stored != nil {
		fit = stored.Fit
		rf := &reportFit{Revision: stored.Revision, FittedAt: fit.FittedAt, Temperature: fit.Temperature, Applied: fit.AppliesTemperature(), N: fit.N, LastLabel: fit.Window.LastLabel}
		if fit.Risk != nil {
			rf.TargetError, rf.AbstainAll = &fit.Risk.TargetError, fit.Risk.AbstainAll
			if !fit.Risk.AbstainAll {
				rf.Threshold = &fit.Risk.Threshold
			}
		}
		e.Fit, e.Type = rf, fit.Type
		ece := fit.Before.ECE
		if fit.AppliesTemperature() {
			ece = fit.After.ECE
		}
		e.FitECE = &ece
	}
	if c, ok := counts[key]; ok {
		e.Decided, e.Abstained = c[0], c[1]
		if total := c[0] + c[1]; total > 0 {
			cov, abst := float64(c[0])/float64(total), float64(c[1])/float64(total)
			e.Coverage, e.AbstentionRate = &cov, &abst
		}
	}
	if g == nil {
		return e
	}
	if e.Type == "" {
		e.Type = g.Type
	}
	e.Labels = len(g.Samples)
	var audits []risk.Label
	for _, s := range g.Risk {
		if s.Kind == calibration.KindAudit {
			audits = append(audits, risk.Label{Value: 1, Wrong: s.Wrong, Weight: s.Weight})
		}
	}
	e.Audits = len(audits)
	if len(audits) > 0 {
		if iv, err := risk.Estimate(audits, delta); err == nil {
			e.DecidedError = &iv
		}
	}
	if e.DecidedError != nil && fit != nil && fit.Risk != nil {
		switch target := fit.Risk.TargetError; {
		case e.DecidedError.Lower > target:
			e.ErrorStatus = "ABOVE"
		case e.DecidedError.Estimate > target:
			e.ErrorStatus = "above"
		default:
			e.ErrorStatus = "ok"
		}
	}
	// Drift: the labels newer than those the fit learnt from, with the fit applied, as a
	// worker applies it; a question whose type changed since is compared on nothing.
	if fit != nil && fit.Type == g.Type {
		var recent []calibration.Sample
		for i, s := range g.Samples {
			if g.At[i].After(fit.Window.LastLabel) {
				recent = append(recent, s)
			}
		}
		e.RecentLabels = len(recent)
		if len(recent) > 0 {
			m := calibration.MeasureRaw(g.Type, recent, calibration.MeasureOptions{})
			if fit.AppliesTemperature() {
				m = calibration.MeasureCalibrated(g.Type, recent, fit.Temperature, calibration.MeasureOptions{})
			}
			e.RecentECE = &m.ECE
			e.Drift = len(recent) >= driftMinLabels && m.ECE-*e.FitECE > driftECE
		}
	}
	return e
}

// evaluation is what --apply stores in the entry's fit.
func (e *reportEntry) evaluation(since, until, now time.Time) *calibration.Evaluation {
	ev := &calibration.Evaluation{At: now.UTC(), Since: since.UTC(), Until: until.UTC(), Audits: e.Audits, DecidedError: e.DecidedError,
		Decided: e.Decided, Abstained: e.Abstained, Coverage: e.Coverage, AbstentionRate: e.AbstentionRate,
		RecentLabels: e.RecentLabels, RecentECE: e.RecentECE}
	if e.FitECE != nil {
		ev.FitECE = *e.FitECE
	}
	return ev
}

// storeEvaluation writes ev into the stored fit, on the revision read (a fit replaced meanwhile
// by --apply is read again and updated once more, keeping the new fit).
func storeEvaluation(ctx context.Context, kv jetstream.KeyValue, stored calibration.Entry, ev *calibration.Evaluation) (uint64, error) {
	fit, rev := *stored.Fit, stored.Revision
	for attempt := 0; ; attempt++ {
		fit.Evaluation = ev
		b, err := calibration.Encode(&fit)
		if err != nil {
			return 0, err
		}
		uctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		next, err := kv.Update(uctx, stored.Key, b, rev)
		cancel()
		if err == nil {
			return next, nil
		}
		if attempt > 0 || !errors.Is(err, jetstream.ErrKeyExists) && !strings.Contains(err.Error(), "wrong last sequence") {
			return 0, fmt.Errorf("store the evaluation in %s: %w", stored.Key, err)
		}
		gctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		cur, gerr := kv.Get(gctx, stored.Key)
		cancel()
		if gerr != nil {
			return 0, fmt.Errorf("read %s again: %w", stored.Key, gerr)
		}
		f, derr := calibration.Decode(cur.Key(), cur.Value())
		if derr != nil {
			return 0, fmt.Errorf("%s was replaced by a value that is not a fit: %w", stored.Key, derr)
		}
		fit, rev = *f, cur.Revision()
	}
}

// verdictCounts reads, from the run records finished in the window, each question's decided
// and abstained (or reviewed) answers, keyed like the fits (sink.ReadVerdictCounts). When the
// runs table cannot be read (a database without sys1's run schema) it returns a note instead.
func (q labelQuery) verdictCounts(ctx context.Context, conn driver.Conn) (map[string][2]int64, string) {
	counts, err := sink.ReadVerdictCounts(ctx, conn, q.sinkQuery())
	switch {
	case errors.Is(err, sink.ErrNoRunsSchema):
		return nil, fmt.Sprintf("no run records (%s.runs does not exist): coverage and abstention rate unknown", q.database)
	case err != nil:
		return nil, fmt.Sprintf("run records unreadable (%v): coverage and abstention rate unknown", err)
	}
	out := map[string][2]int64{}
	for _, c := range counts {
		out[calibration.Key(c.Model, c.Caller, c.Question)] = [2]int64{c.Decided, c.Abstained}
	}
	return out, ""
}

func printEvaluationReport(w io.Writer, r *calibrationReportOut) {
	mode := "report only (--apply stores these figures in each stored fit, for the workers' metrics)"
	if r.Applied {
		mode = "--apply: figures stored in the fits of bucket " + r.Bucket
	}
	fmt.Fprintf(w, "report of %s, labels (%s) labelled and runs finished %s to %s%s; intervals at %s; %s\n",
		r.Database, r.Labels, r.Since.Format("2006-01-02 15:04"), r.Until.Format("2006-01-02 15:04 MST"), describeFilters(r.Filters), pctG(1-r.Delta), mode)
	if r.RunsNote != "" {
		fmt.Fprintf(w, "note: %s\n", r.RunsNote)
	}
	for _, e := range r.Entries {
		typ := ""
		if e.Type != "" {
			typ = " (" + string(e.Type) + ")"
		}
		fmt.Fprintf(w, "\n%s · caller %s · question %s%s   key %s\n", e.Model, e.Caller, e.Question, typ, e.Key)
		if e.Fit == nil {
			fmt.Fprintf(w, "  no stored fit\n")
		} else {
			t := fmt.Sprintf("T %.3f", e.Fit.Temperature)
			if !e.Fit.Applied {
				t = "no temperature applied"
			}
			target := "no risk fit"
			switch {
			case e.Fit.TargetError != nil && e.Fit.AbstainAll:
				target = fmt.Sprintf("target error %s: abstain all", pctG(*e.Fit.TargetError))
			case e.Fit.TargetError != nil:
				target = fmt.Sprintf("target error %s at threshold %s", pctG(*e.Fit.TargetError), fmtThreshold(*e.Fit.Threshold))
			}
			fmt.Fprintf(w, "  fit of %s (revision %d, n %s): %s, %s\n", e.Fit.FittedAt.Format("2006-01-02"), e.Fit.Revision, thousandsInt(e.Fit.N), t, target)
		}
		fmt.Fprintf(w, "  labels in the window: %s, %s of them audit samples\n", thousandsInt(e.Labels), thousandsInt(e.Audits))
		if e.DecidedError != nil {
			verdict := ""
			switch e.ErrorStatus {
			case "ok":
				verdict = ": within the target"
			case "above":
				verdict = ": above the target, though the interval still holds it"
			case "ABOVE":
				verdict = ": ABOVE THE TARGET (the whole interval is above it)"
			}
			fmt.Fprintf(w, "  error of decided answers (audit samples only): %s [%s, %s]%s\n", pct(e.DecidedError.Estimate), pct(e.DecidedError.Lower), pct(e.DecidedError.Upper), verdict)
		} else {
			fmt.Fprintf(w, "  error of decided answers: unknown (no audit samples labelled in the window)\n")
		}
		if e.Coverage != nil {
			fmt.Fprintf(w, "  coverage %s decided, abstention rate %s (of %s answers)\n", pct(*e.Coverage), pct(*e.AbstentionRate), thousandsInt(int(e.Decided+e.Abstained)))
		} else if r.RunsNote == "" {
			fmt.Fprintf(w, "  coverage: no judged answers of this question finished in the window\n")
		}
		switch {
		case e.Fit == nil:
		case e.RecentECE == nil:
			fmt.Fprintf(w, "  ECE: no labels newer than the fit's last (%s)\n", e.Fit.LastLabel.Format("2006-01-02 15:04"))
		default:
			drift := ""
			switch {
			case e.Drift:
				drift = fmt.Sprintf(": DRIFT (more than %.2f above the fit's): refit", driftECE)
			case e.RecentLabels < driftMinLabels:
				drift = fmt.Sprintf(" (fewer than %d labels: mostly noise)", driftMinLabels)
			}
			fmt.Fprintf(w, "  ECE on %s labels newer than the fit: %.4f (%.4f at the fit)%s\n", thousandsInt(e.RecentLabels), *e.RecentECE, *e.FitECE, drift)
		}
		switch {
		case e.Stored:
			fmt.Fprintf(w, "  stored: %s revision %d\n", r.Bucket, e.Revision)
		case r.Applied && e.NotStored != "":
			fmt.Fprintf(w, "  not stored: %s\n", e.NotStored)
		}
	}
}
