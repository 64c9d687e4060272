package sink

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/contract/wire"
	"github.com/sys1hq/sys1/sink/chtest"
	"github.com/sys1hq/sys1/worker/natsconn/natstest"
	"github.com/sys1hq/sys1/worker/topology"
)

// startNATS runs a real in-process nats-server with JetStream.
func startNATS(tb testing.TB) *server.Server { return natstest.Start(tb) }

func connectJS(tb testing.TB, srv *server.Server) (*nats.Conn, jetstream.JetStream) {
	return natstest.Connect(tb, srv)
}

// testEnv is one test's NATS server, migrated ClickHouse database and sink configuration.
type testEnv struct {
	srv  *server.Server
	js   jetstream.JetStream
	db   *chtest.DB
	cfg  Config
	topo topology.Config
}

func newEnv(tb testing.TB, mutate func(*Config)) *testEnv {
	tb.Helper()
	db := chtest.New(tb)
	srv := startNATS(tb)
	_, js := connectJS(tb, srv)
	cfg := DefaultConfig()
	cfg.DSN, cfg.Database = db.DSN, db.Name
	cfg.BatchSize, cfg.BatchAge = 1000, 100*time.Millisecond
	cfg.RetryMin, cfg.RetryMax = 20*time.Millisecond, 200*time.Millisecond
	cfg.StatsInterval = 50 * time.Millisecond
	cfg.ShutdownTimeout = 5 * time.Second
	if mutate != nil {
		mutate(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn, err := Open(ctx, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = conn.Close() })
	if err := Migrate(ctx, conn, cfg); err != nil {
		tb.Fatal(err)
	}
	topo := topology.Default()
	if err := topology.EnsureRunsStream(ctx, js, topo); err != nil {
		tb.Fatal(err)
	}
	// SYS1_LABELS, and SYS1_LABEL_SUBMISSIONS, where producers' submissions wait for the
	// workers (the sink never reads them).
	if err := topology.EnsureLabelSubmissionsStream(ctx, js, topo); err != nil {
		tb.Fatal(err)
	}
	return &testEnv{srv: srv, js: js, db: db, cfg: cfg, topo: topo}
}

// runningSink is a sink started in the background.
type runningSink struct {
	*Sink
	cancel context.CancelFunc
	done   chan struct{} // closed when Run returned, with its error in err
	err    error
}

// stop cancels the sink and waits for Run to return.
func (r *runningSink) stop(tb testing.TB) {
	tb.Helper()
	r.cancel()
	select {
	case <-r.done:
		if r.err != nil {
			tb.Fatalf("Run: %v", r.err)
		}
	case <-time.After(30 * time.Second):
		tb.Fatal("sink did not stop within 30s of cancellation")
	}
}

// startSink opens its own ClickHouse and NATS connections (cfg's DSN) and runs a sink.
func (e *testEnv) startSink(tb testing.TB, cfg Config, hook func(s *Sink)) *runningSink {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	// The outage test starts a sink while ClickHouse is unreachable, so don't require a ping.
	opts, err := ParseDSN(cfg.DSN)
	if err != nil {
		tb.Fatal(err)
	}
	conn, err := openNoPing(opts)
	if err != nil {
		tb.Fatal(err)
	}
	_, js := connectJS(tb, e.srv)
	s, err := New(cfg, Deps{JS: js, ClickHouse: conn, Topology: e.topo, Log: zerolog.New(zerolog.NewTestWriter(tb)).Level(zerolog.WarnLevel)})
	if err != nil {
		tb.Fatal(err)
	}
	if hook != nil {
		hook(s)
	}
	r := &runningSink{Sink: s, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		r.err = s.Run(ctx)
		_ = conn.Close()
	}()
	tb.Cleanup(func() {
		cancel()
		<-r.done
	})
	return r
}

// waitFor polls cond until it holds or within passes (natstest.WaitFor).
func waitFor(tb testing.TB, within time.Duration, what string, cond func() bool) {
	tb.Helper()
	natstest.WaitFor(tb, within, what, cond)
}

// consumerDrained reports whether the sink consumer has nothing pending or unacked.
func (e *testEnv) consumerDrained(tb testing.TB) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cons, err := e.js.Consumer(ctx, e.topo.RunsStream, e.topo.SinkConsumer)
	if err != nil {
		return false
	}
	info, err := cons.Info(ctx)
	return err == nil && info.NumPending == 0 && info.NumAckPending == 0
}

