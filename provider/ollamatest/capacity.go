package ollamatest

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"
)

// Capacity makes the fake serve like a real Ollama with one model loaded: Slots calls are
// served at once (OLLAMA_NUM_PARALLEL; Ollama forces 1 for models that do not complete
// text), the others wait in a FIFO queue, and each call holds its slot for a service time
// that grows with its questions and the size of its state.
//
// Ollama's OLLAMA_MAX_QUEUE does not guard a model that is already loaded (ollama#7758), so
// the realistic default is an unbounded queue: callers get no 503 backpressure, only longer
// and longer latency. MaxQueue > 0 models a server (or a proxy in front of it) that does
// refuse: a call arriving at a full queue is answered 503 with Ollama's ErrMaxQueue text.
//
// The queue behaves as Ollama's scheduler does: a call whose client gives up while it waits
// leaves the queue and costs nothing. A call already in service keeps its slot until its
// service time is over even when the client has gone (the model's pass over the prompt is
// not interrupted): that is the wasted work that makes timeouts cut goodput.
//
// Invalid requests, unknown models and programmed faults are answered before the queue, as
// Ollama validates a request before scheduling it; WithLatency and a fault's Delay are spent
// before the queue too (network and handler overhead, not model time).
type Capacity struct {
	// Slots is how many calls are served at once (at least 1).
	Slots int
	// MaxQueue bounds the calls waiting for a slot; 0 means unbounded (Ollama's behaviour
	// for a loaded model). A call beyond it is answered 503.
	MaxQueue int
	// Base is each call's fixed service time.
	Base time.Duration
	// PerQuestion is added for every question.
	PerQuestion time.Duration
	// PerStateKiB is added for every question and every KiB of state (the request's raw
	// state JSON): each question is decided over the whole state, so the cost is their product.
	PerStateKiB time.Duration
}

// Validate reports every bad field in one error.
func (c Capacity) Validate() error {
	var errs []error
	if c.Slots < 1 {
		errs = append(errs, fmt.Errorf("slots must be at least 1, got %d", c.Slots))
	}
	if c.MaxQueue < 0 {
		errs = append(errs, fmt.Errorf("max queue must not be negative (0 = unbounded), got %d", c.MaxQueue))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"base", c.Base}, {"per-question", c.PerQuestion}, {"per-KiB-of-state", c.PerStateKiB}} {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("%s service time must not be negative, got %s", d.name, d.v))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("ollamatest capacity: %w", err)
	}
	return nil
}

// ServiceTime is how long a call with this many questions and this many bytes of state
// holds its slot: Base + questions × (PerQuestion + PerStateKiB × state KiB).
func (c Capacity) ServiceTime(questions, stateBytes int) time.Duration {
	kib := float64(stateBytes) / 1024
	perQuestion := float64(c.PerQuestion) + float64(c.PerStateKiB)*kib
	return c.Base + time.Duration(float64(questions)*perQuestion)
}

// WithCapacity turns on the realistic serving model (see Capacity). It panics on a Capacity
// that Validate rejects: check user input with Validate first.
func WithCapacity(c Capacity) Option {
	if err := c.Validate(); err != nil {
		panic(err)
	}
	return func(s *Server) { s.capacity = &capacityQueue{cfg: c} }
}

// QueueStats is a snapshot of the realistic serving model (see Capacity). Every counter
// counts /v1/systemone calls that reached the queue (valid requests for a known model).
type QueueStats struct {
	// Waiting is the number of calls queued for a slot now; MaxWaiting the most ever.
	Waiting    int `json:"waiting"`
	MaxWaiting int `json:"max_waiting"`
	// Serving is the number of slots busy now.
	Serving int `json:"serving"`
	// Served counts calls answered after their service.
	Served int64 `json:"served"`
	// Wasted counts calls served to the end after their client had gone (timed out or
	// cancelled): slot time that produced nothing.
	Wasted int64 `json:"wasted"`
	// Abandoned counts calls whose client gave up while they waited; they cost no slot time.
	Abandoned int64 `json:"abandoned"`
	// Rejected counts calls answered 503 because MaxQueue calls were already waiting.
	Rejected int64 `json:"rejected"`
	// ServiceTime is the slot time spent, summed over Served and Wasted calls.
	ServiceTime time.Duration `json:"service_time_ns"`
}

