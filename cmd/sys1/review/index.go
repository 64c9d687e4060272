package review

import (
	"cmp"
	"container/heap"
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
	"github.com/sys1hq/sys1/contract/wire"
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

// itemMeta is the part of a review item the queue shows. Its strings are bounded (run id,
// caller and model by maxMetaField, the question's name by maxQuestionKept, the reason by
// maxMetaField), so the index's size depends on the number of items, not on their content;
// repeated strings (callers, models, reasons, question names) are stored once.
type itemMeta struct {
	ID, RunID, Caller, Model, Question string
	// QuestionClipped: the question's name is longer than the index keeps (Question ends
	// in "…"); the item page shows it whole.
	QuestionClipped bool
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
	// Legacy: the item is a message of its own, as versions before contract.ReviewRun wrote
	// them (state copied per question); still shown and labelled like any other.
	Legacy bool
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

const (
	maxMetaField = 256
	// maxQuestionKept is how much of a question's name the index keeps: enough to tell names
	// apart and show them whole on hover; the contract allows names of up to 64 KiB.
	maxQuestionKept = 1024
	// maxInterned bounds the table of shared strings: past it, new strings are kept as they
	// are (a hostile producer's unique names cannot grow it without bound).
	maxInterned = 1 << 18
)

type index struct {
	log zerolog.Logger

	mu       sync.RWMutex
	items    map[string]*itemMeta
	labelled map[string]labelMeta
	// Counts kept as items and labels come and go, so a page never walks the whole queue to
	// say how long it is: pending items per caller and per question, done items per reviewer.
	pendingN, doneN int
	byCaller        map[string]int
	byQuestion      map[string]int
	doneBy          map[string]int
	interned        map[string]string
	// bySeq lists the items of each review message: a message whose items are all labelled
	// (and the labels published) leaves the stream (labelledMessages).
	bySeq map[uint64][]string

	labelsLoaded     chan struct{} // closed once the bucket's entries at start are read
	labelsLoadedOnce sync.Once

	malformed    atomic.Int64
	itemsReady   atomic.Bool
	labelsReady  atomic.Bool
	streamFirst  atomic.Uint64 // items below this sequence have aged out of the stream
	lastItemSeen atomic.Uint64
	sweeps       atomic.Int64 // pruneAged's passes, for tests that wait for one
}

func newIndex(log zerolog.Logger) *index {
	return &index{log: log, items: map[string]*itemMeta{}, labelled: map[string]labelMeta{}, labelsLoaded: make(chan struct{}),
		byCaller: map[string]int{}, byQuestion: map[string]int{}, doneBy: map[string]int{}, interned: map[string]string{},
		bySeq: map[uint64][]string{}}
}

// ready reports whether the index has read the whole stream and bucket as they were at start.
func (x *index) ready() bool { return x.itemsReady.Load() && x.labelsReady.Load() }

// intern returns the shared copy of s (x.mu held).
func (x *index) intern(s string) string {
	if v, ok := x.interned[s]; ok {
		return v
	}
	if len(x.interned) < maxInterned {
		x.interned[s] = s
	}
	return s
}

// count moves an item into (delta 1) or out of (delta -1) the counts, as pending or as done by
// the reviewer of l (x.mu held).
func (x *index) count(m *itemMeta, l *labelMeta, delta int) {
	if l != nil {
		x.doneN += delta
		bump(x.doneBy, l.Reviewer, delta)
		return
	}
	x.pendingN += delta
	bump(x.byCaller, m.Caller, delta)
	bump(x.byQuestion, m.Question, delta)
}

func bump(m map[string]int, k string, delta int) {
	if n := m[k] + delta; n > 0 {
		m[k] = n
	} else {
		delete(m, k)
	}
}

// labelOf is the item's label, if any (x.mu held).
func (x *index) labelOf(id string) *labelMeta {
	if l, ok := x.labelled[id]; ok {
		return &l
	}
	return nil
}

// add records an item (the first copy of an id wins: a republished item keeps its place).
func (x *index) add(m *itemMeta) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if _, ok := x.items[m.ID]; ok {
		return
	}
	m.Caller, m.Model, m.Question, m.Reason = x.intern(m.Caller), x.intern(m.Model), x.intern(m.Question), x.intern(m.Reason)
	x.items[m.ID] = m
	x.bySeq[m.Seq] = append(x.bySeq[m.Seq], m.ID)
	x.count(m, x.labelOf(m.ID), 1)
}

// forget drops an item that is no longer on the stream (aged out or deleted).
func (x *index) forget(id string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.forgetLocked(id)
}

func (x *index) forgetLocked(id string) {
	m, ok := x.items[id]
	if !ok {
		return
	}
	x.count(m, x.labelOf(id), -1)
	delete(x.items, id)
	ids := slices.DeleteFunc(x.bySeq[m.Seq], func(v string) bool { return v == id })
	if len(ids) == 0 {
		delete(x.bySeq, m.Seq)
	} else {
		x.bySeq[m.Seq] = ids
	}
}

func (x *index) reset() {
	x.mu.Lock()
	defer x.mu.Unlock()
	clear(x.items)
	x.pendingN, x.doneN = 0, 0
	clear(x.byCaller)
	clear(x.byQuestion)
	clear(x.doneBy)
	clear(x.interned)
	clear(x.bySeq)
}

func (x *index) setLabel(id string, l labelMeta) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if m, ok := x.items[id]; ok {
		x.count(m, x.labelOf(id), -1)
		x.count(m, &l, 1)
	}
	x.labelled[id] = l
}

