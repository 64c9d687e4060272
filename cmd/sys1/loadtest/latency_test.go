package loadtest

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// samples returns 1ms … n ms.
func samples(n int) []time.Duration {
	s := make([]time.Duration, n)
	for i := range s {
		s[i] = time.Duration(i+1) * time.Millisecond
	}
	return s
}

func TestPercentile(t *testing.T) {
	hundred, thousand := samples(100), samples(1000)
	for _, tc := range []struct {
		name    string
		samples []time.Duration
		p       float64
		want    time.Duration
	}{
		{"empty", nil, 50, 0},
		{"single p0", []time.Duration{7}, 0, 7},
		{"single p50", []time.Duration{7}, 50, 7},
		{"single p100", []time.Duration{7}, 100, 7},
		{"p0 is min", hundred, 0, 1 * time.Millisecond},
		{"p1", hundred, 1, 1 * time.Millisecond},
		{"p50", hundred, 50, 50 * time.Millisecond},
		{"p90", hundred, 90, 90 * time.Millisecond},
		{"p99", hundred, 99, 99 * time.Millisecond},
		{"p99.5 rounds up", hundred, 99.5, 100 * time.Millisecond},
		{"p100 is max", hundred, 100, 100 * time.Millisecond},
		// p99.9 of 1000 is rank 999 exactly; 99.9/100 × 1000 in floating point is 999.0000000000001.
		{"p99.9 of 1000", thousand, 99.9, 999 * time.Millisecond},
		{"p99.9 of 41000", samples(41000), 99.9, 40959 * time.Millisecond},
		{"p99.9 of 1001", samples(1001), 99.9, 1000 * time.Millisecond},
		{"above 100 clamps", hundred, 150, 100 * time.Millisecond},
		{"negative clamps", hundred, -3, 1 * time.Millisecond},
		// Nearest rank of 4 samples: p50 → rank 2, p51 → rank 3, p75 → rank 3, p76 → rank 4.
		{"four p50", []time.Duration{10, 20, 30, 40}, 50, 20},
		{"four p51", []time.Duration{10, 20, 30, 40}, 51, 30},
		{"four p75", []time.Duration{10, 20, 30, 40}, 75, 30},
		{"four p76", []time.Duration{10, 20, 30, 40}, 76, 40},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Percentile(tc.samples, tc.p); got != tc.want {
				t.Fatalf("Percentile(p%g) = %s, want %s", tc.p, got, tc.want)
			}
		})
	}
}

func TestSummarizeSortsAndSummarizes(t *testing.T) {
	samples := make([]time.Duration, 1000)
	for i := range samples {
		samples[i] = time.Duration(i+1) * time.Millisecond
	}
	rand.Shuffle(len(samples), func(i, j int) { samples[i], samples[j] = samples[j], samples[i] })
	s := Summarize(samples)
	want := Summary{Count: 1000, MinMS: 1, P50MS: 500, P90MS: 900, P99MS: 990, MaxMS: 1000, MeanMS: 500.5}
	if s != want {
		t.Fatalf("Summarize = %+v, want %+v", s, want)
	}
	if !slices.IsSorted(samples) {
		t.Fatal("Summarize should leave the samples sorted")
	}
	if got := Summarize(nil); got != (Summary{}) {
		t.Fatalf("Summarize(nil) = %+v, want zero", got)
	}
}

func TestSummarizeKeepsMicroseconds(t *testing.T) {
	s := Summarize([]time.Duration{1500 * time.Microsecond, 250 * time.Microsecond})
	if s.MinMS != 0.25 || s.MaxMS != 1.5 || s.P50MS != 0.25 {
		t.Fatalf("sub-millisecond samples lost precision: %+v", s)
	}
}
