package review

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"golang.org/x/crypto/bcrypt"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/contract/wire"
	"github.com/sys1hq/sys1/worker/natsconn/natstest"
)

func TestMain(m *testing.M) {
	hashCost = bcrypt.MinCost // the cost is checked by cmd/sys1's --hash-password test
	os.Exit(m.Run())
}

// harness is a review page against a real nats-server, served on a real loopback port.
type harness struct {
	t    *testing.T
	srv  *server.Server
	js   jetstream.JetStream
	rs   *Server
	web  *httptest.Server
	logs *natstest.Buffer
	cfg  Config
	stop context.CancelFunc
	done chan struct{}
}

type harnessOpts struct {
	maxPayload int32
	configure  func(*Config)
	reuse      *harness // same NATS server (a restart of the review page)
}

// Test users: bcrypt at its minimum cost keeps the tests fast.
var testUsers = map[string]string{"alice": "alice-password", "bob": "bob-password-2"}

func writeUsers(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	b.WriteString("# reviewers\n")
	for name, pw := range testUsers {
		h, err := bcrypt.GenerateFromPassword([]byte(pw), bcrypt.MinCost)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "%s:%s\n", name, h)
	}
	path := filepath.Join(t.TempDir(), "reviewers.htpasswd")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func newHarness(t *testing.T, o harnessOpts) *harness {
	t.Helper()
	h := &harness{t: t, logs: &natstest.Buffer{}}
	if o.reuse != nil {
		h.srv, h.js = o.reuse.srv, o.reuse.js
	} else {
		h.srv = natstest.Start(t, func(opts *server.Options) {
			if o.maxPayload > 0 {
				opts.MaxPayload = o.maxPayload
			}
		})
		_, h.js = natstest.Connect(t, h.srv)
	}
	cfg := DefaultConfig()
	cfg.UsersFile = writeUsers(t)
	cfg.RecoverAfter, cfg.RecoverEvery = 0, 20*time.Millisecond
	if o.maxPayload > 0 {
		cfg.Topology.MaxMsgSize = o.maxPayload
		cfg.MaxItemBytes = int(o.maxPayload)
	}
	if o.configure != nil {
		o.configure(&cfg)
	}
	h.cfg = cfg
	log := zerolog.New(h.logs)
	rs, err := New(context.Background(), h.js, cfg, log)
	if err != nil {
		t.Fatalf("review.New: %v", err)
	}
	h.rs = rs
	ctx, cancel := context.WithCancel(context.Background())
	h.stop, h.done = cancel, make(chan struct{})
	go func() { defer close(h.done); rs.Run(ctx) }()
	h.web = httptest.NewServer(rs.Handler())
	t.Cleanup(h.close)
	natstest.WaitFor(t, 10*time.Second, "the index to catch up", rs.Ready)
	return h
}

// close stops the page (a crash, as far as NATS is concerned: nothing is flushed on purpose).
func (h *harness) close() {
	if h.stop == nil {
		return
	}
	h.web.Close()
	h.stop()
	<-h.done
	h.stop = nil
}

func desc(s string) *string { return &s }

// ticketItem is a choice item like the worker publishes for an abstained triage question.
func ticketItem(runID string) contract.ReviewItem {
	conf := 0.18
	return contract.ReviewItem{
		ID: contract.ReviewItemID(runID, "label"), RunID: runID, Caller: "billing", Provider: "ollama", Model: "nimble",
		Question: "label", Type: contract.TypeChoice,
		Instructions: json.RawMessage(`"Which team should handle this ticket?"`),
		Options: []contract.Option{{Key: "billing", Description: desc("charges, invoices, refunds")},
			{Key: "bug", Description: desc("something is broken")}, {Key: "account", Description: desc("login, profile, access")}},
		Probabilities: []contract.Probability{{Key: "billing", P: 0.41}, {Key: "bug", P: 0.23}, {Key: "account", P: 0.36}},
		Confidence:    &conf, Choice: "billing",
		Verdict: contract.Verdict{Status: contract.VerdictAbstained, Rule: "triage", Reason: "confidence 0.18 < 0.50"},
		Mode:    contract.ReviewNotify,
		State: json.RawMessage(`{"ticket":{"subject":"Charged twice after the app crashed","body":"I tried to pay my invoice and the app ` +
			`crashed, then I saw two charges on my card. I also cannot log in on my phone since.","customer":"c-1042","plan":"pro"},` +
			`"history":[{"at":"2026-11-28","event":"invoice issued"},{"at":"2026-11-29","event":"payment failed"}]}`),
		Images:    []contract.ImageRef{},
		CreatedAt: time.Now().UTC().Add(-5 * time.Minute),
	}
}

