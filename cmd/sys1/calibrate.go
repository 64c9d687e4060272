package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/sink"
	"github.com/sys1hq/sys1/worker/calibration"
	calplot "github.com/sys1hq/sys1/worker/calibration/plot"
	"github.com/sys1hq/sys1/worker/topology"
)

func init() {
	register(command{name: "calibrate", summary: "fit temperature scaling and risk thresholds from labels; report, list or delete stored fits", run: runCalibrate})
}

const calibrateUsage = `usage: sys1 calibrate [--since 30d] [--until TIME] [--model M] [--caller C] [--question Q]
                      [--min-labels 50] [--thresholds 0.5,0.7,0.9] [--threshold-on confidence|probability]
                      [--target-error ε [--delta 0.1] [--labels review]]
                      [--plot-dir DIR] [--json] [--dry-run | --apply]
       sys1 calibrate --report [--since 30d] [--until TIME] [--model M] [--caller C] [--question Q]
                      [--delta 0.1] [--labels review] [--json] [--apply]
       sys1 calibrate --list [--model M] [--caller C] [--question Q] [--json]
       sys1 calibrate --delete KEY... | --delete [--model M] [--caller C] [--question Q]

Fits one temperature T per (model, caller, question name) to the labelled answers in ClickHouse
(view labelled_answers of SYS1_CLICKHOUSE_DATABASE, labels in [since, until)), and prints per
fit: n, T, and before -> after for ECE (15 bins), Brier, NLL, accuracy and, per threshold,
coverage (the share of answers whose confidence, or top probability, is at least the threshold:
those a policy rule with that minimum decides instead of abstaining) with the accuracy among
them. Nothing is stored unless --apply: then the converged fits go to the KV bucket
SYS1_CALIBRATION_BUCKET (sys1-calibration), where workers pick them up without a restart.

With --target-error ε it also fits, per group, the risk threshold: the most permissive
threshold on confidence (or top probability, --threshold-on; calibrated when the temperature
converged) whose upper confidence bound on the error among the answers it decides is at
most ε with probability at least 1 - δ (--delta). Labels weigh the inverse of their chance of
being labelled: 1 for a reviewed abstention, 1/share for an audit sample (audit_sample);
producers' labels join only with --labels producer (weight 1: their sampling is unknown). It
prints n, the threshold, coverage, the error among decided answers and its bound, or that no
threshold meets ε ("abstain all"); --apply stores it beside the temperature, for policy rules
with max_error.

--report prints, per question, the decided answers' error estimated from audit samples alone
with its interval, coverage and abstention rate (from the run records), and ECE on the labels
newer than the stored fit against the fit's own; with --apply it stores these figures in each
stored fit, where the workers export them as metrics (the scheduled evaluation: a CronJob).

Question names key the fits: a question renamed between runs is a new question, with its own
labels and its own fit; the old name's fit stays in the bucket, applying to nothing, until
--delete. A question whose type changed is fitted on the rows of its latest type only.

Exit status: 0 when at least one fit was made (and, with --apply, stored; with --target-error,
at least one risk fit), 1 when none was (an empty window, too few labels) or storing failed,
2 on usage, configuration or connection errors. --report: 0 when it reported on a question
(and, with --apply, stored every evaluation it could), 1 when there was nothing to report or
storing failed. ClickHouse: SYS1_CLICKHOUSE_DSN, SYS1_CLICKHOUSE_DATABASE [sys1]. NATS (--apply, --list,
--delete): SYS1_NATS_URL and SYS1_NATS_* as for 'sys1 decide'.

flags:
`

// calibrateFlags are the parsed command line.
type calibrateFlags struct {
	since, until                   string
	model, caller, question        string
	minLabels                      int
	thresholds                     string
	thresholdOn                    string
	plotDir                        string
	json, apply, dryRun, list, del bool
	// risk control (--target-error, --delta, --labels) and the report
	targetError, delta float64
	targetSet, report  bool
	labels             string
	set                map[string]bool // flags given on the command line
}

