package review

import (
	"bufio"
	"crypto/subtle"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sys1hq/sys1/contract"
)

// maxFormBytes bounds a POST body: forms carry a token and a label, nothing large.
const maxFormBytes = 64 << 10

func (s *Server) sessionCookieName() string {
	if s.secure {
		return "__Host-sys1_review" // the prefix pins it to this host, Secure and Path=/
	}
	return "sys1_review"
}

func (s *Server) loginCookieName() string {
	if s.secure {
		return "__Host-sys1_review_login"
	}
	return "sys1_review_login"
}

func (s *Server) setCookie(w http.ResponseWriter, name, value string, maxAge time.Duration) {
	c := &http.Cookie{Name: name, Value: value, Path: "/", HttpOnly: true, Secure: s.secure,
		SameSite: http.SameSiteLaxMode, MaxAge: int(maxAge / time.Second)}
	if maxAge < 0 {
		c.MaxAge = -1
	}
	http.SetCookie(w, c)
}

// page is what every page's layout needs.
type page struct {
	Title  string
	User   string
	CSRF   string
	Counts counts
	Data   any
}

// render streams a page to the client as it is executed: a page is never held whole in
// memory, however long the queue (its size is bounded anyway: a page of items and the filters'
// most frequent values). The templates are fixed and tested, so a failure half way is a bug:
// logged, and the page is cut short.
func (s *Server) render(w http.ResponseWriter, status int, name string, p page) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	bw := bufio.NewWriterSize(w, 32<<10)
	if err := s.pages[name].Execute(bw, p); err != nil {
		s.log.Error().Err(err).Str("page", name).Msg("rendering a page failed; the page was cut short")
	}
	_ = bw.Flush()
}

type messageData struct{ Heading, Text, Back string }

// message renders a short page saying what happened.
func (s *Server) message(w http.ResponseWriter, _ *http.Request, sess *session, status int, heading, text string) {
	p := page{Title: heading, Data: messageData{Heading: heading, Text: text, Back: "/"}}
	if sess != nil {
		p.User, p.CSRF, p.Counts = sess.User, sess.CSRF, s.idx.counts(sess.User)
	}
	s.render(w, status, "message", p)
}

// withSession runs h for a logged-in reviewer. Without a live session a page redirects to the
// login; a POST is refused. Every POST must carry the session's CSRF token.
func (s *Server) withSession(h func(http.ResponseWriter, *http.Request, *session)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var sess session
		c, err := r.Cookie(s.sessionCookieName())
		if err == nil {
			sess, err = s.sessions.get(r.Context(), c.Value)
		}
		if err == nil && (sess.Hash == "" || sess.Hash != s.users.Current().Fingerprint(sess.User)) {
			// Removed from the reviewers file since signing in, or given a new password: the
			// session ends at once, not at its expiry.
			err = errNoSession
			_ = s.sessions.end(r.Context(), c.Value)
		}
		if err != nil {
			if !errors.Is(err, errNoSession) && !errors.Is(err, http.ErrNoCookie) {
				s.log.Error().Err(err).Msg("session lookup failed")
				s.message(w, r, nil, http.StatusServiceUnavailable, "Unavailable", "Sessions cannot be read right now (is NATS reachable?). Try again in a moment.")
				return
			}
			if r.Method != http.MethodGet && r.Method != http.MethodHead {
				s.message(w, r, nil, http.StatusForbidden, "Not signed in", "Your session has ended. Sign in again and repeat what you did.")
				return
			}
			http.Redirect(w, r, "/login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
			return
		}
		if r.Method == http.MethodPost {
			r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
			if err := r.ParseForm(); err != nil {
				s.message(w, r, &sess, http.StatusBadRequest, "Bad request", "The form could not be read.")
				return
			}
			if !tokensEqual(r.PostForm.Get("csrf"), sess.CSRF) {
				s.log.Warn().Str("user", sess.User).Str("path", r.URL.Path).Msg("POST without a valid CSRF token refused")
				s.message(w, r, &sess, http.StatusForbidden, "Refused", "This form is missing its security token or it has expired. Reload the page and try again.")
				return
			}
		}
		h(w, r, &sess)
	}
}

