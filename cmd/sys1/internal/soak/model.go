package soak

import (
	"encoding/json"
	"strings"
	"sync"
	"time"

	"github.com/sys1hq/sys1/provider/ollamatest"
)

// model is the fleet's model: one fake Ollama per worker slot (so each call is known to come
// from that slot's worker), all made slow or failing together, every call logged.
type model struct {
	fakes []*ollamatest.Server
	base  time.Duration

	mu    sync.Mutex
	calls []Call
}

// stateTag is how a request's state names what its calls count under: "soak <key> …" (a key
// has no spaces).
const stateTag = "soak "

// keyOf is the key a state names ("" when it names none).
func keyOf(state string) string {
	rest, ok := strings.CutPrefix(state, stateTag)
	if !ok {
		return ""
	}
	key, _, _ := strings.Cut(rest, " ")
	return key
}

func newModel(slots int, latency time.Duration) *model {
	m := &model{base: latency}
	for slot := 1; slot <= slots; slot++ {
		m.fakes = append(m.fakes, ollamatest.NewServer(ollamatest.WithLatency(latency), ollamatest.WithRecordLimit(0),
			ollamatest.WithCallLog(func(c ollamatest.Call) { m.log(slot, c) })))
	}
	return m
}

func (m *model) log(slot int, c ollamatest.Call) {
	var body struct {
		State json.RawMessage `json:"state"`
	}
	key := ""
	if json.Unmarshal(c.Body, &body) == nil {
		var s string
		if json.Unmarshal(body.State, &s) == nil {
			key = keyOf(s)
		}
	}
	m.mu.Lock()
	m.calls = append(m.calls, Call{Key: key, Slot: slot, Started: c.Started, Ended: c.Ended, Answered: c.Answered, Fault: c.Fault})
	m.mu.Unlock()
}

// url is worker slot's fake (slots count from 1).
func (m *model) url(slot int) string { return m.fakes[slot-1].URL() }

// slow adds d to every call; heal takes it away.
func (m *model) slow(d time.Duration) {
	for _, f := range m.fakes {
		f.SetLatency(m.base + d)
	}
}

// fail makes every call fail as how says.
func (m *model) fail(how string) {
	var f ollamatest.Fault
	switch how {
	case FailUnavailable:
		f = ollamatest.Busy(503, "1")
	case FailError:
		f = ollamatest.Status(500)
	case FailDrop:
		f = ollamatest.Drop()
	default:
		f = ollamatest.Hang()
	}
	for _, fake := range m.fakes {
		fake.FailAlways(f)
	}
}

// heal ends every fault.
func (m *model) heal() {
	for _, f := range m.fakes {
		f.Heal()
		f.SetLatency(m.base)
	}
}

// snapshot is every call so far.
func (m *model) snapshot() []Call {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]Call(nil), m.calls...)
}

// answered counts the calls answered so far.
func (m *model) answered() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, c := range m.calls {
		if c.Answered {
			n++
		}
	}
	return n
}

func (m *model) close() {
	for _, f := range m.fakes {
		f.Close()
	}
}
