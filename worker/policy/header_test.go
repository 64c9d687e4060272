package policy

import (
	"strings"
	"testing"

	"github.com/sys1hq/sys1/contract"
)

func TestParseMinConfidence(t *testing.T) {
	good := map[string]float64{"": 0, "  ": 0, "0": 0, "0.7": 0.7, " 0.7 ": 0.7, "1": 1, "1.0": 1, ".5": 0.5, "7e-1": 0.7, "0.70": 0.7}
	for in, want := range good {
		got, err := ParseMinConfidence(in)
		if err != nil || got != want {
			t.Errorf("%q: %v %v, want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"abc", "NaN", "nan", "Inf", "+Inf", "1.5", "-0.1", "1e400", "0x1p-1", "70%", "0,7", "0.7 0.8",
		strings.Repeat("0", 40), "0.7\x00", "\xff", strings.Repeat("9", 10000)} {
		_, err := ParseMinConfidence(in)
		if err == nil {
			t.Errorf("%q accepted", in)
			continue
		}
		if err.Code != contract.CodeInvalidInput || err.Status != 400 ||
			!strings.HasPrefix(err.Message, "[SYS1_INVALID_INPUT] Sys1-Min-Confidence: ") ||
			!strings.HasSuffix(err.Message, "is not a number in [0, 1] (for example 0.7)") {
			t.Errorf("%q: %+v", in, err)
		}
		if len(err.Message) > 160 {
			t.Errorf("%q: message of %d bytes quotes too much", in[:10], len(err.Message))
		}
	}
}