func tokensEqual(got, want string) bool {
	return got != "" && want != "" && subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}

type loginData struct {
	Token, Next, Name, Error string
}

// localPath keeps a post-login redirect on this site: a plain local path, else "/". Browsers
// read a Location leniently — they drop tabs and newlines anywhere and take a backslash for a
// slash — so "/\t/evil.example" or "/\\evil.example" would leave the site as "//evil.example":
// any control character or backslash refuses the path outright, as does "//" (another host)
// and anything url.Parse reads a scheme or host in.
func localPath(next string) string {
	if next == "" || next[0] != '/' || strings.HasPrefix(next, "//") || len(next) > 2048 {
		return "/"
	}
	for i := 0; i < len(next); i++ {
		if c := next[i]; c < 0x20 || c == 0x7f || c == '\\' {
			return "/"
		}
	}
	if !utf8.ValidString(next) {
		return "/"
	}
	u, err := url.Parse(next)
	if err != nil || u.Scheme != "" || u.Host != "" || u.User != nil || u.Opaque != "" || strings.HasPrefix(u.Path, "//") {
		return "/"
	}
	return next
}

func (s *Server) loginPage(w http.ResponseWriter, r *http.Request) {
	if c, err := r.Cookie(s.sessionCookieName()); err == nil {
		if _, err := s.sessions.get(r.Context(), c.Value); err == nil {
			http.Redirect(w, r, "/", http.StatusSeeOther)
			return
		}
	}
	s.showLogin(w, http.StatusOK, loginData{Next: localPath(r.URL.Query().Get("next"))})
}

// showLogin renders the login form with a fresh login CSRF token: a random value in a cookie
// and in the form, which a POST must bring back both (there is no session yet to hold it).
func (s *Server) showLogin(w http.ResponseWriter, status int, d loginData) {
	d.Token = randomToken()
	s.setCookie(w, s.loginCookieName(), d.Token, time.Hour)
	s.render(w, status, "login", page{Title: "Sign in", Data: d})
}

func (s *Server) clientIP(r *http.Request) string { return clientAddr(r, s.cfg.TrustedProxies) }

func (s *Server) login(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
	if err := r.ParseForm(); err != nil {
		s.message(w, r, nil, http.StatusBadRequest, "Bad request", "The form could not be read.")
		return
	}
	next := localPath(r.PostForm.Get("next"))
	c, err := r.Cookie(s.loginCookieName())
	if err != nil || !tokensEqual(r.PostForm.Get("csrf"), c.Value) {
		s.log.Warn().Str("remote", s.clientIP(r)).Msg("login without a valid CSRF token refused")
		s.showLogin(w, http.StatusForbidden, loginData{Next: next, Error: "The sign-in form expired or did not come from this page. Please try again."})
		return
	}
	name := clip(r.PostForm.Get("user"), maxNameLen)
	password := r.PostForm.Get("password")
	ip := s.clientIP(r)
	// Failures count against the name and, apart, the address; a browser the reviewer signed in
	// with before counts only against itself (device.go).
	userKey := "user:" + strings.ToLower(name)
	keys := []string{userKey, "ip:" + ip}
	device, known := s.deviceOf(r, name)
	if known {
		keys = []string{device}
	}
	if wait := s.throttle.wait(keys...); wait > 0 {
		secs := int(math.Ceil(wait.Seconds()))
		w.Header().Set("Retry-After", strconv.Itoa(secs))
		s.log.Warn().Str("user", name).Str("remote", ip).Msg("login refused: too many failed attempts")
		s.showLogin(w, http.StatusTooManyRequests, loginData{Next: next, Name: name,
			Error: fmt.Sprintf("Too many failed sign-ins. Try again in %d seconds.", secs)})
		return
	}
	select {
	case s.bcryptSlots <- struct{}{}:
	case <-r.Context().Done():
		return
	}
	ok := s.users.Current().Verify(name, password)
	<-s.bcryptSlots
	if !ok {
		s.throttle.fail(keys...)
		s.log.Warn().Str("user", name).Str("remote", ip).Msg("login failed: wrong user name or password")
		s.showLogin(w, http.StatusUnauthorized, loginData{Next: next, Name: name, Error: "Wrong user name or password."})
		return
	}
	// A success clears that user's failures (and its device's), not the address's: the
	// strangers' failures from it are theirs.
	s.throttle.succeed(userKey)
	if known {
		s.throttle.succeed(device)
	}
	id, _, err := s.sessions.create(r.Context(), name, s.users.Current().Fingerprint(name))
	if err != nil {
		s.log.Error().Err(err).Msg("creating a session failed")
		s.message(w, r, nil, http.StatusServiceUnavailable, "Unavailable", "Signing in is not possible right now (is NATS reachable?). Try again in a moment.")
		return
	}
	s.setCookie(w, s.loginCookieName(), "", -1)
	s.setCookie(w, s.sessionCookieName(), id, s.cfg.SessionTTL)
	s.setDevice(w, name)
	s.log.Info().Str("user", name).Str("remote", ip).Msg("reviewer signed in")
	http.Redirect(w, r, next, http.StatusSeeOther)
}

