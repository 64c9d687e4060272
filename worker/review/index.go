package review

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/worker/topology"
)

// The index is what a replica knows about the review queue, in memory: the metadata of every
// item on SYS1_REVIEW (never its state, instructions or options: an item page fetches the full
// item by its stream sequence) and who labelled what, from the review bucket.
//
// Items arrive through an ordered consumer: an ephemeral, flow-controlled consumer that
// replays the stream from its start, in order, and that JetStream forgets when the replica
// goes. It fits: every replica needs every item (a durable consumer shared by replicas would
// split them between replicas), nothing is acknowledged (labels live in the bucket), and a
// replica that restarts simply replays. Labels arrive through a watch of the bucket, which
// delivers every current entry and then each change, so a label given on one replica leaves
// every replica's queue at once.

// itemMeta is the part of a review item the queue shows. Its strings are bounded by
// maxMetaField, so the index's size depends on the number of items, not on their content.
type itemMeta struct {
	ID, RunID, Caller, Model, Question string
	// Token is the token of the item's subject, sys1.review.<token>: its label goes to
	// sys1.labels.<token>.accepted (topology.ReviewLabelSubject).
	Token         string
	Type          contract.QuestionType
	Confidence    float64
	HasConfidence bool
	Audit         bool
	Reason        string
	CreatedAt     time.Time
	Seq           uint64
}

// labelMeta is one entry of the review bucket: who labelled an item, when, and whether the
// label is on SYS1_LABELS yet.
type labelMeta struct {
	Reviewer   string
	LabelledAt time.Time
	Value      string // the label value as JSON, for "already labelled … as …"
	Published  bool
	Revision   uint64
	Created    time.Time // when the entry was written (the KV's own clock)
}

const maxMetaField = 256

type index struct {
	log zerolog.Logger

	mu       sync.RWMutex
	items    map[string]*itemMeta
	labelled map[string]labelMeta

	labelsLoaded     chan struct{} // closed once the bucket's entries at start are read
	labelsLoadedOnce sync.Once

	malformed    atomic.Int64
	itemsReady   atomic.Bool
	labelsReady  atomic.Bool
	streamFirst  atomic.Uint64 // items below this sequence have aged out of the stream
	lastItemSeen atomic.Uint64
}

func newIndex(log zerolog.Logger) *index {
	return &index{log: log, items: map[string]*itemMeta{}, labelled: map[string]labelMeta{}, labelsLoaded: make(chan struct{})}
}

// ready reports whether the index has read the whole stream and bucket as they were at start.
func (x *index) ready() bool { return x.itemsReady.Load() && x.labelsReady.Load() }

// add records an item (the first copy of an id wins: a republished item keeps its place).
func (x *index) add(m *itemMeta) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if _, ok := x.items[m.ID]; !ok {
		x.items[m.ID] = m
	}
}

// forget drops an item that is no longer on the stream (aged out or deleted).
func (x *index) forget(id string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	delete(x.items, id)
}

func (x *index) reset() {
	x.mu.Lock()
	defer x.mu.Unlock()
	clear(x.items)
}

func (x *index) setLabel(id string, l labelMeta) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.labelled[id] = l
}

func (x *index) unsetLabel(id string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	delete(x.labelled, id)
}

// item returns an item's metadata and its label, if any.
func (x *index) item(id string) (itemMeta, *labelMeta, bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	m, ok := x.items[id]
	if !ok {
		return itemMeta{}, nil, false
	}
	if l, done := x.labelled[id]; done {
		return *m, &l, true
	}
	return *m, nil, true
}

func (x *index) label(id string) (labelMeta, bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	l, ok := x.labelled[id]
	return l, ok
}

// Sort orders of the queue.
const (
	sortOldest         = "oldest"
	sortConfidenceLow  = "confidence"
	sortConfidenceHigh = "-confidence"
)

// query selects and orders pending items.
type query struct {
	Caller, Question, Sort string
}

