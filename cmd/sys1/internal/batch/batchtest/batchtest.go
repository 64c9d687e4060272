// Package batchtest is a test double for the worker side of batches: it consumes
// sys1.batch.> from the request stream of a real nats-server and answers like a worker
// replica (SPEC §4 replies to Sys1-Reply-To, the run-id gate in the sys1-runs bucket in the
// worker's format, Sys1-Deadline checked after the gate), with answers from the simulator
// provider. It can misbehave as the network may: answer twice, lose a reply, answer out of
// order. It is for testing producers (sys1 batch); it is not a worker.
package batchtest

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/contract/wire"
	"github.com/sys1hq/sys1/provider/simulator"
	"github.com/sys1hq/sys1/worker"
	"github.com/sys1hq/sys1/worker/topology"
)

// Options shape the double's behaviour.
type Options struct {
	// Concurrency is how many requests are handled at once (answers come out of order).
	Concurrency int
	// DuplicateEvery > 0 answers one run id in N twice (replies are at least once).
	DuplicateEvery int
	// LoseEvery > 0 loses the first reply of one run id in N: the run finishes and is stored,
	// the reply never arrives (a later send is answered from the stored outcome).
	LoseEvery int
	// Delay, when set, is how long a run takes before it is answered.
	Delay func(runID string) time.Duration
	// Fail, when set, fails a valid request with the error it returns (nil: answer it).
	Fail func(req *contract.Request) *contract.Error
	// Caller is the gate's owner of every run (the worker's verified caller); empty: the
	// caller token of the request's subject, as auth modes none and subject have it.
	Caller string
}

// Responder answers batch requests until the test ends.
type Responder struct {
	t    testing.TB
	nc   *nats.Conn
	kv   jetstream.KeyValue
	opts Options
	sim  *simulator.Simulator
	cc   jetstream.ConsumeContext
	work chan jetstream.Msg
	wg   sync.WaitGroup
	stop chan struct{}

	mu       sync.Mutex
	calls    map[string]int // provider calls by run id
	answered map[string]int // replies published by run id
	subjects map[string]int // requests received by subject
	received map[string]bool
	headers  map[string]nats.Header // the last request's headers by run id
	open     map[string]bool        // run ids received and not answered yet
	maxOpen  int
}

// Start creates the topology (streams, gate bucket, batch consumer) and starts answering.
func Start(t testing.TB, nc *nats.Conn, js jetstream.JetStream, opts Options) *Responder {
	t.Helper()
	if opts.Concurrency <= 0 {
		opts.Concurrency = 8
	}
	ctx := context.Background()
	topo := topology.Default()
	kv, err := topology.Ensure(ctx, js, topo)
	if err != nil {
		t.Fatalf("batchtest: topology: %v", err)
	}
	cons, err := topology.EnsureBatchConsumer(ctx, js, topo)
	if err != nil {
		t.Fatalf("batchtest: consumer: %v", err)
	}
	r := &Responder{
		t: t, nc: nc, kv: kv, opts: opts, sim: simulator.New(0),
		work: make(chan jetstream.Msg), stop: make(chan struct{}),
		calls: map[string]int{}, answered: map[string]int{}, subjects: map[string]int{},
		received: map[string]bool{}, open: map[string]bool{}, headers: map[string]nats.Header{},
	}
	for range opts.Concurrency {
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			for {
				select {
				case m := <-r.work:
					r.handle(m)
				case <-r.stop:
					return
				}
			}
		}()
	}
	r.cc, err = cons.Consume(func(m jetstream.Msg) {
		select {
		case r.work <- m:
		case <-r.stop:
		}
	}, jetstream.PullMaxMessages(opts.Concurrency))
	if err != nil {
		t.Fatalf("batchtest: consume: %v", err)
	}
	t.Cleanup(r.Stop)
	return r
}

// Stop stops answering (idempotent).
func (r *Responder) Stop() {
	select {
	case <-r.stop:
		return
	default:
	}
	r.cc.Stop()
	close(r.stop)
	r.wg.Wait()
}

