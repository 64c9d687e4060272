package soak

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// collector reads every message a durable, replicated consumer of the soak's delivers — the
// replies stored for the soak's callers, the accepted labels — through every failover, each
// stream sequence once. A durable R3 consumer outlives any node; a redelivery (an ack lost
// with a node) is recognised by its sequence.
type collector struct {
	name   string
	cons   jetstream.Consumer
	handle func(jetstream.Msg, *jetstream.MsgMetadata)

	mu   sync.Mutex
	seen map[uint64]bool
	last time.Time // when the last new message arrived
	errs int
}

func newCollector(ctx context.Context, js jetstream.JetStream, stream, name string, filters []string, replicas int, handle func(jetstream.Msg, *jetstream.MsgMetadata)) (*collector, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cons, err := js.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{
		Durable:        name,
		Description:    "sys1 soak: reads what the fleet stored, to check it",
		FilterSubjects: filters,
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        10 * time.Second,
		DeliverPolicy:  jetstream.DeliverAllPolicy,
		MaxAckPending:  4096,
		Replicas:       replicas,
	})
	if err != nil {
		return nil, err
	}
	return &collector{name: name, cons: cons, handle: handle, seen: map[uint64]bool{}}, nil
}

// run pulls until ctx ends.
func (c *collector) run(ctx context.Context) {
	for ctx.Err() == nil {
		batch, err := c.cons.Fetch(256, jetstream.FetchMaxWait(time.Second))
		if err == nil {
			for m := range batch.Messages() {
				meta, merr := m.Metadata()
				if merr != nil {
					_ = m.Term()
					continue
				}
				c.mu.Lock()
				fresh := !c.seen[meta.Sequence.Stream]
				c.seen[meta.Sequence.Stream] = true
				if fresh {
					c.last = time.Now()
				}
				c.mu.Unlock()
				if fresh {
					c.handle(m, meta)
				}
				_ = m.Ack() // a lost ack brings it back: skipped above
			}
			err = batch.Error()
		}
		if err != nil && !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, context.DeadlineExceeded) {
			c.mu.Lock()
			c.errs++
			c.mu.Unlock()
			t := time.NewTimer(100 * time.Millisecond) // a node failing over: pull again soon
			select {
			case <-ctx.Done():
				t.Stop()
			case <-t.C:
			}
		}
	}
}

// replies gathers the replies stored for the soak's callers.
type replies struct {
	mu      sync.Mutex
	all     []Reply
	byRun   map[string][]Reply
	badBody int
	// onReply, when set, is told of every new reply (the load's label producer listens).
	onReply func(Reply)
}

func newReplies() *replies { return &replies{byRun: map[string][]Reply{}} }

func (r *replies) handle(m jetstream.Msg, meta *jetstream.MsgMetadata) {
	body := m.Data()
	rep, err := ParseReply(m.Headers().Get("Sys1-Run-Id"), meta.Sequence.Stream, meta.Timestamp, sha256.Sum256(body), body)
	r.mu.Lock()
	if err != nil {
		r.badBody++
		r.mu.Unlock()
		return
	}
	r.all = append(r.all, rep)
	r.byRun[rep.RunID] = append(r.byRun[rep.RunID], rep)
	cb := r.onReply
	r.mu.Unlock()
	if cb != nil {
		cb(rep)
	}
}

// answered reports whether run has a reply (for a held run: its release).
func (r *replies) answered(runID string, held bool) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, x := range r.byRun[runID] {
		// A held caller's run that failed before it had an answer to hold is answered with its
		// error like any run: no release follows (the holds check judges it at the end).
		if !held || x.Review == "reviewed" || (x.Status == "failed" && x.Review == "") {
			return true
		}
	}
	return false
}

func (r *replies) snapshot() []Reply {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Reply(nil), r.all...)
}

// labels gathers the accepted labels.
type labels struct {
	mu  sync.Mutex
	all []Label
}

func (l *labels) handle(m jetstream.Msg, meta *jetstream.MsgMetadata) {
	var b struct {
		RunID    string          `json:"run_id"`
		Question string          `json:"question"`
		Value    json.RawMessage `json:"label"`
		Reviewer string          `json:"reviewer"`
		Source   string          `json:"source"`
		Item     string          `json:"item"`
	}
	if json.Unmarshal(m.Data(), &b) != nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.all = append(l.all, Label{RunID: b.RunID, Question: b.Question, Value: string(b.Value), Source: b.Source, Reviewer: b.Reviewer, Item: b.Item, At: meta.Timestamp, Seq: meta.Sequence.Stream})
}

func (l *labels) snapshot() []Label {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Label(nil), l.all...)
}