func (q query) normalised() query {
	switch q.Sort {
	case sortConfidenceLow, sortConfidenceHigh:
	default:
		q.Sort = sortOldest
	}
	return q
}

// compare orders two items as the queue shows them (q normalised): by age, oldest first, or
// by confidence with age breaking ties. Items without a confidence sort after those with one,
// either way.
func (q query) compare(a, b itemMeta) int {
	if q.Sort != sortOldest {
		if a.HasConfidence != b.HasConfidence {
			if a.HasConfidence {
				return -1
			}
			return 1
		}
		c := cmp.Compare(a.Confidence, b.Confidence)
		if q.Sort == sortConfidenceHigh {
			c = -c
		}
		if c != 0 {
			return c
		}
	}
	return cmp.Or(a.CreatedAt.Compare(b.CreatedAt), cmp.Compare(a.Seq, b.Seq))
}

// pending returns the unlabelled items matching q, in q's order.
func (x *index) pending(q query) []itemMeta {
	q = q.normalised()
	x.mu.RLock()
	out := make([]itemMeta, 0, len(x.items))
	for id, m := range x.items {
		if _, done := x.labelled[id]; done {
			continue
		}
		if q.Caller != "" && m.Caller != q.Caller || q.Question != "" && m.Question != q.Question {
			continue
		}
		out = append(out, *m)
	}
	x.mu.RUnlock()
	slices.SortFunc(out, q.compare)
	return out
}

// facet is one value of a filter with its pending count.
type facet struct {
	Value string
	Count int
}

// counts summarises the queue for the header and the filters.
type counts struct {
	Pending, Done, DoneByMe int
	Callers, Questions      []facet
	Malformed               int64
}

func (x *index) counts(me string) counts {
	x.mu.RLock()
	defer x.mu.RUnlock()
	var c counts
	callers, questions := map[string]int{}, map[string]int{}
	for id, m := range x.items {
		if l, done := x.labelled[id]; done {
			c.Done++
			if l.Reviewer == me {
				c.DoneByMe++
			}
			continue
		}
		c.Pending++
		callers[m.Caller]++
		questions[m.Question]++
	}
	c.Callers, c.Questions = facets(callers), facets(questions)
	c.Malformed = x.malformed.Load()
	return c
}

func facets(m map[string]int) []facet {
	out := make([]facet, 0, len(m))
	for v, n := range m {
		out = append(out, facet{v, n})
	}
	slices.SortFunc(out, func(a, b facet) int { return strings.Compare(a.Value, b.Value) })
	return out
}

// publishing lists the labels whose entry says they are not on SYS1_LABELS yet.
func (x *index) publishing() map[string]labelMeta {
	x.mu.RLock()
	defer x.mu.RUnlock()
	out := map[string]labelMeta{}
	for id, l := range x.labelled {
		if !l.Published {
			out[id] = l
		}
	}
	return out
}

// metaOf checks a decoded item against the subject it came on and keeps its metadata.
func metaOf(it *contract.ReviewItem, subject string, seq uint64) (*itemMeta, error) {
	token, err := topology.ReviewToken(subject)
	if err != nil {
		return nil, err
	}
	if err := checkItemSubject(it, subject); err != nil {
		return nil, err
	}
	if want := contract.ReviewItemID(it.RunID, it.Question); it.ID != want {
		return nil, fmt.Errorf("item id %q is not the id of its run and question (%s)", it.ID, want)
	}
	for _, f := range []struct{ name, v string }{{"run_id", it.RunID}, {"question", it.Question}, {"model", it.Model}, {"caller", it.Caller}, {"subject", it.Subject}} {
		if len(f.v) > maxMetaField {
			return nil, fmt.Errorf("%s is %d bytes long (at most %d)", f.name, len(f.v), maxMetaField)
		}
	}
	if it.RunID == "" || it.Question == "" {
		return nil, errors.New("run_id and question must not be empty")
	}
	if err := checkShape(it); err != nil {
		return nil, err
	}
	m := &itemMeta{ID: it.ID, RunID: it.RunID, Caller: it.Caller, Token: token, Model: it.Model, Question: it.Question,
		Type: it.Type, Audit: it.Audit || it.Verdict.Audit, Reason: clip(it.Verdict.Reason, maxMetaField),
		CreatedAt: it.CreatedAt, Seq: seq}
	if it.Confidence != nil {
		m.Confidence, m.HasConfidence = *it.Confidence, true
	}
	return m, nil
}