func (s *Server) logout(w http.ResponseWriter, r *http.Request, sess *session) {
	if c, err := r.Cookie(s.sessionCookieName()); err == nil {
		if err := s.sessions.end(r.Context(), c.Value); err != nil {
			s.log.Error().Err(err).Msg("ending a session failed")
		}
	}
	s.setCookie(w, s.sessionCookieName(), "", -1)
	s.log.Info().Str("user", sess.User).Msg("reviewer signed out")
	http.Redirect(w, r, "/login", http.StatusSeeOther)
}

// queryOf reads the queue's filters and order from a request (URL or form).
func queryOf(v url.Values) query {
	return query{Caller: clip(v.Get("caller"), maxMetaField), Question: clip(v.Get("question"), maxQuestionKept),
		Search: clip(strings.TrimSpace(v.Get("search")), maxMetaField), Sort: v.Get("sort")}.normalised()
}

// values encodes q for links (only what differs from the defaults).
func (q query) values() url.Values {
	v := url.Values{}
	if q.Caller != "" {
		v.Set("caller", q.Caller)
	}
	if q.Question != "" {
		v.Set("question", q.Question)
	}
	if q.Search != "" {
		v.Set("search", q.Search)
	}
	if q.Sort != sortOldest {
		v.Set("sort", q.Sort)
	}
	return v
}

// queuePageSize is how many items a queue page lists; maxQueuePage bounds how deep a page
// number may go (a reviewer narrows the queue with the filters instead: a page that deep
// would cost a sort of everything before it).
const (
	queuePageSize = 100
	maxQueuePage  = 200
)

type queueData struct {
	Query              query
	Items              []itemMeta
	Total, Page, Pages int
	PrevURL, NextURL   string
	First              string // the first item's URL, for "Start reviewing"
	Ready              bool
	Callers, Questions []facet // the filters' choices: the most frequent, and the selected one
	MaxFacets          int
}

func (s *Server) queuePage(w http.ResponseWriter, r *http.Request, sess *session) {
	q := queryOf(r.URL.Query())
	pageNo, _ := strconv.Atoi(r.URL.Query().Get("page"))
	pageNo = min(max(pageNo, 1), maxQueuePage)
	items, total := s.idx.page(q, (pageNo-1)*queuePageSize, queuePageSize)
	d := queueData{Query: q, Items: items, Total: total, Page: pageNo, Ready: s.Ready(), MaxFacets: maxFacets,
		Pages: min((total+queuePageSize-1)/queuePageSize, maxQueuePage)}
	d.Callers, d.Questions = s.idx.facets(q)
	link := func(p int) string {
		v := q.values()
		v.Set("page", strconv.Itoa(p))
		return "/?" + v.Encode()
	}
	if pageNo > 1 {
		d.PrevURL = link(pageNo - 1)
	}
	if pageNo < d.Pages {
		d.NextURL = link(pageNo + 1)
	}
	switch {
	case pageNo == 1 && len(items) > 0:
		d.First = itemURL(items[0].ID, q, nil)
	case pageNo > 1:
		if first, ok := s.idx.next(q, ""); ok {
			d.First = itemURL(first, q, nil)
		}
	}
	s.render(w, http.StatusOK, "queue", page{Title: "Review queue", User: sess.User, CSRF: sess.CSRF, Counts: s.idx.counts(sess.User), Data: d})
}

