package calibration

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/sys1hq/sys1/contract"
)

// FormatVersion is the version of the Fit JSON this package writes and reads.
const FormatVersion = 1

// Fit is one stored calibration: the KV value under Key(Model, Caller, Question).
type Fit struct {
	Format   int                   `json:"format"`
	Model    string                `json:"model"`
	Caller   string                `json:"caller"`
	Question string                `json:"question"`
	Type     contract.QuestionType `json:"type"`
	// Temperature is T of p' ∝ p^(1/T).
	Temperature float64 `json:"temperature"`
	// N is the number of labels fitted; Skipped counts the rows left out, per reason.
	N       int            `json:"n"`
	Skipped map[string]int `json:"skipped,omitempty"`
	// Converged is false when the fit stopped on a bound or did not settle; Note says why.
	Converged bool   `json:"converged"`
	Note      string `json:"note,omitempty"`
	// ThresholdOn is the value the coverage thresholds were compared with.
	ThresholdOn ThresholdOn `json:"threshold_on"`
	Before      Metrics     `json:"before"`
	After       Metrics     `json:"after"`
	FittedAt    time.Time   `json:"fitted_at"`
	Window      Window      `json:"window"`
	// Risk is the risk fit (sys1 calibrate --target-error), nil without one. A fit stored for
	// its risk part although its temperature did not converge has Temperature 1 and Converged
	// false, and workers do not apply its temperature.
	Risk *Risk `json:"risk,omitempty"`
	// Evaluation is the latest scheduled evaluation (sys1 calibrate --report --apply), which
	// the workers export as metrics; nil until one ran.
	Evaluation *Evaluation `json:"evaluation,omitempty"`
}

// Window is the label window a fit learnt from: the query's bounds [Since, Until) on
// labelled_at, and the first and last label actually in it.
type Window struct {
	Since      time.Time `json:"since"`
	Until      time.Time `json:"until"`
	FirstLabel time.Time `json:"first_label"`
	LastLabel  time.Time `json:"last_label"`
}

// Key is the fit's KV key.
func (f *Fit) Key() string { return Key(f.Model, f.Caller, f.Question) }

// AppliesTemperature reports whether workers apply the fit's temperature: only a converged
// one (a fit stored for its risk threshold alone carries T = 1, not converged).
func (f *Fit) AppliesTemperature() bool { return f.Converged }

// Validate checks what a worker relies on before applying a fit: the format, the names, a
// question type and a finite temperature within the bounds.
func (f *Fit) Validate() error {
	var errs []string
	if f.Format != FormatVersion {
		errs = append(errs, fmt.Sprintf("format %d, this sys1 reads format %d", f.Format, FormatVersion))
	}
	if f.Model == "" {
		errs = append(errs, "model is empty")
	}
	if f.Question == "" {
		errs = append(errs, "question is empty")
	}
	switch f.Type {
	case contract.TypeChoice, contract.TypeNoul, contract.TypeScore:
	default:
		errs = append(errs, fmt.Sprintf("type %q is not choice, noul or score", string(f.Type)))
	}
	if math.IsNaN(f.Temperature) || f.Temperature < MinTemperature || f.Temperature > MaxTemperature {
		errs = append(errs, fmt.Sprintf("temperature %v is outside [%g, %g]", f.Temperature, MinTemperature, MaxTemperature))
	}
	if f.N < 1 {
		errs = append(errs, fmt.Sprintf("n %d: a fit needs labels", f.N))
	}
	if f.Risk != nil {
		if err := f.Risk.Validate(); err != nil {
			errs = append(errs, err.Error())
		}
		if f.Risk.Calibrated && !f.Converged {
			errs = append(errs, "the risk thresholds are on calibrated values, but the temperature did not converge (and is not applied)")
		}
	}
	if len(errs) > 0 {
		return errors.New(strings.Join(errs, "; "))
	}
	return nil
}

// Group is the labelled answers of one (model, caller, question), ready to fit.
type Group struct {
	Model, Caller, Question string
	Type                    contract.QuestionType
	Samples                 []Sample
	// FirstLabel and LastLabel are the earliest and latest labelled_at among Samples.
	FirstLabel, LastLabel time.Time
	// Skipped counts the group's rows that could not be used, per reason.
	Skipped map[SkipReason]int
}

// Options set how Calibrate fits and measures.
type Options struct {
	// MinLabels is the fewest samples a fit is made from (DefaultMinLabels when 0).
	MinLabels int
	Measure   MeasureOptions
	// Since and Until are the label window's bounds, recorded in the fit.
	Since, Until time.Time
	// Now is the fit's fitted_at (time.Now when zero).
	Now time.Time
}

