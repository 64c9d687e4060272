package limit

// Waiting is how many Acquire calls wait on a, for tests that order waiters.
func Waiting(a *Adaptive) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.waiters.len()
}
