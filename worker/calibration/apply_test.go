package calibration

import (
	"math"
	"strings"
	"testing"

	"github.com/sys1hq/sys1/contract"
)

func choiceAnswer(probs ...contract.Probability) *contract.Answer {
	return &contract.Answer{Name: "label", Type: contract.TypeChoice, Probabilities: probs}
}

func TestCalibrationApplyChoiceFormula(t *testing.T) {
	f := &Fit{Type: contract.TypeChoice, Temperature: 2, Question: "label"}
	// Arrival order is kept, whatever the probabilities.
	a := choiceAnswer(contract.Probability{Key: "bug", P: 0.2}, contract.Probability{Key: "billing", P: 0.7}, contract.Probability{Key: "account", P: 0.1})
	c, err := Apply(f, a)
	if err != nil {
		t.Fatal(err)
	}
	z := math.Sqrt(0.2) + math.Sqrt(0.7) + math.Sqrt(0.1)
	want := []float64{math.Sqrt(0.2) / z, math.Sqrt(0.7) / z, math.Sqrt(0.1) / z}
	h := 0.0
	for i, p := range c.Probabilities {
		if p.Key != a.Probabilities[i].Key || math.Abs(p.P-want[i]) > 1e-12 {
			t.Errorf("probability %d = %+v, want %s %v", i, p, a.Probabilities[i].Key, want[i])
		}
		h -= want[i] * math.Log(want[i])
	}
	if c.Confidence == nil || math.Abs(*c.Confidence-(1-h/math.Log(3))) > 1e-12 {
		t.Errorf("confidence = %v, want 1 − H/ln 3 = %v", c.Confidence, 1-h/math.Log(3))
	}
	if c.Noul != nil || c.Temperature != 2 {
		t.Errorf("calibrated = %+v", c)
	}
	if a.Probabilities[0].P != 0.2 {
		t.Error("Apply changed the answer")
	}
}

func TestCalibrationApplyIdentityAndTies(t *testing.T) {
	a := &contract.Answer{Type: contract.TypeScore, Probabilities: []contract.Probability{{Key: "0", P: 0.1}, {Key: "1", P: 0.6}, {Key: "2", P: 0.3}}}
	c, err := ApplyTemperature(1, a)
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range c.Probabilities {
		if math.Abs(p.P-a.Probabilities[i].P) > 1e-15 {
			t.Errorf("T = 1 changed %s: %v → %v", p.Key, a.Probabilities[i].P, p.P)
		}
	}
	// An exact tie for the top stays a tie, and reports confidence 0 as upstream does.
	tie := choiceAnswer(contract.Probability{Key: "a", P: 0.4}, contract.Probability{Key: "b", P: 0.4}, contract.Probability{Key: "c", P: 0.2})
	c, err = ApplyTemperature(0.5, tie)
	if err != nil {
		t.Fatal(err)
	}
	if c.Probabilities[0].P != c.Probabilities[1].P || *c.Confidence != 0 {
		t.Errorf("tie: %+v confidence %v", c.Probabilities, *c.Confidence)
	}
	// A zero is treated as Epsilon, as when fitting.
	zero := choiceAnswer(contract.Probability{Key: "a", P: 1}, contract.Probability{Key: "b", P: 0})
	c, _ = ApplyTemperature(2, zero)
	if want := math.Sqrt(Epsilon) / (1 + math.Sqrt(Epsilon)); math.Abs(c.Probabilities[1].P-want) > 1e-15 {
		t.Errorf("zero → %v, want %v", c.Probabilities[1].P, want)
	}
}

func TestCalibrationApplyNoul(t *testing.T) {
	f := &Fit{Type: contract.TypeNoul, Temperature: 2}
	c, err := Apply(f, &contract.Answer{Type: contract.TypeNoul, Noul: 0.9})
	if err != nil {
		t.Fatal(err)
	}
	// √0.9 / (√0.9 + √0.1) = 3/4.
	if c.Noul == nil || math.Abs(*c.Noul-0.75) > 1e-12 || c.Confidence != nil || c.Probabilities != nil {
		t.Errorf("noul 0.9 at T = 2: %+v", c)
	}
	// The two-class formula is the general one on [1 − P, P].
	for _, p := range []float64{0, 1e-9, 0.03, 0.5, 0.77, 1} {
		for _, T := range []float64{0.05, 0.6, 1, 2.5, 20} {
			c, _ := ApplyTemperature(T, &contract.Answer{Type: contract.TypeNoul, Noul: p})
			two := []float64{1 - p, p}
			scaleInto(two, two, 1/T)
			if math.Abs(*c.Noul-two[1]) > 1e-12 {
				t.Errorf("P %v T %v: %v, general form %v", p, T, *c.Noul, two[1])
			}
		}
	}
}

func TestCalibrationApplyRefuses(t *testing.T) {
	good := choiceAnswer(contract.Probability{Key: "a", P: 0.6}, contract.Probability{Key: "b", P: 0.4})
	for _, tc := range []struct {
		name string
		fit  *Fit
		a    *contract.Answer
		want string
	}{
		{"another type", &Fit{Type: contract.TypeScore, Temperature: 1, Question: "label"}, good, "is for a score question, the answer is choice"},
		{"T below the bound", &Fit{Type: contract.TypeChoice, Temperature: 0.01}, good, "outside"},
		{"T NaN", &Fit{Type: contract.TypeChoice, Temperature: math.NaN()}, good, "outside"},
		{"one probability", &Fit{Type: contract.TypeChoice, Temperature: 1}, choiceAnswer(contract.Probability{Key: "a", P: 1}), "need at least 2"},
		{"NaN probability", &Fit{Type: contract.TypeChoice, Temperature: 1}, choiceAnswer(contract.Probability{Key: "a", P: math.NaN()}, contract.Probability{Key: "b", P: 0.5}), "not in [0, 1]"},
		{"noul above 1", &Fit{Type: contract.TypeNoul, Temperature: 1}, &contract.Answer{Type: contract.TypeNoul, Noul: 1.5}, "not a probability"},
	} {
		if _, err := Apply(tc.fit, tc.a); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
}