// itemURL links to an item, keeping the queue's filters and order (and extra parameters).
func itemURL(id string, q query, extra url.Values) string {
	v := q.values()
	for k, vs := range extra {
		v[k] = vs
	}
	u := "/items/" + id
	if len(v) > 0 {
		u += "?" + v.Encode()
	}
	return u
}

// next redirects to the pending item after the one named by "after", in the queue's order,
// wrapping around to the start: skipping walks forward, and skipped items come back only
// after the rest of the queue.
func (s *Server) next(w http.ResponseWriter, r *http.Request, sess *session) {
	v := r.URL.Query()
	q := queryOf(v)
	after := v.Get("after")
	extra := url.Values{}
	if id := v.Get("labelled"); wellFormedItemID(id) {
		extra.Set("labelled", id)
		if v.Get("delayed") == "1" {
			extra.Set("delayed", "1")
		}
	}
	pick, _ := s.idx.next(q, after)
	if pick == "" {
		u := "/"
		if vv := q.values(); len(vv) > 0 {
			u += "?" + vv.Encode()
		}
		if len(extra) > 0 {
			sep := "?"
			if strings.Contains(u, "?") {
				sep = "&"
			}
			u += sep + extra.Encode()
		}
		http.Redirect(w, r, u, http.StatusSeeOther)
		return
	}
	http.Redirect(w, r, itemURL(pick, q, extra), http.StatusSeeOther)
}

// choiceView is one button of the item page.
type choiceView struct {
	Name, Value    string // the form field and value the button submits
	Key            string // what the reviewer reads as the option's name
	Description    string
	HasDescription bool
	P              float64
	HasP           bool
	Shortcut       string // "1"…"9", or "" past the ninth
	Picked         bool   // the model's answer
	ID             string
}

type itemData struct {
	Meta         itemMeta
	Item         *contract.ReviewItem
	State        shown
	Instructions shown
	Choices      []choiceView
	Labelled     *labelMeta // the item's label, when it has one
	Mine         bool       // … given by this reviewer
	Error        string
	Notice       string
	Query        query
	SkipURL      string
	QueueURL     string
	Verdict      contract.Verdict
}

func (s *Server) itemPage(w http.ResponseWriter, r *http.Request, sess *session) {
	id := r.PathValue("id")
	q := queryOf(r.URL.Query())
	it, meta, ok := s.loadItem(w, r, sess, id, 0)
	if !ok {
		return
	}
	d := s.itemData(sess, it, meta, q)
	if prev := r.URL.Query().Get("labelled"); wellFormedItemID(prev) {
		if l, ok := s.idx.label(prev); ok && l.Reviewer == sess.User {
			pm, _, _ := s.idx.item(prev)
			d.Notice = fmt.Sprintf("Saved: %s for %s.", labelText(l.Value), nonEmpty(pm.Question, "the previous item"))
			if r.URL.Query().Get("delayed") == "1" {
				d.Notice += " Publishing it was delayed; it will be published automatically."
			}
		}
	}
	s.render(w, http.StatusOK, "item", page{Title: titleOf(it), User: sess.User, CSRF: sess.CSRF, Counts: s.idx.counts(sess.User), Data: d})
}

// titleOf is an item page's title: the question's name, cut short (names may be 64 KiB).
func titleOf(it *contract.ReviewItem) string { return clip(it.Question, 80) + " · review" }

