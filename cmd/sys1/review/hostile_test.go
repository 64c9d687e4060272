package review

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/contract/wire"
	"github.com/sys1hq/sys1/worker/natsconn/natstest"
)

// loginFrom signs in with X-Forwarded-For set to addr (as a TLS proxy in front would).
func (c *client) loginFrom(addr, user, password string) response {
	c.t.Helper()
	page := c.get("/login")
	req, _ := http.NewRequest(http.MethodPost, c.h.web.URL+"/login",
		strings.NewReader(url.Values{"csrf": {csrfOf(c.t, page.body)}, "user": {user}, "password": {password}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if addr != "" {
		req.Header.Set("X-Forwarded-For", addr)
	}
	return c.do(req)
}

// TestReviewStrangersCannotLockOutAReviewer: behind the TLS proxy README recommends, nine
// failed sign-ins with random names no longer make alice wait (the throttle counts the
// client's address from X-Forwarded-For of a trusted proxy, not the proxy's); a browser alice
// signed in with before is not slowed by anyone's failures, her own name's included; a
// success clears her name's counter; and X-Forwarded-For from anyone but a trusted proxy is
// not believed.
func TestReviewStrangersCannotLockOutAReviewer(t *testing.T) {
	proxies, _ := ParseTrustedProxies("127.0.0.1, ::1")
	h := newHarness(t, harnessOpts{configure: func(c *Config) { c.TrustedProxies = proxies }})
	stranger := h.client()
	for i := range 9 {
		stranger.loginFrom("203.0.113.7", fmt.Sprintf("random-%d", i), "guess")
	}
	if res := stranger.loginFrom("203.0.113.7", "random-x", "guess"); res.status != http.StatusTooManyRequests {
		t.Errorf("the stranger's address after 10 failures: %d, want 429", res.status)
	}
	if res := h.client().loginFrom("198.51.100.9", "alice", testUsers["alice"]); res.status != http.StatusSeeOther {
		t.Fatalf("alice behind the same proxy after a stranger's failures: %d\n%s", res.status, res.body)
	}

	// A success clears alice's own counter: four failures, a success, four more are not five
	// in a row (each from another address, so only her name's counter is at stake).
	for i := range 4 {
		h.client().loginFrom(fmt.Sprintf("192.0.2.%d", i+1), "alice", "typo")
	}
	if res := h.client().loginFrom("192.0.2.50", "alice", testUsers["alice"]); res.status != http.StatusSeeOther {
		t.Fatalf("alice after four typos: %d", res.status)
	}
	for i := range 4 {
		h.client().loginFrom(fmt.Sprintf("192.0.2.%d", i+10), "alice", "typo")
	}
	if res := h.client().loginFrom("192.0.2.60", "alice", testUsers["alice"]); res.status != http.StatusSeeOther {
		t.Fatalf("alice after a success and four more typos: %d (the success did not clear her counter)", res.status)
	}

	// Strangers now guess alice's password from everywhere: a fresh browser waits, the one she
	// signed in with before does not.
	known := h.client()
	if res := known.loginFrom("198.51.100.9", "alice", testUsers["alice"]); res.status != http.StatusSeeOther {
		t.Fatalf("alice's browser: %d", res.status)
	}
	known.post("/logout", url.Values{"csrf": {csrfOf(t, known.get("/").body)}}) // the browser keeps its device cookie
	for i := range 8 {
		h.client().loginFrom(fmt.Sprintf("198.18.0.%d", i+1), "alice", "guess")
	}
	if res := h.client().loginFrom("198.51.100.10", "alice", testUsers["alice"]); res.status != http.StatusTooManyRequests {
		t.Errorf("a new browser for alice while her name is being guessed: %d, want 429", res.status)
	}
	if res := known.loginFrom("198.51.100.9", "alice", testUsers["alice"]); res.status != http.StatusSeeOther {
		t.Errorf("alice's own browser while her name is being guessed: %d, want to sign in", res.status)
	}

	// From a peer that is not a trusted proxy, X-Forwarded-For is the client's own say-so.
	if got := clientAddr(&http.Request{RemoteAddr: "10.9.9.9:5000", Header: http.Header{"X-Forwarded-For": {"1.2.3.4"}}}, proxies); got != "10.9.9.9" {
		t.Errorf("untrusted peer's X-Forwarded-For believed: %s", got)
	}
	for _, tc := range []struct{ xff, want string }{
		{"1.2.3.4", "1.2.3.4"},
		{"6.6.6.6, 1.2.3.4", "1.2.3.4"},   // the client's own claim before the real hop is ignored
		{"1.2.3.4, 127.0.0.1", "1.2.3.4"}, // a chain of trusted proxies
		{"not-an-ip", "127.0.0.1"},
	} {
		r := &http.Request{RemoteAddr: "127.0.0.1:5000", Header: http.Header{"X-Forwarded-For": {tc.xff}}}
		if got := clientAddr(r, proxies); got != tc.want {
			t.Errorf("X-Forwarded-For %q: %s, want %s", tc.xff, got, tc.want)
		}
	}
	if _, err := ParseTrustedProxies("10.0.0.0/8, nonsense"); err == nil || !strings.Contains(err.Error(), "nonsense") {
		t.Errorf("a bad proxy list: %v", err)
	}
	if p, _ := ParseTrustedProxies("10.1.2.3/8"); len(p) != 1 || p[0] != netip.MustParsePrefix("10.0.0.0/8") {
		t.Errorf("prefix not masked: %v", p)
	}
	// The device cookie is the password hash's: a forged or another user's one counts for
	// nothing.
	if _, ok := h.rs.deviceOf(reqWithCookie(h.rs.deviceCookieName(), "YWxpY2U.1700000000.forged"), "alice"); ok {
		t.Error("a forged device cookie was taken")
	}
}

func reqWithCookie(name, value string) *http.Request {
	r, _ := http.NewRequest(http.MethodPost, "/login", nil)
	r.AddCookie(&http.Cookie{Name: name, Value: value})
	return r
}

// TestReviewRedirectsStayLocal: the post-login redirect is a plain local path. What browsers
// read as another site once they have dropped tabs and newlines, or taken a backslash for a
// slash, goes to the queue instead.
func TestReviewRedirectsStayLocal(t *testing.T) {
	for in, want := range map[string]string{
		"/items/rv-1?caller=billing&sort=-confidence": "/items/rv-1?caller=billing&sort=-confidence",
		"/":                             "/",
		"/\t/evil.example/phish":        "/",
		"/\n/evil.example":              "/",
		"/\r/evil.example":              "/",
		"/\x00x":                        "/",
		"/\x7fx":                        "/",
		"/\\evil.example":               "/",
		"/a\\b":                         "/",
		"//evil.example":                "/",
		"https://evil.example/":         "/",
		"evil.example":                  "/",
		"":                              "/",
		"/%09/evil.example":             "/%09/evil.example", // percent-encoded: a path, browsers keep it
		"/\xff":                         "/",
		"/" + strings.Repeat("a", 3000): "/",
	} {
		if got := localPath(in); got != want {
			t.Errorf("localPath(%q) = %q, want %q", in, got, want)
		}
	}
	h := newHarness(t, harnessOpts{})
	c := h.client()
	page := c.get("/login?next=" + url.QueryEscape("/\t/evil.example/phish"))
	res := c.post("/login", url.Values{"csrf": {csrfOf(t, page.body)}, "user": {"alice"}, "password": {testUsers["alice"]}, "next": {"/\t/evil.example/phish"}})
	if res.status != http.StatusSeeOther || res.header.Get("Location") != "/" {
		t.Errorf("login with a TAB in next: %d to %q, want the queue", res.status, res.header.Get("Location"))
	}
	if strings.Contains(page.body, "evil.example") {
		t.Errorf("the login form carries the foreign target")
	}
}

// TestReviewSessionEndsWhenThePasswordChanges: a new hash for alice in the reviewers file ends
// her sessions at once, not after their 12 hours.
func TestReviewSessionEndsWhenThePasswordChanges(t *testing.T) {
	h := newHarness(t, harnessOpts{configure: func(c *Config) { c.UsersReload = 10 * time.Millisecond }})
	alice, bob := h.client(), h.client()
	alice.mustLogin("alice")
	bob.mustLogin("bob")
	old, _ := os.ReadFile(h.cfg.UsersFile)
	var lines []string
	for _, l := range strings.Split(string(old), "\n") {
		if strings.HasPrefix(l, "alice:") {
			hash, _ := bcrypt.GenerateFromPassword([]byte("a new password"), bcrypt.MinCost)
			l = "alice:" + string(hash)
		}
		lines = append(lines, l)
	}
	before := h.rs.users.Current().Fingerprint("alice")
	if err := os.WriteFile(h.cfg.UsersFile, []byte(strings.Join(lines, "\n")), 0o600); err != nil {
		t.Fatal(err)
	}
	natstest.WaitFor(t, 10*time.Second, "the reload", func() bool { return h.rs.users.Current().Fingerprint("alice") != before })
	if res := alice.get("/"); res.status != http.StatusSeeOther || !strings.HasPrefix(res.header.Get("Location"), "/login") {
		t.Errorf("alice's session after her password changed: %d %s", res.status, res.header.Get("Location"))
	}
	if res := bob.get("/"); res.status != http.StatusOK {
		t.Errorf("bob's session: %d", res.status)
	}
	if res := h.client().login("alice", "a new password"); res.status != http.StatusSeeOther {
		t.Errorf("alice with her new password: %d", res.status)
	}
}

// TestReviewLongQuestionNamesAreShownAndLabelled: a question name over 256 bytes (here 2 KiB)
// is in the queue — cut, the whole name on hover — and its item can be labelled, so a held
// reply waiting for it is released like any other.
func TestReviewLongQuestionNamesAreShownAndLabelled(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	long := "Is the customer asking for " + strings.Repeat("a refund of every charge ", 80) + "?"
	it := ticketItem("run-long")
	it.Question, it.ID = long, contract.ReviewItemID("run-long", long)
	h.publish(it)
	h.waitIndexed(it.ID)
	if n := h.rs.idx.malformed.Load(); n != 0 {
		t.Fatalf("%d malformed items", n)
	}
	c := h.client()
	csrf := c.mustLogin("alice")
	q := c.get("/").body
	if !strings.Contains(q, `title="`+long[:200]) || !strings.Contains(q, "Is the customer asking for a refund") || strings.Contains(q, long) {
		i := strings.Index(q, "<table")
		t.Errorf("the queue does not show the long name cut with the whole of it on hover: %s", q[max(i, 0):min(i+4000, len(q))])
	}
	page := c.get("/items/" + it.ID)
	if page.status != http.StatusOK || !strings.Contains(page.body, "The whole question name") {
		t.Fatalf("item page: %d", page.status)
	}
	res := c.post("/items/"+it.ID+"/label", url.Values{"csrf": {csrf}, "value": {"bug"}})
	if res.status != http.StatusSeeOther {
		t.Fatalf("label: %d\n%s", res.status, res.body)
	}
	natstest.WaitFor(t, 10*time.Second, "the label", func() bool { return len(h.labels()) == 1 })
	l, err := contract.DecodeLabel(h.labels()[0].Data)
	if err != nil || l.Question != long || l.Item != it.ID {
		t.Errorf("label %+v, %v", l, err)
	}
}

// TestReviewStaticFilesAreNotListed: /static/ serves its files, never a listing.
func TestReviewStaticFilesAreNotListed(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	c := h.client()
	for _, p := range []string{"/static/", "/static", "/static/..", "/static/nope.css"} {
		res := c.get(p)
		if res.status == http.StatusOK || strings.Contains(res.body, `href="review.css"`) || strings.Contains(res.body, `href="favicon.svg"`) {
			t.Errorf("GET %s: %d\n%s", p, res.status, res.body)
		}
	}
	if res := c.get("/static/review.css"); res.status != http.StatusOK || !strings.Contains(res.header.Get("Content-Type"), "text/css") {
		t.Errorf("GET /static/review.css: %d %s", res.status, res.header.Get("Content-Type"))
	}
}

// TestReviewShowsARunsMessageAndEarlierItems: a run's review message (its state once, two
// questions) is two items in the queue, each showing the state and labelled on its own; an
// item of the earlier format, already on the stream, is shown and labelled alike.
func TestReviewShowsARunsMessageAndEarlierItems(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	first := ticketItem("run-two")
	second := ticketItem("run-two")
	second.Question, second.ID = "urgent", contract.ReviewItemID("run-two", "urgent")
	second.Type, second.Options, second.Probabilities, second.Choice = contract.TypeNoul, nil, nil, ""
	noul := 0.55
	second.Noul = &noul
	rr := contract.ReviewRun{RunID: "run-two", Caller: "billing", Provider: "ollama", Model: "nimble", State: first.State,
		Images: []contract.ImageRef{}, CreatedAt: first.CreatedAt, Items: []contract.ReviewItem{first, second}}
	b, _ := rr.MarshalJSON()
	h.publishRaw(wire.ReviewPrefix+"billing", b)
	legacy := ticketItem("run-old")
	h.publish(legacy)
	for _, id := range []string{first.ID, second.ID, legacy.ID} {
		h.waitIndexed(id)
	}
	c := h.client()
	csrf := c.mustLogin("alice")
	for _, id := range []string{first.ID, second.ID, legacy.ID} {
		page := c.get("/items/" + id)
		if page.status != http.StatusOK || !strings.Contains(page.body, "Charged twice after the app crashed") {
			t.Errorf("item %s: %d, state shown %v", id, page.status, strings.Contains(page.body, "Charged twice"))
		}
	}
	for id, value := range map[string]string{first.ID: "bug", second.ID: "true", legacy.ID: "billing"} {
		if res := c.post("/items/"+id+"/label", url.Values{"csrf": {csrf}, "value": {value}}); res.status != http.StatusSeeOther {
			t.Errorf("label %s: %d", id, res.status)
		}
	}
	natstest.WaitFor(t, 10*time.Second, "three labels", func() bool { return len(h.labels()) == 3 })
	if q := c.get("/").body; !strings.Contains(q, "Nothing to review") {
		t.Error("the queue is not empty after labelling every item")
	}
	_ = context.Background()
}

// TestReviewLabelledMessagesLeaveTheStream: once every item of a run's review message is
// labelled and published, the message leaves SYS1_REVIEW — the caller's review quota counts
// what is pending — and a reviewer who had one of its items open is told who labelled it.
func TestReviewLabelledMessagesLeaveTheStream(t *testing.T) {
	h := newHarness(t, harnessOpts{configure: func(c *Config) { c.PruneEvery = 50 * time.Millisecond }})
	first := ticketItem("run-done")
	second := ticketItem("run-done")
	second.Question, second.ID = "urgent", contract.ReviewItemID("run-done", "urgent")
	second.Type, second.Options, second.Probabilities, second.Choice = contract.TypeNoul, nil, nil, ""
	rr := contract.ReviewRun{RunID: "run-done", Caller: "billing", Provider: "ollama", Model: "nimble", State: first.State,
		Images: []contract.ImageRef{}, CreatedAt: first.CreatedAt, Items: []contract.ReviewItem{first, second}}
	b, _ := rr.MarshalJSON()
	seq := h.publishRaw(wire.ReviewPrefix+"billing", b)
	other := ticketItem("run-pending")
	h.publish(other)
	h.waitIndexed(second.ID)
	h.waitIndexed(other.ID)
	onStream := func(seq uint64) bool {
		s, _ := h.js.Stream(context.Background(), h.cfg.Topology.ReviewStream)
		_, err := s.GetMsg(context.Background(), seq)
		return err == nil
	}
	alice, bob := h.client(), h.client()
	csrf := alice.mustLogin("alice")
	bobCSRF := bob.mustLogin("bob")
	alice.post("/items/"+first.ID+"/label", url.Values{"csrf": {csrf}, "value": {"bug"}})
	natstest.WaitFor(t, 10*time.Second, "the first label published", func() bool { return len(h.labels()) == 1 })
	natstest.WaitFor(t, 10*time.Second, "the first label in the index as published", func() bool {
		l, ok := h.rs.idx.label(first.ID)
		return ok && l.Published
	})
	sweeps := h.rs.idx.sweeps.Load()
	natstest.WaitFor(t, 10*time.Second, "two more sweeps", func() bool { return h.rs.idx.sweeps.Load() >= sweeps+2 })
	if !onStream(seq) {
		t.Fatal("a half-labelled message left the stream")
	}
	alice.post("/items/"+second.ID+"/label", url.Values{"csrf": {csrf}, "value": {"false"}})
	natstest.WaitFor(t, 10*time.Second, "the labelled message removed", func() bool { return !onStream(seq) })
	if res := bob.get("/items/" + second.ID); !strings.Contains(res.body, "Already labelled by alice") {
		t.Errorf("bob opening a labelled, removed item: %d\n%s", res.status, res.body)
	}
	if res := bob.post("/items/"+second.ID+"/label", url.Values{"csrf": {bobCSRF}, "value": {"true"}}); !strings.Contains(res.body, "Already labelled by alice") {
		t.Errorf("bob labelling it: %d", res.status)
	}
	if !onStream(2) {
		t.Error("the pending item's message was removed")
	}
	if n := len(h.labels()); n != 2 {
		t.Errorf("%d labels, want 2", n)
	}
}
