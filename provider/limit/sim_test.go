package limit_test

import (
	"container/heap"
	"context"
	"math"
	"slices"
	"time"

	"github.com/sys1hq/sys1/provider/limit"
)

// A discrete-event simulation on a virtual clock: replicas, each with its own limiter and
// closed-loop workers, calling one model server with a few slots and an unbounded FIFO
// queue (the shape of provider/ollamatest's Capacity). Deterministic, and fast enough for
// CI; the real-time evidence over HTTP is provider/limit/internal/limiteval.

type simServer struct {
	slots   int
	service func(size float64) time.Duration
}

type simConfig struct {
	server     simServer
	replicas   int
	workers    int // per replica: the closed loop's concurrency (SYS1_CONCURRENCY)
	timeout    time.Duration
	turnaround time.Duration // a worker's own time between two calls
	duration   time.Duration
	warmup     time.Duration // results before it are left out of the figures
	sizes      func(replica int, n int) float64
	// costError, when set, multiplies a call's service time: how far the size the limiter
	// is told is from what the call really costs.
	costError func(replica int, n int) float64
	// start delays each replica's first call (a replica joining late).
	start func(replica int) time.Duration
	// trace, when set, is called every traceEvery with the calls at the server and queued.
	trace      func(now time.Duration, atServer, queued int)
	traceEvery time.Duration
}

type simReplica struct {
	lim      limit.Limiter
	idle     int // workers ready to call
	ok       int
	timeouts int
	busy     time.Duration // service time of the calls answered in time (goodput)
	latency  []time.Duration
	seq      int
}

type simResult struct {
	replicas []*simReplica
	trace    [][]float64 // per replica, the effective limit at each tenth of the run
	wasted   time.Duration
	elapsed  time.Duration
	slots    int
}

// goodput is the share of the server's slot time spent on calls answered in time.
func (r simResult) goodput() float64 {
	var busy time.Duration
	for _, rep := range r.replicas {
		busy += rep.busy
	}
	return busy.Seconds() / (r.elapsed.Seconds() * float64(r.slots))
}

func (r simResult) timeouts() int {
	n := 0
	for _, rep := range r.replicas {
		n += rep.timeouts
	}
	return n
}

func (r simResult) p99() time.Duration {
	var all []time.Duration
	for _, rep := range r.replicas {
		all = append(all, rep.latency...)
	}
	return quantile(all, 0.99)
}

// fairness is Jain's index of the replicas' answered calls: 1 when equal, 1/n when one
// replica has them all.
func (r simResult) fairness() float64 {
	var sum, sq float64
	for _, rep := range r.replicas {
		x := float64(rep.ok)
		sum += x
		sq += x * x
	}
	if sq == 0 {
		return 0
	}
	return sum * sum / (float64(len(r.replicas)) * sq)
}

func quantile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(math.Ceil(q*float64(len(s))))-1)]
}

type simEvent struct {
	at   time.Duration
	seq  int
	kind int // evSend, evFinish, evTimeout
	call *simCall
	rep  int
}

const (
	evSend = iota
	evFinish
	evTimeout
)

type simCall struct {
	rep      int
	size     float64
	tok      limit.Token
	sent     time.Duration
	service  time.Duration
	started  bool
	finished bool
	timedOut bool
}

type eventQueue []*simEvent

