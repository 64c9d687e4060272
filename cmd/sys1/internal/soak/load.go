package soak

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sys1hq/sys1/contract/wire"
	"github.com/sys1hq/sys1/worker/client"
)

// The soak's callers: each is a kind of traffic, told apart by its subject token
// (SYS1_AUTH_MODE=subject).
const (
	CallerPlain  = "soak-plain"  // no limits; producers label some of its runs
	CallerBudget = "soak-budget" // a day budget of Budget decisions
	CallerCache  = "soak-cache"  // the exact cache on; bodies repeat
	CallerHold   = "soak-hold"   // the policy holds every reply for a reviewer's label
	CallerBatch  = "soak-batch"  // the running sys1 batch
)

// cacheBodies is how many distinct bodies the cache caller sends: most of its runs are hits.
const cacheBodies = 8

// body is a request whose state names key (so the fake model's calls count under it).
func body(key string, held bool) []byte {
	second := `"urgent":{"type":"noul","instructions":"Is it urgent?"}`
	if held {
		second = `"approve":{"type":"noul","instructions":"May the refund be paid without a person's approval?"}`
	}
	return []byte(`{"state":"` + stateTag + key + ` my card was charged twice for one order and I want the second charge back",` +
		`"questions":{"label":{"type":"choice","instructions":"Which team should handle this ticket?",` +
		`"criteria":{"billing":"Payments, invoices, refunds","bug":"The product misbehaves","account":null}},` + second + `}}`)
}

// load publishes the interactive traffic at a steady rate, and producers' labels for some of
// the plain caller's answered runs. Every publish is retried, with the same Nats-Msg-Id, until
// JetStream acknowledges it (a duplicate's ack counts: an earlier try was stored) or for as
// long as the de-duplication window keeps a retry from being stored twice.
type load struct {
	cl  *client.Client
	js  jetstream.JetStream
	rng *rand.Rand // the traffic's (run's goroutine only)
	// labelRng picks the runs producers label (runLabels' goroutine only, under mu).
	labelRng *rand.Rand
	rate     float64
	// weights of the kinds of traffic.
	kinds []string

	mu       sync.Mutex
	requests []*Request
	labels   []SentLabel
	toLabel  []string // plain runs answered with success, not yet labelled
	seq      map[string]int

	inFlight     atomic.Int64
	acked        atomic.Int64
	retries      atomic.Int64
	labelPending atomic.Int64
}

// retryFor bounds a publish's retries: within the request stream's de-duplication window
// (2 m), so a retry is never stored as a second message.
const retryFor = 90 * time.Second

func newLoad(nc *nats.Conn, seed uint64, rate float64) (*load, error) {
	cl, err := client.New(nc)
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	l := &load{cl: cl, js: js, rng: rand.New(rand.NewPCG(seed, seed^0x10ad)), labelRng: rand.New(rand.NewPCG(seed, seed^0x1abe1)),
		rate: rate, seq: map[string]int{}}
	// Plain traffic most, then the limited kinds.
	for kind, w := range map[string]int{KindPlain: 45, KindBudget: 20, KindCache: 20, KindHold: 15} {
		for range w {
			l.kinds = append(l.kinds, kind)
		}
	}
	// Map iteration order is random; sort so a seed replays the same traffic.
	sortStrings(l.kinds)
	return l, nil
}

func sortStrings(s []string) {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}

// run publishes until ctx ends, then waits for the publishes in flight.
func (l *load) run(ctx context.Context) {
	var wg sync.WaitGroup
	slots := make(chan struct{}, 256)
	interval := time.Duration(float64(time.Second) / l.rate)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			wg.Wait()
			return
		case <-tick.C:
			kind := l.kinds[l.rng.IntN(len(l.kinds))]
			cacheKey := l.rng.IntN(cacheBodies)
			select {
			case slots <- struct{}{}: // at most 256 publishes retrying at once: the load falls behind, never piles up
			case <-ctx.Done():
				continue
			}
			r := l.next(kind, cacheKey)
			wg.Go(func() {
				defer func() { <-slots }()
				l.publish(r)
			})
		}
	}
}

