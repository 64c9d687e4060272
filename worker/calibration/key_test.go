package calibration

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sys1hq/sys1/contract"
)

// The KV key alphabet of nats.go (jetstream.keyValid): these characters, no empty token.
var kvKey = regexp.MustCompile(`^[-/_=.a-zA-Z0-9]+$`)

func validKVKey(k string) bool {
	return kvKey.MatchString(k) && !strings.HasPrefix(k, ".") && !strings.HasSuffix(k, ".") && !strings.Contains(k, "..")
}

func TestCalibrationKey(t *testing.T) {
	for _, tc := range []struct{ model, caller, question, want string }{
		{"nimble", "billing", "refund_requested", "nimble.billing.refund_requested"},
		{"nimble:latest", "svc-a", "label", "nimble=3Alatest.svc-a.label"},
		{"hf.co/x/m:q4", "c", "urgency level", "hf=2Eco=2Fx=2Fm=3Aq4.c.urgency=20level"},
		{"m", "", "q", "m.=.q"},
		{"m", "c", "=", "m.c.=3D"},
		{"m", "c", "dringlichkeit-ä", "m.c.dringlichkeit-=C3=A4"},
	} {
		got := Key(tc.model, tc.caller, tc.question)
		if got != tc.want || !validKVKey(got) {
			t.Errorf("Key(%q, %q, %q) = %q, want %q (a valid KV key)", tc.model, tc.caller, tc.question, got, tc.want)
		}
		m, c, q, err := ParseKey(got)
		if err != nil || m != tc.model || c != tc.caller || q != tc.question {
			t.Errorf("ParseKey(%q) = %q, %q, %q, %v", got, m, c, q, err)
		}
	}
	// Names containing the separator cannot collide.
	if Key("a.b", "c", "d") == Key("a", "b.c", "d") {
		t.Error("separator inside a name collides")
	}
	for _, bad := range []string{"a.b", "a.b.c.d", "a..c", "a.b.=3", "a.b.=3a", "a.b.=41", "a.b.c*", "a.b.=G0"} {
		if _, _, _, err := ParseKey(bad); err == nil {
			t.Errorf("ParseKey(%q) accepted", bad)
		}
	}
}

func FuzzCalibrationKey(f *testing.F) {
	f.Add("nimble:latest", "billing", "refund_requested")
	f.Add("", "=", ".")
	f.Add("a.b", "=3A", "\xff")
	f.Fuzz(func(t *testing.T, model, caller, question string) {
		k := Key(model, caller, question)
		if !validKVKey(k) {
			t.Fatalf("Key(%q, %q, %q) = %q is not a valid KV key", model, caller, question, k)
		}
		m, c, q, err := ParseKey(k)
		if err != nil || m != model || c != caller || q != question {
			t.Fatalf("ParseKey(Key(%q, %q, %q)) = %q, %q, %q, %v", model, caller, question, m, c, q, err)
		}
	})
}

// FuzzParseKey: whatever ParseKey accepts is exactly what Key would write (one spelling per
// triple), and nothing panics.
func FuzzCalibrationParseKey(f *testing.F) {
	f.Add("nimble=3Alatest.billing.label")
	f.Add("m.=.q")
	f.Add("a.b.=41")
	f.Fuzz(func(t *testing.T, key string) {
		m, c, q, err := ParseKey(key)
		if err != nil {
			return
		}
		if back := Key(m, c, q); back != key {
			t.Fatalf("ParseKey(%q) = %q, %q, %q, which Key writes as %q", key, m, c, q, back)
		}
	})
}

func validFit() *Fit {
	return &Fit{
		Format: FormatVersion, Model: "nimble", Caller: "billing", Question: "label", Type: contract.TypeChoice,
		Temperature: 1.7, N: 120, Converged: true, ThresholdOn: OnConfidence,
		Before:   Metrics{ECE: 0.1, Brier: 0.3, NLL: 0.9, Accuracy: 0.8, Coverage: []CoveragePoint{}, Bins: []Bin{}},
		After:    Metrics{ECE: 0.02, Brier: 0.28, NLL: 0.7, Accuracy: 0.8, Coverage: []CoveragePoint{}, Bins: []Bin{}},
		FittedAt: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC),
		Window:   Window{Since: time.Date(2026, 10, 31, 12, 0, 0, 0, time.UTC), Until: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)},
	}
}

func TestCalibrationEncodeDecode(t *testing.T) {
	f := validFit()
	b, err := Encode(f)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Decode(f.Key(), b)
	if err != nil {
		t.Fatal(err)
	}
	again, _ := Encode(got)
	if string(again) != string(b) {
		t.Errorf("round trip changed the value:\n%s\n%s", b, again)
	}
	for _, field := range []string{`"temperature":1.7`, `"n":120`, `"fitted_at":"2026-11-30T12:00:00Z"`, `"window":{"since":"2026-10-31T12:00:00Z"`, `"converged":true`, `"model":"nimble"`} {
		if !strings.Contains(string(b), field) {
			t.Errorf("value lacks %s: %s", field, b)
		}
	}

	mutate := func(change func(m map[string]any)) []byte {
		var m map[string]any
		_ = json.Unmarshal(b, &m)
		change(m)
		out, _ := json.Marshal(m)
		return out
	}
	for _, tc := range []struct {
		name  string
		key   string
		value []byte
		want  string
	}{
		{"not JSON", f.Key(), []byte("{nope"), "not a fit"},
		{"an array", f.Key(), []byte("[]"), "not a fit"},
		{"T a string", f.Key(), mutate(func(m map[string]any) { m["temperature"] = "2" }), "not a fit"},
		{"T out of range", f.Key(), mutate(func(m map[string]any) { m["temperature"] = 50 }), "outside"},
		{"newer format", f.Key(), mutate(func(m map[string]any) { m["format"] = 2 }), "format 2"},
		{"no type", f.Key(), mutate(func(m map[string]any) { delete(m, "type") }), "type"},
		{"no labels", f.Key(), mutate(func(m map[string]any) { m["n"] = 0 }), "needs labels"},
		{"another model's fit", Key("other", "billing", "label"), b, "not of its key"},
		{"bad key", "nope", b, "model.caller.question"},
		{"huge", f.Key(), []byte(`{"model":"` + strings.Repeat("m", 2<<20) + `"}`), "is no fit"},
	} {
		if _, err := Decode(tc.key, tc.value); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
	bad := validFit()
	bad.After.ECE = nanValue()
	if _, err := Encode(bad); err == nil {
		t.Error("Encode accepted a NaN metric")
	}
}

func nanValue() float64 { var z float64; return z / z }

// FuzzDecode: a corrupt value is an error, never a panic, and whatever decodes is a fit a
// worker may apply.
func FuzzCalibrationDecode(f *testing.F) {
	good, _ := Encode(validFit())
	f.Add(validFit().Key(), good)
	f.Add("m.c.q", []byte(`{"format":1,"model":"m","caller":"c","question":"q","type":"noul","temperature":0.05,"n":1}`))
	f.Add("m.c.q", []byte(`null`))
	f.Fuzz(func(t *testing.T, key string, value []byte) {
		fit, err := Decode(key, value)
		if err != nil {
			return
		}
		if err := fit.Validate(); err != nil || fit.Key() != key {
			t.Fatalf("Decode accepted %q under %q: %v", value, key, err)
		}
		if _, err := ApplyTemperature(fit.Temperature, &contract.Answer{Type: contract.TypeNoul, Noul: 0.5}); err != nil {
			t.Fatalf("decoded fit cannot be applied: %v", err)
		}
	})
}
