package calibration

import (
	"testing"

	"github.com/sys1hq/sys1/contract"
)

// One fit on 10,000 labels (issue 13: well under a second). FitTemperature is the search
// alone; Calibrate adds the before and after metrics, as `sys1 calibrate` runs it.
func BenchmarkFitTemperature10k(b *testing.B) {
	for _, typ := range allTypes {
		samples, _ := synth(typ, 10_000, 2.5, 1)
		b.Run(string(typ), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := FitTemperature(samples); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkCalibrate10k(b *testing.B) {
	samples, _ := synth(contract.TypeChoice, 10_000, 2.5, 1)
	g := group(contract.TypeChoice, samples)
	o := Options{Measure: MeasureOptions{Thresholds: []float64{0.5, 0.7, 0.9}, ThresholdOn: OnConfidence}}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Calibrate(g, o); err != nil {
			b.Fatal(err)
		}
	}
}