func (x *index) unsetLabel(id string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.unsetLabelLocked(id)
}

func (x *index) unsetLabelLocked(id string) {
	if m, ok := x.items[id]; ok {
		x.count(m, x.labelOf(id), -1)
		x.count(m, nil, 1)
	}
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

// query selects and orders pending items: an exact caller, an exact question (as the index
// keeps it), and Search, a piece of the caller's or the question's name, any case.
type query struct {
	Caller, Question, Search, Sort string
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
func (q query) compare(a, b *itemMeta) int {
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
	// Not cmp.Or: it would compute every tie-breaker, ids included, for every comparison.
	if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
		return c
	}
	if c := cmp.Compare(a.Seq, b.Seq); c != 0 {
		return c
	}
	return strings.Compare(a.ID, b.ID) // items of one run's message share its sequence
}

// matcher is q's filter, prepared once per page (x.mu held): a search is matched against the
// distinct pending callers and question names once, not against every item.
type matcher struct {
	q              query
	search         bool
	names, callers map[string]bool // the pending question names and callers the search finds
}

func (x *index) matcher(q query) matcher {
	f := matcher{q: q}
	needle := strings.ToLower(q.Search)
	if needle == "" {
		return f
	}
	f.search, f.names, f.callers = true, map[string]bool{}, map[string]bool{}
	for name := range x.byQuestion {
		if containsFold(name, needle) {
			f.names[name] = true
		}
	}
	for caller := range x.byCaller {
		if containsFold(caller, needle) {
			f.callers[caller] = true
		}
	}
	return f
}

func (f matcher) match(m *itemMeta) bool {
	if f.q.Caller != "" && m.Caller != f.q.Caller || f.q.Question != "" && m.Question != f.q.Question {
		return false
	}
	return !f.search || f.names[m.Question] || f.callers[m.Caller]
}

// containsFold reports whether s contains the lower-case needle, ignoring case. Names are
// mostly ASCII: there it looks for the needle's first byte (either case) with IndexByte, which
// is fast, and compares from there, never allocating; other names are lowered first.
func containsFold(s, needle string) bool {
	if needle == "" {
		return true
	}
	if len(needle) > len(s) {
		return false
	}
	for i := 0; i < len(needle); i++ {
		if needle[i] >= 0x80 {
			return strings.Contains(strings.ToLower(s), needle)
		}
	}
	first, other := needle[0], needle[0]
	if first >= 'a' && first <= 'z' {
		other = first - ('a' - 'A')
	}
	for i := 0; i+len(needle) <= len(s); {
		j := strings.IndexByte(s[i:len(s)-len(needle)+1], first)
		if other != first {
			if k := strings.IndexByte(s[i:len(s)-len(needle)+1], other); k >= 0 && (j < 0 || k < j) {
				j = k
			}
		}
		if j < 0 {
			break
		}
		i += j
		if equalFoldASCII(s[i:i+len(needle)], needle) {
			return true
		}
		i++
	}
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return strings.Contains(strings.ToLower(s), needle) // the name is not ASCII
		}
	}
	return false
}

