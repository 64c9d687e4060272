package worker

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/sys1hq/sys1/contract/wire"
	"github.com/sys1hq/sys1/worker/auth"
	"github.com/sys1hq/sys1/worker/internal/outbox"
	"github.com/sys1hq/sys1/worker/metrics"
	"github.com/sys1hq/sys1/worker/topology"
)

// Storage full is an operating state, not a wedge. Every stream and bucket has a byte limit
// (topology), and the ones whose messages must not be lost refuse new messages at it. A
// worker that meets such a refusal never retries in place: it says which stream refuses, in
// its log (once, when the stream starts refusing, and again when it takes messages again), in
// health (Full, and status degraded) and in /metrics (sys1_worker_stream_full), and it goes on
// with what it can do:
//
//   - SYS1_REVIEW full, or a caller at its SYS1_REVIEW_MAX_PER_CALLER: the run is answered,
//     its reply saying the review was not queued (queueReview).
//   - SYS1_RUNS full: the reply still goes out, but the delivery is not acknowledged until the
//     record is stored (back-pressure): it comes back with the retry delay and writes the
//     record from the run's stored outcome, never scoring it again.
//   - SYS1_LABELS full: label submissions wait, unread, until there is room.
//   - The run-id bucket full: runs cannot be claimed and are redelivered later.
//
// Each SYS1_STATUS_INTERVAL × storageEvery the fleet watcher also reads every stream's bytes
// and byte limit (sys1_worker_stream_bytes, sys1_worker_stream_max_bytes, the alerts' input),
// clears a full mark once the stream has room for its largest message again, and counts each
// caller's requests waiting on subjects other than its own (the quota backstop, see
// admitQuota).

// storageEvery is how many fleet-watcher intervals pass between two readings of the streams:
// the gauges move slowly, and a refusal marks a stream full at once anyway.
const storageEvery = 5

// StreamUsage is one stream (or bucket's stream) as the replica last read it.
type StreamUsage struct {
	Name     string `json:"name"`
	Bytes    uint64 `json:"bytes"`
	MaxBytes int64  `json:"max_bytes"`
	Messages uint64 `json:"messages"`
	// Full is set while the stream refuses new messages; Refusal says why ("stream full",
	// "server storage exhausted") and Variable which limit to raise.
	Full     bool   `json:"full,omitempty"`
	Refusal  string `json:"refusal,omitempty"`
	Variable string `json:"variable,omitempty"`
	// Error says why the stream could not be read, when it could not.
	Error string `json:"error,omitempty"`
}

type fullMark struct {
	since   time.Time
	refusal topology.Refusal
}

// storage is what the replica knows of its streams' room, and of callers over their quota.
type storage struct {
	// log says when a stream starts and stops refusing; variables name the limit to raise
	// for each stream (topology.Config.StreamVariables).
	log       zerolog.Logger
	variables map[string]string

	mu    sync.Mutex
	full  map[string]fullMark
	usage []StreamUsage
	// extras counts, per caller token, the requests waiting on its subjects other than
	// sys1.decide.<caller> (further tokens, batches), and excess how many of them are over
	// the quota and not refused yet: the quota backstop.
	extras map[string]uint64
	excess map[string]int64
	// atLimit counts, per quota kind, the callers whose subject holds its quota now: JetStream
	// refuses their next publish (sys1_worker_quota_callers_at_limit).
	atLimit map[string]int
}

// Note classifies the outcome of a store into stream (outbox.Room): a refusal for room marks the stream
// full (and is logged when it starts), a success clears the mark. It returns err, wrapped in a
// *outbox.Refused when JetStream refused for room or quota.
func (s *storage) Note(stream string, err error) error {
	if err == nil {
		s.storeOK(stream)
		return nil
	}
	refusal := topology.Refused(err)
	if refusal == topology.NotRefused {
		return err
	}
	if refusal != topology.RefusedQuota {
		s.markFull(stream, refusal, err)
	}
	return &outbox.Refused{Stream: stream, Refusal: refusal, Err: err}
}