func nonEmpty(s, otherwise string) string {
	if s == "" {
		return otherwise
	}
	return s
}

// labelText says a label value as a person reads it.
func labelText(v string) string {
	switch v {
	case "null":
		return "“none of these”"
	case "true":
		return "yes (true)"
	case "false":
		return "no (false)"
	}
	if strings.HasPrefix(v, `"`) {
		var b strings.Builder
		b.WriteString("“")
		t, _ := unquoteLimited([]byte(v), 200)
		b.WriteString(t)
		b.WriteString("”")
		return b.String()
	}
	return "level " + v
}

// loadItem finds an item by id (or, when this replica's index does not know it yet, by the
// stream sequence the form carried) and reads it whole. It writes the error page itself.
func (s *Server) loadItem(w http.ResponseWriter, r *http.Request, sess *session, id string, seqHint uint64) (*contract.ReviewItem, itemMeta, bool) {
	if !wellFormedItemID(id) {
		s.message(w, r, sess, http.StatusNotFound, "No such item", "This is not the address of a review item.")
		return nil, itemMeta{}, false
	}
	meta, _, known := s.idx.item(id)
	seq := meta.Seq
	if !known {
		seq = seqHint
	}
	if seq == 0 {
		s.message(w, r, sess, http.StatusNotFound, "No such item", "This item is not in the review queue (it may have aged out of the stream).")
		return nil, itemMeta{}, false
	}
	it, fetched, err := s.fetch(r.Context(), seq, id)
	if err != nil {
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			if l, ok := s.idx.label(id); ok {
				// Labelled, with every question of its run: the message left the stream.
				s.message(w, r, sess, http.StatusConflict, "Already labelled",
					fmt.Sprintf("Already labelled by %s at %s as %s.", l.Reviewer, l.LabelledAt.UTC().Format("2006-01-02 15:04:05 UTC"), labelText(l.Value)))
				return nil, itemMeta{}, false
			}
			s.idx.forget(id)
			s.message(w, r, sess, http.StatusNotFound, "No such item", "This item is no longer on the review stream (it aged out or was deleted).")
			return nil, itemMeta{}, false
		}
		if !known {
			s.message(w, r, sess, http.StatusNotFound, "No such item", "This item is not in the review queue.")
			return nil, itemMeta{}, false
		}
		s.log.Error().Err(err).Str("item", id).Uint64("stream_seq", seq).Msg("reading a review item failed")
		s.message(w, r, sess, http.StatusServiceUnavailable, "Unavailable", "The item cannot be read right now. Try again in a moment.")
		return nil, itemMeta{}, false
	}
	if !known {
		meta = *fetched
	}
	return it, meta, true
}

func (s *Server) itemData(sess *session, it *contract.ReviewItem, meta itemMeta, q query) itemData {
	d := itemData{Meta: meta, Item: it, Query: q, Verdict: it.Verdict,
		State:        show(it.State, s.cfg.StateLimit),
		Instructions: show(it.Instructions, s.cfg.InstructionsLimit),
		Choices:      choices(it),
		SkipURL:      "/next?" + withAfter(q, it.ID),
		QueueURL:     "/",
	}
	if v := q.values(); len(v) > 0 {
		d.QueueURL += "?" + v.Encode()
	}
	if l, ok := s.idx.label(it.ID); ok {
		d.Labelled, d.Mine = &l, l.Reviewer == sess.User
	}
	return d
}

func withAfter(q query, id string) string {
	v := q.values()
	v.Set("after", id)
	return v.Encode()
}