// NoFitReason says why a group got no fit.
type NoFitReason string

// The reasons a group gets no fit.
const (
	NoFitTooFewLabels NoFitReason = "too few labels"
	NoFitOneClass     NoFitReason = "all labels one class"
)

// NoFitError is Calibrate's answer for a group it will not fit.
type NoFitError struct {
	Reason  NoFitReason
	Message string
}

func (e *NoFitError) Error() string { return e.Message }

// Calibrate fits one temperature to g and measures it before and after. It refuses (a
// *NoFitError) a group with fewer than MinLabels samples, and one whose labels are all the
// same class: a temperature learnt from one class only pushes every answer toward it, which
// says nothing about the answers of the other classes. A fit that stopped on a bound is
// returned with Converged false.
func Calibrate(g Group, o Options) (Fit, error) {
	minLabels := o.MinLabels
	if minLabels <= 0 {
		minLabels = DefaultMinLabels
	}
	if len(g.Samples) < minLabels {
		return Fit{}, &NoFitError{Reason: NoFitTooFewLabels, Message: fmt.Sprintf("%d usable labels, at least %d needed (--min-labels)%s", len(g.Samples), minLabels, skippedNote(g.Skipped))}
	}
	if one, ok := oneClass(g.Samples); ok {
		return Fit{}, &NoFitError{Reason: NoFitOneClass, Message: fmt.Sprintf("all %d labels are %s: a temperature needs labels of at least two classes", len(g.Samples), one)}
	}
	t, err := FitTemperature(g.Samples)
	if err != nil {
		return Fit{}, err
	}
	now := o.Now
	if now.IsZero() {
		now = time.Now()
	}
	f := Fit{
		Format: FormatVersion, Model: g.Model, Caller: g.Caller, Question: g.Question, Type: g.Type,
		Temperature: t.T, N: len(g.Samples), Converged: t.Converged, Note: t.Note,
		ThresholdOn: o.Measure.ThresholdOn,
		Before:      MeasureRaw(g.Type, g.Samples, o.Measure),
		After:       MeasureCalibrated(g.Type, g.Samples, t.T, o.Measure),
		FittedAt:    now.UTC(),
		Window:      Window{Since: o.Since.UTC(), Until: o.Until.UTC(), FirstLabel: g.FirstLabel.UTC(), LastLabel: g.LastLabel.UTC()},
	}
	if len(g.Skipped) > 0 {
		f.Skipped = make(map[string]int, len(g.Skipped))
		for r, n := range g.Skipped {
			f.Skipped[string(r)] = n
		}
	}
	return f, nil
}

// RiskOnlyFit is the fit of a group that gets no temperature (why says why) but may still get
// a risk threshold: T = 1, not converged (so never applied), measured as the provider sent
// the answers.
func RiskOnlyFit(g Group, o Options, why string) Fit {
	now := o.Now
	if now.IsZero() {
		now = time.Now()
	}
	raw := MeasureRaw(g.Type, g.Samples, o.Measure)
	f := Fit{
		Format: FormatVersion, Model: g.Model, Caller: g.Caller, Question: g.Question, Type: g.Type,
		Temperature: 1, N: len(g.Samples), Note: "no temperature: " + why, ThresholdOn: o.Measure.ThresholdOn,
		Before: raw, After: raw, FittedAt: now.UTC(),
		Window: Window{Since: o.Since.UTC(), Until: o.Until.UTC(), FirstLabel: g.FirstLabel.UTC(), LastLabel: g.LastLabel.UTC()},
	}
	if len(g.Skipped) > 0 {
		f.Skipped = make(map[string]int, len(g.Skipped))
		for r, n := range g.Skipped {
			f.Skipped[string(r)] = n
		}
	}
	return f
}

// oneClass reports whether every sample has the same label, and which (as an index).
func oneClass(samples []Sample) (string, bool) {
	first := samples[0].Label
	for _, s := range samples[1:] {
		if s.Label != first {
			return "", false
		}
	}
	if name := samples[0].LabelName; name != "" {
		return fmt.Sprintf("%q", name), true
	}
	return fmt.Sprintf("class #%d", first), true
}

func skippedNote(skipped map[SkipReason]int) string {
	n := 0
	for _, c := range skipped {
		n += c
	}
	if n == 0 {
		return ""
	}
	return fmt.Sprintf("; %d more rows were skipped as unusable", n)
}
