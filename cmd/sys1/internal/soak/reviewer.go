package soak

import (
	"context"
	"errors"
	"fmt"
	"html"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// reviewer is an automatic reviewer team working the review page the way people do, over its
// HTTP interface: signed in, it reads the queue, and each item it finds there is taken by one
// of a few reviewers after a random delay (seeded), who opens the item, picks one of its buttons
// and submits it. Now and then a second reviewer submits the same item at the same moment, so
// the page's "first label wins" is exercised with the held reply behind it.
type reviewer struct {
	base     string
	password string
	rng      *rand.Rand
	rngMu    sync.Mutex
	people   []*person
	maxDelay time.Duration

	labelled, refused, failed, conflicts atomic.Int64
	lastErr                              atomic.Pointer[string]
}

type person struct {
	name   string
	client *http.Client
	mu     sync.Mutex // guards signed; held while signing in
	signed bool
}

func newReviewer(base, password string, names []string, seed uint64, maxDelay time.Duration) *reviewer {
	r := &reviewer{base: base, password: password, rng: rand.New(rand.NewPCG(seed, seed^0x4e71e3)), maxDelay: maxDelay}
	for _, n := range names {
		jar, _ := cookiejar.New(nil)
		r.people = append(r.people, &person{name: n, client: &http.Client{
			Jar: jar, Timeout: 15 * time.Second,
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}})
	}
	return r
}

func (r *reviewer) intn(n int) int {
	r.rngMu.Lock()
	defer r.rngMu.Unlock()
	return r.rng.IntN(n)
}

func (r *reviewer) note(err error) {
	s := err.Error()
	r.lastErr.Store(&s)
}

// reviewers is how many items are being labelled at once.
const reviewers = 6

// run works the queue until ctx ends.
func (r *reviewer) run(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	slots := make(chan struct{}, reviewers)
	var mu sync.Mutex
	taken := map[string]bool{} // items a reviewer is on
	for ctx.Err() == nil {
		ids, err := r.queue(ctx, r.people[0])
		if err != nil {
			r.failed.Add(1)
			r.note(err)
		}
		for _, id := range ids {
			mu.Lock()
			busy := taken[id]
			taken[id] = true
			mu.Unlock()
			if busy {
				continue
			}
			select {
			case slots <- struct{}{}:
			case <-ctx.Done():
				return
			}
			delay := time.Duration(r.intn(int(r.maxDelay/time.Millisecond)+1)) * time.Millisecond
			wg.Go(func() {
				defer func() { <-slots }()
				// A moment's thought, as a person would take.
				pause(ctx, delay)
				if err := r.label(ctx, id); err != nil {
					r.failed.Add(1)
					r.note(err)
				}
				mu.Lock()
				delete(taken, id) // labelled, or failed: if it is still pending it comes back
				mu.Unlock()
			})
		}
		pause(ctx, 300*time.Millisecond)
	}
}

// itemLink is an item's link on the queue page.
var itemLink = regexp.MustCompile(`href="/items/(rv-[0-9a-f]+)`)

// queue reads the pending items' ids from the queue page, oldest first.
func (r *reviewer) queue(ctx context.Context, p *person) ([]string, error) {
	if err := r.signIn(ctx, p); err != nil {
		return nil, err
	}
	resp, page, err := r.get(ctx, p, "/")
	if err != nil {
		return nil, err
	}
	if resp.StatusCode == http.StatusSeeOther {
		p.signOut()
		return nil, errors.New("signed out")
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("the queue: %s", resp.Status)
	}
	var ids []string
	seen := map[string]bool{}
	for _, m := range itemLink.FindAllStringSubmatch(page, -1) {
		if !seen[m[1]] {
			seen[m[1]] = true
			ids = append(ids, m[1])
		}
	}
	return ids, nil
}

// label labels one item, sometimes by two reviewers at once.
func (r *reviewer) label(ctx context.Context, item string) error {
	p := r.people[0]
	page, err := r.itemPage(ctx, p, item)
	if err != nil {
		return err
	}
	form, err := labelForm(page)
	if err != nil {
		return fmt.Errorf("item %s: %w", item, err)
	}
	choice := form.choices[r.intn(len(form.choices))]
	if len(r.people) > 1 && r.intn(5) == 0 {
		// A second reviewer on the same item at the same moment: exactly one label may win.
		q := r.people[1]
		if err := r.signIn(ctx, q); err == nil {
			if other, err := r.itemPage(ctx, q, item); err == nil {
				if f2, err := labelForm(other); err == nil {
					alt := f2.choices[r.intn(len(f2.choices))]
					var wg sync.WaitGroup
					wg.Go(func() { _, _ = r.submit(ctx, q, item, f2, alt) })
					_, err := r.submit(ctx, p, item, form, choice)
					wg.Wait()
					return err
				}
			}
		}
	}
	_, err = r.submit(ctx, p, item, form, choice)
	return err
}

func (p *person) signOut() {
	p.mu.Lock()
	p.signed = false
	p.mu.Unlock()
}

var (
	csrfField   = regexp.MustCompile(`<input type="hidden" name="csrf" value="([^"]*)">`)
	seqField    = regexp.MustCompile(`<input type="hidden" name="seq" value="([^"]*)">`)
	sortField   = regexp.MustCompile(`<input type="hidden" name="sort" value="([^"]*)">`)
	choiceField = regexp.MustCompile(`<button type="submit" name="([^"]+)" value="([^"]*)"`)
)

func (r *reviewer) get(ctx context.Context, p *person, path string) (*http.Response, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.base+path, nil)
	if err != nil {
		return nil, "", err
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	return resp, string(b), err
}

func (r *reviewer) post(ctx context.Context, p *person, path string, form url.Values) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.base+path, strings.NewReader(form.Encode()))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := p.client.Do(req)
	if err != nil {
		return nil, err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<20))
	resp.Body.Close()
	return resp, nil
}