// Calls is how many times the provider was called for runID.
func (r *Responder) Calls(runID string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls[runID]
}

// AllCalls returns the provider calls by run id.
func (r *Responder) AllCalls() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]int, len(r.calls))
	for k, v := range r.calls {
		out[k] = v
	}
	return out
}

// Header is the headers of the last request for runID (nil if none came).
func (r *Responder) Header(runID string) nats.Header {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.headers[runID]
}

// Received is how many distinct run ids arrived.
func (r *Responder) Received() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.received)
}

// MaxOpen is the most run ids that had arrived and were not answered yet at any one time: the
// producer's window as this side saw it.
func (r *Responder) MaxOpen() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.maxOpen
}

// Subjects returns how many requests arrived on each subject.
func (r *Responder) Subjects() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]int, len(r.subjects))
	for k, v := range r.subjects {
		out[k] = v
	}
	return out
}

// every picks one run id in n, deterministically.
func every(runID, salt string, n int) bool {
	if n <= 0 {
		return false
	}
	sum := sha256.Sum256([]byte(salt + runID))
	return binary.BigEndian.Uint64(sum[:8])%uint64(n) == 0
}

// gateValue is the worker's runState (worker/gate.go) as JSON.
type gateValue struct {
	Caller    string          `json:"caller"`
	Status    string          `json:"status"`
	StreamSeq uint64          `json:"stream_seq"`
	StartedAt time.Time       `json:"started_at"`
	ReplyTo   string          `json:"reply_to,omitempty"`
	Reply     json.RawMessage `json:"reply,omitempty"`
	Subject   string          `json:"record_subject,omitempty"`
}

func (r *Responder) handle(m jetstream.Msg) {
	ctx := context.Background()
	meta, err := m.Metadata()
	if err != nil {
		_ = m.Term()
		return
	}
	h := m.Headers()
	runID := h.Get(wire.HeaderRunID)
	if !worker.ValidRunID(runID) {
		runID = "SYS1_REQUESTS~" + strconv.FormatUint(meta.Sequence.Stream, 10) + "~test"
	}
	replyTo := h.Get(wire.HeaderReplyTo)
	r.mu.Lock()
	r.subjects[m.Subject()]++
	r.headers[runID] = h
	if !r.received[runID] {
		r.received[runID] = true
		r.open[runID] = true
		r.maxOpen = max(r.maxOpen, len(r.open))
	}
	r.mu.Unlock()

	// The gate, as the worker keeps it: claim, or answer a finished run from its outcome.
	key := worker.GateKey(runID)
	caller := r.opts.Caller
	if caller == "" {
		caller, _ = topology.CallerToken(m.Subject())
	}
	fresh, _ := json.Marshal(gateValue{Caller: caller, Status: "running", StreamSeq: meta.Sequence.Stream, StartedAt: time.Now().UTC()})
	rev, err := r.kv.Create(ctx, key, fresh)
	if errors.Is(err, jetstream.ErrKeyExists) {
		e, gerr := r.kv.Get(ctx, key)
		if gerr != nil {
			_ = m.NakWithDelay(20 * time.Millisecond)
			return
		}
		var st gateValue
		_ = json.Unmarshal(e.Value(), &st)
		switch {
		case st.Status == "done":
			r.reply(replyTo, runID, st.Reply, false)
			_ = m.Ack()
			return
		case st.StreamSeq != meta.Sequence.Stream:
			// Another message owns the run and is in flight: answer once it has finished.
			if !r.gone(ctx, st.StreamSeq) {
				_ = m.NakWithDelay(20 * time.Millisecond)
				return
			}
			st.StreamSeq = meta.Sequence.Stream
			v, _ := json.Marshal(st)
			if rev, err = r.kv.Update(ctx, key, v, e.Revision()); err != nil {
				_ = m.NakWithDelay(20 * time.Millisecond)
				return
			}
		default:
			rev = e.Revision()
		}
	} else if err != nil {
		_ = m.NakWithDelay(20 * time.Millisecond)
		return
	}

	var cerr *contract.Error
	var res *contract.Result
	deadline, derr := time.Parse(time.RFC3339Nano, h.Get(wire.HeaderDeadline))
	switch {
	case h.Get(wire.HeaderDeadline) != "" && derr != nil:
		cerr = contract.Errorf(contract.CodeInvalidInput, "%s: %q is not an RFC 3339 time", wire.HeaderDeadline, h.Get(wire.HeaderDeadline))
	case derr == nil && !time.Now().Before(deadline):
		cerr = contract.Errorf(contract.CodeExpired, "deadline %s passed before the provider was called", deadline.UTC().Format(time.RFC3339Nano))
	default:
		req, e := contract.DecodeRequest(m.Data())
		if e != nil {
			cerr = e
			break
		}
		if r.opts.Delay != nil {
			time.Sleep(r.opts.Delay(runID)) // the provider's latency, simulated
		}
		r.mu.Lock()
		r.calls[runID]++
		r.mu.Unlock()
		if r.opts.Fail != nil {
			cerr = r.opts.Fail(req)
		}
		if cerr == nil {
			if req.Model == "" {
				req.Model = "nimble"
			}
			resp, err := r.sim.Evaluate(ctx, req)
			if err != nil {
				cerr = contract.Errorf(contract.CodeInternal, "simulator: %v", err)
			} else {
				res = &contract.Result{Provider: simulator.Name, Model: req.Model, Answers: resp.Answers, Usage: resp.Usage}
			}
		}
	}
	rep := contract.Reply{RunID: runID, Attempts: []contract.Attempt{}}
	subject := wire.Runs(string(contract.StatusSuccess))
	if cerr != nil {
		rep.Status, rep.Error = contract.StatusFailed, cerr
		subject = wire.Runs(string(contract.StatusFailed))
	} else {
		rep.Status, rep.Result = contract.StatusSuccess, res
	}
	body, _ := rep.MarshalJSON()
	done, _ := json.Marshal(gateValue{Caller: caller, Status: "done", StreamSeq: meta.Sequence.Stream, StartedAt: time.Now().UTC(), ReplyTo: replyTo, Reply: body, Subject: subject})
	if _, err := r.kv.Update(ctx, key, done, rev); err != nil {
		_ = m.NakWithDelay(20 * time.Millisecond)
		return
	}
	r.reply(replyTo, runID, body, true)
	_ = m.Ack()
}

