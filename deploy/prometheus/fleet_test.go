package promdeploy

import (
	"bytes"
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/rs/zerolog"
	"golang.org/x/crypto/bcrypt"

	"github.com/sys1hq/sys1/cmd/sys1/review"
	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/provider/ollama"
	"github.com/sys1hq/sys1/provider/ollamatest"
	"github.com/sys1hq/sys1/sink"
	"github.com/sys1hq/sys1/sink/chtest"
	"github.com/sys1hq/sys1/worker"
	"github.com/sys1hq/sys1/worker/auth"
	"github.com/sys1hq/sys1/worker/client"
	"github.com/sys1hq/sys1/worker/limits"
	"github.com/sys1hq/sys1/worker/metrics"
	"github.com/sys1hq/sys1/worker/natsconn"
	"github.com/sys1hq/sys1/worker/natsconn/natstest"
	"github.com/sys1hq/sys1/worker/policy"
	"github.com/sys1hq/sys1/worker/topology"
)

// The fleet under load: one in-process nats-server, a worker replica against the fake Ollama,
// the sink against ClickHouse (chshim in CI), the review page, each serving /metrics over
// HTTP as in production, and the NATS exporter's series from the server's own figures.
//
// The load is a mix that gives every dashboard panel and alert something to show: answered
// runs (caller svc-a), invalid requests (svc-b), a caller over its day budget (budget-c),
// answers the policy sends to review (review-d), and requests the model always fails with a
// 500 (svc-e: retried, then answered SYS1_UPSTREAM_ERROR).

const (
	fleetValid    = 120
	fleetInvalid  = 20
	fleetBudget   = 10
	fleetReview   = 12
	fleetUpstream = 4
	fleetReplica  = "replica-1"
)

func fleetRequest(i int, marker string) []byte {
	return fmt.Appendf(nil, `{"model":"nimble","state":{"ticket":%d,"note":%q},"questions":{
 "label":{"type":"choice","instructions":"Which team owns this?","criteria":{"billing":"Payments","bug":null}},
 "urgent":{"type":"noul","instructions":"Is it urgent?"}}}`, i, marker)
}

type fleet struct {
	reviewMetrics string // the review page's /metrics URL
	scraper       *scraper
	w             *worker.Worker
	sink          *sink.Sink
	producer      *nats.Conn
}