func runCalibrate(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("calibrate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, calibrateUsage); fs.PrintDefaults() }
	var f calibrateFlags
	fs.StringVar(&f.since, "since", "30d", "start of the label window: a duration back from now (30d, 12h, 1d12h) or a time (2026-11-01, RFC 3339)")
	fs.StringVar(&f.until, "until", "now", "end of the label window (exclusive), in the same forms")
	fs.StringVar(&f.model, "model", "", "only this model")
	fs.StringVar(&f.caller, "caller", "", "only this caller")
	fs.StringVar(&f.question, "question", "", "only this question name")
	fs.IntVar(&f.minLabels, "min-labels", calibration.DefaultMinLabels, "fewest usable labels a fit is made from")
	fs.StringVar(&f.thresholds, "thresholds", "0.5,0.7,0.9", "policy thresholds to report coverage and accuracy at (comma list in [0, 1])")
	fs.StringVar(&f.thresholdOn, "threshold-on", string(calibration.OnConfidence), "what a threshold is compared with: confidence (policy min_confidence) or probability (min_probability); noul always uses max(P, 1-P)")
	fs.StringVar(&f.plotDir, "plot-dir", "", "write a reliability diagram PNG per fit into this directory")
	fs.BoolVar(&f.json, "json", false, "print JSON instead of tables")
	fs.BoolVar(&f.apply, "apply", false, "store the converged fits in the calibration bucket")
	fs.BoolVar(&f.dryRun, "dry-run", false, "print what would be stored, store nothing (the default)")
	fs.BoolVar(&f.list, "list", false, "list the fits stored in the calibration bucket")
	fs.BoolVar(&f.del, "delete", false, "delete stored fits: the KEYs given, or those matching --model/--caller/--question")
	fs.Float64Var(&f.targetError, "target-error", 0, "also fit the risk threshold guaranteeing at most this error among decided answers (ε in (0, 1), e.g. 0.05)")
	fs.Float64Var(&f.delta, "delta", 0.1, "the chance the risk guarantee may fail (δ in (0, 1)); --report: its intervals are at 1 - δ")
	fs.StringVar(&f.labels, "labels", "review", "labels for risk fits and reports: review (reviewed abstentions and audit samples, weighted), producer, or review,producer")
	fs.BoolVar(&f.report, "report", false, "report the decided answers' error from audit samples, coverage, abstention rate and ECE drift per question; with --apply, store them for the workers' metrics")
	// Flags may come before or after KEYs (sys1 calibrate --delete KEY --model m is refused
	// with a message, not misread): parse again after each argument, as 'sys1 decide' does.
	// After "--" everything is an argument.
	var positional []string
	for rest := args; ; {
		if err := fs.Parse(rest); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return exitOK
			}
			return exitUsage
		}
		if used := len(rest) - fs.NArg(); used > 0 && rest[used-1] == "--" {
			positional = append(positional, fs.Args()...)
			break
		}
		if fs.NArg() == 0 {
			break
		}
		positional, rest = append(positional, fs.Arg(0)), fs.Args()[1:]
	}
	usage := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "sys1 calibrate: "+format+"\n", a...)
		return exitUsage
	}
	f.set = map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { f.set[fl.Name] = true })
	f.targetSet = f.set["target-error"]
	modes := 0
	for _, on := range []bool{(f.apply || f.dryRun) && !f.report, f.list, f.del, f.report} {
		if on {
			modes++
		}
	}
	switch {
	case f.apply && f.dryRun:
		return usage("--apply and --dry-run contradict each other")
	case modes > 1:
		return usage("--list, --delete, --report and fitting (--apply, --dry-run) are separate modes; give one")
	case len(positional) > 0 && !f.del:
		return usage("unexpected arguments %q (keys are for --delete)", positional)
	case f.report && f.targetSet:
		return usage("--target-error is for fitting: --report measures each stored fit against its own target")
	case f.report && (f.set["thresholds"] || f.set["plot-dir"] || f.set["threshold-on"] || f.set["min-labels"]):
		return usage("--thresholds, --threshold-on, --min-labels and --plot-dir are for fitting, not --report")
	case !f.targetSet && !f.report && (f.set["delta"] || f.set["labels"]):
		return usage("--delta and --labels go with --target-error or --report")
	}
	if f.report {
		return calibrateReportMode(ctx, f, time.Now(), stdout, stderr)
	}
	if f.list {
		return calibrateList(ctx, f, stdout, stderr)
	}
	if f.del {
		return calibrateDelete(ctx, f, positional, stdout, stderr)
	}
	return calibrateFit(ctx, f, time.Now(), stdout, stderr)
}

var daysPrefix = regexp.MustCompile(`^(\d+)d(.*)$`)

// parseWindowTime reads a window bound: "now", a duration back from now with an optional
// leading day count (30d, 1d12h, 90m), a date (2026-11-01, UTC midnight) or an RFC 3339 time.
func parseWindowTime(s string, now time.Time) (time.Time, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return time.Time{}, errors.New("empty: give a duration (30d), a date or an RFC 3339 time")
	}
	if s == "now" {
		return now, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	if t, err := time.Parse("2006-01-02", s); err == nil {
		return t, nil
	}
	var d time.Duration
	rest := s
	if m := daysPrefix.FindStringSubmatch(s); m != nil {
		days, err := strconv.Atoi(m[1])
		if err != nil || days > 100*365 {
			return time.Time{}, fmt.Errorf("%q: too many days", s)
		}
		d, rest = time.Duration(days)*24*time.Hour, m[2]
	}
	if rest != "" {
		more, err := time.ParseDuration(rest)
		if err != nil || rest[0] == '-' || rest[0] == '+' {
			return time.Time{}, fmt.Errorf("%q is not a duration (30d, 12h, 1d12h), a date (2026-11-01) or an RFC 3339 time", s)
		}
		d += more
	}
	if d < 0 {
		return time.Time{}, fmt.Errorf("%q: give a duration back from now without a sign", s)
	}
	return now.Add(-d), nil
}

// fitReport is one fitted group in the output.
type fitReport struct {
	Key      string           `json:"key"`
	Stored   bool             `json:"stored"`
	Revision uint64           `json:"revision,omitempty"`
	NotStore string           `json:"not_stored,omitempty"` // why --apply left it out
	Plot     string           `json:"plot,omitempty"`
	Fit      *calibration.Fit `json:"fit"`
	// RiskNoFit says why the group got no risk fit (--target-error); the fit's risk is nil.
	RiskNoFit *riskNoFit `json:"risk_no_fit,omitempty"`
}