// checkItemSubject applies the rule the worker publishes items by, topology.ReviewSubject: an
// item of a request published on sys1.decide.<token>… (or sys1.batch.<token>.…) belongs on
// sys1.review.<token>, whoever its verified caller is (in mode jwt a token's sub, which need
// not be a subject token). Items written before they named their request's subject belong on
// sys1.review.<caller>, their caller being that token then, except mode none's: those all said
// caller "anonymous", whatever their subject.
func checkItemSubject(it *contract.ReviewItem, subject string) error {
	if it.Subject == "" {
		if subject == topology.ReviewPrefix+it.Caller || it.Caller == contract.LegacyAnonymousCaller {
			return nil
		}
		return fmt.Errorf("item claims caller %q but was published on %s", it.Caller, subject)
	}
	want, err := topology.ReviewSubject(it.Subject)
	if err != nil {
		return fmt.Errorf("item names request subject %q: %w", clip(it.Subject, 64), err)
	}
	if want != subject {
		return fmt.Errorf("item of a request on %q belongs on %s, not %s", clip(it.Subject, 64), want, subject)
	}
	return nil
}

// checkShape refuses an item a reviewer could not label: a choice without options, a score
// without levels, more options or levels than a question may have.
func checkShape(it *contract.ReviewItem) error {
	switch it.Type {
	case contract.TypeChoice:
		if len(it.Options) < 2 || len(it.Options) > 26 {
			return fmt.Errorf("a choice item needs 2–26 options, got %d", len(it.Options))
		}
	case contract.TypeScore:
		if len(it.Levels) < 2 || len(it.Levels) > 26 {
			return fmt.Errorf("a score item needs 2–26 levels, got %d", len(it.Levels))
		}
	case contract.TypeNoul:
		for _, o := range it.Options {
			if o.Key != "true" && o.Key != "false" {
				return fmt.Errorf("a noul item's sides are \"true\" and \"false\", got %q", o.Key)
			}
		}
	}
	return nil
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

func utf8RuneStart(b byte) bool { return b&0xC0 != 0x80 }

// followItems keeps the index fed from the review stream until ctx ends. A consumer that
// fails (the stream deleted or recreated, a long NATS outage) is rebuilt from the stream's
// start after a pause, with the index emptied first: sequences of a recreated stream mean
// other messages. A reader that stalls (below) resumes after the last item it read.
func (x *index) followItems(ctx context.Context, js jetstream.JetStream, stream string, maxBytes int, stallCheck time.Duration) {
	var from uint64 // 0: the stream's start
	for ctx.Err() == nil {
		err := x.consumeItems(ctx, js, stream, maxBytes, from, stallCheck)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, errStalled) {
			from = x.lastItemSeen.Load() + 1
			x.log.Warn().Err(err).Str("stream", stream).Uint64("from_seq", from).Msg("review items: the reader stalled; reading on from the last item seen")
			continue
		}
		from = 0
		x.log.Warn().Err(err).Str("stream", stream).Msg("review items: reading the stream failed; starting over")
		x.itemsReady.Store(false)
		select {
		case <-ctx.Done():
			return
		case <-time.After(topology.RecreateSettle):
		}
		x.reset()
		x.lastItemSeen.Store(0)
	}
}