func startFleet(t *testing.T) *fleet {
	t.Helper()
	db := chtest.New(t) // skips without SYS1_TEST_CLICKHOUSE_DSN; fails under SYS1_TEST_REQUIRE_CLICKHOUSE=1 (CI)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	log := zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.ErrorLevel)

	srv, err := natsconn.StartEmbedded(natsconn.EmbeddedOptions{Port: -1, StoreDir: t.TempDir(), Logger: &log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	connect := func(name string) (*nats.Conn, jetstream.JetStream) {
		nc, err := nats.Connect(srv.ClientURL(), nats.Name(name))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		return nc, js
	}

	fake := ollamatest.New(t, ollamatest.WithLatency(5*time.Millisecond))
	fake.FailIf(func(b []byte) bool { return bytes.Contains(b, []byte("always-500")) }, ollamatest.Fault{Status: 500})
	prov, err := ollama.New(ollama.Config{BaseURL: fake.URL(), TimeoutMS: "30000", MaxConns: 8}, ollama.Deps{Log: log})
	if err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	abstention, err := policy.Load(write("policy.yaml", "rules:\n  - name: review-everything\n    caller: review-*\n    min_confidence: 0.9999\n    review: notify\n"))
	if err != nil {
		t.Fatal(err)
	}
	lim, err := limits.LoadLimits(write("limits.yaml", "rules:\n  - name: tiny\n    caller: budget-*\n    input_tokens_per_day: 1\n"))
	if err != nil {
		t.Fatal(err)
	}
	authCfg := auth.DefaultConfig()
	authCfg.Mode = "subject"
	authn, err := auth.New(ctx, authCfg, log)
	if err != nil {
		t.Fatal(err)
	}

	topo := topology.Default()
	nc, js := connect("worker")
	reg := metrics.NewRegistry()
	w, err := worker.New(ctx, worker.Config{
		Concurrency: 8, ConcurrencyMode: "fixed", MaxDeliver: 2, ShutdownGrace: 5 * time.Second, FetchBatch: 16,
		RetryBase: 50 * time.Millisecond, RetryMax: 200 * time.Millisecond, ID: fleetReplica,
	}, worker.Options{
		NC: nc, JS: js, Topology: topo, Provider: prov, ModelPolicy: contract.Policy{DefaultModel: "nimble"},
		Abstention: abstention, Limits: lim, Auth: authn, Logger: log, Version: "test",
		FetchWait: 250 * time.Millisecond, Metrics: reg, MetricsCallerLabel: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	wg.Go(func() {
		if err := w.Run(ctx); err != nil {
			t.Errorf("worker: %v", err)
		}
	})
	workerHTTP := httptest.NewServer(w.Handler())
	t.Cleanup(workerHTTP.Close)

	cfg := sink.DefaultConfig()
	cfg.DSN, cfg.Database, cfg.BatchAge = db.DSN, db.Name, 200*time.Millisecond
	conn, err := sink.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	if err := sink.Migrate(ctx, conn, cfg); err != nil {
		t.Fatal(err)
	}
	_, sjs := connect("sink")
	sk, err := sink.New(cfg, sink.Deps{JS: sjs, ClickHouse: conn, Topology: topo, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	sinkReg := metrics.NewRegistry() // as `sys1 sink` serves it
	if err := sk.Instrument(sinkReg, nil); err != nil {
		t.Fatal(err)
	}
	wg.Go(func() {
		if err := sk.Run(ctx); err != nil && ctx.Err() == nil {
			t.Errorf("sink: %v", err)
		}
	})
	sinkHTTP := httptest.NewServer(metrics.Handler(sinkReg, log))
	t.Cleanup(sinkHTTP.Close)

	hash, err := bcrypt.GenerateFromPassword([]byte("a long password"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	rcfg := review.DefaultConfig()
	rcfg.UsersFile = write("reviewers", "alice:"+string(hash)+"\n")
	_, rjs := connect("review")
	rv, err := review.New(ctx, rjs, rcfg, log)
	if err != nil {
		t.Fatal(err)
	}
	wg.Go(func() { rv.Run(ctx) })
	reviewHTTP := httptest.NewServer(rv.Handler())
	t.Cleanup(reviewHTTP.Close)

	producer, _ := connect("producer")
	return &fleet{
		w: w, sink: sk, producer: producer, reviewMetrics: reviewHTTP.URL + "/metrics",
		scraper: newScraper(t,
			target{job: "sys1-worker", instance: workerHTTP.Listener.Addr().String(), url: workerHTTP.URL + "/metrics"},
			target{job: "sys1-sink", instance: sinkHTTP.Listener.Addr().String(), url: sinkHTTP.URL + "/metrics"},
			target{job: "sys1-review", instance: reviewHTTP.Listener.Addr().String(), url: reviewHTTP.URL + "/metrics"},
			target{job: "nats", instance: "nats-exporter:7777", text: exporterText(srv)},
		),
	}
}

// load publishes the mix, scraping every interval while it is answered and recorded, and a
// little after, and returns once every run is answered, recorded and the review queue holds
// its items.
func (f *fleet) load(ctx context.Context, t *testing.T, interval time.Duration) {
	t.Helper()
	c, err := client.New(f.producer)
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	scraped := make(chan error, 1)
	go func() {
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			if err := f.scraper.scrape(ctx); err != nil {
				scraped <- err
				return
			}
			select {
			case <-stop:
				scraped <- nil
				return
			case <-tick.C:
			}
		}
	}()
	publish := func(caller string, body []byte) {
		if _, err := c.Publish(ctx, client.Request{Caller: caller, Body: body}); err != nil {
			t.Fatalf("publish %s: %v", caller, err)
		}
	}
	for i := range fleetValid {
		publish("svc-a", fleetRequest(i, "ok"))
		switch {
		case i < fleetInvalid:
			publish("svc-b", []byte(`{"model":"nimble"}`))
		case i < fleetInvalid+fleetBudget:
			publish("budget-c", fleetRequest(i, "budget"))
		case i < fleetInvalid+fleetBudget+fleetReview:
			publish("review-d", fleetRequest(i, "review"))
		case i < fleetInvalid+fleetBudget+fleetReview+fleetUpstream:
			publish("svc-e", fleetRequest(i, "always-500"))
		}
	}
	total := int64(fleetValid + fleetInvalid + fleetBudget + fleetReview + fleetUpstream)
	waitFor(t, "every run answered and recorded, and the review page showing its items", 60*time.Second, func() bool {
		st := f.w.Stats()
		return st.Succeeded+st.Failed >= total && f.sink.Stats().Inserted >= uint64(total) && f.reviewPending(ctx) > 0
	})
	// Two more scrapes after the last answer: every counter has its final value in storage,
	// and the gauges have settled (in flight 0, lag 0).
	settled := f.scraper.scrapes() + 2
	waitFor(t, "two scrapes after the load", 10*time.Second, func() bool { return f.scraper.scrapes() >= settled })
	close(stop)
	if err := <-scraped; err != nil {
		t.Fatal(err)
	}
}

// waitFor polls cond until it holds or d passes (natstest.WaitFor).
func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	natstest.WaitFor(t, d, what, cond)
}

func (s *scraper) scrapes() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, b := range s.bodies {
		n = max(n, len(b))
	}
	return n
}

// reviewPending is the review page's pending count, as it serves it.
func (f *fleet) reviewPending(ctx context.Context) int {
	text, err := target{url: f.reviewMetrics}.fetch(ctx)
	if err != nil {
		return 0
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(text))
	if err != nil || fams["sys1_review_pending_items"] == nil {
		return 0
	}
	return int(fams["sys1_review_pending_items"].GetMetric()[0].GetGauge().GetValue())
}