// riskNoFit is why a group got no risk fit.
type riskNoFit struct {
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// noFitReport is one group without a fit.
type noFitReport struct {
	Model    string                `json:"model"`
	Caller   string                `json:"caller"`
	Question string                `json:"question"`
	Type     contract.QuestionType `json:"type"`
	N        int                   `json:"n"`
	Reason   string                `json:"reason"`
	Message  string                `json:"message"`
}

// calibrateReport is the whole output (--json prints it).
type calibrateReport struct {
	Database    string                  `json:"database"`
	Since       time.Time               `json:"since"`
	Until       time.Time               `json:"until"`
	Filters     map[string]string       `json:"filters,omitempty"`
	Rows        int                     `json:"rows"`
	Skipped     map[string]int          `json:"skipped,omitempty"`
	DryRun      bool                    `json:"dry_run"`
	Bucket      string                  `json:"bucket"`
	ThresholdOn calibration.ThresholdOn `json:"threshold_on"`
	// TargetError, Delta and Labels are the risk fit's settings (--target-error); absent
	// without one.
	TargetError float64       `json:"target_error,omitempty"`
	Delta       float64       `json:"delta,omitempty"`
	Labels      string        `json:"labels,omitempty"`
	Fits        []fitReport   `json:"fits"`
	NoFit       []noFitReport `json:"no_fit"`
}

func calibrateFit(ctx context.Context, f calibrateFlags, now time.Time, stdout, stderr io.Writer) int {
	cfg := sink.DefaultConfig()
	topo := topology.Default()
	var since, until time.Time
	var thresholds []float64
	var on calibration.ThresholdOn
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
		if f.minLabels < 2 {
			errs = append(errs, fmt.Errorf("--min-labels: must be at least 2, got %d", f.minLabels))
		}
		if thresholds, err = parseThresholdList(f.thresholds); err != nil {
			errs = append(errs, fmt.Errorf("--thresholds: %w", err))
		}
		if on, err = calibration.ParseThresholdOn(f.thresholdOn); err != nil {
			errs = append(errs, fmt.Errorf("--threshold-on: %w", err))
		}
		errs = append(errs, riskFlagErrors(f)...)
		return errs
	})
	if err := loadConfig(&cfg, requireDSN(&cfg), &topo, flags); err != nil {
		fmt.Fprintln(stderr, "sys1 calibrate:", err)
		return exitUsage
	}
	if f.plotDir != "" {
		if err := os.MkdirAll(f.plotDir, 0o755); err != nil {
			fmt.Fprintf(stderr, "sys1 calibrate: --plot-dir: %v\n", err)
			return exitUsage
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
	sources, _ := calibration.ParseSources(f.labels) // checked with the flags
	q := labelQuery{database: cfg.Database, since: since, until: until, model: f.model, caller: f.caller, question: f.question,
		risk: f.targetSet, sources: sources}
	groups, rows, skipped, err := q.load(ctx, conn)
	if err != nil {
		fmt.Fprintf(stderr, "sys1 calibrate: %v\n", err)
		return exitFailed
	}

	rep := calibrateReport{
		Database: cfg.Database, Since: since.UTC(), Until: until.UTC(), Filters: q.filters(), Rows: rows,
		DryRun: !f.apply, Bucket: topo.CalibrationBucket, ThresholdOn: on,
		Fits: []fitReport{}, NoFit: []noFitReport{},
	}
	if f.targetSet {
		rep.TargetError, rep.Delta, rep.Labels = f.targetError, f.delta, sources.String()
	}
	if len(skipped) > 0 {
		rep.Skipped = map[string]int{}
		for r, n := range skipped {
			rep.Skipped[string(r)] = n
		}
	}
	opts := calibration.Options{MinLabels: f.minLabels, Measure: calibration.MeasureOptions{Thresholds: thresholds, ThresholdOn: on}, Since: since, Until: until, Now: now}
	riskOpts := calibration.RiskOptions{TargetError: f.targetError, Delta: f.delta, Sources: sources, ThresholdOn: on, MinLabels: f.minLabels, Now: now}
	riskFits := 0
	for _, gd := range groups {
		g := gd.Group
		fit, err := calibration.Calibrate(g, opts)
		var nf *calibration.NoFitError
		switch {
		case errors.As(err, &nf) && f.targetSet && nf.Reason == calibration.NoFitOneClass:
			// No temperature from labels of one class, but a threshold may still be
			// certified: a fit that carries the risk part alone.
			fit = calibration.RiskOnlyFit(g, opts, nf.Message)
		case errors.As(err, &nf):
			rep.NoFit = append(rep.NoFit, noFitReport{Model: g.Model, Caller: g.Caller, Question: g.Question, Type: g.Type, N: len(g.Samples), Reason: string(nf.Reason), Message: nf.Message})
			continue
		case err != nil:
			fmt.Fprintf(stderr, "sys1 calibrate: %s: %v\n", calibration.Key(g.Model, g.Caller, g.Question), err)
			return exitFailed
		}
		r := fitReport{Key: fit.Key(), Fit: &fit}
		if f.targetSet {
			T := 0.0
			if fit.Converged {
				T = fit.Temperature
			}
			risk, err := calibration.FitRisk(g.Type, gd.Risk, gd.RiskSkipped, T, riskOpts)
			switch {
			case errors.As(err, &nf):
				r.RiskNoFit = &riskNoFit{Reason: string(nf.Reason), Message: nf.Message}
			case err != nil:
				fmt.Fprintf(stderr, "sys1 calibrate: %s: risk: %v\n", fit.Key(), err)
				return exitFailed
			default:
				fit.Risk = risk
				riskFits++
			}
		}
		switch {
		case !fit.Converged && fit.Risk != nil && fit.Temperature != 1:
			// Stored for its threshold, with a temperature no worker applies (T = 1 for
			// older workers, which apply every temperature they find).
			fit.Note = fmt.Sprintf("fitted T %.3f did not converge (%s): not applied, T = 1 stored", fit.Temperature, fit.Note)
			fit.Temperature, fit.After = 1, fit.Before
		case !fit.Converged && fit.Risk == nil && errors.As(err, &nf):
			// Neither a temperature (labels of one class) nor a threshold.
			rep.NoFit = append(rep.NoFit, noFitReport{Model: g.Model, Caller: g.Caller, Question: g.Question, Type: g.Type, N: len(g.Samples), Reason: string(nf.Reason),
				Message: nf.Message + "; risk: " + r.RiskNoFit.Message})
			continue
		case !fit.Converged && fit.Risk == nil:
			r.NotStore = "did not converge: " + fit.Note
		}
		if f.plotDir != "" {
			r.Plot = filepath.Join(f.plotDir, r.Key+".png")
			if err := calplot.SavePNG(r.Plot, &fit); err != nil {
				fmt.Fprintf(stderr, "sys1 calibrate: plot: %v\n", err)
				return exitFailed
			}
		}
		rep.Fits = append(rep.Fits, r)
	}

	code := exitOK
	if f.apply && len(rep.Fits) > 0 {
		if c := storeFits(ctx, topo, rep.Fits, stderr); c != exitOK {
			code = c
		}
	}
	stored := 0
	for _, r := range rep.Fits {
		if r.Stored {
			stored++
		}
	}
	if len(rep.Fits) == 0 || (f.apply && stored == 0) || (f.targetSet && riskFits == 0) {
		code = exitFailed
	}
	if f.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			fmt.Fprintf(stderr, "sys1 calibrate: %v\n", err)
			return exitFailed
		}
	} else {
		printCalibrateReport(stdout, &rep)
	}
	switch {
	case rows == 0:
		fmt.Fprintf(stderr, "sys1 calibrate: no labelled answers in %s.labelled_answers labelled in [%s, %s)%s: nothing to fit\n",
			cfg.Database, since.UTC().Format(time.RFC3339), until.UTC().Format(time.RFC3339), describeFilters(q.filters()))
	case len(rep.Fits) == 0:
		fmt.Fprintf(stderr, "sys1 calibrate: no fit made (%d groups without one; see above)\n", len(rep.NoFit))
	case f.apply && stored == 0:
		fmt.Fprintf(stderr, "sys1 calibrate: no fit stored (none converged; see above)\n")
	case f.targetSet && riskFits == 0:
		fmt.Fprintf(stderr, "sys1 calibrate: no risk fit made for --target-error %g (see above)\n", f.targetError)
	}
	return code
}

