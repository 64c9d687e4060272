package plot

import (
	"bytes"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/worker/calibration"
	"github.com/sys1hq/sys1/worker/calibration/synthetic"
)

func TestCalibrationWritePNG(t *testing.T) {
	f := exampleFit(t)
	var buf bytes.Buffer
	if err := WritePNG(&buf, f); err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(&buf)
	if err != nil {
		t.Fatalf("not a PNG: %v", err)
	}
	if b := img.Bounds(); b.Dx() != 1320 || b.Dy() != 770 {
		t.Errorf("size %v, want 1320×770", b)
	}
	// SYS1_PLOT_OUT=DIR writes example diagrams there, to look at.
	if dir := os.Getenv("SYS1_PLOT_OUT"); dir != "" {
		for _, ex := range []*calibration.Fit{f, exampleFitOf(t, contract.TypeNoul, "refund_requested", 0.6, 300), exampleFitOf(t, contract.TypeScore, "urgency", 1.6, 5000)} {
			if err := SavePNG(filepath.Join(dir, ex.Key()+".png"), ex); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// exampleFit fits an overconfident synthetic model.
func exampleFit(t *testing.T) *calibration.Fit {
	return exampleFitOf(t, contract.TypeChoice, "label", 2.5, 2000)
}

func exampleFitOf(t *testing.T, typ contract.QuestionType, question string, distort float64, n int) *calibration.Fit {
	t.Helper()
	g := calibration.Group{Model: "nimble", Caller: "billing", Question: question, Type: typ,
		FirstLabel: time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC), LastLabel: time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC)}
	for _, a := range synthetic.Generate(typ, n, distort, 1) {
		g.Samples = append(g.Samples, calibration.Sample{Probs: a.Reported, Label: a.Label, Confidence: math.NaN()})
	}
	f, err := calibration.Calibrate(g, calibration.Options{Measure: calibration.MeasureOptions{Thresholds: []float64{0.5, 0.7}, ThresholdOn: calibration.OnProbability}})
	if err != nil {
		t.Fatal(err)
	}
	return &f
}
