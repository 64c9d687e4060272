package worker_test

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
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"golang.org/x/crypto/bcrypt"

	"github.com/sys1hq/sys1/cmd/sys1/review"
	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/worker/client"
)

// holdAllPolicy holds every question for review (the fake's confidence is below 0.99).
const holdAllPolicy = `
rules:
  - name: hold-all
    min_confidence: 0.99
    review: hold
`

// TestAHeldLongQuestionIsReleasedByItsLabel: a run held for review whose question name is far
// over 256 bytes (an earlier review page could never show it, so its reply waited until the
// run-id TTL) is shown on the review page, labelled there by a reviewer, and its reply is then
// released once, the question reviewed with that label.
func TestAHeldLongQuestionIsReleasedByItsLabel(t *testing.T) {
	h := newHarness(t)
	h.start(subjectAuth(t), withPolicy(t, holdAllPolicy))
	long := "Is the customer asking for " + strings.Repeat("a refund of every charge ", 60) + "?"
	q, _ := json.Marshal(long)
	body := `{"model":"nimble","state":{"subject":"Refund","body":"Please refund everything"},"questions":{` + string(q) +
		`:{"type":"choice","instructions":"Which team owns this?","criteria":{"billing":"Payments","bug":null}}}}`
	durable := "sys1.replies.svc-a.long-1"
	if _, err := h.cl.Publish(context.Background(), client.Request{Caller: "svc-a", Body: []byte(body), RunID: "long-1", ReplyTo: durable}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the held run's review item", 10*time.Second, func() bool { return len(h.reviewItems()) == 1 })
	it := h.reviewItems()[0]
	if it.Question != long || it.Mode != contract.ReviewHold || len(long) <= 1024 {
		t.Fatalf("review item for %.40q… (%d bytes), mode %s", it.Question, len(long), it.Mode)
	}

	page := startReviewPage(t, h.js)
	csrf := page.login("alice")
	if q := page.get("/"); !strings.Contains(q, it.ID) || !strings.Contains(q, "Is the customer asking for a refund") {
		t.Fatalf("the queue does not show the long question's item %s", it.ID)
	}
	if p := page.get("/items/" + it.ID); !strings.Contains(p, "Is the customer asking for a refund") {
		t.Fatalf("the item page does not show the question")
	}
	if len(h.durableReplies(durable)) != 0 {
		t.Fatalf("a held run was answered before its label")
	}
	if status := page.post("/items/"+it.ID+"/label", url.Values{"csrf": {csrf}, "value": {"bug"}}); status != http.StatusSeeOther {
		t.Fatalf("label: HTTP %d", status)
	}

	waitFor(t, "the released reply", 10*time.Second, func() bool { return len(h.durableReplies(durable)) == 1 })
	m := h.durableReplies(durable)[0]
	rep, err := client.ParseReply(&nats.Msg{Data: m.Data, Header: m.Header})
	if err != nil {
		t.Fatal(err)
	}
	v, ok := rep.Verdicts.Get(long)
	if !ok || v.Status != contract.VerdictReviewed || string(v.Label) != `"bug"` || v.Reviewer != "alice" {
		t.Errorf("the long question's verdict %+v", v)
	}
	if rep.Review == nil || rep.Review.Status != contract.ReviewReviewed {
		t.Errorf("reply %s", rep.Raw)
	}
}

// reviewPage is a review page (sys1 review) on h's NATS, and a signed-in browser for it.
type reviewPage struct {
	t    *testing.T
	url  string
	http *http.Client
}

func startReviewPage(t *testing.T, js jetstream.JetStream) *reviewPage {
	t.Helper()
	hash, err := bcrypt.GenerateFromPassword([]byte("alice-password"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	cfg := review.DefaultConfig()
	cfg.UsersFile = filepath.Join(t.TempDir(), "reviewers")
	if err := os.WriteFile(cfg.UsersFile, []byte("alice:"+string(hash)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	rs, err := review.New(ctx, js, cfg, zerolog.Nop())
	if err != nil {
		cancel()
		t.Fatalf("review.New: %v", err)
	}
	done := make(chan struct{})
	go func() { defer close(done); rs.Run(ctx) }()
	web := httptest.NewServer(rs.Handler())
	t.Cleanup(func() { web.Close(); cancel(); <-done })
	waitFor(t, "the review page to catch up", 10*time.Second, rs.Ready)
	jar, _ := cookiejar.New(nil)
	return &reviewPage{t: t, url: web.URL, http: &http.Client{Jar: jar, Timeout: 30 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

var csrfInPage = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

func (p *reviewPage) do(req *http.Request) (int, string) {
	p.t.Helper()
	res, err := p.http.Do(req)
	if err != nil {
		p.t.Fatalf("%s %s: %v", req.Method, req.URL.Path, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

func (p *reviewPage) get(path string) string {
	p.t.Helper()
	req, _ := http.NewRequest(http.MethodGet, p.url+path, nil)
	status, body := p.do(req)
	if status != http.StatusOK {
		p.t.Fatalf("GET %s: HTTP %d", path, status)
	}
	return body
}

func (p *reviewPage) post(path string, form url.Values) int {
	p.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, p.url+path, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	status, _ := p.do(req)
	return status
}

// login signs in as user (password <user>-password) and returns the session's CSRF token.
func (p *reviewPage) login(user string) string {
	p.t.Helper()
	m := csrfInPage.FindStringSubmatch(p.get("/login"))
	if m == nil {
		p.t.Fatal("no CSRF token on the login page")
	}
	if status := p.post("/login", url.Values{"csrf": {m[1]}, "user": {user}, "password": {user + "-password"}}); status != http.StatusSeeOther {
		p.t.Fatalf("login as %s: HTTP %d", user, status)
	}
	if m = csrfInPage.FindStringSubmatch(p.get("/")); m == nil {
		p.t.Fatalf("no CSRF token on the queue page after login as %s", user)
	}
	return m[1]
}
