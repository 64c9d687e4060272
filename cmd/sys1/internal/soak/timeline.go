package soak

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"time"
)

// Event is one thing the soak did to the fleet (or saw it do): a process killed or started, a
// NATS node restarted, ClickHouse cut off, the fleet paused, the model made slow.
type Event struct {
	At time.Time
	// Until ends a condition that lasts (ClickHouse cut off, the model failing, a pause); zero
	// for an instant.
	Until  time.Time
	What   string // "kill worker", "start nats", "cut clickhouse", ...
	Target string // "w2", "n3", "all nats nodes", ...
	Detail string // "leader of SYS1_REQUESTS", "pid 4711", "503 for every call", ...
}

func (e Event) String(start time.Time) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%8s  %s", offset(start, e.At), e.What)
	if e.Target != "" {
		b.WriteString(" " + e.Target)
	}
	if !e.Until.IsZero() {
		fmt.Fprintf(&b, " until %s", offset(start, e.Until))
	}
	if e.Detail != "" {
		b.WriteString(" (" + e.Detail + ")")
	}
	return b.String()
}

func offset(start, t time.Time) string {
	d := t.Sub(start).Truncate(100 * time.Millisecond)
	if d < 0 {
		return d.String()
	}
	return "+" + d.String()
}

// Timeline records events as they happen; it is safe for concurrent use. Events print as they
// are added when Out is set.
type Timeline struct {
	Start time.Time
	Out   io.Writer

	mu     sync.Mutex
	events []Event
}

// NewTimeline starts a timeline at start.
func NewTimeline(start time.Time, out io.Writer) *Timeline { return &Timeline{Start: start, Out: out} }

// setStart moves the timeline's zero (the load's start, once the fleet is ready).
func (t *Timeline) setStart(start time.Time) {
	t.mu.Lock()
	t.Start = start
	t.mu.Unlock()
}

// Add records e (and prints it).
func (t *Timeline) Add(e Event) {
	if e.At.IsZero() {
		e.At = time.Now()
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.events = append(t.events, e)
	if t.Out != nil {
		fmt.Fprintln(t.Out, e.String(t.Start))
	}
}

// Events are the events so far, in time order.
func (t *Timeline) Events() []Event {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := append([]Event(nil), t.events...)
	sort.SliceStable(out, func(i, j int) bool { return out[i].At.Before(out[j].At) })
	return out
}

// Around returns the events that happen, or last, within [from-margin, to+margin].
func (t *Timeline) Around(from, to time.Time, margin time.Duration) []Event {
	lo, hi := from.Add(-margin), to.Add(margin)
	var out []Event
	for _, e := range t.Events() {
		end := e.At
		if e.Until.After(end) {
			end = e.Until
		}
		if !end.Before(lo) && !e.At.After(hi) {
			out = append(out, e)
		}
	}
	return out
}

// Count is how many events have this What.
func (t *Timeline) Count(what string) int {
	n := 0
	for _, e := range t.Events() {
		if e.What == what {
			n++
		}
	}
	return n
}