func (e *testEnv) count(tb testing.TB, query string, args ...any) uint64 {
	tb.Helper()
	return e.db.Count(tb, fmt.Sprintf(query, "`"+e.db.Name+"`"), args...)
}

// publish sends records to sys1.runs.<status> and waits for every JetStream ack.
func (e *testEnv) publish(tb testing.TB, recs []contract.RunRecord) {
	tb.Helper()
	bodies := make([][]byte, len(recs))
	subjects := make([]string, len(recs))
	for i := range recs {
		b, err := json.Marshal(&recs[i])
		if err != nil {
			tb.Fatal(err)
		}
		bodies[i], subjects[i] = b, wire.RunsPrefix+string(recs[i].Status)
	}
	e.publishRaw(tb, subjects, bodies)
}

func (e *testEnv) publishRaw(tb testing.TB, subjects []string, bodies [][]byte) {
	tb.Helper()
	// Async publishes, awaited a chunk at a time: the client stalls (and then fails) past a
	// few thousand outstanding acks, which a loaded machine reaches.
	const chunk = 1000
	for lo := 0; lo < len(bodies); lo += chunk {
		hi := min(lo+chunk, len(bodies))
		futures := make([]jetstream.PubAckFuture, 0, hi-lo)
		for i := lo; i < hi; i++ {
			f, err := e.js.PublishAsync(subjects[i], bodies[i])
			if err != nil {
				tb.Fatal(err)
			}
			futures = append(futures, f)
		}
		for _, f := range futures {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				tb.Fatalf("publishing a run record: %v", err)
			case <-time.After(60 * time.Second):
				tb.Fatal("publishing run records did not complete")
			}
		}
	}
}

// Fixture data: enough variety for every analyst query.
var (
	fxModels  = []string{"nimble", "brisk", "deep"}
	fxCallers = []string{"billing", "search", "support", "fraud"}
	fxCodes   = []contract.Code{contract.CodeModelUnavailable, contract.CodeTimeout, contract.CodeInvalidInput, contract.CodeProviderBusy}
	fxBase    = time.Now().UTC().Add(-2 * time.Hour).Truncate(time.Minute)
	// fxBatch holds the even runs; fxPrices are USD per run by model ("deep" is unpriced).
	fxBatch  = "tickets-2026-11"
	fxPrices = map[string]float64{"nimble": 0.0001, "brisk": 0.0003}
)