// equalFoldASCII reports whether s equals the lower-case needle, ASCII letters in any case.
func equalFoldASCII(s, needle string) bool {
	for j := 0; j < len(needle); j++ {
		c := s[j]
		if c >= 'A' && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != needle[j] {
			return false
		}
	}
	return true
}

// page returns the pending items matching q from offset on (at most limit of them), in q's
// order, and how many match in all. It keeps only offset+limit items while it walks the
// queue, so the first pages of a queue of 200,000 cost a walk, not a sort.
func (x *index) page(q query, offset, limit int) ([]itemMeta, int) {
	q = q.normalised()
	keep := offset + limit
	h := &metaHeap{q: q}
	total := 0
	x.mu.RLock()
	f := x.matcher(q)
	for id, m := range x.items {
		if _, done := x.labelled[id]; done || !f.match(m) {
			continue
		}
		total++
		if len(h.items) < keep {
			heap.Push(h, m)
		} else if keep > 0 && q.compare(m, h.items[0]) < 0 {
			h.items[0] = m
			heap.Fix(h, 0)
		}
	}
	x.mu.RUnlock()
	sorted := h.items
	slices.SortFunc(sorted, q.compare)
	if offset >= len(sorted) {
		return nil, total
	}
	out := make([]itemMeta, 0, len(sorted)-offset)
	for _, m := range sorted[offset:] {
		out = append(out, *m)
	}
	return out, total
}

// metaHeap is a max-heap in q's order: its root is the last of the items kept.
type metaHeap struct {
	q     query
	items []*itemMeta
}

func (h *metaHeap) Len() int           { return len(h.items) }
func (h *metaHeap) Less(i, j int) bool { return h.q.compare(h.items[i], h.items[j]) > 0 }
func (h *metaHeap) Swap(i, j int)      { h.items[i], h.items[j] = h.items[j], h.items[i] }
func (h *metaHeap) Push(v any)         { h.items = append(h.items, v.(*itemMeta)) }
func (h *metaHeap) Pop() any {
	last := h.items[len(h.items)-1]
	h.items = h.items[:len(h.items)-1]
	return last
}

// next returns the pending item after the one named by after in q's order, wrapping around to
// the first (never after itself): one walk of the queue.
func (x *index) next(q query, after string) (string, bool) {
	q = q.normalised()
	x.mu.RLock()
	defer x.mu.RUnlock()
	f := x.matcher(q)
	cur := x.items[after]
	var first, following *itemMeta
	for id, m := range x.items {
		if id == after {
			continue
		}
		if _, done := x.labelled[id]; done || !f.match(m) {
			continue
		}
		if first == nil || q.compare(m, first) < 0 {
			first = m
		}
		if cur != nil && q.compare(m, cur) > 0 && (following == nil || q.compare(m, following) < 0) {
			following = m
		}
	}
	switch {
	case following != nil:
		return following.ID, true
	case first != nil:
		return first.ID, true
	}
	return "", false
}

// facet is one value of a filter with its pending count.
type facet struct {
	Value string
	Count int
}

// counts summarises the queue for the header.
type counts struct {
	Pending, Done, DoneByMe int
	Malformed               int64
}

// maxFacets is how many values a filter lists: the most frequent (a hostile producer's 100,000
// question names stay out of the page; the search box finds any of them).
const maxFacets = 20

func (x *index) counts(me string) counts {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return counts{Pending: x.pendingN, Done: x.doneN, DoneByMe: x.doneBy[me], Malformed: x.malformed.Load()}
}

// facets lists the most frequent pending callers and questions (maxFacets each, by count, then
// name), each with its count, and the selected values even when they are not among them.
func (x *index) facets(q query) (callers, questions []facet) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return topFacets(x.byCaller, q.Caller), topFacets(x.byQuestion, q.Question)
}

func topFacets(m map[string]int, selected string) []facet {
	better := func(a, b facet) int { return cmp.Or(cmp.Compare(b.Count, a.Count), strings.Compare(a.Value, b.Value)) }
	top := make([]facet, 0, maxFacets+1)
	for v, n := range m {
		f := facet{v, n}
		if len(top) < maxFacets {
			top = append(top, f)
			if len(top) == maxFacets {
				slices.SortFunc(top, better)
			}
			continue
		}
		if better(f, top[maxFacets-1]) < 0 {
			i, _ := slices.BinarySearchFunc(top, f, better)
			copy(top[i+1:], top[i:maxFacets-1])
			top[i] = f
		}
	}
	slices.SortFunc(top, better)
	if selected != "" && !slices.ContainsFunc(top, func(f facet) bool { return f.Value == selected }) {
		top = append(top, facet{selected, m[selected]})
	}
	return top
}