// choices lists an item's buttons in the question's order: choice options, noul's yes and
// no, or score levels, each with the model's probability where it gave one.
func choices(it *contract.ReviewItem) []choiceView {
	prob := map[string]float64{}
	for _, p := range it.Probabilities {
		prob[p.Key] = p.P
	}
	var out []choiceView
	add := func(value, key string, desc *string, p float64, hasP, picked bool) {
		c := choiceView{Name: "value", Value: value, Key: key, P: p, HasP: hasP, Picked: picked, ID: fmt.Sprintf("opt-%d", len(out)+1)}
		if desc != nil && *desc != "" {
			c.Description, c.HasDescription = *desc, true
		}
		if len(out) < 9 {
			c.Shortcut = strconv.Itoa(len(out) + 1)
		}
		out = append(out, c)
	}
	switch it.Type {
	case contract.TypeChoice:
		for _, o := range it.Options {
			p, ok := prob[o.Key]
			add(o.Key, o.Key, o.Description, p, ok, o.Key == it.Choice)
		}
	case contract.TypeNoul:
		sides := map[string]*string{}
		for _, o := range it.Options {
			sides[o.Key] = o.Description
		}
		var yes float64
		hasP := it.Noul != nil
		if hasP {
			yes = *it.Noul
		} else if p, ok := prob["true"]; ok {
			yes, hasP = p, true
		}
		add("true", "Yes", sides["true"], yes, hasP, hasP && yes >= 0.5)
		add("false", "No", sides["false"], 1-yes, hasP, hasP && yes < 0.5)
	case contract.TypeScore:
		best, bestP := -1, -1.0
		for i := range it.Levels {
			if p, ok := prob[strconv.Itoa(i)]; ok && p > bestP {
				best, bestP = i, p
			}
		}
		for i, level := range it.Levels {
			p, ok := prob[strconv.Itoa(i)]
			l := level
			add(strconv.Itoa(i), "Level "+strconv.Itoa(i), &l, p, ok, i == best)
		}
	}
	return out
}

func (s *Server) submit(w http.ResponseWriter, r *http.Request, sess *session) {
	id := r.PathValue("id")
	form := r.PostForm
	q := queryOf(form)
	seqHint, _ := strconv.ParseUint(form.Get("seq"), 10, 64)
	it, meta, ok := s.loadItem(w, r, sess, id, seqHint)
	if !ok {
		return
	}
	none := form.Get("none") == "1"
	value, err := labelValue(it, form.Get("value"), none)
	if err != nil {
		d := s.itemData(sess, it, meta, q)
		d.Error = "That label does not fit this item: " + err.Error() + "."
		s.render(w, http.StatusBadRequest, "item", page{Title: titleOf(it), User: sess.User, CSRF: sess.CSRF, Counts: s.idx.counts(sess.User), Data: d})
		return
	}
	lbl, err := s.lab.submit(r.Context(), it, meta.Token, sess.User, value)
	extra := url.Values{"after": {id}, "labelled": {id}}
	var already *errAlreadyLabelled
	switch {
	case err == nil:
		s.log.Info().Str("item", id).Str("run_id", it.RunID).Str("caller", it.Caller).Str("question", it.Question).
			Str("reviewer", sess.User).Bool("none", none).Msg("label recorded")
	case errors.Is(err, errPublishDelayed):
		extra.Set("delayed", "1")
	case errors.As(err, &already):
		if already.by.Reviewer == sess.User && already.by.Value == string(lbl.Value) {
			break // a repeated submission of the same label (a double click): done already
		}
		d := s.itemData(sess, it, meta, q)
		d.Labelled, d.Mine = &already.by, already.by.Reviewer == sess.User
		s.render(w, http.StatusConflict, "item", page{Title: titleOf(it), User: sess.User, CSRF: sess.CSRF, Counts: s.idx.counts(sess.User), Data: d})
		return
	default:
		s.log.Error().Err(err).Str("item", id).Msg("saving a label failed")
		d := s.itemData(sess, it, meta, q)
		d.Error = "Your label could not be saved (NATS may be unreachable). Nothing was recorded; try again in a moment."
		s.render(w, http.StatusServiceUnavailable, "item", page{Title: titleOf(it), User: sess.User, CSRF: sess.CSRF, Counts: s.idx.counts(sess.User), Data: d})
		return
	}
	v := q.values()
	for k, vs := range extra {
		v[k] = vs
	}
	http.Redirect(w, r, "/next?"+v.Encode(), http.StatusSeeOther)
}