// errStalled ends a reader that holds back an item the stream has. nats.go's ordered
// consumer (v1.55) can stop delivering for good when the NATS server its connection was on
// dies (SIGKILL, no goodbye): it neither resets nor reports an error. Killing the page's
// server in a 3-node cluster eight times left the page blind to new items (stored, not shown)
// for over a minute in two of them; with this check, never for more than 10 s.
var errStalled = errors.New("no item read for a whole check interval while the stream holds a newer one")

func (x *index) consumeItems(ctx context.Context, js jetstream.JetStream, stream string, maxBytes int, from uint64, stallCheck time.Duration) error {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return fmt.Errorf("look up stream %s: %w", stream, err)
	}
	if s.CachedInfo().State.Msgs == 0 {
		x.itemsReady.Store(true)
	}
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{topology.ReviewSubjects}}
	if from > 0 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, from
	}
	cons, err := s.OrderedConsumer(ctx, cfg)
	if err != nil {
		return fmt.Errorf("ordered consumer on %s: %w", stream, err)
	}
	// PullMaxBytes bounds what the client buffers: items can carry megabytes of state, and the
	// default of 500 buffered messages could hold gigabytes.
	it, err := cons.Messages(jetstream.PullMaxBytes(maxBytes))
	if err != nil {
		return fmt.Errorf("read %s: %w", stream, err)
	}
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	defer it.Stop()
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var stalled atomic.Bool
	go func() {
		if x.watchStall(wctx, s, stallCheck) {
			stalled.Store(true)
			it.Stop()
		}
	}()
	for {
		msg, err := it.Next()
		if err != nil {
			if stalled.Load() {
				return errStalled
			}
			return err
		}
		x.ingest(msg)
	}
}

// watchStall reports true once the reader has read nothing for a whole interval while the
// stream holds an item after the last one read (and false when ctx ends). The check is one
// stream info per interval; only a suspected stall fetches the next item to confirm it.
func (x *index) watchStall(ctx context.Context, s jetstream.Stream, every time.Duration) bool {
	t := time.NewTicker(every)
	defer t.Stop()
	last := x.lastItemSeen.Load()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
		seen := x.lastItemSeen.Load()
		if seen != last {
			last = seen
			continue
		}
		if x.holdsAfter(ctx, s, seen) {
			return true
		}
	}
}

// holdsAfter reports whether the stream has a review item after sequence seq.
func (x *index) holdsAfter(ctx context.Context, s jetstream.Stream, seq uint64) bool {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	info, err := s.Info(ctx)
	if err != nil || info.State.Msgs == 0 || info.State.LastSeq <= seq {
		return false // nothing newer, or NATS cannot say now: look again next interval
	}
	// The last message may have been deleted by hand: ask for the next item itself.
	m, err := s.GetMsg(ctx, seq+1, jetstream.WithGetMsgSubject(topology.ReviewSubjects))
	return err == nil && m.Sequence > seq
}

// ingest indexes one stream message; a malformed one is counted and logged (without its
// content), never fatal.
func (x *index) ingest(msg jetstream.Msg) {
	md, err := msg.Metadata()
	if err != nil {
		x.malformed.Add(1)
		x.log.Warn().Err(err).Str("subject", msg.Subject()).Msg("review item without stream metadata; skipped")
		return
	}
	seq := md.Sequence.Stream
	x.lastItemSeen.Store(seq)
	defer func() {
		if md.NumPending == 0 {
			x.itemsReady.Store(true)
		}
	}()
	it, err := contract.DecodeReviewItem(msg.Data())
	if err == nil {
		var m *itemMeta
		if m, err = metaOf(it, msg.Subject(), seq); err == nil {
			x.add(m)
			return
		}
	}
	x.malformed.Add(1)
	x.log.Warn().Err(err).Uint64("stream_seq", seq).Str("subject", msg.Subject()).Int("bytes", len(msg.Data())).
		Msg("malformed review item skipped")
}

