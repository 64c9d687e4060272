package chain

import (
	"container/list"
	"sync"
)

// routeTable is one link's route breakers, one per model as sent to that provider. Requests
// name arbitrary models, so the table is bounded: past its limit it forgets the least
// recently used closed route (a closed route holds at most a count below the threshold),
// and only when every route is open or absent the least recently used of all.
type routeTable struct {
	limit int
	fresh func() *breaker

	mu      sync.Mutex
	byModel map[string]*list.Element // of *routeEntry
	order   *list.List               // most recently used first
}

type routeEntry struct {
	model   string
	breaker *breaker
}

func newRouteTable(limit int, fresh func() *breaker) *routeTable {
	return &routeTable{limit: limit, fresh: fresh, byModel: make(map[string]*list.Element), order: list.New()}
}

// get is model's breaker, created when the model is new, and marks it used now.
func (t *routeTable) get(model string) *breaker {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e, ok := t.byModel[model]; ok {
		t.order.MoveToFront(e)
		return e.Value.(*routeEntry).breaker
	}
	b := t.fresh()
	t.byModel[model] = t.order.PushFront(&routeEntry{model: model, breaker: b})
	if t.order.Len() > t.limit {
		t.evict()
	}
	return b
}

// evict forgets one route: the least recently used closed one, else the least recently used.
// A call still holding a forgotten breaker records into it harmlessly. Call with mu held.
func (t *routeTable) evict() {
	victim := t.order.Back()
	for e := t.order.Back(); e != nil; e = e.Prev() {
		if e.Value.(*routeEntry).breaker.closed() {
			victim = e
			break
		}
	}
	delete(t.byModel, victim.Value.(*routeEntry).model)
	t.order.Remove(victim)
}

// peek is model's breaker without creating it or marking it used; nil when the table has none.
func (t *routeTable) peek(model string) *breaker {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e, ok := t.byModel[model]; ok {
		return e.Value.(*routeEntry).breaker
	}
	return nil
}

// each calls fn for every route, most recently used first, with the table locked: fn must
// not call back into the table.
func (t *routeTable) each(fn func(model string, b *breaker)) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for e := t.order.Front(); e != nil; e = e.Next() {
		r := e.Value.(*routeEntry)
		fn(r.model, r.breaker)
	}
}
