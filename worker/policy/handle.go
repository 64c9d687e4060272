package policy

import (
	"context"
	"time"

	"github.com/sys1hq/sys1/worker/livefile"
)

// PollInterval is how often Watch looks at the file by default: a stat per poll, so an edit
// is in force within a couple of seconds at no measurable cost.
const PollInterval = 2 * time.Second

// Handle is a policy file kept current while the process runs (see package livefile): a
// changed file is re-read, and an edit that does not parse is refused while the last good
// policy stays in force.
type Handle struct {
	file *livefile.File[*Policy]
}

// Load reads and parses the policy file at path. Any problem (a missing or unreadable file,
// every bad line) is returned as one error: a start-up error, as there is no last good policy
// yet. Whether a policy is configured at all (SYS1_POLICY_FILE set) is the caller's decision.
func Load(path string) (*Handle, error) {
	f, err := livefile.Load(path, Parse)
	if err != nil {
		return nil, err
	}
	return &Handle{file: f}, nil
}

// Current is the policy in force: one atomic load, no lock, safe from any goroutine.
func (h *Handle) Current() *Policy { return h.file.Current() }

// Path is the file's path.
func (h *Handle) Path() string { return h.file.Path() }

// Check re-reads the file if it changed. It reports whether a new policy is in force; a bad
// edit returns its error (naming the file, each bad line and field) and changes nothing.
func (h *Handle) Check() (changed bool, err error) { return h.file.Check() }

// Err is the error of the last refused edit that has not been mended since, or nil.
func (h *Handle) Err() error { return h.file.Err() }

// Watch polls the file every interval (PollInterval when interval ≤ 0) until ctx ends.
// onChange runs after a new policy is in force, onError once per distinct refused edit;
// either may be nil. Callers log both: an operator must see that an edit was refused.
func (h *Handle) Watch(ctx context.Context, interval time.Duration, onChange func(*Policy), onError func(error)) {
	if interval <= 0 {
		interval = PollInterval
	}
	h.file.Watch(ctx, interval, onChange, onError)
}