// makeRecord is run i of a deterministic fixture: every 5th run fails, every 3rd needed a
// retry, and successful runs answer a choice, a noul and a score question. Even runs belong
// to batch fxBatch; runs of "deep" are unpriced (cost_usd null), every 7th run is a cache hit
// (a real $0); successful runs carry verdicts (label abstains below confidence 0.7, urgent
// between P(yes) 0.3 and 0.7), with a calibrated label on every 4th.
func makeRecord(i int) contract.RunRecord {
	conf := 0.5 + float64(i%50)/100
	published := fxBase.Add(time.Duration(i) * 37 * time.Millisecond)
	started := published.Add(time.Duration(i%20) * time.Millisecond)
	latency := int64(20 + i%400)
	finished := started.Add(time.Duration(latency) * time.Millisecond)
	model := fxModels[i%len(fxModels)]
	runID := fmt.Sprintf("run-%07d", i)
	var batchID, itemID string
	if i%2 == 0 {
		batchID, itemID = fxBatch, fmt.Sprint(i)
		runID = batchID + ":" + itemID
	}
	rec := contract.RunRecord{
		SchemaVersion: contract.RecordSchemaVersion,
		RunID:         runID, BatchID: batchID, ItemID: itemID,
		Caller:      fxCallers[i%len(fxCallers)],
		CallerKind:  contract.CallerKindSubject,
		Roles:       []string{"decider"},
		Scopes:      []string{},
		Subject:     "sys1.decide." + fxCallers[i%len(fxCallers)],
		StreamSeq:   uint64(i + 1),
		Deliveries:  1 + i%3/2,
		PublishedAt: published, StartedAt: started, FinishedAt: finished,
		QueuedMS: int64(i % 20), LatencyMS: latency,
		Provider: "ollama", Model: model, RequestedModel: model,
		Worker: "w-1", Version: "test",
		Request: &contract.Request{
			Model: model,
			State: json.RawMessage(fmt.Sprintf(`{"ticket":%d,"text":"secret customer text"}`, i)),
			Questions: []contract.Question{
				{Name: "label", Type: contract.TypeChoice, Instructions: json.RawMessage(`"Pick the best label"`),
					Options: []contract.Option{{Key: "spam"}, {Key: "ham"}}},
				{Name: "urgent", Type: contract.TypeNoul, Instructions: json.RawMessage(`"Is it urgent?"`)},
				{Name: "severity", Type: contract.TypeScore, Instructions: json.RawMessage(`"How severe?"`), Levels: []string{"low", "mid", "high"}},
			},
			Images: []contract.Image{{SHA256: fmt.Sprintf("%064x", i%7), Bytes: 1000 + i%7}},
		},
		Images: []contract.ImageRef{{SHA256: fmt.Sprintf("%064x", i%7), Bytes: 1000 + i%7}},
	}
	if i%3 == 0 {
		rec.TraceID = fmt.Sprintf("%032x", i+1)
	}
	attempts := 1 + i%3/2 // 1, 1, 2
	if i%3 == 2 {
		rec.Attempts = append(rec.Attempts, contract.Attempt{Provider: "ollama", Model: model, Outcome: contract.OutcomeBusy, LatencyMS: 5, Delivery: 1, ErrorCode: contract.CodeProviderBusy, StartedAt: started})
	}
	rec.Attempts = append(rec.Attempts, contract.Attempt{Provider: "ollama", Model: model, Outcome: contract.OutcomeOK, LatencyMS: latency, Delivery: attempts, StartedAt: started})
	if i%5 == 4 {
		code := fxCodes[i%len(fxCodes)]
		rec.Status, rec.ErrorCode, rec.ErrorStatus = contract.StatusFailed, code, code.Status()
		rec.ErrorMessage = "[" + string(code) + "] fixture failure"
		rec.Attempts[len(rec.Attempts)-1].Outcome = contract.OutcomeUnavailable
		rec.Attempts[len(rec.Attempts)-1].ErrorCode = code
		return rec
	}
	rec.Status = contract.StatusSuccess
	if price, ok := fxPrices[model]; ok {
		rec.CostUSD = &price
	}
	if i%7 == 0 {
		free := 0.0
		rec.CacheHit, rec.CostUSD = true, &free
		rec.Attempts = []contract.Attempt{{Provider: "ollama", Model: model, Outcome: contract.OutcomeCache, Delivery: 1, StartedAt: started}}
	}
	choice := []string{"spam", "ham"}[i%2]
	rec.Result = &contract.Result{
		Provider: "ollama", Model: model,
		Usage: contract.Usage{InputTokens: int64(100 + i%50), OutputTokens: 3},
		Answers: []contract.Answer{
			{Name: "label", Type: contract.TypeChoice, Choice: choice, Confidence: &conf,
				Raw:           json.RawMessage(fmt.Sprintf(`{"type":"choice","choice":%q,"probabilities":{"spam":%g,"ham":%g},"confidence":%g}`, choice, conf, 1-conf, conf)),
				Probabilities: []contract.Probability{{Key: "spam", P: conf}, {Key: "ham", P: 1 - conf}}},
			{Name: "urgent", Type: contract.TypeNoul, Noul: float64(i%10) / 10,
				Raw: json.RawMessage(fmt.Sprintf(`{"type":"noul","noul":%g}`, float64(i%10)/10))},
			{Name: "severity", Type: contract.TypeScore, Score: float64(i % 3), Confidence: &conf,
				Raw: json.RawMessage(fmt.Sprintf(`{"type":"score","score":%d,"confidence":%g}`, i%3, conf))},
		},
	}
	rec.Verdicts = fixtureVerdicts(i, conf, float64(i%10)/10)
	for _, v := range rec.Verdicts {
		if v.Status == contract.VerdictAbstained {
			rec.Review = &contract.ReviewRef{Status: contract.ReviewPending, Item: contract.ReviewItemID(rec.RunID, v.Question)}
			break
		}
	}
	return rec
}

func fixtureVerdicts(i int, conf, noul float64) contract.Verdicts {
	label := contract.Verdict{Question: "label", Status: contract.VerdictDecided, Rule: "labels", Reason: fmt.Sprintf("confidence %.2f ≥ 0.70", conf)}
	if conf < 0.7 {
		label.Status, label.Reason = contract.VerdictAbstained, fmt.Sprintf("confidence %.2f < 0.70", conf)
	}
	if i%4 == 0 {
		c := conf * 0.9
		label.Calibrated = &contract.Calibrated{Probabilities: []contract.Probability{{Key: "spam", P: c}, {Key: "ham", P: 1 - c}}, Confidence: &c, Temperature: 1.3}
	}
	urgent := contract.Verdict{Question: "urgent", Status: contract.VerdictDecided, Rule: "urgency", Reason: fmt.Sprintf("P(yes) %.2f outside [0.30, 0.70]", noul)}
	if noul >= 0.3 && noul <= 0.7 {
		urgent.Status, urgent.Reason = contract.VerdictAbstained, fmt.Sprintf("P(yes) %.2f within [0.30, 0.70]", noul)
	}
	return contract.Verdicts{label, urgent, {Question: "severity", Status: contract.VerdictDecided, Reason: "no rule"}}
}

