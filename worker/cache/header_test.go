package cache

import (
	"strings"
	"testing"
	"time"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/worker/limits"
)

func TestMaxAge(t *testing.T) {
	const ceiling = 48 * time.Hour
	day := limits.Rule{Name: "r", Caller: "*", Cache: 24 * time.Hour}
	none := limits.Rule{Name: "r", Caller: "*"}
	off := limits.Rule{Name: "r", Caller: "*", CacheOff: true}
	for _, c := range []struct {
		name   string
		rule   limits.Rule
		header string
		want   time.Duration
	}{
		{"rule, no header", day, "", 24 * time.Hour},
		{"rule, shorter header", day, "1h", time.Hour},
		{"rule, longer header is cut to the rule", day, "72h", 24 * time.Hour},
		{"rule, header 0", day, "0", 0},
		{"rule, header off", day, " OFF ", 0},
		{"rule, header in seconds", day, "3600", time.Hour},
		{"no rule, no header: not opted in", none, "", 0},
		{"no rule, header opts in", none, "2h", 2 * time.Hour},
		{"no rule, header cut to the ceiling", none, "9999h", ceiling},
		{"no rule, huge seconds cut to the ceiling", none, "99999999999999999", ceiling},
		{"off beats the header", off, "1h", 0},
		{"off, no header", off, "", 0},
		{"rule longer than the ceiling", limits.Rule{Cache: 100 * time.Hour}, "", ceiling},
	} {
		got, err := MaxAge(c.rule, c.header, ceiling)
		if err != nil || got != c.want {
			t.Errorf("%s: %s %v, want %s", c.name, got, err, c.want)
		}
	}
	if got, err := MaxAge(day, "1h", 0); got != 0 || err != nil {
		t.Errorf("no cache bucket: %s %v", got, err)
	}
}

func TestBadHeaderIsInvalidInput(t *testing.T) {
	for v, want := range map[string]string{
		"1 day":                        `Sys1-Cache: "1 day" is not a duration (like 24h or 90m, or 0 for no cache)`,
		"1d":                           `Sys1-Cache: "1d" is not a duration`,
		"-1h":                          `Sys1-Cache: "-1h" is negative`,
		"-5":                           `Sys1-Cache: "-5" is negative`,
		"500ms":                        `Sys1-Cache: "500ms" is under a second`,
		"yes":                          `Sys1-Cache: "yes" is not a duration`,
		"24h\x00":                      `Sys1-Cache: "24h\x00" is not a duration`,
		strings.Repeat("9", 100) + "h": `…" is not a duration`,
	} {
		// A bad header is refused whatever the rule: off included.
		for _, rule := range []limits.Rule{{Cache: time.Hour}, {CacheOff: true}} {
			_, err := MaxAge(rule, v, time.Hour)
			if err == nil || err.Code != contract.CodeInvalidInput || !strings.Contains(err.Message, want) {
				t.Errorf("%q: %v, want SYS1_INVALID_INPUT %q", v, err, want)
			}
			if err != nil && len(err.Message) > 160 {
				t.Errorf("%q: message not clipped: %d bytes", v, len(err.Message))
			}
		}
	}
}

// FuzzParseHeader: any header value is an age in [1s, ∞), a clean "no cache", or
// SYS1_INVALID_INPUT; never a panic or a negative age.
func FuzzParseHeader(f *testing.F) {
	for _, s := range []string{"", "24h", "0", "off", "3600", "-1s", "1.5h", "9223372036854775807", "999999999999h", "1µs"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		d, given, err := ParseHeader(v)
		switch {
		case err != nil:
			if err.Code != contract.CodeInvalidInput || !given {
				t.Fatalf("%q: %v", v, err)
			}
		case d < 0, d > 0 && d < time.Second, !given && d != 0:
			t.Fatalf("%q: age %s given %v", v, d, given)
		}
	})
}