// followLabels keeps the index's labels current from the review bucket until ctx ends.
func (x *index) followLabels(ctx context.Context, kv jetstream.KeyValue) {
	for ctx.Err() == nil {
		err := x.watchLabels(ctx, kv)
		if ctx.Err() != nil {
			return
		}
		x.log.Warn().Err(err).Str("bucket", kv.Bucket()).Msg("review labels: watching the bucket failed; starting over")
		select {
		case <-ctx.Done():
			return
		case <-time.After(topology.RecreateSettle):
		}
	}
}

func (x *index) watchLabels(ctx context.Context, kv jetstream.KeyValue) error {
	w, err := kv.WatchAll(ctx)
	if err != nil {
		return fmt.Errorf("watch bucket %s: %w", kv.Bucket(), err)
	}
	defer func() { _ = w.Stop() }()
	seen := map[string]bool{} // keys present at start, to drop labels deleted while we were away
	initial := true
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-w.Updates():
			if !ok {
				return errors.New("the watch ended")
			}
			if e == nil { // every current entry has been delivered
				if initial {
					x.mu.Lock()
					for id := range x.labelled {
						if !seen[id] {
							delete(x.labelled, id)
						}
					}
					x.mu.Unlock()
					initial, seen = false, nil
					x.labelsReady.Store(true)
					x.labelsLoadedOnce.Do(func() { close(x.labelsLoaded) })
				}
				continue
			}
			if e.Operation() != jetstream.KeyValuePut {
				x.unsetLabel(e.Key()) // deleted: the item is pending again
				continue
			}
			c, err := decodeClaim(e.Value())
			if err != nil {
				x.log.Warn().Err(err).Str("key", e.Key()).Msg("malformed review bucket entry: its item counts as labelled by nobody known")
				c = claim{Label: contract.Label{Reviewer: "(unknown)"}, Status: claimPublished}
			}
			if initial {
				seen[e.Key()] = true
			}
			x.setLabel(e.Key(), labelMeta{Reviewer: c.Label.Reviewer, LabelledAt: c.Label.LabelledAt,
				Value: clip(string(c.Label.Value), maxMetaField), Published: c.Status == claimPublished,
				Revision: e.Revision(), Created: e.Created()})
		}
	}
}

// pruneAged drops items that aged out of the stream (limits retention deletes them without a
// message) every interval until ctx ends.
func (x *index) pruneAged(ctx context.Context, js jetstream.JetStream, stream string, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s, err := js.Stream(ctx, stream)
		if err != nil {
			continue
		}
		first := s.CachedInfo().State.FirstSeq
		x.streamFirst.Store(first)
		x.mu.Lock()
		for id, m := range x.items {
			if m.Seq < first {
				delete(x.items, id)
			}
		}
		x.mu.Unlock()
	}
}

// claim is the review bucket's entry for a labelled item: the label itself (everything
// needed to publish it again) and whether it is on SYS1_LABELS yet.
type claim struct {
	Status string         `json:"status"` // claimPublishing or claimPublished
	Label  contract.Label `json:"label"`
	// Subject is where the label goes (topology.ReviewLabelSubject of the item's subject);
	// empty in entries written before it was kept (see labelSubject).
	Subject string `json:"subject,omitempty"`
	// PublishedAt is when the label's publish was acknowledged.
	PublishedAt *time.Time `json:"published_at,omitempty"`
}

// labelSubject is where the claimed label is published: its stored subject, or, in an entry
// written before subjects were kept, sys1.labels.<caller>.accepted, as then.
func (c claim) labelSubject() string {
	if c.Subject != "" {
		return c.Subject
	}
	return topology.LabelsPrefix + c.Label.Caller + "." + topology.LabelAcceptedToken
}

const (
	claimPublishing = "publishing"
	claimPublished  = "published"
)

func decodeClaim(b []byte) (claim, error) {
	var c claim
	if err := json.Unmarshal(b, &c); err != nil {
		return claim{}, err
	}
	if c.Status != claimPublishing && c.Status != claimPublished {
		return claim{}, fmt.Errorf("status %q is neither %q nor %q", c.Status, claimPublishing, claimPublished)
	}
	return c, nil
}