// gone reports whether the message at seq left the request stream (acked or purged).
func (r *Responder) gone(ctx context.Context, seq uint64) bool {
	js, _ := jetstream.New(r.nc)
	s, err := js.Stream(ctx, topology.Default().RequestsStream)
	if err != nil {
		return false
	}
	_, err = s.GetMsg(ctx, seq)
	return errors.Is(err, jetstream.ErrMsgNotFound)
}

func (r *Responder) reply(replyTo, runID string, body []byte, first bool) {
	if replyTo == "" {
		return
	}
	r.mu.Lock()
	r.answered[runID]++
	n := r.answered[runID]
	delete(r.open, runID)
	r.mu.Unlock()
	if first && n == 1 && every(runID, "lose", r.opts.LoseEvery) {
		return
	}
	var env struct {
		Status string `json:"status"`
		Error  *struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	_ = json.Unmarshal(body, &env)
	msg := nats.NewMsg(replyTo)
	msg.Data = body
	msg.Header.Set(wire.HeaderRunID, runID)
	msg.Header.Set(wire.HeaderStatus, env.Status)
	if env.Error != nil {
		msg.Header.Set(wire.HeaderErrorCode, env.Error.Code)
	}
	if err := r.nc.PublishMsg(msg); err != nil {
		r.t.Logf("batchtest: reply: %v", err)
	}
	if every(runID, "dup", r.opts.DuplicateEvery) {
		_ = r.nc.PublishMsg(msg)
	}
}

// String describes the double in test logs.
func (r *Responder) String() string {
	return fmt.Sprintf("batchtest.Responder(%d calls)", len(r.AllCalls()))
}
