package review

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/crypto/bcrypt"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/contract/wire"
	"github.com/sys1hq/sys1/worker/natsconn/natstest"
	"github.com/sys1hq/sys1/worker/topology"
)

func TestReviewParseUsersNamesEveryBadLine(t *testing.T) {
	good := "$2y$05$" + strings.Repeat("a", 53)
	file := strings.Join([]string{
		"# comment", "",
		"alice:" + good,
		"bob:$apr1$abc$defghijklmnopqrstuvwx", // line 4
		"carol:{SHA}W6ph5Mm5Pz8GgiULbPgzG37mj9g=",
		"dave:abcdefghijklm", // crypt
		"erin:hunter2",       // plain text
		"no colon here",
		"alice:" + good,      // duplicate
		"bad name:" + good,   // space in the name
		"frank:$2y$05$short", // malformed bcrypt
	}, "\n")
	_, err := ParseUsers([]byte(file))
	if err == nil {
		t.Fatal("bad file accepted")
	}
	for _, want := range []string{
		`line 4 (user "bob"): the password hash is Apache MD5 ($apr1$); only bcrypt`,
		`line 5 (user "carol"): the password hash is SHA-1 ({SHA})`,
		`line 6 (user "dave"): the password hash is crypt (DES)`,
		`line 7 (user "erin"): the password hash is not a recognised hash (plain text?)`,
		`line 8: not name:hash`,
		`line 9 (user "alice"): the user is listed twice`,
		`line 10: user name "bad name"`,
		`line 11 (user "frank"): the bcrypt hash is malformed`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
	if strings.Contains(err.Error(), "hunter2") || strings.Contains(err.Error(), "W6ph5") {
		t.Errorf("the error quotes a password or hash: %v", err)
	}
	if _, err := ParseUsers([]byte("# nobody\n")); err == nil || !strings.Contains(err.Error(), "no users") {
		t.Errorf("empty file: %v", err)
	}
	line, err := HashPassword("zoe", "a long enough password")
	if err != nil {
		t.Fatal(err)
	}
	u, err := ParseUsers([]byte(line + "\n"))
	if err != nil || !u.Verify("zoe", "a long enough password") || u.Verify("zoe", "wrong") || u.Verify("nobody", "a long enough password") {
		t.Fatalf("HashPassword's line does not verify: %v", err)
	}
	if cost, _ := bcrypt.Cost([]byte(line[len("zoe:"):])); cost != hashCost {
		t.Errorf("HashPassword's cost is %d, want %d", cost, hashCost)
	}
}

func TestReviewCheckListen(t *testing.T) {
	for _, tc := range []struct {
		addr string
		tls  bool
		ok   bool
	}{
		{"127.0.0.1:8090", false, true}, {"localhost:8090", false, true}, {"[::1]:8090", false, true},
		{"127.8.9.10:80", false, true}, {":8090", false, false}, {"0.0.0.0:8090", false, false},
		{"192.0.2.7:8090", false, false}, {"0.0.0.0:8443", true, true}, {"nonsense", true, false},
	} {
		err := CheckListen(tc.addr, tc.tls)
		if (err == nil) != tc.ok {
			t.Errorf("CheckListen(%q, tls=%v) = %v", tc.addr, tc.tls, err)
		}
	}
}

func TestReviewLoginWrongPasswordAndThrottle(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	c := h.client()
	res := c.login("alice", "not her password")
	if res.status != http.StatusUnauthorized || !strings.Contains(res.body, "Wrong user name or password.") {
		t.Fatalf("wrong password: %d\n%s", res.status, res.body)
	}
	// An unknown user reads exactly the same.
	if res := c.login("mallory", "x"); res.status != http.StatusUnauthorized || !strings.Contains(res.body, "Wrong user name or password.") {
		t.Fatalf("unknown user: %d", res.status)
	}
	if c.get("/").status != http.StatusSeeOther {
		t.Fatal("a failed login opened the queue")
	}
	for range freeFailures - 1 {
		c.login("alice", "guess")
	}
	// Now even the right password waits: guessing cannot go faster than the delay.
	res = c.login("alice", testUsers["alice"])
	if res.status != http.StatusTooManyRequests || res.header.Get("Retry-After") == "" || !strings.Contains(res.body, "Too many failed sign-ins") {
		t.Fatalf("after %d failures: %d %v\n%s", freeFailures, res.status, res.header, res.body)
	}
	if strings.Contains(h.logs.String(), "guess") || strings.Contains(h.logs.String(), testUsers["alice"]) {
		t.Errorf("a password reached the log:\n%s", h.logs.String())
	}
	// The client address is throttled too: bob, from the same address, waits as well.
	if res := h.client().login("bob", testUsers["bob"]); res.status != http.StatusTooManyRequests {
		t.Errorf("same address, other user: %d, want 429 (the address is throttled)", res.status)
	}
}

func TestReviewThrottleDelays(t *testing.T) {
	now := time.Unix(1000, 0)
	th := newThrottle(func() time.Time { return now })
	for range freeFailures {
		if d := th.wait("user:a"); d != 0 {
			t.Fatalf("waits %s before %d failures", d, freeFailures)
		}
		th.fail("user:a")
	}
	if d := th.wait("user:a"); d != time.Second {
		t.Fatalf("after %d failures wait %s, want 1s", freeFailures, d)
	}
	th.fail("user:a")
	if d := th.wait("user:a", "ip:x"); d != 2*time.Second {
		t.Fatalf("after one more, wait %s, want 2s", d)
	}
	now = now.Add(2 * time.Second)
	if d := th.wait("user:a"); d != 0 {
		t.Fatalf("the delay did not pass: %s", d)
	}
	for range 30 {
		th.fail("user:a")
	}
	if d := th.wait("user:a"); d != maxLoginDelay {
		t.Fatalf("the delay is not capped: %s", d)
	}
	th.succeed("user:a")
	if d := th.wait("user:a"); d != 0 {
		t.Fatalf("success did not reset: %s", d)
	}
}

func TestReviewSessionExpiryAndLogout(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	c := h.client()
	csrf := c.mustLogin("alice")
	if res := c.get("/"); res.status != http.StatusOK || !strings.Contains(res.body, "Signed in as <strong>alice</strong>") {
		t.Fatalf("queue after login: %d", res.status)
	}
	// The session ends on the server at its expiry, whatever the browser keeps.
	h.rs.sessions.now = func() time.Time { return time.Now().Add(h.cfg.SessionTTL + time.Second) }
	if res := c.get("/"); res.status != http.StatusSeeOther || !strings.HasPrefix(res.header.Get("Location"), "/login") {
		t.Fatalf("expired session: %d %s", res.status, res.header.Get("Location"))
	}
	if res := c.post("/logout", url.Values{"csrf": {csrf}}); res.status != http.StatusForbidden {
		t.Fatalf("POST with an expired session: %d", res.status)
	}
	h.rs.sessions.now = time.Now
	// Logout ends the session on the server: replaying the old cookie fails.
	if res := c.post("/logout", url.Values{"csrf": {csrf}}); res.status != http.StatusSeeOther {
		t.Fatalf("logout: %d", res.status)
	}
	u, _ := url.Parse(h.web.URL)
	old := &http.Cookie{Name: "sys1_review", Value: "x"}
	for _, ck := range c.http.Jar.Cookies(u) {
		old = ck
	}
	replay := h.client()
	replay.http.Jar.SetCookies(u, []*http.Cookie{old})
	if res := replay.get("/"); res.status != http.StatusSeeOther {
		t.Fatalf("the logged-out cookie still works: %d", res.status)
	}
}

// TestReviewSessionsBucketIsBounded: once the review page has started, its sessions bucket
// (KV_sys1-review-sessions) has the byte limit SYS1_REVIEW_SESSIONS_MAX_BYTES, by default and
// as configured, also when an earlier version left the bucket unbounded; sessions are stored
// in it.
func TestReviewSessionsBucketIsBounded(t *testing.T) {
	limit := func(h *harness) int64 {
		t.Helper()
		s, err := h.js.Stream(context.Background(), "KV_"+h.cfg.SessionsBucket)
		if err != nil {
			t.Fatal(err)
		}
		return s.CachedInfo().Config.MaxBytes
	}
	h := newHarness(t, harnessOpts{})
	if got, want := limit(h), int64(topology.Default().ReviewSessionsMaxBytes); got != want || want <= 0 {
		t.Errorf("sessions bucket max bytes %d, want the default of SYS1_REVIEW_SESSIONS_MAX_BYTES, %d", got, want)
	}
	// As a version before the bounds left it: no byte limit.
	unbounded := SessionsBucketConfig(h.cfg.SessionsBucket, h.cfg.SessionTTL, 1, 0)
	if _, err := h.js.UpdateKeyValue(context.Background(), unbounded); err != nil {
		t.Fatal(err)
	}
	h.close()
	h2 := newHarness(t, harnessOpts{reuse: h, configure: func(c *Config) { c.Topology.ReviewSessionsMaxBytes = 3 * topology.MiB }})
	if got := limit(h2); got != int64(3*topology.MiB) {
		t.Errorf("after a restart with SYS1_REVIEW_SESSIONS_MAX_BYTES=3MiB: max bytes %d", got)
	}
	h2.client().mustLogin("alice")
	kv, err := h2.js.KeyValue(context.Background(), h2.cfg.SessionsBucket)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := kv.Status(context.Background()); err != nil || st.Values() != 1 {
		t.Errorf("sessions stored: %v, %v; want 1", st, err)
	}
}

func TestReviewCookiesAndSecurityHeaders(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	c := h.client()
	res := c.login("alice", testUsers["alice"])
	var session string
	for _, sc := range res.header.Values("Set-Cookie") {
		if strings.HasPrefix(sc, "sys1_review=") {
			session = sc
		}
	}
	for _, want := range []string{"HttpOnly", "SameSite=Lax", "Path=/", "Max-Age=43200"} {
		if !strings.Contains(session, want) {
			t.Errorf("session cookie lacks %s: %s", want, session)
		}
	}
	page := c.get("/")
	for k, want := range map[string]string{
		"Content-Security-Policy": "script-src 'self'", "X-Frame-Options": "DENY",
		"X-Content-Type-Options": "nosniff", "Referrer-Policy": "same-origin", "Cache-Control": "no-store",
	} {
		if !strings.Contains(page.header.Get(k), want) {
			t.Errorf("%s = %q, want it to contain %q", k, page.header.Get(k), want)
		}
	}
	if strings.Contains(page.header.Get("Content-Security-Policy"), "unsafe-inline") {
		t.Error("the CSP allows inline script or style")
	}
	if !strings.Contains(page.header.Get("Content-Security-Policy"), "frame-ancestors 'none'") {
		t.Error("the CSP allows framing")
	}
}

func TestReviewCSRF(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	it := ticketItem("run-csrf")
	h.publish(it)
	h.waitIndexed(it.ID)
	c := h.client()
	csrf := c.mustLogin("alice")
	path := "/items/" + it.ID + "/label"
	for name, form := range map[string]url.Values{
		"no token":    {"value": {"bug"}},
		"wrong token": {"value": {"bug"}, "csrf": {strings.Repeat("x", 43)}},
	} {
		if res := c.post(path, form); res.status != http.StatusForbidden || !strings.Contains(res.body, "security token") {
			t.Errorf("%s: %d\n%s", name, res.status, res.body)
		}
	}
	// A token without a session (another browser that copied it) is refused too.
	if res := h.client().post(path, url.Values{"value": {"bug"}, "csrf": {csrf}}); res.status != http.StatusForbidden {
		t.Errorf("no session: %d", res.status)
	}
	// A cross-site form post is refused before any token is looked at.
	req, _ := http.NewRequest(http.MethodPost, h.web.URL+path, strings.NewReader(url.Values{"value": {"bug"}, "csrf": {csrf}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	if res := c.do(req); res.status != http.StatusForbidden {
		t.Errorf("cross-site POST: %d", res.status)
	}
	// The login form has its own token, bound to a cookie.
	if res := h.client().post("/login", url.Values{"user": {"alice"}, "password": {testUsers["alice"]}}); res.status != http.StatusForbidden {
		t.Errorf("login without its token: %d", res.status)
	}
	if n := len(h.labels()); n != 0 {
		t.Fatalf("%d labels were published by refused requests", n)
	}
	// With the token, the same request goes through.
	if res := c.post(path, url.Values{"value": {"bug"}, "csrf": {csrf}}); res.status != http.StatusSeeOther {
		t.Fatalf("good POST: %d\n%s", res.status, res.body)
	}
}

func TestReviewLabelIsPublished(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	conf := 0.3
	noulP := 0.55
	items := []struct {
		it    contract.ReviewItem
		form  url.Values
		label string
	}{
		{ticketItem("run-choice"), url.Values{"value": {"account"}}, `"account"`},
		{contract.ReviewItem{ID: contract.ReviewItemID("run-noul", "refund"), RunID: "run-noul", Caller: "billing", Question: "refund",
			Type: contract.TypeNoul, Noul: &noulP, Verdict: contract.Verdict{Status: contract.VerdictAbstained}, CreatedAt: time.Now()},
			url.Values{"value": {"false"}}, `false`},
		{contract.ReviewItem{ID: contract.ReviewItemID("run-score", "urgency"), RunID: "run-score", Caller: "support", Question: "urgency",
			Type: contract.TypeScore, Levels: []string{"calm", "annoyed", "blocked"}, Confidence: &conf,
			Probabilities: []contract.Probability{{Key: "0", P: 0.2}, {Key: "1", P: 0.5}, {Key: "2", P: 0.3}},
			Verdict:       contract.Verdict{Status: contract.VerdictAbstained}, CreatedAt: time.Now()},
			url.Values{"value": {"2"}}, `2`},
		{ticketItem("run-none"), url.Values{"none": {"1"}}, `null`},
	}
	for _, x := range items {
		h.publish(x.it)
		h.waitIndexed(x.it.ID)
	}
	c := h.client()
	csrf := c.mustLogin("alice")
	// Values that do not fit their item are refused and publish nothing.
	for _, bad := range []struct {
		id   string
		form url.Values
	}{
		{items[0].it.ID, url.Values{"value": {"refund"}}}, {items[1].it.ID, url.Values{"value": {"maybe"}}},
		{items[2].it.ID, url.Values{"value": {"3"}}}, {items[2].it.ID, url.Values{"value": {"01"}}},
	} {
		bad.form.Set("csrf", csrf)
		if res := c.post("/items/"+bad.id+"/label", bad.form); res.status != http.StatusBadRequest || !strings.Contains(res.body, "does not fit") {
			t.Errorf("bad label %v: %d", bad.form, res.status)
		}
	}
	for _, x := range items {
		x.form.Set("csrf", csrf)
		res := c.post("/items/"+x.it.ID+"/label", x.form)
		if res.status != http.StatusSeeOther {
			t.Fatalf("label %s: %d\n%s", x.it.ID, res.status, res.body)
		}
	}
	natstest.WaitFor(t, 10*time.Second, "four labels", func() bool { return len(h.labels()) == 4 })
	for i, m := range h.labels() {
		x := items[i]
		if want := wire.LabelsPrefix + x.it.Caller + ".accepted"; m.Subject != want {
			t.Errorf("subject %s, want %s", m.Subject, want)
		}
		if got := m.Header.Get(jetstream.MsgIDHeader); got != "review:"+x.it.ID {
			t.Errorf("Nats-Msg-Id %q", got)
		}
		l, derr := contract.DecodeLabel(m.Data)
		if derr != nil {
			t.Fatalf("label message: %v\n%s", derr, m.Data)
		}
		if string(l.Value) != x.label || l.RunID != x.it.RunID || l.Question != x.it.Question || l.Reviewer != "alice" ||
			l.Source != contract.LabelSourceReview || l.Caller != x.it.Caller || l.Item != x.it.ID || time.Since(l.LabelledAt) > time.Minute {
			t.Errorf("label %d = %+v (value %s), want value %s", i, l, l.Value, x.label)
		}
	}
	// The queue is empty now, and the count says who did it.
	q := c.get("/")
	if !strings.Contains(q.body, "Nothing to review") || !strings.Contains(q.body, "<strong>4</strong> by you") {
		t.Errorf("queue after labelling everything:\n%s", q.body)
	}
}

func TestReviewDoubleLabelFirstWins(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	it := ticketItem("run-double")
	h.publish(it)
	h.waitIndexed(it.ID)
	alice, bob := h.client(), h.client()
	ac, bc := alice.mustLogin("alice"), bob.mustLogin("bob")
	if res := bob.get("/items/" + it.ID); res.status != http.StatusOK {
		t.Fatalf("bob opens the item: %d", res.status)
	}
	if res := alice.post("/items/"+it.ID+"/label", url.Values{"csrf": {ac}, "value": {"bug"}}); res.status != http.StatusSeeOther {
		t.Fatalf("alice: %d", res.status)
	}
	res := bob.post("/items/"+it.ID+"/label", url.Values{"csrf": {bc}, "value": {"billing"}})
	if res.status != http.StatusConflict || !strings.Contains(res.body, "Already labelled by <strong>alice</strong>") || !strings.Contains(res.body, "“bug”") {
		t.Fatalf("bob's late label: %d\n%s", res.status, res.body)
	}
	// Alice's double click is not an error, and publishes nothing more.
	if res := alice.post("/items/"+it.ID+"/label", url.Values{"csrf": {ac}, "value": {"bug"}}); res.status != http.StatusSeeOther {
		t.Fatalf("alice again: %d", res.status)
	}
	natstest.WaitFor(t, 5*time.Second, "the label", func() bool { return len(h.labels()) >= 1 })
	if n := len(h.labels()); n != 1 {
		t.Fatalf("%d labels on the stream, want 1", n)
	}
	// Two replicas of the page share the bucket: a second replica sees the label too.
	h2 := newHarness(t, harnessOpts{reuse: h})
	other := h2.client()
	other.mustLogin("bob")
	if page := other.get("/items/" + it.ID); !strings.Contains(page.body, "Already labelled by <strong>alice</strong>") {
		t.Errorf("the second replica does not know the label:\n%s", page.body)
	}
}

func TestReviewHugeStateIsTruncated(t *testing.T) {
	h := newHarness(t, harnessOpts{maxPayload: 16 << 20})
	it := ticketItem("run-huge")
	big := strings.Repeat(`{"line":"lorem ipsum dolor sit amet, consectetur adipiscing elit"},`, 10<<20/66)
	it.State = json.RawMessage(`{"rows":[` + big + `{}]}`)
	if len(it.State) < 10<<20 {
		t.Fatalf("state is only %d bytes", len(it.State))
	}
	h.publish(it)
	h.waitIndexed(it.ID)
	c := h.client()
	c.mustLogin("alice")
	res := c.get("/items/" + it.ID)
	if res.status != http.StatusOK {
		t.Fatalf("item page: %d", res.status)
	}
	if len(res.body) > 200<<10 {
		t.Errorf("the page is %d bytes: the state was not cut", len(res.body))
	}
	if !strings.Contains(res.body, "Showing the first 64.0 KiB of 10.2 MiB") {
		t.Errorf("no truncation notice")
	}
	if !strings.Contains(res.body, `&#34;line&#34;: &#34;lorem ipsum`) {
		t.Errorf("the shown part is not the indented state")
	}
	// The page still works: its label form is there.
	if !strings.Contains(res.body, `data-shortcut="1"`) {
		t.Errorf("the label form is missing")
	}
}

func TestReviewShowLimits(t *testing.T) {
	s := show(json.RawMessage(`"a\nb \u00e9\ud83d\ude00 \"q\""`), 100)
	if s.Text != "a\nb é😀 \"q\"" || s.JSON || s.Truncated {
		t.Errorf("string state: %+v", s)
	}
	s = show(json.RawMessage(`{"a":[1,2,{}],"b":{"c":"x,y:z"},"e":[]}`), 1000)
	want := "{\n  \"a\": [\n    1,\n    2,\n    {}\n  ],\n  \"b\": {\n    \"c\": \"x,y:z\"\n  },\n  \"e\": []\n}"
	if s.Text != want || !s.JSON {
		t.Errorf("indent:\n%s\nwant\n%s", s.Text, want)
	}
	long := `"` + strings.Repeat("é", 1000) + `"`
	for _, raw := range []string{long, `{"k":` + long + `}`} {
		s = show(json.RawMessage(raw), 101)
		if !s.Truncated || len(s.Text) > 101 || !strings.HasSuffix(s.Text, "é") && !strings.HasSuffix(s.Text, "\"") {
			t.Errorf("cut %q: %d bytes %q", raw[:10], len(s.Text), s.Text[len(s.Text)-4:])
		}
		if !json.Valid([]byte(`"`+strings.TrimPrefix(s.Text, `"`)+`"`)) && !s.JSON {
			t.Errorf("cut inside a character")
		}
	}
	if s := show(nil, 10); s.Total != 0 || s.Text != "" {
		t.Errorf("no state: %+v", s)
	}
}

func TestReviewItemWithoutStateAndHostileContentServerSide(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	it := hostileItem("run-hostile")
	h.publish(it)
	plain := ticketItem("run-nostate")
	plain.State = nil
	h.publish(plain)
	h.waitIndexed(it.ID)
	h.waitIndexed(plain.ID)
	c := h.client()
	c.mustLogin("alice")
	page := c.get("/items/" + it.ID)
	if page.status != http.StatusOK {
		t.Fatalf("hostile item page: %d\n%s", page.status, page.body)
	}
	for _, raw := range []string{"<script>window.__pwned", "<img src=x onerror", "<b>bold"} {
		if strings.Contains(page.body, raw) {
			t.Errorf("the page contains %q unescaped", raw)
		}
	}
	for _, escaped := range []string{"&lt;script&gt;window.__pwned", "&lt;img src=x onerror="} {
		if !strings.Contains(page.body, escaped) {
			t.Errorf("the page lacks the escaped text %q", escaped)
		}
	}
	if res := c.get("/items/" + plain.ID); res.status != http.StatusOK || !strings.Contains(res.body, "This item carries no state") {
		t.Errorf("item without state: %d", res.status)
	}
	queue := c.get("/")
	if strings.Contains(queue.body, "<img src=x") {
		t.Error("the queue shows a question name unescaped")
	}
}

// hostileItem carries script in every field a reviewer sees.
func hostileItem(runID string) contract.ReviewItem {
	const s, img = `<script>window.__pwned=1</script>`, `<img src=x onerror="window.__pwned=2">`
	question := `q` + img
	it := contract.ReviewItem{ID: contract.ReviewItemID(runID, question), RunID: runID, Caller: "billing", Model: "nimble" + s,
		Question: question, Type: contract.TypeChoice,
		Instructions: json.RawMessage(contract.AppendJSONString(nil, "Pick one "+s+img)),
		Options: []contract.Option{{Key: "a" + s, Description: desc("<b>bold</b>" + img)}, {Key: `b"` + img, Description: desc(s)},
			{Key: "c", Description: nil}},
		Probabilities: []contract.Probability{{Key: "a" + s, P: 0.5}, {Key: `b"` + img, P: 0.3}, {Key: "c", P: 0.2}},
		Verdict:       contract.Verdict{Status: contract.VerdictAbstained, Rule: "r" + s, Reason: "low " + img},
		State:         json.RawMessage(`{"note":` + string(contract.AppendJSONString(nil, s+img)) + `}`),
		CreatedAt:     time.Now().Add(-time.Hour)}
	return it
}

func TestReviewMalformedItemsAreSkipped(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	good := ticketItem("run-good")
	spoofed := ticketItem("run-spoof") // claims caller billing, published as support
	b, _ := spoofed.MarshalJSON()
	wrongID := ticketItem("run-wrong-id")
	wrongID.ID = contract.ReviewItemID("other", "label")
	wb, _ := wrongID.MarshalJSON()
	noOptions := ticketItem("run-no-options")
	noOptions.Options = nil
	nb, _ := noOptions.MarshalJSON()
	h.publishRaw("sys1.review.billing", []byte(`{"id": "not json`))
	h.publishRaw("sys1.review.billing", []byte("\xff\xfe"))
	h.publishRaw("sys1.review.support", b)
	h.publishRaw("sys1.review.billing", wb)
	h.publishRaw("sys1.review.billing", nb)
	h.publishRaw("sys1.review.billing", []byte(`{"id":"x","secret_state":"do not log me"}`))
	h.publish(good)
	h.waitIndexed(good.ID)
	if n := h.rs.idx.malformed.Load(); n != 6 {
		t.Errorf("malformed count %d, want 6", n)
	}
	logs := h.logs.String()
	if strings.Count(logs, "malformed review item skipped") != 6 {
		t.Errorf("want six warnings:\n%s", logs)
	}
	for _, leak := range []string{"do not log me", "Charged twice"} {
		if strings.Contains(logs, leak) {
			t.Errorf("the log carries item content %q", leak)
		}
	}
	for _, want := range []string{`claims caller \"billing\" but was published on sys1.review.support`, "is not the id of its run and question", "needs 2–26 options"} {
		if !strings.Contains(logs, want) {
			t.Errorf("logs lack %q", want)
		}
	}
	c := h.client()
	c.mustLogin("alice")
	q := c.get("/")
	if !strings.Contains(q.body, "1 pending item") || !strings.Contains(q.body, "6 malformed review item(s) were skipped") {
		t.Errorf("queue:\n%s", q.body)
	}
}

func TestReviewQueueFiltersAndOrder(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	mk := func(run, caller, question string, conf float64, age time.Duration) contract.ReviewItem {
		it := ticketItem(run)
		it.Caller, it.Question, it.ID = caller, question, contract.ReviewItemID(run, question)
		it.Confidence = &conf
		it.CreatedAt = time.Now().Add(-age)
		return it
	}
	items := []contract.ReviewItem{
		mk("r1", "billing", "label", 0.4, 3*time.Hour), mk("r2", "billing", "urgency", 0.1, 2*time.Hour),
		mk("r3", "support", "label", 0.3, 1*time.Hour), mk("r4", "support", "label", 0.2, 4*time.Hour),
	}
	for _, it := range items {
		h.publish(it)
	}
	for _, it := range items {
		h.waitIndexed(it.ID)
	}
	c := h.client()
	c.mustLogin("alice")
	order := func(path string) []string {
		body := c.get(path).body
		var runs []string
		for _, it := range items {
			if i := strings.Index(body, `href="/items/`+it.ID); i >= 0 {
				runs = append(runs, fmt.Sprintf("%d:%s", i, it.RunID))
			}
		}
		// sort by position in the page
		for i := range runs {
			for j := i + 1; j < len(runs); j++ {
				var a, b int
				fmt.Sscanf(runs[i], "%d:", &a)
				fmt.Sscanf(runs[j], "%d:", &b)
				if b < a {
					runs[i], runs[j] = runs[j], runs[i]
				}
			}
		}
		for i, r := range runs {
			runs[i] = r[strings.Index(r, ":")+1:]
		}
		return runs
	}
	for path, want := range map[string]string{
		"/":                                 "r4 r1 r2 r3",
		"/?sort=confidence":                 "r2 r4 r3 r1",
		"/?sort=-confidence":                "r1 r3 r4 r2",
		"/?caller=support":                  "r4 r3",
		"/?question=label&sort=confidence":  "r4 r3 r1",
		"/?caller=billing&question=urgency": "r2",
	} {
		if got := strings.Join(order(path), " "); got != want {
			t.Errorf("%s: %s, want %s", path, got, want)
		}
	}
	// Skipping walks the filtered queue in its order and wraps around.
	next := func(after string, q string) string {
		res := c.get("/next?after=" + after + q)
		return res.header.Get("Location")
	}
	if loc := next(items[3].ID, "&caller=support"); !strings.HasPrefix(loc, "/items/"+items[2].ID) {
		t.Errorf("skip from r4 in support: %s", loc)
	}
	if loc := next(items[2].ID, "&caller=support"); !strings.HasPrefix(loc, "/items/"+items[3].ID) {
		t.Errorf("skip from r3 (the last) wraps to r4: %s", loc)
	}
}

// TestReviewRestartRecovery: a label saved in the bucket but not published (the page died
// between the two writes) is published by the next replica to start; one whose publish went
// through but whose entry was not updated is published again under the same message id, and
// JetStream keeps one copy.
func TestReviewRestartRecovery(t *testing.T) {
	h := newHarness(t, harnessOpts{configure: func(c *Config) { c.RecoverEvery = time.Hour }})
	ctx := context.Background()
	kv, err := h.js.KeyValue(ctx, h.cfg.Topology.ReviewBucket)
	if err != nil {
		t.Fatal(err)
	}
	lost := contract.Label{RunID: "run-lost", Question: "label", Value: json.RawMessage(`"bug"`), Reviewer: "alice",
		LabelledAt: time.Now().UTC().Truncate(time.Millisecond), Source: contract.LabelSourceReview, Caller: "billing", Item: contract.ReviewItemID("run-lost", "label")}
	acked := lost
	acked.RunID, acked.Item, acked.Value = "run-acked", contract.ReviewItemID("run-acked", "label"), json.RawMessage(`null`)
	// Crash 1: after the bucket entry, before the publish.
	b, _ := json.Marshal(claim{Status: claimPublishing, Label: lost})
	if _, err := kv.Create(ctx, lost.Item, b); err != nil {
		t.Fatal(err)
	}
	// Crash 2: after the publish was acknowledged, before the entry said so.
	b, _ = json.Marshal(claim{Status: claimPublishing, Label: acked})
	if _, err := kv.Create(ctx, acked.Item, b); err != nil {
		t.Fatal(err)
	}
	body, _ := acked.MarshalJSON()
	msg := &nats.Msg{Subject: "sys1.labels.billing.accepted", Data: body, Header: nats.Header{jetstream.MsgIDHeader: {"review:" + acked.Item}}}
	if _, err := h.js.PublishMsg(ctx, msg); err != nil {
		t.Fatal(err)
	}
	h.close()

	// The next replica to start recovers both (its first sweep runs at start).
	h2 := newHarness(t, harnessOpts{reuse: h, configure: func(c *Config) { c.RecoverEvery = time.Hour }})
	natstest.WaitFor(t, 10*time.Second, "both entries marked published", func() bool {
		for _, id := range []string{lost.Item, acked.Item} {
			e, err := kv.Get(ctx, id)
			if err != nil {
				return false
			}
			if c, _ := decodeClaim(e.Value()); c.Status != claimPublished {
				return false
			}
		}
		return true
	})
	msgs := h2.labels()
	if len(msgs) != 2 {
		t.Fatalf("%d label messages, want 2 (one each, the republish de-duplicated)", len(msgs))
	}
	got := map[string]contract.Label{}
	for _, m := range msgs {
		l, derr := contract.DecodeLabel(m.Data)
		if derr != nil {
			t.Fatal(derr)
		}
		got[l.RunID] = *l
	}
	if l := got["run-lost"]; string(l.Value) != `"bug"` || l.Reviewer != "alice" || !l.LabelledAt.Equal(lost.LabelledAt) {
		t.Errorf("recovered label = %+v", l)
	}
	if !strings.Contains(h2.logs.String(), "republished a saved label") {
		t.Errorf("the recovery is not logged:\n%s", h2.logs.String())
	}
}

// TestReviewRecoveryWaitsForTheWriter: a label being published right now (younger than the
// grace) is left to its writer.
func TestReviewRecoveryWaitsForTheWriter(t *testing.T) {
	h := newHarness(t, harnessOpts{configure: func(c *Config) { c.RecoverAfter, c.RecoverEvery = time.Hour, time.Hour }})
	ctx := context.Background()
	kv, _ := h.js.KeyValue(ctx, h.cfg.Topology.ReviewBucket)
	l := contract.Label{RunID: "run-young", Question: "q", Value: json.RawMessage(`true`), Reviewer: "bob", LabelledAt: time.Now(),
		Source: contract.LabelSourceReview, Caller: "billing", Item: contract.ReviewItemID("run-young", "q")}
	b, _ := json.Marshal(claim{Status: claimPublishing, Label: l})
	if _, err := kv.Create(ctx, l.Item, b); err != nil {
		t.Fatal(err)
	}
	natstest.WaitFor(t, 5*time.Second, "the index to see the entry", func() bool { _, ok := h.rs.idx.label(l.Item); return ok })
	if n := h.rs.lab.recoverOnce(ctx); n != 0 {
		t.Fatalf("recovered %d labels still within the grace", n)
	}
	h.rs.lab.recoverAfter = 0
	if n := h.rs.lab.recoverOnce(ctx); n != 1 {
		t.Fatalf("recovered %d after the grace, want 1", n)
	}
}

// TestReviewDeletedLabelReopensItem: deleting an item's bucket entry (an operator re-opening
// it) puts it back in every replica's queue.
func TestReviewDeletedLabelReopensItem(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	it := ticketItem("run-reopen")
	h.publish(it)
	h.waitIndexed(it.ID)
	c := h.client()
	csrf := c.mustLogin("alice")
	c.post("/items/"+it.ID+"/label", url.Values{"csrf": {csrf}, "value": {"bug"}})
	if _, n := h.rs.idx.page(query{}, 0, 10); n != 0 {
		t.Fatal("still pending after the label")
	}
	kv, _ := h.js.KeyValue(context.Background(), h.cfg.Topology.ReviewBucket)
	if err := kv.Delete(context.Background(), it.ID); err != nil {
		t.Fatal(err)
	}
	natstest.WaitFor(t, 5*time.Second, "the item pending again", func() bool { _, n := h.rs.idx.page(query{}, 0, 10); return n == 1 })
}

// TestReviewUsersFileReloads: a reviewer added to the file can sign in without a restart; a
// bad edit is refused with an error log and the last good file stays in force.
func TestReviewUsersFileReloads(t *testing.T) {
	h := newHarness(t, harnessOpts{configure: func(c *Config) { c.UsersReload = 10 * time.Millisecond }})
	if res := h.client().login("zoe", "zoe-password"); res.status != http.StatusUnauthorized {
		t.Fatalf("zoe before being added: %d", res.status)
	}
	line, err := HashPassword("zoe", "zoe-password")
	if err != nil {
		t.Fatal(err)
	}
	old, _ := os.ReadFile(h.cfg.UsersFile)
	if err := os.WriteFile(h.cfg.UsersFile, append(old, line+"\n"...), 0o600); err != nil {
		t.Fatal(err)
	}
	natstest.WaitFor(t, 10*time.Second, "the reload", func() bool { return h.rs.users.Current().Has("zoe") })
	if res := h.client().login("zoe", "zoe-password"); res.status != http.StatusSeeOther {
		t.Fatalf("zoe after being added: %d", res.status)
	}
	if err := os.WriteFile(h.cfg.UsersFile, append(old, "mallory:plaintext\n"...), 0o600); err != nil {
		t.Fatal(err)
	}
	natstest.WaitFor(t, 10*time.Second, "the refusal", func() bool {
		return strings.Contains(h.logs.String(), "reviewers file edit refused")
	})
	if !h.rs.users.Current().Has("zoe") || h.rs.users.Current().Has("mallory") {
		t.Error("a bad edit replaced the last good users")
	}
	if strings.Contains(h.logs.String(), "plaintext") {
		t.Error("the log quotes the bad line's hash")
	}
}