// riskFlagErrors checks --target-error, --delta and --labels.
func riskFlagErrors(f calibrateFlags) []error {
	var errs []error
	if f.targetSet && !(f.targetError > 0 && f.targetError < 1) {
		errs = append(errs, fmt.Errorf("--target-error: %v is not in (0, 1): give the share of decided answers allowed to be wrong, e.g. 0.05", f.targetError))
	}
	if !(f.delta > 0 && f.delta < 1) {
		errs = append(errs, fmt.Errorf("--delta: %v is not in (0, 1): give the chance the guarantee may fail, e.g. 0.1", f.delta))
	}
	if _, err := calibration.ParseSources(f.labels); err != nil {
		errs = append(errs, fmt.Errorf("--labels: %w", err))
	}
	return errs
}

func parseThresholdList(s string) ([]float64, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var ts []float64
	for _, part := range strings.Split(s, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(part), 64)
		if err != nil {
			return nil, fmt.Errorf("%q is not a number", part)
		}
		ts = append(ts, v)
	}
	return calibration.ParseThresholds(ts)
}

// storeFits puts the converged fits into the bucket (creating it with the topology's settings
// when it does not exist yet) and marks each report stored with its revision.
func storeFits(ctx context.Context, topo topology.Config, fits []fitReport, stderr io.Writer) int {
	conn, err := dialClient(ctx, "sys1 calibrate", stderr)
	if err != nil {
		fmt.Fprintf(stderr, "sys1 calibrate: %v\n", err)
		return exitUsage
	}
	defer conn.Close()
	kv, err := calibrationBucket(ctx, conn.JS, topo, true)
	if err != nil {
		fmt.Fprintf(stderr, "sys1 calibrate: %v\n", err)
		return exitUsage
	}
	code := exitOK
	for i := range fits {
		if fits[i].NotStore != "" {
			continue
		}
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		if fits[i].Fit.Risk == nil {
			// A risk threshold is made on the values of its own fit (the temperature it was
			// fitted with): a new fit without one replaces it, and max_error rules abstain
			// until it is fitted again. Say so rather than let it vanish unnoticed.
			if e, err := kv.Get(pctx, fits[i].Key); err == nil {
				if old, err := calibration.Decode(e.Key(), e.Value()); err == nil && old.Risk != nil {
					fmt.Fprintf(stderr, "sys1 calibrate: %s: the stored fit had a risk threshold (target error %g); this fit has none, so max_error rules abstain on the question until one is fitted (--target-error)\n", fits[i].Key, old.Risk.TargetError)
				}
			}
		}
		rev, err := calibration.Put(pctx, kv, fits[i].Fit)
		cancel()
		if err != nil {
			fmt.Fprintf(stderr, "sys1 calibrate: %v\n", err)
			code = exitFailed
			continue
		}
		fits[i].Stored, fits[i].Revision = true, rev
	}
	return code
}