// next is the next request of kind.
func (l *load) next(kind string, cacheKey int) *Request {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seq[kind]++
	n := l.seq[kind]
	r := &Request{Kind: kind, PublishedAt: time.Now()}
	switch kind {
	case KindPlain:
		r.Caller, r.RunID = CallerPlain, fmt.Sprintf("p-%06d", n)
	case KindBudget:
		r.Caller, r.RunID = CallerBudget, fmt.Sprintf("b-%06d", n)
	case KindCache:
		r.Caller, r.RunID = CallerCache, fmt.Sprintf("c-%06d", n)
	case KindHold:
		r.Caller, r.RunID = CallerHold, fmt.Sprintf("h-%06d", n)
	}
	r.Key = r.RunID
	if kind == KindCache {
		r.Key = fmt.Sprintf("cache-%d", cacheKey)
	}
	l.requests = append(l.requests, r)
	return r
}

func (l *load) publish(r *Request) {
	req := client.Request{Caller: r.Caller, Body: body(r.Key, r.Kind == KindHold), RunID: r.RunID,
		ReplyTo: wire.Replies(r.Caller, r.RunID)}
	l.inFlight.Add(1)
	defer l.inFlight.Add(-1)
	deadline := time.Now().Add(retryFor)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := l.cl.Publish(ctx, req)
		cancel()
		if err == nil || errors.Is(err, client.ErrDuplicate) {
			l.mu.Lock()
			r.AckedAt = time.Now()
			l.mu.Unlock()
			l.acked.Add(1)
			return
		}
		if time.Now().After(deadline) {
			l.mu.Lock()
			r.PublishErr = err.Error()
			l.mu.Unlock()
			return
		}
		l.retries.Add(1)
		pause := time.NewTimer(200 * time.Millisecond) // a retry's pause, not synchronisation
		<-pause.C
	}
}

// runLabels publishes producers' labels every second until ctx ends (through the drain: runs
// answered late are labelled too), then waits for the publishes in flight.
func (l *load) runLabels(ctx context.Context) {
	var wg sync.WaitGroup
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			wg.Wait()
			return
		case <-tick.C:
			l.publishLabels(ctx, &wg)
		}
	}
}

// labelsInFlight counts label publishes not yet acknowledged.
func (l *load) labelsInFlight() int64 { return l.labelPending.Load() }

// answered is told of every reply; a plain run answered with success may be labelled.
func (l *load) answered(rep Reply) {
	if rep.Status != "success" || !strings.HasPrefix(rep.RunID, "p-") {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.toLabel = append(l.toLabel, rep.RunID)
}

// publishLabels labels one in five of the plain runs answered since the last time, as a
// producer that learned the truth later would.
func (l *load) publishLabels(ctx context.Context, wg *sync.WaitGroup) {
	l.mu.Lock()
	todo := l.toLabel
	l.toLabel = nil
	var picked []string
	seen := map[string]bool{}
	for _, id := range todo {
		if !seen[id] && l.labelRng.IntN(5) == 0 {
			picked = append(picked, id)
		}
		seen[id] = true // a reply seen twice is labelled at most once
	}
	values := make([]string, len(picked))
	for i := range picked {
		values[i] = []string{`"billing"`, `"bug"`, `"account"`}[l.labelRng.IntN(3)]
	}
	l.mu.Unlock()
	for i, id := range picked {
		value := values[i]
		l.labelPending.Add(1)
		wg.Go(func() {
			defer l.labelPending.Add(-1)
			msg := nats.NewMsg(wire.Label(CallerPlain))
			msg.Header.Set(jetstream.MsgIDHeader, "soak-label:"+id)
			msg.Data = []byte(`{"run_id":"` + id + `","question":"label","label":` + value + `,"reviewer":"soak-backoffice"}`)
			deadline := time.Now().Add(retryFor)
			for {
				pctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_, err := l.js.PublishMsg(pctx, msg)
				cancel()
				if err == nil {
					l.mu.Lock()
					l.labels = append(l.labels, SentLabel{RunID: id, Question: "label", Value: value, AckedAt: time.Now()})
					l.mu.Unlock()
					return
				}
				if time.Now().After(deadline) {
					return
				}
				pause := time.NewTimer(200 * time.Millisecond)
				<-pause.C
			}
		})
	}
}

// snapshot is every request and every acknowledged label so far.
func (l *load) snapshot() ([]Request, []SentLabel) {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]Request, len(l.requests))
	for i, r := range l.requests {
		out[i] = *r
	}
	return out, append([]SentLabel(nil), l.labels...)
}
