package calibration

import (
	"math"
	"testing"

	"github.com/sys1hq/sys1/contract"
)

func near(a, b float64) bool { return math.Abs(a-b) < 1e-12 }

// Four answers worked by hand.
func TestCalibrationMeasureByHand(t *testing.T) {
	nan := math.NaN()
	samples := []Sample{
		{Probs: []float64{0.8, 0.1, 0.1}, Label: 0, Confidence: nan},   // top 0.8, right, bin 12
		{Probs: []float64{0.8, 0.15, 0.05}, Label: 1, Confidence: nan}, // top 0.8, wrong, bin 12
		{Probs: []float64{0.5, 0.3, 0.2}, Label: 0, Confidence: nan},   // top 0.5, right, bin 7
		{Probs: []float64{0.2, 0.2, 0.6}, Label: 2, Confidence: nan},   // top 0.6, right, bin 9
	}
	m := MeasureRaw(contract.TypeChoice, samples, MeasureOptions{Thresholds: []float64{0.6, 0.9}, ThresholdOn: OnProbability})
	// Bin 12: 2 answers, mean 0.8, half right: 2/4·0.3; bin 7: 1/4·|1 − 0.5|; bin 9: 1/4·|1 − 0.6|.
	if want := 0.5*0.3 + 0.25*0.5 + 0.25*0.4; !near(m.ECE, want) {
		t.Errorf("ECE = %v, want %v", m.ECE, want)
	}
	if want := (0.06 + (0.64 + 0.7225 + 0.0025) + 0.38 + 0.24) / 4; !near(m.Brier, want) {
		t.Errorf("Brier = %v, want %v", m.Brier, want)
	}
	if want := -(math.Log(0.8) + math.Log(0.15) + math.Log(0.5) + math.Log(0.6)) / 4; !near(m.NLL, want) {
		t.Errorf("NLL = %v, want %v", m.NLL, want)
	}
	if m.Accuracy != 0.75 {
		t.Errorf("accuracy = %v", m.Accuracy)
	}
	if c := m.Coverage[0]; c.Threshold != 0.6 || c.Coverage != 0.75 || c.Decided != 3 || c.Accuracy == nil || !near(*c.Accuracy, 2.0/3) {
		t.Errorf("coverage at 0.6 = %+v", c)
	}
	if c := m.Coverage[1]; c.Coverage != 0 || c.Decided != 0 || c.Accuracy != nil {
		t.Errorf("coverage at 0.9 = %+v, want nothing decided and no accuracy", c)
	}
	if len(m.Bins) != 3 || m.Bins[0].Count != 1 || !near(m.Bins[0].Lower, 7.0/15) || m.Bins[2].Count != 2 || m.Bins[2].Accuracy != 0.5 || !near(m.Bins[2].Confidence, 0.8) {
		t.Errorf("bins = %+v", m.Bins)
	}

	// On confidence, the reported confidence is used when there is one, else 1 − H/ln N.
	samples[0].Confidence = 0.95
	m = MeasureRaw(contract.TypeChoice, samples, MeasureOptions{Thresholds: []float64{0.9}, ThresholdOn: OnConfidence})
	if c := m.Coverage[0]; c.Decided != 1 {
		t.Errorf("on confidence: %+v, want only the answer reporting 0.95", c)
	}
}

func TestCalibrationMeasureNoul(t *testing.T) {
	samples := []Sample{
		{Probs: []float64{0.5, 0.5}, Label: 1}, // P = 0.5 counts as true (labelled_answers.predicted): right
		{Probs: []float64{0.3, 0.7}, Label: 0}, // wrong
		{Probs: []float64{0.9, 0.1}, Label: 0}, // right, top 0.9
	}
	m := MeasureRaw(contract.TypeNoul, samples, MeasureOptions{Thresholds: []float64{0.8}, ThresholdOn: OnConfidence})
	if !near(m.Accuracy, 2.0/3) {
		t.Errorf("accuracy = %v", m.Accuracy)
	}
	// Binary Brier on P(true).
	if want := (0.25 + 0.49 + 0.01) / 3; !near(m.Brier, want) {
		t.Errorf("Brier = %v, want %v", m.Brier, want)
	}
	// Noul has no confidence: max(P, 1 − P) ≥ 0.8 decides only the third.
	if c := m.Coverage[0]; c.Decided != 1 || *c.Accuracy != 1 {
		t.Errorf("coverage = %+v", c)
	}
}

func TestCalibrationMeasureCalibratedMatchesApply(t *testing.T) {
	samples, _ := synth(contract.TypeChoice, 300, 2, 11)
	const T = 1.8
	got := MeasureCalibrated(contract.TypeChoice, samples, T, MeasureOptions{Thresholds: []float64{0.3}, ThresholdOn: OnConfidence})
	// The same answers through Apply, measured raw: identical figures.
	applied := make([]Sample, len(samples))
	for i, s := range samples {
		a := contract.Answer{Type: contract.TypeChoice}
		for j, p := range s.Probs {
			a.Probabilities = append(a.Probabilities, contract.Probability{Key: string(rune('a' + j)), P: p})
		}
		c, err := ApplyTemperature(T, &a)
		if err != nil {
			t.Fatal(err)
		}
		ps := make([]float64, len(c.Probabilities))
		for j, p := range c.Probabilities {
			ps[j] = p.P
		}
		applied[i] = Sample{Probs: ps, Label: s.Label, Confidence: *c.Confidence}
	}
	want := MeasureRaw(contract.TypeChoice, applied, MeasureOptions{Thresholds: []float64{0.3}, ThresholdOn: OnConfidence})
	if !near(got.ECE, want.ECE) || !near(got.Brier, want.Brier) || !near(got.NLL, want.NLL) || got.Coverage[0].Decided != want.Coverage[0].Decided {
		t.Errorf("MeasureCalibrated %+v\nApply then MeasureRaw %+v", got, want)
	}
}

func TestCalibrationParseThresholds(t *testing.T) {
	got, err := ParseThresholds([]float64{0.7, 0.5, 0.7})
	if err != nil || len(got) != 2 || got[0] != 0.5 || got[1] != 0.7 {
		t.Errorf("ParseThresholds = %v, %v", got, err)
	}
	for _, bad := range []float64{-0.1, 1.01, math.NaN()} {
		if _, err := ParseThresholds([]float64{bad}); err == nil {
			t.Errorf("threshold %v accepted", bad)
		}
	}
	if _, err := ParseThresholdOn("entropy"); err == nil {
		t.Error("ParseThresholdOn accepted entropy")
	}
}
