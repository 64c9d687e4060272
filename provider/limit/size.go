package limit

// CallSize is the Result.Size the worker should report for a System One call: questions ×
// (1 + state KiB). A model decides every question over the whole state, so the work grows
// with their product, and a question's own text costs about what a KiB of state does. It is
// a proxy, not the model's cost: the limiter only needs latency per unit of size to stay
// roughly flat when nothing queues. Images are not counted (none of the measurements had
// any). The result is at least 1.
func CallSize(questions, stateBytes int) float64 {
	return max(float64(max(questions, 1))*(1+float64(max(stateBytes, 0))/1024), 1)
}
