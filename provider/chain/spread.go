package chain

import (
	"sync"
	"sync/atomic"
)

// spread counts the distinct models whose calls failed on one provider since its last good
// answer. One model failing is that model's problem (its route opens); several failing with
// no success in between is the provider's (a broken GPU, a proxy answering 500 to
// everything), and opens the provider's circuit.
type spread struct {
	threshold int

	n      atomic.Int32 // len(models), read without the lock on every success
	mu     sync.Mutex
	models map[string]struct{}
}

func newSpread(threshold int) *spread {
	return &spread{threshold: threshold, models: make(map[string]struct{}, threshold)}
}

// fail notes a failure of model and reports whether the distinct models failing reached the
// threshold; when they do the count starts again (the provider's circuit takes over).
func (s *spread) fail(model string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.models[model] = struct{}{}
	if len(s.models) < s.threshold {
		s.n.Store(int32(len(s.models)))
		return false
	}
	clear(s.models)
	s.n.Store(0)
	return true
}

// answered notes a good answer: the failures so far were not the provider's.
func (s *spread) answered() {
	if s.n.Load() == 0 {
		return // the common case costs no lock
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.models)
	s.n.Store(0)
}