func (s *storage) markFull(stream string, refusal topology.Refusal, err error) {
	s.mu.Lock()
	_, was := s.full[stream]
	if s.full == nil {
		s.full = map[string]fullMark{}
	}
	if !was {
		s.full[stream] = fullMark{since: time.Now(), refusal: refusal}
	}
	s.mu.Unlock()
	if !was {
		v := s.variables[stream]
		ev := s.log.Error().Err(err).Str("stream", stream).Str("refusal", refusal.String())
		if refusal == topology.RefusedStorage {
			ev.Msg("the NATS server has no storage left for " + stream + "; the worker goes on with what it can (see README, Storage budget)")
		} else {
			ev.Str("variable", v).Msg("stream " + stream + " is full and refuses new messages; raise " + v + " or free it; the worker goes on with what it can (see README, Storage budget)")
		}
	}
}

func (s *storage) storeOK(stream string) {
	s.mu.Lock()
	_, was := s.full[stream]
	delete(s.full, stream)
	s.mu.Unlock()
	if was {
		s.log.Warn().Str("stream", stream).Msg("stream " + stream + " takes messages again")
	}
}

// isFull reports whether stream refuses new messages, as far as this replica knows.
func (s *storage) isFull(stream string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.full[stream]
	return ok
}

// FullStreams lists the streams refusing new messages now, sorted.
func (w *Worker) FullStreams() []string {
	s := &w.storage
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.full))
	for name := range s.full {
		out = append(out, name)
	}
	slices.Sort(out)
	return out
}

// Streams is every stream's usage as last read, with its full mark.
func (w *Worker) Streams() []StreamUsage {
	s := &w.storage
	s.mu.Lock()
	defer s.mu.Unlock()
	out := slices.Clone(s.usage)
	for i := range out {
		if m, ok := s.full[out[i].Name]; ok {
			out[i].Full, out[i].Refusal = true, m.refusal.String()
		}
	}
	return out
}

// streamNames are the streams the fleet watcher reads: every stream and bucket of the
// topology.
func (w *Worker) streamNames() []string {
	t := w.opt.Topology
	names := []string{t.RequestsStream, t.RunsStream, t.RepliesStream, t.ReviewStream, t.LabelsStream, t.LabelSubmissionsStream,
		t.DeadLetterStream, topology.KVStream(t.RunsBucket), topology.KVStream(t.ReviewBucket), topology.KVStream(t.CalibrationBucket),
		topology.KVStream(t.CacheBucket), topology.KVStream(t.LimitsBucket), topology.KVStream(t.ReviewSessionsBucket),
		topology.KVStream(t.FleetBucket)}
	return names
}

// refreshStorage reads every stream's usage, clears full marks where there is room again and
// counts the callers' requests on further subjects.
func (w *Worker) refreshStorage(ctx context.Context) {
	vars := w.opt.Topology.StreamVariables()
	usage := make([]StreamUsage, 0, 16)
	room := map[string]bool{}
	for _, name := range w.streamNames() {
		u := StreamUsage{Name: name, Variable: vars[name]}
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		s, err := w.opt.JS.Stream(sctx, name)
		cancel()
		switch {
		case errors.Is(err, jetstream.ErrStreamNotFound):
			continue // a bucket this replica does not use (no limits file, no review page yet)
		case err != nil:
			if ctx.Err() != nil {
				return
			}
			u.Error = err.Error()
		default:
			info := s.CachedInfo()
			u.Bytes, u.MaxBytes, u.Messages = info.State.Bytes, info.Config.MaxBytes, info.State.Msgs
			largest := int64(max(info.Config.MaxMsgSize, 0))
			room[name] = u.MaxBytes <= 0 || int64(u.Bytes)+largest < u.MaxBytes
		}
		usage = append(usage, u)
	}
	extras := w.countExtras(ctx)
	atLimit := w.countAtLimit(ctx)
	s := &w.storage
	s.mu.Lock()
	s.usage, s.extras, s.atLimit = usage, extras, atLimit
	s.excess = map[string]int64{}
	for token, n := range extras {
		if over := int64(n) - int64(w.opt.Topology.RequestsPerCaller); over > 0 {
			s.excess[token] = over
		}
	}
	var cleared []string
	for name, m := range s.full {
		// A stream at its own limit is clear once it has room for its largest message; a
		// server out of storage, once a whole reading passed without a refusal.
		if (m.refusal == topology.RefusedFull && room[name]) ||
			(m.refusal == topology.RefusedStorage && time.Since(m.since) > storageEvery*w.cfg.StatusInterval) {
			delete(s.full, name)
			cleared = append(cleared, name)
		}
	}
	s.mu.Unlock()
	for _, name := range cleared {
		w.log.Warn().Str("stream", name).Msg("stream " + name + " has room again")
	}
}

