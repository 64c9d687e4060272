package worker

import (
	"net/http"
	"strings"

	"github.com/sys1hq/sys1/provider/chain"
	"github.com/sys1hq/sys1/worker/metrics"
)

// Handler serves the replica's operational endpoints:
//
//	/healthz  the process is up (liveness)
//	/readyz   NATS is connected and the provider's last probe was healthy (readiness)
//	/metrics  the registry the replica is on (Options.Metrics), in the Prometheus text format
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
		state := h.Status
		if full := w.FullStreams(); len(full) > 0 {
			// Still ready: it answers what it can. The probe's body says what it cannot store.
			state += "; full, refusing new messages: " + strings.Join(full, ", ")
		}
		_, _ = rw.Write([]byte("ready (" + state + ")\n"))
	})
	mux.Handle("/metrics", metrics.Handler(w.registry, w.log))
	return mux
}

func (w *Worker) pausedGauge() int64 {
	if w.Health().Paused != nil {
		return 1
	}
	return 0
}

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