// labelledMessages lists the stream sequences of the review messages whose every item is
// labelled and whose labels are all on SYS1_LABELS: they have served their purpose.
func (x *index) labelledMessages() []uint64 {
	x.mu.RLock()
	defer x.mu.RUnlock()
	var out []uint64
	for seq, ids := range x.bySeq {
		done := true
		for _, id := range ids {
			if l, ok := x.labelled[id]; !ok || !l.Published {
				done = false
				break
			}
		}
		if done {
			out = append(out, seq)
		}
	}
	slices.Sort(out)
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
	for _, f := range []struct{ name, v string }{{"run_id", it.RunID}, {"model", it.Model}, {"caller", it.Caller}, {"subject", it.Subject}} {
		if len(f.v) > maxMetaField {
			return nil, fmt.Errorf("%s is %d bytes long (at most %d)", f.name, len(f.v), maxMetaField)
		}
	}
	if len(it.Question) > contract.MaxTextBytes {
		return nil, fmt.Errorf("question is %d bytes long (no question name is longer than %d)", len(it.Question), contract.MaxTextBytes)
	}
	if it.RunID == "" || it.Question == "" {
		return nil, errors.New("run_id and question must not be empty")
	}
	if err := checkShape(it); err != nil {
		return nil, err
	}
	m := &itemMeta{ID: it.ID, RunID: it.RunID, Caller: it.Caller, Token: token, Model: it.Model, Question: clip(it.Question, maxQuestionKept),
		QuestionClipped: len(it.Question) > maxQuestionKept,
		Type:            it.Type, Audit: it.Audit || it.Verdict.Audit, Reason: clip(it.Verdict.Reason, maxMetaField),
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
		if subject == wire.Review(it.Caller) || it.Caller == contract.LegacyAnonymousCaller {
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
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{wire.ReviewSubjects}}
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
	m, err := s.GetMsg(ctx, seq+1, jetstream.WithGetMsgSubject(wire.ReviewSubjects))
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
	x.ingestData(msg.Subject(), seq, msg.Data())
}

// ingestData indexes the items of one review message: a run's (contract.ReviewRun), or a
// single item as earlier versions wrote them. Every item must hold up (its caller the
// subject's, its id its run's and question's), or none of the message is shown.
func (x *index) ingestData(subject string, seq uint64, data []byte) {
	rr, legacy, err := contract.DecodeReviewMessage(data)
	var metas []*itemMeta
	if err == nil {
		items := rr.Expand()
		for i := range items {
			m, merr := metaOf(&items[i], subject, seq)
			if merr != nil {
				err = merr
				break
			}
			m.Legacy = legacy
			metas = append(metas, m)
		}
	}
	if err == nil {
		for _, m := range metas {
			x.add(m)
		}
		return
	}
	x.malformed.Add(1)
	x.log.Warn().Err(err).Uint64("stream_seq", seq).Str("subject", subject).Int("bytes", len(data)).
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
							x.unsetLabelLocked(id)
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
// message) every interval until ctx ends. With removeLabelled, it also removes from the stream
// each review message whose items are all labelled and published: the labels are on
// SYS1_LABELS, the run's record keeps the state, and the caller's review quota
// (SYS1_REVIEW_MAX_PER_CALLER, a count of its messages on the stream) counts what is pending.
// The items stay in this index, labelled, so a reviewer who had one open is still told who
// labelled it.
func (x *index) pruneAged(ctx context.Context, js jetstream.JetStream, stream string, every time.Duration, removeLabelled bool) {
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
				x.forgetLocked(id)
			}
		}
		x.mu.Unlock()
		if !removeLabelled || !x.ready() {
			x.sweeps.Add(1)
			continue
		}
		for _, seq := range x.labelledMessages() {
			dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err := s.DeleteMsg(dctx, seq)
			cancel()
			if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
				x.log.Warn().Err(err).Uint64("stream_seq", seq).Msg("could not remove a labelled review message from the stream; will try again")
				continue
			}
			x.mu.Lock()
			delete(x.bySeq, seq) // its items stay, labelled
			x.mu.Unlock()
		}
		x.sweeps.Add(1)
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
	return wire.LabelAccepted(c.Label.Caller)
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