// makeLabel labels a question of fixture run i: every 3rd of its choice answers is labelled
// against the model (so accuracy is neither 0 nor 1), nouls by P(yes) ≥ 0.5 except every 4th,
// scores at their level. Reviewers ana and ben label from the review page, the rest comes from
// the producer.
func makeLabel(i int, question string) contract.Label {
	rec := makeRecord(i)
	var value string
	switch question {
	case "label":
		choice := []string{"spam", "ham"}[i%2]
		if i%3 == 0 {
			choice = []string{"ham", "spam"}[i%2]
		}
		value = `"` + choice + `"`
	case "urgent":
		value = fmt.Sprint(float64(i%10)/10 >= 0.5 != (i%4 == 0))
	default:
		value = fmt.Sprint(i % 3)
	}
	l := contract.Label{
		RunID: rec.RunID, Question: question, Value: json.RawMessage(value), Caller: rec.Caller,
		LabelledAt: time.Now().UTC().Add(-time.Duration(i%50) * time.Minute).Truncate(time.Millisecond), Source: contract.LabelSourceProducer,
	}
	if i%2 == 0 {
		l.Source, l.Reviewer, l.Item = contract.LabelSourceReview, []string{"ana", "ben"}[i/2%2], contract.ReviewItemID(rec.RunID, question)
	}
	return l
}

// makeLabels labels every question of every 5th successful run among runs [0, n).
func makeLabels(n int) []contract.Label {
	var out []contract.Label
	for i := 0; i < n; i++ {
		if i%5 == 4 || i%5 != 0 && i%5 != 2 {
			continue // failures (i%5 == 4) have no answers; label runs 0, 2, 5, 7, …
		}
		for _, q := range []string{"label", "urgent", "severity"} {
			out = append(out, makeLabel(i, q))
		}
	}
	return out
}

// publishLabels sends accepted labels to sys1.labels.<caller>.accepted.
func (e *testEnv) publishLabels(tb testing.TB, labels []contract.Label) {
	tb.Helper()
	subjects := make([]string, len(labels))
	bodies := make([][]byte, len(labels))
	for i := range labels {
		bodies[i], _ = labels[i].MarshalJSON()
		subjects[i] = wire.LabelsPrefix + labels[i].Caller + "." + wire.AcceptedToken
	}
	e.publishRaw(tb, subjects, bodies)
}

func makeRecords(from, n int) []contract.RunRecord {
	out := make([]contract.RunRecord, n)
	for i := range out {
		out[i] = makeRecord(from + i)
	}
	return out
}

// proxy is a TCP proxy a test can cut: while down it refuses new connections (accepts and
// closes them) and drops open ones, like a ClickHouse that went away.
type proxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	up     bool
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

func newProxy(tb testing.TB, target string) *proxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	p := &proxy{ln: ln, target: target, up: true, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.serve()
	tb.Cleanup(func() {
		_ = ln.Close()
		p.setUp(false)
		p.wg.Wait()
	})
	return p
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if !p.up {
			p.mu.Unlock()
			_ = c.Close()
			continue
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			p.mu.Unlock()
			_ = c.Close()
			continue
		}
		p.conns[c], p.conns[up] = struct{}{}, struct{}{}
		p.wg.Add(2)
		p.mu.Unlock()
		pipe := func(dst, src net.Conn) {
			defer p.wg.Done()
			_, _ = io.Copy(dst, src)
			_ = dst.Close()
			_ = src.Close()
			p.mu.Lock()
			delete(p.conns, dst)
			delete(p.conns, src)
			p.mu.Unlock()
		}
		go pipe(up, c)
		go pipe(c, up)
	}
}

func (p *proxy) setUp(up bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.up = up
	if !up {
		for c := range p.conns {
			_ = c.Close()
		}
	}
}

func testLogger(tb testing.TB) zerolog.Logger {
	return zerolog.New(zerolog.NewTestWriter(tb)).Level(zerolog.WarnLevel)
}