func (q eventQueue) Len() int { return len(q) }
func (q eventQueue) Less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	return q[i].seq < q[j].seq
}
func (q eventQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *eventQueue) Push(x any)   { *q = append(*q, x.(*simEvent)) }
func (q *eventQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

// simulate runs cfg with one limiter per replica from newLimiter.
func simulate(cfg simConfig, newLimiter func() limit.Limiter) simResult {
	var (
		now     time.Duration
		events  eventQueue
		seq     int
		serving int
		queue   []*simCall
		res     = simResult{elapsed: cfg.duration - cfg.warmup, slots: cfg.server.slots}
	)
	push := func(at time.Duration, kind int, c *simCall, rep int) {
		seq++
		heap.Push(&events, &simEvent{at: at, seq: seq, kind: kind, call: c, rep: rep})
	}
	reps := make([]*simReplica, cfg.replicas)
	res.trace = make([][]float64, cfg.replicas)
	for i := range reps {
		reps[i] = &simReplica{lim: newLimiter(), idle: cfg.workers}
		at := time.Duration(0)
		if cfg.start != nil {
			at = cfg.start(i)
		}
		push(at, evSend, nil, i)
	}
	res.replicas = reps

	startService := func() {
		for serving < cfg.server.slots && len(queue) > 0 {
			c := queue[0]
			queue = queue[1:]
			serving++
			c.started = true
			push(now+c.service, evFinish, c, c.rep)
		}
	}
	// send fills the replica's limit with calls from idle workers.
	send := func(i int) {
		r := reps[i]
		for r.idle > 0 && r.lim.InFlight() < r.lim.Limit() {
			tok, err := r.lim.Acquire(context.Background())
			if err != nil {
				panic(err) // below the limit, Acquire does not wait
			}
			r.idle--
			size := 64.0
			if cfg.sizes != nil {
				size = cfg.sizes(i, r.seq)
			}
			service := cfg.server.service(size)
			if cfg.costError != nil {
				service = time.Duration(float64(service) * cfg.costError(i, r.seq))
			}
			r.seq++
			c := &simCall{rep: i, size: size, tok: tok, sent: now, service: service}
			queue = append(queue, c)
			push(now+cfg.timeout, evTimeout, c, i)
		}
		startService()
	}
	counted := func(c *simCall) bool { return c.sent >= cfg.warmup }
	done := func(c *simCall) {
		reps[c.rep].idle++
		push(now+cfg.turnaround, evSend, nil, c.rep)
	}
	nextTrace, nextDebug := time.Duration(0), time.Duration(0)
	for events.Len() > 0 {
		e := heap.Pop(&events).(*simEvent)
		if e.at > cfg.duration {
			break
		}
		now = e.at
		for cfg.trace != nil && now >= nextDebug {
			cfg.trace(now, serving+len(queue), len(queue))
			nextDebug += max(cfg.traceEvery, 30*time.Second)
		}
		for now >= nextTrace {
			for i, r := range reps {
				res.trace[i] = append(res.trace[i], float64(r.lim.Limit()))
			}
			nextTrace += cfg.duration / 10
		}
		switch e.kind {
		case evSend:
			send(e.rep)
		case evFinish:
			c := e.call
			serving--
			c.finished = true
			if c.timedOut {
				if counted(c) {
					res.wasted += c.service
				}
			} else {
				lat := now - c.sent
				c.tok.Release(limit.Result{Latency: lat, Size: c.size})
				if counted(c) {
					r := reps[c.rep]
					r.ok++
					r.busy += c.service
					r.latency = append(r.latency, lat)
				}
				done(c)
			}
			startService()
		case evTimeout:
			c := e.call
			if c.finished {
				continue
			}
			c.timedOut = true
			if !c.started {
				queue = slices.DeleteFunc(queue, func(x *simCall) bool { return x == c })
			}
			c.tok.Release(limit.Result{Latency: cfg.timeout, Size: c.size, Dropped: true})
			if counted(c) {
				reps[c.rep].timeouts++
			}
			done(c)
		}
	}
	return res
}

// issueScenario is issue 15's benchmark at the real time scale: 4 replicas × 16 against a
// 2-slot server, 64-question calls of 2.4 s, a 30 s timeout (fixed 16 and 8 time out).
func issueScenario() simConfig {
	return simConfig{
		server: simServer{slots: 2, service: func(size float64) time.Duration {
			return time.Duration(size * float64(37500*time.Microsecond))
		}},
		replicas:   4,
		workers:    16,
		timeout:    30 * time.Second,
		turnaround: 20 * time.Millisecond,
		duration:   2 * time.Hour,
		warmup:     10 * time.Minute,
	}
}