// calibrationBucket opens the bucket; create makes it when missing (--apply), otherwise a
// missing bucket is jetstream.ErrBucketNotFound.
func calibrationBucket(ctx context.Context, js jetstream.JetStream, topo topology.Config, create bool) (jetstream.KeyValue, error) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	kv, err := js.KeyValue(cctx, topo.CalibrationBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) && create {
		kv, err = js.CreateKeyValue(cctx, topo.CalibrationBucketConfig())
	}
	if err != nil {
		return nil, fmt.Errorf("calibration bucket %s: %w", topo.CalibrationBucket, err)
	}
	return kv, nil
}

// labelQuery reads labelled answers from ClickHouse.
type labelQuery struct {
	database                string
	since, until            time.Time
	model, caller, question string
	// risk also reads what a risk fit weighs labels by (source, verdict, audit_share,
	// correct), and sources chooses the labels it uses.
	risk    bool
	sources calibration.Sources
}

func (q labelQuery) filters() map[string]string {
	m := map[string]string{}
	for k, v := range map[string]string{"model": q.model, "caller": q.caller, "question": q.question} {
		if v != "" {
			m[k] = v
		}
	}
	if len(m) == 0 {
		return nil
	}
	return m
}

func describeFilters(m map[string]string) string {
	if len(m) == 0 {
		return ""
	}
	var parts []string
	for _, k := range []string{"model", "caller", "question"} {
		if v, ok := m[k]; ok {
			parts = append(parts, fmt.Sprintf("%s %q", k, v))
		}
	}
	return " for " + strings.Join(parts, ", ")
}

// labelRow is one row of labelled_answers, as far as fitting needs it.
type labelRow struct {
	runID, caller, model, question, typ string
	labelledAt                          time.Time
	label                               string
	confidence                          *float64
	keys                                []string
	values                              []float64
	// read for risk fits only
	source, verdict string
	auditShare      float64
	correct         uint8
}

// labelGroup is one group's samples: for the temperature, and for a risk fit with the time
// each was labelled.
type labelGroup struct {
	calibration.Group
	// At is when each of Group.Samples was labelled.
	At          []time.Time
	Risk        []calibration.RiskSample
	RiskAt      []time.Time
	RiskSkipped map[calibration.SkipReason]int
}

// load reads the window's rows (sink.ReadLabelledAnswers) and groups them per (model,
// caller, question) in that order. Rows that cannot be used are counted per reason, overall
// and in their group.
func (q labelQuery) load(ctx context.Context, conn driver.Conn) (groups []labelGroup, rows int, skipped map[calibration.SkipReason]int, err error) {
	skipped = map[calibration.SkipReason]int{}
	var cur []labelRow
	flush := func() {
		if len(cur) > 0 {
			groups = append(groups, q.buildGroup(cur, skipped))
		}
		cur = nil
	}
	err = sink.ReadLabelledAnswers(ctx, conn, q.sinkQuery(), func(a sink.LabelledAnswer) error {
		r := labelRow{runID: a.RunID, caller: a.Caller, model: a.Model, question: a.Question, typ: a.Type, labelledAt: a.LabelledAt,
			label: a.Label, confidence: a.Confidence, keys: a.ProbKeys, values: a.ProbValues,
			source: a.Source, verdict: a.Verdict, auditShare: a.AuditShare, correct: a.Correct}
		rows++
		if len(cur) > 0 && (cur[0].model != r.model || cur[0].caller != r.caller || cur[0].question != r.question) {
			flush()
		}
		cur = append(cur, r)
		return nil
	})
	switch {
	case errors.Is(err, sink.ErrNoLabelsSchema):
		return nil, 0, nil, fmt.Errorf("%s.labelled_answers does not exist: run 'sys1 migrate' with a sys1 that has the labels schema (%w)", q.database, err)
	case errors.Is(err, sink.ErrNoRiskColumns):
		return nil, 0, nil, fmt.Errorf("%s.labelled_answers lacks the columns risk fits read (audit_share: schema version 5): run 'sys1 migrate' (%w)", q.database, err)
	case err != nil:
		return nil, 0, nil, err
	}
	flush()
	return groups, rows, skipped, nil
}

// sinkQuery is the window and filters as the sink's queries take them.
func (q labelQuery) sinkQuery() sink.LabelledQuery {
	return sink.LabelledQuery{Database: q.database, Since: q.since, Until: q.until, Model: q.model, Caller: q.caller, Question: q.question, Risk: q.risk}
}