func (h *harness) publish(it contract.ReviewItem) uint64 {
	h.t.Helper()
	b, err := it.MarshalJSON()
	if err != nil {
		h.t.Fatal(err)
	}
	return h.publishRaw(wire.ReviewPrefix+it.Caller, b)
}

func (h *harness) publishRaw(subject string, b []byte) uint64 {
	h.t.Helper()
	ack, err := h.js.Publish(context.Background(), subject, b)
	if err != nil {
		h.t.Fatalf("publish %s: %v", subject, err)
	}
	return ack.Sequence
}

// waitIndexed waits until the index holds item id.
func (h *harness) waitIndexed(id string) {
	h.t.Helper()
	// Generous: a 10 MB item takes seconds to read and decode under the race detector on a
	// busy 2-core machine.
	natstest.WaitFor(h.t, time.Minute, "item "+id+" in the index", func() bool {
		_, _, ok := h.rs.idx.item(id)
		return ok
	})
}

// labels returns every message on the labels stream.
func (h *harness) labels() []*jetstream.RawStreamMsg {
	h.t.Helper()
	ctx := context.Background()
	s, err := h.js.Stream(ctx, h.cfg.Topology.LabelsStream)
	if err != nil {
		h.t.Fatal(err)
	}
	var out []*jetstream.RawStreamMsg
	for seq := s.CachedInfo().State.FirstSeq; seq <= s.CachedInfo().State.LastSeq && seq > 0; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err == nil {
			out = append(out, m)
		}
	}
	return out
}

// client is one browser-like HTTP client with its own cookies; it does not follow redirects,
// so tests see each response.
type client struct {
	t    *testing.T
	h    *harness
	http *http.Client
}

func (h *harness) client() *client {
	jar, _ := cookiejar.New(nil)
	return &client{t: h.t, h: h, http: &http.Client{Jar: jar, Timeout: 30 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

type response struct {
	status int
	header http.Header
	body   string
}

func (c *client) do(req *http.Request) response {
	c.t.Helper()
	res, err := c.http.Do(req)
	if err != nil {
		c.t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return response{status: res.StatusCode, header: res.Header, body: string(b)}
}

func (c *client) get(path string) response {
	c.t.Helper()
	req, _ := http.NewRequest(http.MethodGet, c.h.web.URL+path, nil)
	return c.do(req)
}

func (c *client) post(path string, form url.Values) response {
	c.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, c.h.web.URL+path, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	return c.do(req)
}

var csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

func csrfOf(t *testing.T, body string) string {
	t.Helper()
	m := csrfField.FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no CSRF token in the page:\n%s", body)
	}
	return m[1]
}

// login signs in and returns the session's CSRF token.
func (c *client) login(user, password string) response {
	c.t.Helper()
	page := c.get("/login")
	return c.post("/login", url.Values{"csrf": {csrfOf(c.t, page.body)}, "user": {user}, "password": {password}})
}

func (c *client) mustLogin(user string) string {
	c.t.Helper()
	res := c.login(user, testUsers[user])
	if res.status != http.StatusSeeOther {
		c.t.Fatalf("login as %s: %d\n%s", user, res.status, res.body)
	}
	return csrfOf(c.t, c.get("/").body)
}
