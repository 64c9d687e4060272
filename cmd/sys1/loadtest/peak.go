package loadtest

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Peak is the most provider calls that ran at once.
type Peak struct {
	// Calls is the peak: exact across all replicas when Source is the fake Ollama; the sum
	// of each replica's own peak (an upper bound) when it comes from several /metrics.
	Calls int64 `json:"calls"`
	// PerReplica is each replica's own peak, when known.
	PerReplica []int64 `json:"per_replica,omitempty"`
	Source     string  `json:"source"`
}

// PeakMetricName is the worker's gauge of its provider-call peak (worker.Handler /metrics).
const PeakMetricName = "sys1_worker_provider_in_flight_peak"

// ScrapePeak reads PeakMetricName from each worker's /metrics URL. The gauge is the peak since
// the replica started, so scrape replicas started for the benchmark.
func ScrapePeak(ctx context.Context, urls []string) (*Peak, error) {
	p := &Peak{Source: "worker /metrics " + PeakMetricName}
	hc := &http.Client{Timeout: 5 * time.Second}
	for _, u := range urls {
		v, err := scrapeGauge(ctx, hc, u, PeakMetricName)
		if err != nil {
			return nil, err
		}
		p.PerReplica = append(p.PerReplica, v)
		p.Calls += v
	}
	if len(urls) > 1 {
		p.Source += " (sum of replicas' peaks: an upper bound)"
	}
	return p, nil
}

func scrapeGauge(ctx context.Context, hc *http.Client, url, name string) (int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, fmt.Errorf("metrics URL %q: %w", url, err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, fmt.Errorf("scrape %s: %w", url, err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("scrape %s: HTTP %d", url, resp.StatusCode)
	}
	sc := bufio.NewScanner(resp.Body)
	var sum int64
	found := false
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) || len(line) == len(name) || (line[len(name)] != '{' && line[len(name)] != ' ') {
			continue
		}
		// "name{labels} value [timestamp]": the value is the first field after the labels
		// (which may hold spaces), not the last one of the line.
		rest := line[len(name):]
		if rest[0] == '{' {
			end := strings.LastIndexByte(rest, '}')
			if end < 0 {
				return 0, fmt.Errorf("scrape %s: bad %s line %q", url, name, line)
			}
			rest = rest[end+1:]
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			return 0, fmt.Errorf("scrape %s: bad %s line %q", url, name, line)
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return 0, fmt.Errorf("scrape %s: bad %s value %q", url, name, f[0])
		}
		sum += int64(v)
		found = true
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("scrape %s: %w", url, err)
	}
	if !found {
		return 0, fmt.Errorf("scrape %s: no %s metric (is this a sys1 worker's /metrics?)", url, name)
	}
	return sum, nil
}