// buildGroup turns one group's rows (in labelled_at order) into samples: the latest label of
// each run wins, only rows of the latest question type are used, and unusable rows are
// counted in the group and in total. With risk, each usable sample is also weighed for a
// risk fit (or counted in RiskSkipped).
func (q labelQuery) buildGroup(rows []labelRow, total map[calibration.SkipReason]int) labelGroup {
	last := rows[len(rows)-1]
	lg := labelGroup{Group: calibration.Group{Model: last.model, Caller: last.caller, Question: last.question, Type: contract.QuestionType(last.typ), Skipped: map[calibration.SkipReason]int{}}}
	g := &lg.Group
	count := func(r calibration.SkipReason) {
		g.Skipped[r]++
		total[r]++
	}
	latest := make(map[string]int, len(rows)) // run id → index of its latest row
	for i, r := range rows {
		latest[r.runID] = i
	}
	for i, r := range rows {
		switch {
		case latest[r.runID] != i:
			count(calibration.SkipSuperseded)
			continue
		case r.typ != last.typ:
			count(calibration.SkipTypeChanged)
			continue
		}
		s, err := calibration.NewSample(g.Type, r.keys, r.values, r.label, r.confidence)
		var se *calibration.SkipError
		if errors.As(err, &se) {
			count(se.Reason)
			continue
		}
		if g.FirstLabel.IsZero() || r.labelledAt.Before(g.FirstLabel) {
			g.FirstLabel = r.labelledAt
		}
		if r.labelledAt.After(g.LastLabel) {
			g.LastLabel = r.labelledAt
		}
		g.Samples = append(g.Samples, s)
		lg.At = append(lg.At, r.labelledAt)
		if !q.risk {
			continue
		}
		kind, weight, why := calibration.RiskLabel(q.sources, r.source, r.verdict, r.auditShare)
		if why != "" {
			if lg.RiskSkipped == nil {
				lg.RiskSkipped = map[calibration.SkipReason]int{}
			}
			lg.RiskSkipped[why]++
			continue
		}
		lg.Risk = append(lg.Risk, calibration.RiskSample{Sample: s, Wrong: r.correct == 0, Kind: kind, Weight: weight})
		lg.RiskAt = append(lg.RiskAt, r.labelledAt)
	}
	if len(g.Skipped) == 0 {
		g.Skipped = nil
	}
	return lg
}

func printCalibrateReport(w io.Writer, rep *calibrateReport) {
	mode := "dry run: nothing stored (--apply stores the converged fits)"
	if !rep.DryRun {
		mode = "--apply: converged fits stored in bucket " + rep.Bucket
	}
	fmt.Fprintf(w, "%d rows of %s.labelled_answers labelled %s to %s%s: %s, %d without a fit; %s\n",
		rep.Rows, rep.Database, rep.Since.Format("2006-01-02 15:04"), rep.Until.Format("2006-01-02 15:04 MST"), describeFilters(rep.Filters), plural(len(rep.Fits), "fit"), len(rep.NoFit), mode)
	if len(rep.Skipped) > 0 {
		fmt.Fprintf(w, "rows skipped: %s\n", describeCounts(rep.Skipped))
	}
	what := "confidence"
	if rep.ThresholdOn == calibration.OnProbability {
		what = "top probability"
	}
	for _, r := range rep.Fits {
		f := r.Fit
		fmt.Fprintf(w, "\n%s · caller %s · question %s (%s)   key %s\n", f.Model, f.Caller, f.Question, f.Type, r.Key)
		status := "converged"
		if !f.Converged {
			status = "NOT converged: " + f.Note
		}
		fmt.Fprintf(w, "  n %d · T %.3f (%s) · labels %s to %s\n", f.N, f.Temperature, status, f.Window.FirstLabel.Format("2006-01-02"), f.Window.LastLabel.Format("2006-01-02"))
		if len(f.Skipped) > 0 {
			fmt.Fprintf(w, "  rows skipped: %s\n", describeCounts(f.Skipped))
		}
		what := what
		if f.Type == contract.TypeNoul {
			what = "max(P, 1−P)" // noul has no confidence; its policy is a band around 0.5
		}
		row := func(name, before, after string) {
			fmt.Fprintf(w, "  %-32s %9s  →  %9s\n", name, before, after)
		}
		fmt.Fprintf(w, "  %-32s %9s     %9s\n", "", "before", "after")
		row("ECE (15 bins)", fmt.Sprintf("%.4f", f.Before.ECE), fmt.Sprintf("%.4f", f.After.ECE))
		row("Brier", fmt.Sprintf("%.4f", f.Before.Brier), fmt.Sprintf("%.4f", f.After.Brier))
		row("NLL", fmt.Sprintf("%.4f", f.Before.NLL), fmt.Sprintf("%.4f", f.After.NLL))
		row("accuracy", pct(f.Before.Accuracy), pct(f.After.Accuracy))
		for i, b := range f.Before.Coverage {
			a := f.After.Coverage[i]
			row(fmt.Sprintf("coverage, %s ≥ %.2f", what, b.Threshold), pct(b.Coverage), pct(a.Coverage))
			row("  accuracy of those decided", pctPtr(b.Accuracy), pctPtr(a.Accuracy))
		}
		if rep.TargetError > 0 {
			printRisk(w, &r, rep)
		}
		if r.Plot != "" {
			fmt.Fprintf(w, "  plot: %s\n", r.Plot)
		}
		switch {
		case r.Stored:
			fmt.Fprintf(w, "  stored: %s revision %d\n", rep.Bucket, r.Revision)
		case r.NotStore != "":
			fmt.Fprintf(w, "  not stored: %s\n", r.NotStore)
		case rep.DryRun && f.Risk != nil && f.Risk.AbstainAll:
			fmt.Fprintf(w, "  would store under %s: T %.4f, n %d, risk \"abstain all\" (max_error %g)\n", r.Key, f.Temperature, f.N, f.Risk.TargetError)
		case rep.DryRun && f.Risk != nil:
			fmt.Fprintf(w, "  would store under %s: T %.4f, n %d, risk threshold %s (max_error %g)\n", r.Key, f.Temperature, f.N, fmtThreshold(f.Risk.Threshold), f.Risk.TargetError)
		case rep.DryRun:
			fmt.Fprintf(w, "  would store under %s: T %.4f, n %d\n", r.Key, f.Temperature, f.N)
		default:
			fmt.Fprintf(w, "  not stored (see the error above)\n")
		}
	}
	if len(rep.NoFit) > 0 {
		fmt.Fprintf(w, "\nno fit:\n")
		for _, n := range rep.NoFit {
			fmt.Fprintf(w, "  %s · caller %s · question %s (%s): %s\n", n.Model, n.Caller, n.Question, n.Type, n.Message)
		}
	}
}

