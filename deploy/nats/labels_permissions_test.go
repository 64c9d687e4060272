package natsdeploy

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"golang.org/x/crypto/bcrypt"

	"github.com/sys1hq/sys1/cmd/sys1/review"
	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/contract/examples"
	"github.com/sys1hq/sys1/contract/wire"
	"github.com/sys1hq/sys1/provider/ollama"
	"github.com/sys1hq/sys1/provider/ollamatest"
	"github.com/sys1hq/sys1/worker"
	"github.com/sys1hq/sys1/worker/auth"
	"github.com/sys1hq/sys1/worker/client"
	"github.com/sys1hq/sys1/worker/natsconn/natstest"
	"github.com/sys1hq/sys1/worker/policy"
	"github.com/sys1hq/sys1/worker/topology"
)

// violations collects the permission violations the server reports to one connection.
type violations struct {
	mu   sync.Mutex
	list []string
}

func (v *violations) handler(_ *nats.Conn, _ *nats.Subscription, err error) {
	if strings.Contains(err.Error(), "Permissions Violation") {
		v.mu.Lock()
		v.list = append(v.list, err.Error())
		v.mu.Unlock()
	}
}

func (v *violations) snapshot() []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return append([]string(nil), v.list...)
}

// connectAs connects as a user of the file with its inbox prefix, noting every violation.
func connectAs(t *testing.T, url, name string) (*nats.Conn, jetstream.JetStream, *violations) {
	t.Helper()
	v := &violations{}
	nc, err := nats.Connect(url, nats.UserInfo(name, passwords[name]), nats.CustomInboxPrefix("_INBOX."+name), nats.ErrorHandler(v.handler))
	if err != nil {
		t.Fatalf("%s: connect: %v", name, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js, v
}

// TestPermissionsForLabelsAndReview runs the real worker (as sys1-worker), the real review page
// (as sys1-review) and a producer (svc-a) against the deploy file, through issue 12's whole
// loop — a held run, a producer's label, a reviewer's label releasing the reply — with no
// permission violation on the way; then the sink's label lane reads the checked labels as
// sys1-sink, and each user is refused what is not its job.
func TestPermissionsForLabelsAndReview(t *testing.T) {
	s := startFromFile(t)
	natsURL := s.ClientURL()

	// The worker, with a policy that holds the ticket's routing question for a person.
	wnc, wjs, wviol := connectAs(t, natsURL, "sys1-worker")
	polPath := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(polPath, []byte("rules:\n  - name: routing\n    question: label\n    min_confidence: 0.99\n    review: hold\n  - name: lax\n    min_confidence: 0\n    noul_abstain_between: [0.0, 0.0]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	pol, err := policy.Load(polPath)
	if err != nil {
		t.Fatal(err)
	}
	fake := ollamatest.New(t)
	prov, err := ollama.New(ollama.Config{BaseURL: fake.URL(), TimeoutMS: "5000"}, ollama.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	authn, err := auth.New(context.Background(), auth.Config{Mode: auth.ModeSubject}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w, err := worker.New(ctx, worker.Config{Concurrency: 2, MaxDeliver: 3, ShutdownGrace: 5 * time.Second, FetchBatch: 2,
		RetryBase: 20 * time.Millisecond, RetryMax: 200 * time.Millisecond, StoreRetry: 2 * time.Second, ID: "perm-worker"},
		worker.Options{NC: wnc, JS: wjs, Topology: topology.Default(), Provider: prov, Auth: authn, Abstention: pol,
			ModelPolicy: contract.Policy{DefaultModel: "nimble", AllowedModels: []string{"nimble"}}, Logger: zerolog.Nop(), Version: "test", FetchWait: 200 * time.Millisecond})
	if err != nil {
		t.Fatalf("worker.New as sys1-worker: %v", err)
	}
	workerDone := make(chan struct{})
	go func() { defer close(workerDone); _ = w.Run(ctx) }()
	defer func() { cancel(); <-workerDone }()

	// The review page.
	_, rjs, rviol := connectAs(t, natsURL, "sys1-review")
	hash, _ := bcrypt.GenerateFromPassword([]byte("alice-pw"), bcrypt.MinCost)
	users := filepath.Join(t.TempDir(), "reviewers")
	if err := os.WriteFile(users, []byte("alice:"+string(hash)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	rcfg := review.DefaultConfig()
	rcfg.UsersFile = users
	rs, err := review.New(ctx, rjs, rcfg, zerolog.Nop())
	if err != nil {
		t.Fatalf("review.New as sys1-review: %v", err)
	}
	reviewDone := make(chan struct{})
	go func() { defer close(reviewDone); rs.Run(ctx) }()
	defer func() { cancel(); <-reviewDone }()
	web := httptest.NewServer(rs.Handler())
	defer web.Close()
	natstest.WaitFor(t, 10*time.Second, "the review page to catch up", rs.Ready)

	// svc-a asks; the run is held, its item reaches the review page.
	pnc, _, pviol := connectAs(t, natsURL, "svc-a")
	cl, err := client.New(pnc)
	if err != nil {
		t.Fatal(err)
	}
	inbox := pnc.NewInbox()
	replies, err := pnc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := examples.Request("ticket")
	if _, err := cl.Publish(ctx, client.Request{Caller: "svc-a", Body: body, RunID: "perm-1", ReplyTo: inbox}); err != nil {
		t.Fatalf("svc-a request: %v", err)
	}
	itemID := contract.ReviewItemID("perm-1", "label")
	browser := newBrowser(t, web.URL)
	csrf := browser.login("alice", "alice-pw")
	natstest.WaitFor(t, 10*time.Second, "the item on the review page", func() bool {
		return strings.Contains(browser.get("/").body, itemID)
	})

	// svc-a's own label (once the run's outcome is stored): checked by the worker, accepted,
	// answered.
	natstest.WaitFor(t, 10*time.Second, "the held run stored", func() bool { return w.Stats().Succeeded == 1 })
	labelInbox := pnc.NewInbox()
	labelReplies, err := pnc.SubscribeSync(labelInbox)
	if err != nil {
		t.Fatal(err)
	}
	lm := &nats.Msg{Subject: "sys1.labels.svc-a", Data: []byte(`{"run_id":"perm-1","question":"refund_requested","label":false}`), Header: nats.Header{}}
	lm.Header.Set(wire.HeaderReplyTo, labelInbox)
	pjs, _ := jetstream.New(pnc)
	if _, err := pjs.PublishMsg(ctx, lm); err != nil {
		t.Fatalf("svc-a label: %v", err)
	}
	m, err := labelReplies.NextMsg(10 * time.Second)
	if err != nil {
		t.Fatalf("no label reply: %v", err)
	}
	var lr contract.LabelReply
	if err := json.Unmarshal(m.Data, &lr); err != nil || lr.Status != contract.LabelAccepted {
		t.Fatalf("label reply %s", m.Data)
	}
	if m, err := replies.NextMsg(100 * time.Millisecond); err == nil {
		t.Fatalf("a producer's label released the hold: %s", m.Data)
	}

	// Alice labels the item: the held reply arrives, reviewed.
	if res := browser.post("/items/"+itemID+"/label", url.Values{"csrf": {csrf}, "value": {"billing"}}); res.status != http.StatusSeeOther {
		t.Fatalf("label on the review page: %d\n%s", res.status, res.body)
	}
	m, err = replies.NextMsg(10 * time.Second)
	if err != nil {
		t.Fatalf("no released reply: %v", err)
	}
	rep, err := client.ParseReply(m)
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := rep.Verdicts.Get("label"); v.Status != contract.VerdictReviewed || v.Reviewer != "alice" || rep.Review.Status != contract.ReviewReviewed {
		t.Fatalf("released reply %s", m.Data)
	}

	// The sink's label lane reads both checked labels.
	_, sjs, sviol := connectAs(t, natsURL, "sys1-sink")
	cfg := topology.Default()
	if err := topology.EnsureLabelsStream(ctxT(t, 5*time.Second), sjs, cfg); err != nil {
		t.Fatalf("sink: EnsureLabelsStream: %v", err)
	}
	scons, err := topology.EnsureSinkLabelsConsumer(ctxT(t, 5*time.Second), sjs, cfg, 30*time.Second, 100)
	if err != nil {
		t.Fatalf("sink: label consumer: %v", err)
	}
	batch, err := scons.Fetch(2, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var sources []string
	for m := range batch.Messages() {
		l, derr := contract.DecodeLabel(m.Data())
		if derr != nil {
			t.Fatal(derr)
		}
		sources = append(sources, m.Subject()+" "+l.Source)
		if err := m.Ack(); err != nil {
			t.Fatal(err)
		}
	}
	if strings.Join(sources, ", ") != "sys1.labels.svc-a.accepted producer, sys1.labels.svc-a.accepted review" {
		t.Errorf("the sink read %v", sources)
	}

	// Nothing on the way hit a permission.
	for name, v := range map[string]*violations{"sys1-worker": wviol, "sys1-review": rviol, "svc-a": pviol, "sys1-sink": sviol} {
		if got := v.snapshot(); len(got) > 0 {
			t.Errorf("%s hit permissions on the way:\n%s", name, strings.Join(got, "\n"))
		}
	}

	// And each is refused what is not its job.
	reviewer := connect(t, s, "sys1-review")
	for _, subj := range []string{"sys1.decide.svc-a", "sys1.labels.svc-a", "sys1.labels.svc-a.rejected", "sys1.runs.success", "sys1.review.svc-a", "$KV.sys1-runs.rperm", "sys1.replies.svc-a.x"} {
		if err := reviewer.nc.Publish(subj, []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
		reviewer.expectViolation(t, "Publish", subj)
	}
	refused := func(u *user, subject string, call func(ctx context.Context) error) {
		t.Helper()
		if err := call(ctxT(t, negativeWait)); err == nil {
			t.Fatalf("%s reached %s", u.name, subject)
		}
		u.expectViolation(t, "Publish", subject)
	}
	refused(reviewer, "$JS.API.STREAM.INFO.SYS1_RUNS", func(ctx context.Context) error { _, err := reviewer.js.Stream(ctx, cfg.RunsStream); return err })
	refused(reviewer, "$JS.API.STREAM.INFO.KV_sys1-runs", func(ctx context.Context) error { _, err := reviewer.js.KeyValue(ctx, cfg.RunsBucket); return err })
	refused(reviewer, "$JS.API.CONSUMER.CREATE.SYS1_LABELS", func(ctx context.Context) error {
		_, err := reviewer.js.CreateOrUpdateConsumer(ctx, cfg.LabelsStream, jetstream.ConsumerConfig{Durable: "peek"})
		return err
	})
	producer := connect(t, s, "svc-a")
	for _, subj := range []string{"sys1.labels.svc-b", "sys1.labels.svc-a.accepted", "sys1.labels.svc-b.accepted", "sys1.review.svc-a"} {
		if err := producer.nc.Publish(subj, []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
		producer.expectViolation(t, "Publish", subj)
	}
	sinkUser := connect(t, s, "sys1-sink")
	refused(sinkUser, "$JS.API.CONSUMER.CREATE.SYS1_LABELS.sys1-labels", func(ctx context.Context) error {
		_, err := sinkUser.js.CreateOrUpdateConsumer(ctx, cfg.LabelsStream, jetstream.ConsumerConfig{Durable: cfg.LabelsConsumer, FilterSubject: "sys1.labels.*"})
		return err
	})
	if err := sinkUser.nc.Publish("sys1.labels.svc-a.accepted", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	sinkUser.expectViolation(t, "Publish", "sys1.labels.svc-a.accepted")
}

// browser is a cookie-keeping HTTP client of the review page that does not follow redirects.
type browser struct {
	t    *testing.T
	base string
	http *http.Client
}

type page struct {
	status int
	body   string
}

func newBrowser(t *testing.T, base string) *browser {
	jar, _ := cookiejar.New(nil)
	return &browser{t: t, base: base, http: &http.Client{Jar: jar, Timeout: 10 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

func (b *browser) do(req *http.Request) page {
	b.t.Helper()
	res, err := b.http.Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	return page{res.StatusCode, string(body)}
}

func (b *browser) get(path string) page {
	req, _ := http.NewRequest(http.MethodGet, b.base+path, nil)
	return b.do(req)
}

func (b *browser) post(path string, form url.Values) page {
	req, _ := http.NewRequest(http.MethodPost, b.base+path, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	return b.do(req)
}

var csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

func (b *browser) csrf(body string) string {
	b.t.Helper()
	m := csrfField.FindStringSubmatch(body)
	if m == nil {
		b.t.Fatalf("no CSRF token in the page:\n%s", body)
	}
	return m[1]
}

// login signs in and returns the session's CSRF token.
func (b *browser) login(user, password string) string {
	b.t.Helper()
	res := b.post("/login", url.Values{"csrf": {b.csrf(b.get("/login").body)}, "user": {user}, "password": {password}})
	if res.status != http.StatusSeeOther {
		b.t.Fatalf("login: %d\n%s", res.status, res.body)
	}
	return b.csrf(b.get("/").body)
}
