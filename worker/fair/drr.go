package fair

// Scheduler decides which flow the next messages come from: weighted deficit round robin
// (Shreedhar and Varghese, SIGCOMM 1995) between groups — the callers — and plain round robin
// between the flows of one group — a caller's batches, in the batch lane; in the other lanes a
// caller has one flow. A message costs one unit; a group's turn allows it weight units, so
// over any stretch in which two callers both have work waiting, each receives messages in
// proportion to its weight, whatever either has queued. A group whose flows run dry leaves
// the ring and forgets what its turn had left (it cannot bank service while idle), and one
// that comes back joins at the end of the ring.
//
// It is work-conserving: a lone group is given everything asked for at once, however small
// its weight.
//
// The Scheduler is pure bookkeeping (no I/O, no clock) and not safe for concurrent use: one
// pull loop owns it.
type Scheduler struct {
	groups map[string]*group
	flows  map[string]*flow
	ring   []*group // groups with an active flow, in turn order
	turn   int      // index in ring of the group whose turn it is
}

type group struct {
	key     string
	weight  int
	deficit int
	started bool    // its turn has begun: the deficit has had this turn's quantum
	flows   []*flow // active flows, in turn order
	next    int     // index in flows of the next flow to serve
}

type flow struct {
	key    string
	group  *group
	active bool
}

// NewScheduler returns an empty scheduler.
func NewScheduler() *Scheduler {
	return &Scheduler{groups: map[string]*group{}, flows: map[string]*flow{}}
}

// Activate says flowKey, of groupKey, has messages waiting. The group's weight (at least 1)
// is set from weight each time. Activating an active flow only updates the weight.
func (s *Scheduler) Activate(groupKey, flowKey string, weight int) {
	weight = max(weight, 1)
	g := s.groups[groupKey]
	if g == nil {
		g = &group{key: groupKey}
		s.groups[groupKey] = g
	}
	g.weight = weight
	f := s.flows[flowKey]
	if f == nil {
		f = &flow{key: flowKey, group: g}
		s.flows[flowKey] = f
	}
	if f.active {
		return
	}
	if f.group != g { // a flow key names one group for good; a reused key moves with it
		f.group = g
	}
	f.active = true
	g.flows = append(g.flows, f)
	if len(g.flows) == 1 {
		g.deficit, g.started = 0, false
		s.ring = append(s.ring, g)
	}
}

// Deactivate says flowKey has nothing waiting (its last fetch came back short, or failed).
func (s *Scheduler) Deactivate(flowKey string) {
	f := s.flows[flowKey]
	if f == nil || !f.active {
		return
	}
	f.active = false
	g := f.group
	i := indexOf(g.flows, f)
	g.flows = append(g.flows[:i], g.flows[i+1:]...)
	if i < g.next {
		g.next--
	}
	if g.next >= len(g.flows) {
		g.next = 0
	}
	delete(s.flows, flowKey) // idle flows are not kept: a lane may see many over a day
	if len(g.flows) > 0 {
		return
	}
	// The group ran dry: out of the ring, and what its turn had left is forgotten.
	j := indexOf(s.ring, g)
	s.ring = append(s.ring[:j], s.ring[j+1:]...)
	switch {
	case j < s.turn:
		s.turn--
	case j == s.turn:
		// The next group's turn begins (it is now at index turn).
	}
	if s.turn >= len(s.ring) {
		s.turn = 0
	}
	g.deficit, g.started = 0, false
	delete(s.groups, g.key)
}

// Next is the flow whose turn it is and how many messages it may take now, at most left. ok
// is false when no flow is active.
func (s *Scheduler) Next(left int) (flowKey string, n int, ok bool) {
	if len(s.ring) == 0 || left < 1 {
		return "", 0, false
	}
	g := s.ring[s.turn]
	f := g.flows[g.next]
	if len(s.ring) == 1 {
		// Alone: everything it can use (work-conserving), and no credit carried into a
		// contest that has not begun.
		g.deficit, g.started = 0, false
		return f.key, left, true
	}
	if !g.started {
		g.deficit += g.weight
		g.started = true
	}
	return f.key, min(left, g.deficit), true
}

// Took records that flowKey was given got messages of the n Next allowed; exhausted says it
// has no more waiting (it gave fewer than asked, or its fetch failed), which deactivates it.
func (s *Scheduler) Took(flowKey string, got int, exhausted bool) {
	f := s.flows[flowKey]
	if f == nil || !f.active {
		return
	}
	g := f.group
	alone := len(s.ring) == 1
	if !alone {
		g.deficit = max(g.deficit-got, 0)
	}
	if exhausted {
		s.Deactivate(flowKey)
		if len(g.flows) == 0 { // the group left the ring; Deactivate moved the turn on
			return
		}
	} else if len(g.flows) > 1 {
		g.next = (g.next + 1) % len(g.flows) // a caller's batches take turns within its turn
	}
	if alone || g.deficit > 0 {
		return // the turn goes on
	}
	g.started = false
	s.turn = (s.turn + 1) % len(s.ring)
}

// Active is the number of flows and groups with messages waiting.
func (s *Scheduler) Active() (flows, groups int) { return len(s.flows), len(s.ring) }

// IsActive reports whether flowKey is active.
func (s *Scheduler) IsActive(flowKey string) bool {
	f := s.flows[flowKey]
	return f != nil && f.active
}

func indexOf[T comparable](xs []T, x T) int {
	for i, v := range xs {
		if v == x {
			return i
		}
	}
	panic("fair: scheduler state corrupt: element not found")
}