// printRisk writes a fit's risk part: n and the labels' weights, then the threshold with its
// coverage, error and bound, or that none meets the target.
func printRisk(w io.Writer, r *fitReport, rep *calibrateReport) {
	if r.RiskNoFit != nil {
		fmt.Fprintf(w, "  risk (target error %s): no risk fit: %s\n", pctG(rep.TargetError), r.RiskNoFit.Message)
		return
	}
	k := r.Fit.Risk
	value := "confidence"
	switch {
	case r.Fit.Type == contract.TypeNoul:
		value = "max(P, 1−P)"
	case k.ThresholdOn == calibration.OnProbability:
		value = "top probability"
	}
	if k.Calibrated {
		value = "calibrated " + value
	}
	fmt.Fprintf(w, "  risk: target error %s with probability ≥ %s (δ %g), threshold on %s\n", pctG(k.TargetError), pctG(1-k.Delta), k.Delta, value)
	fmt.Fprintf(w, "    n %s labels (%s): %s\n", thousandsInt(k.N), rep.Labels, describeRiskLabels(k))
	if len(k.Skips) > 0 {
		fmt.Fprintf(w, "    left out: %s\n", describeCounts(k.Skips))
	}
	if k.AbstainAll {
		fmt.Fprintf(w, "    no threshold meets %s: the strictest tested, %s, has an upper bound of %s\n", pctG(k.TargetError), fmtThreshold(k.Start), pct(k.StartBound))
		fmt.Fprintf(w, "    → \"abstain all\": a rule with max_error %g abstains on every answer of this question\n", k.TargetError)
	} else {
		fmt.Fprintf(w, "    threshold %s: decides %s of answers (estimated), error among them %s, upper bound %s ≤ %s\n",
			fmtThreshold(k.Threshold), pct(k.Coverage), pct(k.Error), pct(k.Bound), pctG(k.TargetError))
	}
	for _, n := range k.Notes {
		fmt.Fprintf(w, "    note: %s\n", n)
	}
}

// describeRiskLabels says how many labels of each kind a risk fit weighed, and by what.
func describeRiskLabels(k *calibration.Risk) string {
	var parts []string
	if n := k.Labels[string(calibration.KindAbstention)]; n > 0 {
		parts = append(parts, fmt.Sprintf("%s reviewed abstentions × 1", thousandsInt(n)))
	}
	if n := k.Labels[string(calibration.KindAudit)]; n > 0 {
		var ws []string
		for _, s := range k.Strata {
			if s.Weight > 1 {
				ws = append(ws, fmt.Sprintf("%g", s.Weight))
			}
		}
		parts = append(parts, fmt.Sprintf("%s audit samples × %s", thousandsInt(n), strings.Join(ws, ", ")))
	}
	if n := k.Labels[string(calibration.KindProducer)]; n > 0 {
		parts = append(parts, fmt.Sprintf("%s producer labels × 1 (sampling unknown)", thousandsInt(n)))
	}
	return strings.Join(parts, ", ")
}

// fmtThreshold writes a threshold of the 0.001 grid with two to three decimals.
func fmtThreshold(t float64) string {
	return strings.TrimSuffix(strconv.FormatFloat(t, 'f', 3, 64), "0")
}

// pctG writes a share as a percentage without trailing zeros: 0.05 → 5%, 0.025 → 2.5%.
func pctG(v float64) string { return strconv.FormatFloat(math.Round(v*1e8)/1e6, 'f', -1, 64) + "%" }

// thousandsInt writes n with commas.
func thousandsInt(n int) string {
	s := strconv.Itoa(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

func describeCounts(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%d %s", m[k], k)
	}
	return strings.Join(parts, "; ")
}

func plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return fmt.Sprintf("%d %ss", n, word)
}

func pct(v float64) string { return fmt.Sprintf("%.1f%%", 100*v) }

func pctPtr(v *float64) string {
	if v == nil {
		return "–"
	}
	return pct(*v)
}