// Queue returns the serving model's counters; zero without WithCapacity.
func (s *Server) Queue() QueueStats {
	q := s.capacity
	if q == nil {
		return QueueStats{}
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	st := q.stats
	st.Waiting, st.Serving = len(q.waiting), q.serving
	return st
}

// AwaitQueue blocks until cond holds for the serving model's counters, or ctx ends. Tests
// use it to order calls (one in service, then one waiting, ...) without sleeping.
func (s *Server) AwaitQueue(ctx context.Context, cond func(QueueStats) bool) error {
	q := s.capacity
	if q == nil {
		return errors.New("ollamatest: AwaitQueue needs WithCapacity")
	}
	for {
		q.mu.Lock()
		st := q.stats
		st.Waiting, st.Serving = len(q.waiting), q.serving
		if cond(st) {
			q.mu.Unlock()
			return nil
		}
		if q.changed == nil {
			q.changed = make(chan struct{})
		}
		changed := q.changed
		q.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("ollamatest: waiting for a queue state (now %d waiting, %d serving): %w", st.Waiting, st.Serving, ctx.Err())
		}
	}
}

// capacityQueue is the slots and the FIFO queue behind them.
type capacityQueue struct {
	cfg Capacity

	mu      sync.Mutex
	serving int
	waiting []*queued // FIFO: the head gets the next free slot
	stats   QueueStats
	changed chan struct{} // closed (and replaced) on every change: AwaitQueue's signal
}

type queued struct {
	granted chan struct{} // closed when the slot is handed over
	has     bool          // guarded by mu: the slot was handed over
}

var errQueueFull = errors.New("server busy, please try again.  maximum pending requests exceeded")

// notify wakes AwaitQueue; callers hold mu.
func (q *capacityQueue) notify() {
	if q.changed != nil {
		close(q.changed)
		q.changed = nil
	}
}

// acquire takes a slot, waiting in FIFO order. It returns errQueueFull when MaxQueue calls
// already wait, and the context's error (or errServerClosed) when the wait ends first.
func (q *capacityQueue) acquire(ctx context.Context, closed <-chan struct{}) error {
	q.mu.Lock()
	if q.serving < q.cfg.Slots && len(q.waiting) == 0 {
		q.serving++
		q.notify()
		q.mu.Unlock()
		return nil
	}
	if q.cfg.MaxQueue > 0 && len(q.waiting) >= q.cfg.MaxQueue {
		q.stats.Rejected++
		q.notify()
		q.mu.Unlock()
		return errQueueFull
	}
	me := &queued{granted: make(chan struct{})}
	q.waiting = append(q.waiting, me)
	q.stats.MaxWaiting = max(q.stats.MaxWaiting, len(q.waiting))
	q.notify()
	q.mu.Unlock()

	var err error
	select {
	case <-me.granted:
		return nil
	case <-ctx.Done():
		err = ctx.Err()
	case <-closed:
		err = errServerClosed
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if me.has {
		// The slot arrived as the wait ended: pass it on rather than serve a gone client.
		q.releaseLocked()
	} else {
		for i, w := range q.waiting {
			if w == me {
				q.waiting = append(q.waiting[:i], q.waiting[i+1:]...)
				break
			}
		}
	}
	q.stats.Abandoned++
	q.notify()
	return err
}

// release frees a slot after a service of d; clientGone marks the work as wasted.
func (q *capacityQueue) release(d time.Duration, clientGone bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.stats.ServiceTime += d
	if clientGone {
		q.stats.Wasted++
	} else {
		q.stats.Served++
	}
	q.releaseLocked()
}

// releaseLocked hands the slot to the head of the queue, or frees it.
func (q *capacityQueue) releaseLocked() {
	if len(q.waiting) > 0 {
		next := q.waiting[0]
		q.waiting = q.waiting[1:]
		next.has = true
		close(next.granted)
	} else {
		q.serving--
	}
	q.notify()
}

var errServerClosed = errors.New("ollamatest: server closed")

// serve runs one valid call through the serving model: queue, slot, service time. It
// reports whether to answer; when it returns false the call has been dealt with (a 503 or
// a dropped connection) or its client is gone.
func (s *Server) serve(w http.ResponseWriter, r *http.Request, questions, stateBytes int) bool {
	q := s.capacity
	switch err := q.acquire(r.Context(), s.done); {
	case errors.Is(err, errQueueFull):
		writeError(w, http.StatusServiceUnavailable, err.Error())
		return false
	case errors.Is(err, errServerClosed):
		dropConnection(w)
		return false
	case err != nil:
		return false // the client gave up while queued
	}
	d := q.cfg.ServiceTime(questions, stateBytes)
	start := time.Now()
	// The slot is held for the whole service time whether or not the client stays.
	finished := s.hold(start.Add(d))
	gone := r.Context().Err() != nil
	took := time.Since(start)
	s.busy.Add(int64(took))
	q.release(took, gone || !finished)
	if !finished {
		dropConnection(w)
		return false
	}
	return !gone
}
