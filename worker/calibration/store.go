package calibration

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// Store keeps the fits of a calibration bucket in memory, current with the bucket: it watches
// every key, so a fit put with `sys1 calibrate --apply` applies from the next lookup on, and
// a deleted one stops applying, without a restart. Safe for concurrent use.
type Store struct {
	log     zerolog.Logger
	bucket  string
	watcher jetstream.KeyWatcher

	mu   sync.RWMutex
	fits map[fitID]*Fit
	keys map[string]fitID // KV key → its fit, for deletes
	rev  uint64           // the last revision applied
	// changed is closed (and replaced) after each update, waking WaitRevision.
	changed chan struct{}

	// stopping is closed by Stop before it stops the watcher, so follow can tell a requested
	// end from a lost connection; done is closed when follow returns.
	stopping chan struct{}
	done     chan struct{}
	stop     sync.Once
}

type fitID struct{ model, caller, question string }

// NewStore watches kv and returns once every fit already in it is loaded (or ctx ends). A
// value that is not a valid fit, or sits under a key that does not name it, is skipped with a
// warning on log; if it replaces a good fit, the good fit stays in memory (the last good
// version, as for every file sys1 reloads) and the warning says so. ctx bounds the initial
// load only; the watch lasts until Stop (or the connection closes, which is logged).
func NewStore(ctx context.Context, kv jetstream.KeyValue, log zerolog.Logger) (*Store, error) {
	// The watch outlives ctx (nats.go stops a watcher when its context ends): ctx bounds the
	// initial load below, Stop ends the watch.
	w, err := kv.WatchAll(context.WithoutCancel(ctx))
	if err != nil {
		return nil, fmt.Errorf("watch calibration bucket %s: %w", kv.Bucket(), err)
	}
	s := &Store{
		log: log, bucket: kv.Bucket(), watcher: w,
		fits: map[fitID]*Fit{}, keys: map[string]fitID{},
		changed: make(chan struct{}), stopping: make(chan struct{}), done: make(chan struct{}),
	}
	// Initial values, up to the nil marker, are applied here so the first lookup sees them.
	for loaded := false; !loaded; {
		select {
		case <-ctx.Done():
			_ = w.Stop()
			return nil, fmt.Errorf("load calibration bucket %s: %w", s.bucket, ctx.Err())
		case e, ok := <-w.Updates():
			if !ok {
				return nil, fmt.Errorf("load calibration bucket %s: the watch ended", s.bucket)
			}
			if e == nil {
				loaded = true
				continue
			}
			s.apply(e)
		}
	}
	s.log.Info().Str("bucket", s.bucket).Int("fits", s.Len()).Msg("calibration fits loaded")
	go s.follow()
	return s, nil
}

func (s *Store) follow() {
	defer close(s.done)
	for e := range s.watcher.Updates() {
		if e != nil {
			s.apply(e)
		}
	}
	select {
	case <-s.stopping:
	default:
		// The connection closed under the watch: the fits in memory stay, but no longer follow
		// the bucket.
		s.log.Warn().Str("bucket", s.bucket).Msg("calibration watch ended; fits are no longer updated")
	}
}

func (s *Store) apply(e jetstream.KeyValueEntry) {
	key := e.Key()
	s.mu.Lock()
	defer func() {
		if e.Revision() > s.rev {
			s.rev = e.Revision()
		}
		close(s.changed)
		s.changed = make(chan struct{})
		s.mu.Unlock()
	}()
	if e.Operation() != jetstream.KeyValuePut {
		if id, ok := s.keys[key]; ok {
			delete(s.fits, id)
			delete(s.keys, key)
			s.log.Info().Str("key", key).Uint64("revision", e.Revision()).Msg("calibration fit removed")
		}
		return
	}
	f, err := Decode(key, e.Value())
	if err != nil {
		ev := s.log.Warn().Err(err).Str("bucket", s.bucket).Str("key", key).Uint64("revision", e.Revision()).Int("bytes", len(e.Value()))
		if id, ok := s.keys[key]; ok {
			ev = ev.Float64("kept_temperature", s.fits[id].Temperature)
			ev.Msg("calibration value skipped: not a valid fit; the previous fit of this key stays in use")
			return
		}
		ev.Msg("calibration value skipped: not a valid fit")
		return
	}
	id := fitID{f.Model, f.Caller, f.Question}
	s.fits[id] = f
	s.keys[key] = id
	s.log.Info().Str("key", key).Uint64("revision", e.Revision()).Float64("temperature", f.Temperature).Int("n", f.N).Msg("calibration fit loaded")
}

// Lookup returns the fit for a run's model, caller and question, if there is one. The fit is
// shared: callers must not modify it. A fit is keyed by its model, so a run of another model
// never gets it.
func (s *Store) Lookup(model, caller, question string) (*Fit, bool) {
	s.mu.RLock()
	f, ok := s.fits[fitID{model, caller, question}]
	s.mu.RUnlock()
	if !ok || f.Model != model {
		return nil, false
	}
	return f, true
}

// List returns a copy of every loaded fit, sorted by model, caller and question (for the
// capabilities endpoint).
func (s *Store) List() []Fit {
	s.mu.RLock()
	out := make([]Fit, 0, len(s.fits))
	for _, f := range s.fits {
		out = append(out, *f)
	}
	s.mu.RUnlock()
	slices.SortFunc(out, func(a, b Fit) int {
		if c := strings.Compare(a.Model, b.Model); c != 0 {
			return c
		}
		if c := strings.Compare(a.Caller, b.Caller); c != 0 {
			return c
		}
		return strings.Compare(a.Question, b.Question)
	})
	return out
}

// Len is the number of loaded fits.
func (s *Store) Len() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return len(s.fits)
}

// Revision is the last bucket revision the store has applied (a put, a delete, or a value it
// skipped).
func (s *Store) Revision() uint64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.rev
}

// WaitRevision returns once the store has applied revision rev of the bucket (as returned by
// Put), or ctx ends. Tests use it to know a fit is in effect without polling.
func (s *Store) WaitRevision(ctx context.Context, rev uint64) error {
	for {
		s.mu.RLock()
		have, changed := s.rev, s.changed
		s.mu.RUnlock()
		if have >= rev {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("calibration store at revision %d, waiting for %d: %w", have, rev, ctx.Err())
		case <-changed:
		case <-s.done:
			return fmt.Errorf("calibration store stopped at revision %d, waiting for %d", have, rev)
		}
	}
}

// Stop ends the watch; the fits stay readable. It returns once the store no longer updates.
func (s *Store) Stop() error {
	var err error
	s.stop.Do(func() {
		close(s.stopping)
		err = s.watcher.Stop()
	})
	<-s.done
	return err
}