// calibrateList prints the stored fits, matching the filters.
func calibrateList(ctx context.Context, f calibrateFlags, stdout, stderr io.Writer) int {
	entries, code := readFits(ctx, stderr)
	if code != exitOK {
		return code
	}
	entries = slices.DeleteFunc(entries, func(e calibration.Entry) bool { return !matches(e, f) })
	if f.json {
		type item struct {
			Key      string           `json:"key"`
			Revision uint64           `json:"revision"`
			Created  time.Time        `json:"created"`
			Fit      *calibration.Fit `json:"fit,omitempty"`
			Error    string           `json:"error,omitempty"`
		}
		items := []item{}
		for _, e := range entries {
			it := item{Key: e.Key, Revision: e.Revision, Created: e.Created.UTC(), Fit: e.Fit}
			if e.Err != nil {
				it.Error = e.Err.Error()
			}
			items = append(items, it)
		}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(items); err != nil {
			fmt.Fprintf(stderr, "sys1 calibrate: %v\n", err)
			return exitFailed
		}
		return exitOK
	}
	if len(entries) == 0 {
		fmt.Fprintln(stdout, "no fits stored")
		return exitOK
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tMODEL\tCALLER\tQUESTION\tTYPE\tT\tN\tECE\tRISK\tFITTED\tREVISION")
	for _, e := range entries {
		if e.Err != nil {
			fmt.Fprintf(tw, "%s\t(unusable: %v)\t\t\t\t\t\t\t\t\t%d\n", e.Key, e.Err, e.Revision)
			continue
		}
		fit := e.Fit
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%.3f\t%d\t%.3f → %.3f\t%s\t%s\t%d\n", e.Key, fit.Model, fit.Caller, fit.Question, fit.Type, fit.Temperature, fit.N, fit.Before.ECE, fit.After.ECE, riskColumn(fit.Risk), fit.FittedAt.Format("2006-01-02 15:04"), e.Revision)
	}
	_ = tw.Flush()
	return exitOK
}

// riskColumn is the RISK column of --list: the stored risk threshold and what it was fitted
// for, "abstain all" when no threshold met the target, "–" without a risk fit.
func riskColumn(r *calibration.Risk) string {
	if r == nil {
		return "–"
	}
	if r.AbstainAll {
		return fmt.Sprintf("abstain all (ε %.3g)", r.TargetError)
	}
	return fmt.Sprintf("%s ≥ %.3f (ε %.3g, coverage %.3f)", r.ThresholdOn, r.Threshold, r.TargetError, r.Coverage)
}

// matches reports whether a stored entry passes the --model/--caller/--question filters (an
// unusable entry is matched on the names its key gives).
func matches(e calibration.Entry, f calibrateFlags) bool {
	model, caller, question, err := calibration.ParseKey(e.Key)
	if err != nil {
		return f.model == "" && f.caller == "" && f.question == ""
	}
	return (f.model == "" || f.model == model) && (f.caller == "" || f.caller == caller) && (f.question == "" || f.question == question)
}

func readFits(ctx context.Context, stderr io.Writer) ([]calibration.Entry, int) {
	topo := topology.Default()
	if err := loadConfig(&topo); err != nil {
		fmt.Fprintln(stderr, "sys1 calibrate:", err)
		return nil, exitUsage
	}
	conn, err := dialClient(ctx, "sys1 calibrate", stderr)
	if err != nil {
		fmt.Fprintf(stderr, "sys1 calibrate: %v\n", err)
		return nil, exitUsage
	}
	defer conn.Close()
	kv, err := calibrationBucket(ctx, conn.JS, topo, false)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, exitOK // nothing was ever stored
	}
	if err != nil {
		fmt.Fprintf(stderr, "sys1 calibrate: %v\n", err)
		return nil, exitUsage
	}
	lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	entries, err := calibration.List(lctx, kv)
	if err != nil {
		fmt.Fprintf(stderr, "sys1 calibrate: %v\n", err)
		return nil, exitFailed
	}
	return entries, exitOK
}

// calibrateDelete deletes the fits under the given keys, or every stored fit matching the
// filters (at least one filter: deleting everything takes naming it).
func calibrateDelete(ctx context.Context, f calibrateFlags, keys []string, stdout, stderr io.Writer) int {
	filtered := f.model != "" || f.caller != "" || f.question != ""
	switch {
	case len(keys) > 0 && filtered:
		fmt.Fprintln(stderr, "sys1 calibrate: --delete takes KEYs or --model/--caller/--question, not both")
		return exitUsage
	case len(keys) == 0 && !filtered:
		fmt.Fprintln(stderr, "sys1 calibrate: --delete needs KEYs (see --list) or at least one of --model, --caller, --question")
		return exitUsage
	}
	for _, k := range keys {
		if _, _, _, err := calibration.ParseKey(k); err != nil {
			fmt.Fprintf(stderr, "sys1 calibrate: %v\n", err)
			return exitUsage
		}
	}
	topo := topology.Default()
	if err := loadConfig(&topo); err != nil {
		fmt.Fprintln(stderr, "sys1 calibrate:", err)
		return exitUsage
	}
	conn, err := dialClient(ctx, "sys1 calibrate", stderr)
	if err != nil {
		fmt.Fprintf(stderr, "sys1 calibrate: %v\n", err)
		return exitUsage
	}
	defer conn.Close()
	kv, err := calibrationBucket(ctx, conn.JS, topo, false)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		fmt.Fprintf(stderr, "sys1 calibrate: no fits stored (bucket %s does not exist)\n", topo.CalibrationBucket)
		return exitFailed
	}
	if err != nil {
		fmt.Fprintf(stderr, "sys1 calibrate: %v\n", err)
		return exitUsage
	}
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if filtered {
		entries, err := calibration.List(dctx, kv)
		if err != nil {
			fmt.Fprintf(stderr, "sys1 calibrate: %v\n", err)
			return exitFailed
		}
		for _, e := range entries {
			if matches(e, f) {
				keys = append(keys, e.Key)
			}
		}
		if len(keys) == 0 {
			fmt.Fprintf(stderr, "sys1 calibrate: no stored fit matches%s\n", describeFilters(labelQuery{model: f.model, caller: f.caller, question: f.question}.filters()))
			return exitFailed
		}
	}
	code := exitOK
	for _, k := range keys {
		if err := calibration.Delete(dctx, kv, k); err != nil {
			fmt.Fprintf(stderr, "sys1 calibrate: %v\n", err)
			code = exitFailed
			continue
		}
		fmt.Fprintf(stdout, "deleted %s\n", k)
	}
	return code
}
