package loadtest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// ProcessUsage is what /proc says of another process: the CPU time it has used so far (user +
// system, every thread) and its memory.
type ProcessUsage struct {
	CPU time.Duration
	// RSS is VmRSS now; HighWater is VmHWM, the most it has been resident over its life.
	RSS, HighWater uint64
}

// userHZ is the unit of /proc/<pid>/stat's times: USER_HZ, 100 on every Linux architecture
// (the kernel scales its own tick to it for this ABI).
const userHZ = 100

// ReadProcess reads pid's usage from /proc/<pid>/stat and /proc/<pid>/status (Linux). The
// CPU time has the resolution of USER_HZ: 10 ms.
func ReadProcess(pid int) (ProcessUsage, error) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ProcessUsage{}, err
	}
	cpu, err := parseStatCPU(stat)
	if err != nil {
		return ProcessUsage{}, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return ProcessUsage{}, err
	}
	u := ProcessUsage{CPU: cpu}
	sc := bufio.NewScanner(bytes.NewReader(status))
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		switch name {
		case "VmRSS":
			u.RSS = parseKB(value)
		case "VmHWM":
			u.HighWater = parseKB(value)
		}
	}
	return u, nil
}

// parseStatCPU is utime + stime (fields 14 and 15) of a /proc/<pid>/stat line. The command
// name (field 2) is in parentheses and may hold spaces and parentheses itself, so fields are
// counted from after its last ')'.
func parseStatCPU(stat []byte) (time.Duration, error) {
	end := bytes.LastIndexByte(stat, ')')
	if end < 0 {
		return 0, errors.New("no command name")
	}
	// After the name: field 3 (state) onwards.
	fields := strings.Fields(string(stat[end+1:]))
	if len(fields) < 13 {
		return 0, fmt.Errorf("%d fields after the command name, want at least 13", len(fields))
	}
	var ticks int64
	for _, f := range fields[11:13] { // fields 14 and 15
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("CPU time %q: %w", f, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / userHZ, nil
}

// parseKB is a /proc/<pid>/status size ("  34816 kB") in bytes; 0 when it does not parse.
func parseKB(s string) uint64 {
	f := strings.Fields(s)
	if len(f) == 0 {
		return 0
	}
	n, err := strconv.ParseUint(f[0], 10, 64)
	if err != nil {
		return 0
	}
	return n << 10
}
