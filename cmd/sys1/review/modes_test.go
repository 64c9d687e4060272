package review

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/lestrrat-go/jwx/v3/jwa"
	"github.com/lestrrat-go/jwx/v3/jwt"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/contract/examples"
	"github.com/sys1hq/sys1/worker/auth"
	sys1client "github.com/sys1hq/sys1/worker/client"
	"github.com/sys1hq/sys1/worker/natsconn/natstest"
)

// modesSecret signs the jwt mode's test tokens (HS256 needs at least 32 bytes).
const modesSecret = "review-modes-test-secret-0123456789abcdef"

// modeCase is one auth mode: how the worker authenticates, and who each producer is in it.
type modeCase struct {
	mode string
	cfg  auth.Config
	// caller is the verified caller of a producer publishing on sys1.decide.<token>; token
	// signs its request in mode jwt.
	caller func(token string) string
	bearer func(t *testing.T, token string) string
}

func reviewModes() []modeCase {
	same := func(token string) string { return token }
	none := func(*testing.T, string) string { return "" }
	// In mode jwt the verified caller is the token's sub, which differs from the subject
	// token on purpose: that split is what the review subject rule must survive.
	jwtSub := func(token string) string { return token + "-svc@idp.test" }
	return []modeCase{
		{mode: auth.ModeNone, cfg: auth.Config{Mode: auth.ModeNone}, caller: same, bearer: none},
		{mode: auth.ModeSubject, cfg: auth.Config{Mode: auth.ModeSubject}, caller: same, bearer: none},
		{mode: auth.ModeJWT, cfg: auth.Config{Mode: auth.ModeJWT, HS256Secret: auth.Secret(modesSecret), Issuer: "https://idp.test",
			Audience: "sys1", RolesClaim: "roles", AllowedRoles: []string{"administrator"}, Leeway: time.Second,
			JWKSRefresh: time.Minute, JWKSMinRefresh: time.Second},
			caller: jwtSub,
			bearer: func(t *testing.T, token string) string {
				t.Helper()
				tok, err := jwt.NewBuilder().Subject(jwtSub(token)).Issuer("https://idp.test").Audience([]string{"sys1"}).
					IssuedAt(time.Now()).Expiration(time.Now().Add(time.Hour)).Claim("roles", []string{"administrator"}).Build()
				if err != nil {
					t.Fatal(err)
				}
				signed, err := jwt.Sign(tok, jwt.WithKey(jwa.HS256(), []byte(modesSecret)))
				if err != nil {
					t.Fatal(err)
				}
				return string(signed)
			}},
	}
}

// heldRun is one producer's run, held for review, and the inbox its reply comes to.
type heldRun struct {
	token, caller, runID, item string
	replies                    *nats.Subscription
}

