package loadtest

import (
	"bufio"
	"bytes"
	"os"
	"runtime"
	"strconv"
	"sync"
	"time"
)

// MemorySampler samples this process's resident memory (VmRSS from /proc/self/status; the Go
// runtime's Sys where /proc is missing) and the Go heap in use, every Interval.
type MemorySampler struct {
	Interval time.Duration

	mu      sync.Mutex
	samples []MemSample
	start   time.Time
	stop    chan struct{}
	done    chan struct{}
}

// MemSample is one memory reading.
type MemSample struct {
	AtMS      float64 `json:"at_ms"`
	RSSBytes  uint64  `json:"rss_bytes"`
	HeapBytes uint64  `json:"heap_inuse_bytes"`
}

// MemoryReport summarises the samples: the first and last, the peak, and the kernel's
// high-water mark (VmHWM, the peak RSS over the process's whole life) at the end.
type MemoryReport struct {
	Source       string      `json:"source"`
	StartRSS     uint64      `json:"start_rss_bytes"`
	PeakRSS      uint64      `json:"peak_rss_bytes"`
	EndRSS       uint64      `json:"end_rss_bytes"`
	HighWater    uint64      `json:"vm_hwm_bytes,omitempty"`
	PeakHeap     uint64      `json:"peak_heap_inuse_bytes"`
	Samples      []MemSample `json:"samples"`
	SamplePeriod float64     `json:"sample_period_ms"`
}

// Start begins sampling; Stop ends it. A sampler runs once.
func (m *MemorySampler) Start() {
	if m.Interval <= 0 {
		m.Interval = 250 * time.Millisecond
	}
	m.start = time.Now()
	m.stop, m.done = make(chan struct{}), make(chan struct{})
	m.sample()
	go func() {
		defer close(m.done)
		t := time.NewTicker(m.Interval)
		defer t.Stop()
		for {
			select {
			case <-m.stop:
				return
			case <-t.C:
				m.sample()
			}
		}
	}()
}

// Stop takes a last sample and stops.
func (m *MemorySampler) Stop() {
	if m.stop == nil {
		return
	}
	close(m.stop)
	<-m.done
	m.sample()
}

func (m *MemorySampler) sample() {
	rss, _ := procStatus("VmRSS")
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	if rss == 0 {
		rss = ms.Sys
	}
	m.mu.Lock()
	m.samples = append(m.samples, MemSample{AtMS: float64(time.Since(m.start).Milliseconds()), RSSBytes: rss, HeapBytes: ms.HeapInuse})
	m.mu.Unlock()
}

// Report summarises what was sampled.
func (m *MemorySampler) Report() *MemoryReport {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.samples) == 0 {
		return nil
	}
	r := &MemoryReport{Source: "VmRSS (/proc/self/status), whole process", SamplePeriod: float64(m.Interval.Milliseconds())}
	if _, err := procStatus("VmRSS"); err != nil {
		r.Source = "Go runtime Sys (no /proc), whole process"
	}
	r.StartRSS, r.EndRSS = m.samples[0].RSSBytes, m.samples[len(m.samples)-1].RSSBytes
	for _, s := range m.samples {
		r.PeakRSS = max(r.PeakRSS, s.RSSBytes)
		r.PeakHeap = max(r.PeakHeap, s.HeapBytes)
	}
	r.HighWater, _ = procStatus("VmHWM")
	r.Samples = append([]MemSample(nil), m.samples...)
	return r
}

// procStatus reads one "<field>: <n> kB" line of /proc/self/status, in bytes.
func procStatus(field string) (uint64, error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := sc.Bytes()
		rest, ok := bytes.CutPrefix(line, []byte(field+":"))
		if !ok {
			continue
		}
		f := bytes.Fields(rest)
		if len(f) == 0 {
			break
		}
		kb, err := strconv.ParseUint(string(f[0]), 10, 64)
		if err != nil {
			return 0, err
		}
		return kb * 1024, nil
	}
	return 0, os.ErrNotExist
}
