package worker

import (
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/sys1hq/sys1/provider/chain"
)

// Handler serves the replica's operational endpoints:
//
//	/healthz  the process is up (liveness)
//	/readyz   NATS is connected and the provider's last probe was healthy (readiness)
//	/metrics  counters in the Prometheus text format (no client library: a handful of lines)
//
// Scale replicas on the consumer's pending count (JetStream's own metrics, or
// `nats consumer info SYS1_REQUESTS sys1-worker`), not on these: a replica can't see the queue.
func (w *Worker) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(rw http.ResponseWriter, _ *http.Request) {
		rw.WriteHeader(http.StatusOK)
		_, _ = rw.Write([]byte("ok\n"))
	})
	mux.HandleFunc("/readyz", func(rw http.ResponseWriter, req *http.Request) {
		if !w.opt.NC.IsConnected() {
			http.Error(rw, "nats: not connected", http.StatusServiceUnavailable)
			return
		}
		// The providers' last probes (refreshed every SYS1_PROBE_INTERVAL), never a probe per
		// request: a scraper or a probe storm must not multiply model-server traffic.
		h := w.chain.Health()
		if h.Status != chain.StatusOK && h.Status != chain.StatusDegraded {
			http.Error(rw, "providers: "+healthSummary(h), http.StatusServiceUnavailable)
			return
		}
		_, _ = rw.Write([]byte("ready (" + h.Status + ")\n"))
	})
	mux.HandleFunc("/metrics", func(rw http.ResponseWriter, _ *http.Request) {
		rw.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		w.WriteMetrics(rw)
	})
	return mux
}

// WriteMetrics writes the replica's counters in the Prometheus text format (what /metrics
// serves), labelled with the replica id.
func (w *Worker) WriteMetrics(out io.Writer) {
	s := w.Stats()
	id := labelValue(w.cfg.ID)
	for _, m := range []struct {
		name, kind, help string
		v                int64
	}{
		{"sys1_worker_in_flight", "gauge", "Messages being processed by this replica.", s.InFlight},
		{"sys1_worker_provider_in_flight", "gauge", "Provider calls running now.", s.ProviderInFlight},
		{"sys1_worker_provider_in_flight_peak", "gauge", "Most provider calls ever running at once.", s.ProviderPeak},
		{"sys1_worker_provider_calls_total", "counter", "Provider calls made.", s.ProviderCalls},
		{"sys1_worker_runs_succeeded_total", "counter", "Runs finished with status success.", s.Succeeded},
		{"sys1_worker_runs_failed_total", "counter", "Runs finished with status failed.", s.Failed},
		{"sys1_worker_redeliveries_total", "counter", "Deliveries nak'ed for a transient error.", s.Retried},
		{"sys1_worker_replays_total", "counter", "Finished runs answered again from their stored outcome.", s.Replayed},
		{"sys1_worker_paused", "gauge", "1 while the fleet's interactive consumer is paused (sys1 pause), else 0.", w.pausedGauge()},
	} {
		fmt.Fprintf(out, "# HELP %s %s\n# TYPE %s %s\n%s{worker=\"%s\"} %d\n", m.name, m.help, m.name, m.kind, m.name, id, m.v)
	}
}

func (w *Worker) pausedGauge() int64 {
	if w.Health().Paused != nil {
		return 1
	}
	return 0
}

// labelValue escapes a Prometheus label value: the format knows only \\, \" and \n (Go's %q
// also writes escapes such as \t or \x00, which make a scraper reject the whole page).
func labelValue(s string) string {
	return labelEscaper.Replace(strings.ToValidUTF8(s, "\uFFFD"))
}

var labelEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)

func healthSummary(h chain.Health) string {
	parts := make([]string, 0, len(h.Providers))
	for _, p := range h.Providers {
		state := "up"
		if !p.OK {
			state = "down"
			if p.Detail != "" {
				state += ": " + p.Detail
			}
		}
		parts = append(parts, p.Name+" "+state)
	}
	return h.Status + " (" + strings.Join(parts, "; ") + ")"
}