func (r *reviewer) signIn(ctx context.Context, p *person) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.signed {
		return nil
	}
	resp, page, err := r.get(ctx, p, "/login")
	if err != nil {
		return fmt.Errorf("sign-in page: %w", err)
	}
	if resp.StatusCode == http.StatusSeeOther {
		p.signed = true // a session the page still knows
		return nil
	}
	m := csrfField.FindStringSubmatch(page)
	if resp.StatusCode != http.StatusOK || m == nil {
		return fmt.Errorf("sign-in page: %s", resp.Status)
	}
	resp, err = r.post(ctx, p, "/login", url.Values{"csrf": {html.UnescapeString(m[1])}, "next": {"/"}, "user": {p.name}, "password": {r.password}})
	if err != nil {
		return fmt.Errorf("sign in: %w", err)
	}
	if resp.StatusCode != http.StatusSeeOther {
		return fmt.Errorf("sign in as %s: %s", p.name, resp.Status)
	}
	p.signed = true
	return nil
}

func (r *reviewer) itemPage(ctx context.Context, p *person, id string) (string, error) {
	resp, page, err := r.get(ctx, p, "/items/"+url.PathEscape(id))
	if err != nil {
		return "", err
	}
	if resp.StatusCode == http.StatusSeeOther {
		p.signOut()
		return "", errors.New("signed out")
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("item %s: %s", id, resp.Status)
	}
	return page, nil
}

type itemForm struct {
	csrf, seq, sort string
	choices         [][2]string // form field, value
}

func labelForm(page string) (itemForm, error) {
	var f itemForm
	m := csrfField.FindStringSubmatch(page)
	s := seqField.FindStringSubmatch(page)
	if m == nil || s == nil {
		return f, errors.New("no label form on the item page")
	}
	f.csrf, f.seq = html.UnescapeString(m[1]), html.UnescapeString(s[1])
	if so := sortField.FindStringSubmatch(page); so != nil {
		f.sort = html.UnescapeString(so[1])
	}
	for _, c := range choiceField.FindAllStringSubmatch(page, -1) {
		f.choices = append(f.choices, [2]string{html.UnescapeString(c[1]), html.UnescapeString(c[2])})
	}
	if len(f.choices) == 0 {
		return f, errors.New("no label buttons on the item page")
	}
	return f, nil
}

// submit posts one label; it reports whether the page recorded it.
func (r *reviewer) submit(ctx context.Context, p *person, id string, f itemForm, choice [2]string) (bool, error) {
	form := url.Values{"csrf": {f.csrf}, "seq": {f.seq}, "sort": {f.sort}, choice[0]: {choice[1]}}
	resp, err := r.post(ctx, p, "/items/"+url.PathEscape(id)+"/label", form)
	if err != nil {
		return false, err
	}
	switch resp.StatusCode {
	case http.StatusSeeOther:
		if strings.HasPrefix(resp.Header.Get("Location"), "/login") {
			p.signOut()
			return false, errors.New("signed out")
		}
		r.labelled.Add(1)
		return true, nil
	case http.StatusConflict:
		r.conflicts.Add(1) // the other reviewer was first: the page said so
		return false, nil
	default:
		r.refused.Add(1)
		return false, fmt.Errorf("label %s: %s", id, resp.Status)
	}
}

func pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