// countExtras counts each caller's requests waiting on subjects other than its own
// sys1.decide.<caller>: one stream info each for sys1.decide.*.> and sys1.batch.>, whose
// subjects are few (a subject per batch in flight) unless a caller spreads requests over many,
// which is what the backstop is for. A stream that cannot be read leaves the backstop off
// until the next reading.
func (w *Worker) countExtras(ctx context.Context) map[string]uint64 {
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	s, err := w.opt.JS.Stream(sctx, w.opt.Topology.RequestsStream)
	if err != nil {
		return nil
	}
	out := map[string]uint64{}
	for _, filter := range []string{wire.DecidePrefix + "*.>", wire.BatchSubjects} {
		info, err := s.Info(sctx, jetstream.WithSubjectFilter(filter))
		if err != nil {
			return nil
		}
		for subject, n := range info.State.Subjects {
			if token, err := auth.CallerFromSubject(subject); err == nil {
				out[token] += n
			}
		}
	}
	return out
}

// countAtLimit counts, for each quota, the callers whose own subject holds as many messages as
// the quota allows: sys1.decide.<caller> (requests), sys1.review.<caller> (review items),
// sys1.labels.<caller> (label submissions). JetStream refuses those callers at publish, which
// the worker cannot see; this is how an operator does.
func (w *Worker) countAtLimit(ctx context.Context) map[string]int {
	t := w.opt.Topology
	out := map[string]int{metrics.QuotaRequests: 0, metrics.QuotaReview: 0, metrics.QuotaLabels: 0}
	for _, q := range []struct {
		kind, stream, filter string
		quota                int
	}{
		{metrics.QuotaRequests, t.RequestsStream, wire.DecidePrefix + "*", t.RequestsPerCaller},
		{metrics.QuotaReview, t.ReviewStream, wire.ReviewPrefix + "*", t.ReviewPerCaller},
		{metrics.QuotaLabels, t.LabelSubmissionsStream, wire.LabelsSubmitted, t.LabelsPerCaller},
	} {
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		s, err := w.opt.JS.Stream(sctx, q.stream)
		if err == nil {
			var info *jetstream.StreamInfo
			if info, err = s.Info(sctx, jetstream.WithSubjectFilter(q.filter)); err == nil {
				for _, n := range info.State.Subjects {
					if n >= uint64(q.quota) {
						out[q.kind]++
					}
				}
			}
		}
		cancel()
	}
	return out
}

// QuotaAtLimit is, per quota kind, how many callers are at their quota now (last reading).
func (w *Worker) QuotaAtLimit() map[string]int {
	s := &w.storage
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]int, len(s.atLimit))
	for k, v := range s.atLimit {
		out[k] = v
	}
	return out
}

// overQuota reports whether a request of the caller with subject token, on one of its further
// subjects, is to be refused: the caller held more there than its quota at the last reading,
// and fewer of the excess have been refused since than it held over. It also returns what the
// caller held.
func (s *storage) overQuota(token string) (uint64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.excess[token] <= 0 {
		return s.extras[token], false
	}
	s.excess[token]--
	return s.extras[token], true
}

// primarySubject reports whether subject is the caller's own sys1.decide.<caller>, the one
// JetStream's per-subject limit bounds exactly.
func primarySubject(subject string) bool {
	rest, ok := strings.CutPrefix(subject, wire.DecidePrefix)
	return ok && rest != "" && !strings.Contains(rest, ".")
}
