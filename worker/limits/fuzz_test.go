package limits

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzParseLimits: any bytes either parse into rules that keep every invariant the budget
// relies on, or fail with a *FileError whose problems name lines within the file. Never a
// panic, never a half-parsed result.
func FuzzParseLimits(f *testing.F) {
	f.Add([]byte(goodLimits))
	f.Add([]byte("rules:\n  - caller: a\n    usd_per_day: -1\n    cache: 1 day\n"))
	f.Add([]byte("rules:\n  - &r {caller: a, in_flight: 1}\n  - *r\n"))
	f.Add([]byte("rules: [{caller: '*', decisions_per_minute: 1e9, cache: off}]\n"))
	f.Add([]byte("a: &a [*a]\n"))
	f.Add([]byte("rules:\n- caller: \"x\\\\\"\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		l, err := ParseLimits(data)
		if err != nil {
			checkFileError(t, err, data)
			if l != nil {
				t.Fatal("a refused file returned limits")
			}
			return
		}
		names := map[string]bool{}
		for _, r := range l.Rules {
			if globProblem(r.Caller) != "" || r.Name == "" || names[r.Name] {
				t.Fatalf("bad rule accepted: %+v", r)
			}
			names[r.Name] = true
			if r.DecisionsPerMinute < 0 || r.InputTokensPerDay < 0 || r.USDPerDay < 0 || r.InFlight < 0 ||
				r.InFlight > maxInFlight || r.USDPerDay > maxUSDPerDay || r.Cache < 0 || r.Cache > maxCache ||
				r.Cache > 0 && r.Cache < minCache || r.CacheOff && r.Cache != 0 {
				t.Fatalf("limit out of range accepted: %+v", r)
			}
			if !globMatch(r.Caller, strings.ReplaceAll(strings.ReplaceAll(r.Caller, "*", ""), "\\", "")) && !strings.ContainsAny(r.Caller, "?\\") {
				t.Fatalf("glob %q does not match its own literal text", r.Caller)
			}
		}
	})
}

// FuzzParsePrices: the same for prices: accepted prices are finite, non-negative and bounded.
func FuzzParsePrices(f *testing.F) {
	f.Add([]byte(goodPrices))
	f.Add([]byte("providers:\n  ollama:\n    nimble:\n      input_per_million: abc\n"))
	f.Add([]byte("providers:\n  ollama:\n    a: {input_per_million: 1, output_per_million: 2}\n    a:latest: {input_per_million: 1, output_per_million: 2}\n"))
	f.Add([]byte("providers: {x: {m: {input_per_million: '1e3', output_per_million: .inf}}}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := ParsePrices(data)
		if err != nil {
			checkFileError(t, err, data)
			if p != nil {
				t.Fatal("a refused file returned prices")
			}
			return
		}
		for k, pr := range p.byModel {
			for _, v := range []float64{pr.InputPerMillion, pr.OutputPerMillion, pr.PerRequest} {
				if !(v >= 0 && v <= maxPrice) {
					t.Fatalf("%q: price out of range accepted: %+v", k, pr)
				}
			}
		}
	})
}

func checkFileError(t *testing.T, err error, data []byte) {
	t.Helper()
	var fe *FileError
	if !errors.As(err, &fe) || len(fe.Problems) == 0 {
		t.Fatalf("not a *FileError with problems: %v", err)
	}
	if len(fe.Problems) > maxListed {
		t.Fatalf("%d problems listed", len(fe.Problems))
	}
	lines := strings.Count(string(data), "\n") + strings.Count(string(data), "\r") + 1 // YAML breaks lines at \r too
	for _, p := range fe.Problems {
		if p.Line < 0 || p.Line > lines+1 {
			t.Fatalf("problem at line %d of a %d-line file: %s", p.Line, lines, p)
		}
	}
	if !utf8.ValidString(err.Error()) {
		t.Fatalf("message is not valid UTF-8: %q", err.Error())
	}
}
