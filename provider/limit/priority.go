package limit

import "context"

// Urgent marks ctx's Acquire as urgent: it is handed the next free slot before every waiter
// that is not (an interactive request before batch items), in arrival order among the urgent
// ones. Waiting costs nothing more: a call that is not urgent is only overtaken, never dropped.
func Urgent(ctx context.Context) context.Context { return context.WithValue(ctx, urgentKey{}, true) }

type urgentKey struct{}

func isUrgent(ctx context.Context) bool { v, _ := ctx.Value(urgentKey{}).(bool); return v }

// queue is a limiter's waiters: the urgent first, each part in arrival order.
type queue[W any] struct {
	urgent, other []W
}

func (q *queue[W]) push(w W, urgent bool) {
	if urgent {
		q.urgent = append(q.urgent, w)
		return
	}
	q.other = append(q.other, w)
}

func (q *queue[W]) len() int { return len(q.urgent) + len(q.other) }

// pop removes the next waiter; ok is false when there is none.
func (q *queue[W]) pop() (w W, ok bool) {
	if len(q.urgent) > 0 {
		w, q.urgent = q.urgent[0], q.urgent[1:]
		return w, true
	}
	if len(q.other) > 0 {
		w, q.other = q.other[0], q.other[1:]
		return w, true
	}
	return w, false
}

// remove takes w out of the queue (it gave up); match tells waiters apart.
func (q *queue[W]) remove(match func(W) bool) {
	for _, part := range []*[]W{&q.urgent, &q.other} {
		for i, x := range *part {
			if match(x) {
				*part = append((*part)[:i], (*part)[i+1:]...)
				return
			}
		}
	}
}
