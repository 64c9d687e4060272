package loadtest

import (
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

func TestParseStatCPU(t *testing.T) {
	// A command name with spaces and parentheses: fields count from its last ')'.
	stat := "4242 (sys1 (w) x) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 37 0 0 20 0 9 0 100 1000 200 18446744073709551615"
	got, err := parseStatCPU([]byte(stat))
	if err != nil {
		t.Fatal(err)
	}
	if want := 2870 * time.Millisecond; got != want {
		t.Fatalf("CPU %s, want %s (250 + 37 ticks of 10 ms)", got, want)
	}
	for _, bad := range []string{"no name here", "1 (x) S 1 2", "1 (x) S 1 2 3 4 5 6 7 8 9 10 ten 11 12"} {
		if _, err := parseStatCPU([]byte(bad)); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

func TestReadProcessReadsItself(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skipf("needs /proc, which only Linux has (GOOS=%s)", runtime.GOOS)
	}
	// Burn a little CPU so the reading is above zero at 10 ms resolution.
	deadline := time.Now().Add(30 * time.Millisecond)
	x := 0
	for time.Now().Before(deadline) {
		x++
	}
	u, err := ReadProcess(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if u.CPU <= 0 || u.RSS == 0 || u.HighWater < u.RSS {
		t.Fatalf("usage %+v: want CPU, RSS and a high-water mark at least RSS (%d)", u, x)
	}
	if _, err := ReadProcess(-1); err == nil || !strings.Contains(err.Error(), "/proc/-1") {
		t.Fatalf("a process that does not exist: %v", err)
	}
}