// publishHeld publishes the ticket example as producer token (on sys1.decide.<token>, with a
// bearer token in mode jwt), asking for a reply in the producer's own inbox.
func publishHeld(t *testing.T, nc *nats.Conn, mc modeCase, token, runID string) heldRun {
	t.Helper()
	cl, err := sys1client.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	inbox := "_INBOX." + token + "." + nuid.Next()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	body, err := examples.Request("ticket")
	if err != nil {
		t.Fatal(err)
	}
	req := sys1client.Request{Caller: token, Body: body, RunID: runID, ReplyTo: inbox, Token: mc.bearer(t, token)}
	if _, err := cl.Publish(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	return heldRun{token: token, caller: mc.caller(token), runID: runID, item: contract.ReviewItemID(runID, "label"), replies: sub}
}

// released waits for the run's reply and checks that a person's label released it.
func (r heldRun) released(t *testing.T, label, reviewer string) {
	t.Helper()
	m, err := r.replies.NextMsg(20 * time.Second)
	if err != nil {
		t.Fatalf("%s: no reply after the label: %v", r.runID, err)
	}
	rep, err := sys1client.ParseReply(m)
	if err != nil {
		t.Fatal(err)
	}
	v, _ := rep.Verdicts.Get("label")
	if rep.Status != contract.StatusSuccess || v.Status != contract.VerdictReviewed || string(v.Label) != label || v.Reviewer != reviewer ||
		rep.Review == nil || rep.Review.Status != contract.ReviewReviewed || rep.Review.Item != r.item || len(rep.Review.Items) != 1 {
		t.Fatalf("%s: released reply %s", r.runID, rep.Raw)
	}
}

// TestReviewPageInEveryAuthMode is the review loop for two producers in each auth mode: a
// worker holds each one's run for review; the page shows both items, under each run's
// verified caller (in mode none the subject token, in mode jwt the token's sub), none skipped
// as malformed; its caller filter separates them; a reviewer's label goes to the producer's
// own sys1.labels.<token>.accepted carrying the run's caller, and releases that producer's
// held reply only. Mode none, the default, is driven in Chromium.
func TestReviewPageInEveryAuthMode(t *testing.T) {
	for _, mc := range reviewModes() {
		t.Run(mc.mode, func(t *testing.T) {
			var chromium string
			if mc.mode == auth.ModeNone {
				chromium = needChromium(t)
			}
			h := newHarness(t, harnessOpts{})
			startWorkerAuth(t, h.srv.ClientURL(), loopPolicy, mc.cfg)
			nc, err := nats.Connect(h.srv.ClientURL())
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			billing := publishHeld(t, nc, mc, "billing", "modes-"+mc.mode+"-1")
			support := publishHeld(t, nc, mc, "support", "modes-"+mc.mode+"-2")
			h.waitIndexed(billing.item)
			h.waitIndexed(support.item)
			if n := h.rs.idx.malformed.Load(); n != 0 {
				t.Fatalf("%d items skipped as malformed:\n%s", n, h.logs.String())
			}
			if m, err := billing.replies.NextMsg(100 * time.Millisecond); err == nil {
				t.Fatalf("the held run was answered before anyone labelled it: %s", m.Data)
			}

			if chromium != "" {
				labelInBrowser(t, h, chromium, billing, support)
			} else {
				labelOverHTTP(t, h, billing, support)
			}
			billing.released(t, `"bug"`, "alice")
			if m, err := support.replies.NextMsg(300 * time.Millisecond); err == nil {
				t.Fatalf("a label for billing's run released support's: %s", m.Data)
			}

			natstest.WaitFor(t, 10*time.Second, "the label on SYS1_LABELS", func() bool { return len(h.labels()) == 1 })
			m := h.labels()[0]
			l, derr := contract.DecodeLabel(m.Data)
			if derr != nil {
				t.Fatal(derr)
			}
			if m.Subject != "sys1.labels.billing.accepted" || l.Caller != billing.caller || l.RunID != billing.runID || l.Item != billing.item {
				t.Fatalf("label on %s: %s; want it on sys1.labels.billing.accepted for caller %s", m.Subject, m.Data, billing.caller)
			}
		})
	}
}

// labelOverHTTP checks the queue and its caller filter and labels billing's item "bug" as
// alice, with plain HTTP requests.
func labelOverHTTP(t *testing.T, h *harness, billing, support heldRun) {
	t.Helper()
	c := h.client()
	csrf := c.mustLogin("alice")
	all := c.get("/")
	for _, r := range []heldRun{billing, support} {
		if !strings.Contains(all.body, `<option value="`+r.caller+`">`+r.caller+` (1)</option>`) || !strings.Contains(all.body, "/items/"+r.item) {
			t.Fatalf("the queue lacks %s's item or its caller %q in the filter:\n%s", r.token, r.caller, all.body)
		}
	}
	if strings.Contains(all.body, "malformed") {
		t.Fatalf("the queue reports malformed items:\n%s", all.body)
	}
	only := c.get("/?caller=" + url.QueryEscape(billing.caller))
	if !strings.Contains(only.body, "/items/"+billing.item) || strings.Contains(only.body, "/items/"+support.item) {
		t.Fatalf("the caller filter does not separate the producers:\n%s", only.body)
	}
	page := c.get("/items/" + billing.item)
	if page.status != http.StatusOK || !strings.Contains(page.body, "<dd>"+billing.caller+"</dd>") {
		t.Fatalf("item page %d, want caller %s:\n%s", page.status, billing.caller, page.body)
	}
	if res := c.post("/items/"+billing.item+"/label", url.Values{"csrf": {csrf}, "value": {"bug"}}); res.status != http.StatusSeeOther {
		t.Fatalf("label: %d\n%s", res.status, res.body)
	}
}

// labelInBrowser does what labelOverHTTP does, in Chromium: sign in, filter the queue by
// caller, open billing's item and press 2 (its second option, "bug").
func labelInBrowser(t *testing.T, h *harness, chromium string, billing, support heldRun) {
	t.Helper()
	b := startBrowser(t, chromium)
	b.signIn(h.web.URL + "/")
	queue := b.text(`table.items`)
	if !strings.Contains(queue, billing.caller) || !strings.Contains(queue, support.caller) {
		t.Fatalf("the queue lacks the producers' items:\n%s", queue)
	}
	b.do("filter by caller",
		chromedp.SetValue(chromedp.ID("caller"), billing.caller),
		chromedp.Click(chromedp.CSS(`form.filters button[type=submit]`)))
	natstest.WaitFor(t, 30*time.Second, "the filtered queue", func() bool { return strings.Contains(b.location(), "caller="+billing.caller) })
	b.do("the filtered queue", chromedp.WaitVisible(chromedp.CSS(`a[href^="/items/`+billing.item+`"]`)))
	if queue := b.text(`table.items`); strings.Contains(queue, support.caller) {
		t.Fatalf("the caller filter shows another producer's item:\n%s", queue)
	}
	b.do("open the item",
		chromedp.Click(chromedp.CSS(`a[href^="/items/`+billing.item+`"]`)),
		chromedp.WaitVisible(chromedp.CSS(`ol.choices`)))
	// Billing had one item: the filtered queue is empty afterwards (support's item remains).
	b.do("press 2", chromedp.KeyEvent("2"), chromedp.WaitVisible(chromedp.CSS(`p.empty`)))
	if empty := b.text(`p.empty`); !strings.Contains(empty, "matching these filters") {
		t.Fatalf("after pressing 2: %q", empty)
	}
	if p := b.logs.snapshot(); len(p) > 0 {
		t.Errorf("the pages logged problems:\n%s", strings.Join(p, "\n"))
	}
}

// TestReviewItemSubjectRule: the page accepts an item only on the subject the worker's rule
// (topology.ReviewSubject) gives for the request subject it names, whatever its caller; items
// written before items named their request's subject are accepted on sys1.review.<caller>, and
// mode none's old items (caller anonymous) on any token.
func TestReviewItemSubjectRule(t *testing.T) {
	item := func(caller, subject string) *contract.ReviewItem {
		it := ticketItem("rule-1")
		it.Caller, it.Subject = caller, subject
		return &it
	}
	for _, tt := range []struct {
		name   string
		it     *contract.ReviewItem
		on     string
		token  string
		accept bool
	}{
		{"jwt caller, its subject's token", item("billing-svc@idp.test", "sys1.decide.billing.eu"), "sys1.review.billing", "billing", true},
		{"batch request", item("analytics", "sys1.batch.analytics.b-1"), "sys1.review.analytics", "analytics", true},
		{"another producer's token", item("billing", "sys1.decide.billing"), "sys1.review.support", "", false},
		{"a subject that is no request's", item("billing", "sys1.runs.success"), "sys1.review.billing", "", false},
		{"legacy: caller is the token", item("billing", ""), "sys1.review.billing", "billing", true},
		{"legacy: another caller", item("billing", ""), "sys1.review.support", "", false},
		{"legacy mode none", item("anonymous", ""), "sys1.review.cli", "cli", true},
	} {
		m, err := metaOf(tt.it, tt.on, 7)
		if tt.accept != (err == nil) {
			t.Errorf("%s: accepted %v (%v), want %v", tt.name, err == nil, err, tt.accept)
			continue
		}
		if err == nil && (m.Token != tt.token || m.Caller != tt.it.Caller) {
			t.Errorf("%s: token %q caller %q, want %q and %q", tt.name, m.Token, m.Caller, tt.token, tt.it.Caller)
		}
	}
}
