package soak

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// The checks, in the order they run and print. Each is one guarantee of sys1's, judged from
// outside the workers.
const (
	CheckAnswered  = "every acknowledged request got exactly one final answer"
	CheckScored    = "no run was scored twice"
	CheckHolds     = "every held reply was released once, after its label"
	CheckBudgets   = "each budget admitted exactly its limit"
	CheckBatch     = "every batch item has one result line"
	CheckRecords   = "ClickHouse holds one record per run under FINAL"
	CheckLabels    = "ClickHouse holds one row per label under FINAL"
	CheckConsumers = "no consumer is left with pending or unacknowledged messages"
	CheckProcesses = "every process still runs"
)

// Checks lists the checks in order.
var Checks = []string{CheckAnswered, CheckScored, CheckHolds, CheckBudgets, CheckBatch, CheckRecords, CheckLabels, CheckConsumers, CheckProcesses}

// Violation is one broken guarantee: which check, the runs it concerns, what was seen, and
// the time window to show the fault timeline around.
type Violation struct {
	Check    string
	RunIDs   []string
	Detail   string
	From, To time.Time
}

// CheckResult is one check's outcome: how many things it looked at, and what it found wrong.
type CheckResult struct {
	Check      string
	Checked    int
	Violations []Violation
	// Notes say what the check let pass and why (documented exceptions), or what it could not
	// judge.
	Notes []string
}

// Report is every check's result.
type Report struct {
	Results []CheckResult
}

// Violations are all the violations, check by check.
func (r Report) Violations() []Violation {
	var out []Violation
	for _, res := range r.Results {
		out = append(out, res.Violations...)
	}
	return out
}

// Result returns one check's result.
func (r Report) Result(check string) CheckResult {
	for _, res := range r.Results {
		if res.Check == check {
			return res
		}
	}
	return CheckResult{Check: check}
}

// StoreRetry bounds how long after a model's answer a worker may still have been storing it
// (SYS1_STORE_RETRY, plus the ack wait's redelivery): a worker killed later than that after
// a call had stored it, so a second scoring is not excused by that kill.
const StoreRetry = 2*time.Minute + 30*time.Second

// Check judges the observations. It is pure: the same observations give the same report.
func Check(o Observations) Report {
	c := newChecker(o)
	return Report{Results: []CheckResult{
		c.answered(), c.scored(), c.holds(), c.budgets(), c.batch(), c.records(), c.labelRows(), c.consumers(), c.processes(),
	}}
}

type checker struct {
	o        Observations
	requests map[string]*Request // by run id
	replies  map[string][]Reply  // by run id, in stream order
	labels   map[[2]string][]Label
}

func newChecker(o Observations) *checker {
	c := &checker{o: o, requests: map[string]*Request{}, replies: map[string][]Reply{}, labels: map[[2]string][]Label{}}
	for i := range o.Requests {
		c.requests[o.Requests[i].RunID] = &o.Requests[i]
	}
	rs := append([]Reply(nil), o.Replies...)
	sort.SliceStable(rs, func(i, j int) bool { return rs[i].Seq < rs[j].Seq })
	for _, r := range rs {
		c.replies[r.RunID] = append(c.replies[r.RunID], r)
	}
	ls := append([]Label(nil), o.Labels...)
	sort.SliceStable(ls, func(i, j int) bool { return ls[i].Seq < ls[j].Seq })
	for _, l := range ls {
		k := [2]string{l.RunID, l.Question}
		c.labels[k] = append(c.labels[k], l)
	}
	return c
}

// distinct are a run's replies with one per body, in stream order.
func distinct(rs []Reply) []Reply {
	var out []Reply
	seen := map[[32]byte]bool{}
	for _, r := range rs {
		if !seen[r.Hash] {
			seen[r.Hash] = true
			out = append(out, r)
		}
	}
	return out
}

// final are the replies that answer a run for good: for a held run only the released one
// (review "reviewed"), for every other run any reply.
func (c *checker) final(r *Request) []Reply {
	rs := c.replies[r.RunID]
	if r.Kind != KindHold {
		return rs
	}
	var out []Reply
	for _, x := range rs {
		if x.Review == "reviewed" {
			out = append(out, x)
		}
	}
	if len(out) == 0 && c.failedUnheld(r) {
		return rs // it failed before it had an answer to hold: its failure is its answer
	}
	return out
}

// failedUnheld reports whether a held caller's run failed without ever being held: every reply
// a failure with no review, and no reviewer's label for it. The policy holds answers; a run
// that got none (the model failing through all its deliveries) has nothing to hold and is
// answered with its error like any other. A failed run that a reviewer labelled is not this:
// its review item showed an answer the run never gave.
func (c *checker) failedUnheld(r *Request) bool {
	rs := c.replies[r.RunID]
	if len(rs) == 0 {
		return false
	}
	for _, x := range rs {
		if x.Status != "failed" || x.Review != "" {
			return false
		}
	}
	for k, ls := range c.labels {
		if k[0] == r.RunID && ls[0].Source == "review" {
			return false
		}
	}
	return true
}

// window is a run's time span: from its publish to its last reply (or the end).
func (c *checker) window(r *Request) (time.Time, time.Time) {
	to := c.o.End
	if rs := c.replies[r.RunID]; len(rs) > 0 {
		to = rs[len(rs)-1].At
	}
	return r.PublishedAt, to
}

func (c *checker) answered() CheckResult {
	res := CheckResult{Check: CheckAnswered}
	unacked := 0
	for i := range c.o.Requests {
		r := &c.o.Requests[i]
		if !r.Acked() {
			if len(c.replies[r.RunID]) > 0 {
				unacked++ // stored although its ack was lost: answered, which is fine
			}
			continue
		}
		res.Checked++
		from, to := c.window(r)
		d := distinct(c.final(r))
		switch {
		case len(d) == 0 && r.Kind == KindHold:
			// Not released (or replies went out that are not the release): the holds check
			// says which.
		case len(d) == 0:
			res.Violations = append(res.Violations, Violation{Check: res.Check, RunIDs: []string{r.RunID}, From: from, To: to,
				Detail: fmt.Sprintf("%s request (caller %s) acknowledged at %s and never answered", r.Kind, r.Caller, offset(c.o.Start, r.AckedAt))})
		case len(d) > 1:
			var outcomes []string
			for _, x := range d {
				outcomes = append(outcomes, describe(x, c.o.Start))
			}
			res.Violations = append(res.Violations, Violation{Check: res.Check, RunIDs: []string{r.RunID}, From: from, To: to,
				Detail: fmt.Sprintf("%d different answers: %s", len(d), strings.Join(outcomes, "; "))})
		}
	}
	for id, rs := range c.replies {
		if c.requests[id] == nil {
			res.Violations = append(res.Violations, Violation{Check: res.Check, RunIDs: []string{id}, From: rs[0].At, To: rs[len(rs)-1].At,
				Detail: fmt.Sprintf("%d replies for a run the load never sent", len(rs))})
		}
	}
	if unacked > 0 {
		res.Notes = append(res.Notes, fmt.Sprintf("%d requests whose publish was never acknowledged were stored and answered anyway", unacked))
	}
	sortViolations(res.Violations)
	return res
}

func describe(r Reply, start time.Time) string {
	s := r.Status
	if r.ErrorCode != "" {
		s += " " + r.ErrorCode
	}
	if r.Review != "" {
		s += ", review " + r.Review
	}
	return fmt.Sprintf("%s (stored %s, seq %d)", s, offset(start, r.At), r.Seq)
}

// scored compares, for every request key, how often the fake model answered with how many of
// those answers the runs used: a run answered from the model uses exactly one, a cache hit or
// a failure none. An extra answer is excused only when the worker that got it was killed
// before it could have stored it (then the run's next delivery asks again, or finds the
// cache an earlier run filled: the one way a run is scored twice, documented). Failed calls
// (programmed faults, timeouts) score nothing.
func (c *checker) scored() CheckResult {
	res := CheckResult{Check: CheckScored}
	type tally struct {
		runs     []string
		expected int
		// unreleased counts held runs never released: each may have used one answer (the
		// holds check reports them).
		unreleased int
		calls      []Call
		// asked is every call the model got for the key, answered or not (a fault, a timeout).
		asked    []Call
		from, to time.Time
		// settled is when the last of its runs had its outcome stored (its first final
		// reply); zero while one has none.
		settled time.Time
		open    bool
		// skipped: a run of the key ended refused by the breakers (SYS1_PROVIDER_UNAVAILABLE,
		// every provider's circuit open): a delivery reached the model call and was not let
		// through, so it asked again as far as the breakers allowed.
		skipped bool
		// lastHit is the first final reply of the key's last run answered from the cache: a
		// delivery after a lost answer may find the cache (filled by an earlier run) instead
		// of asking the model again. Zero: no hit.
		lastHit time.Time
		// spans are the key's runs, each from its publication to when its outcome was stored
		// (its first final reply; the end of the soak while it has none): a call belongs to
		// a run open when it started.
		spans []span
	}
	byKey := map[string]*tally{}
	get := func(key string) *tally {
		t := byKey[key]
		if t == nil {
			t = &tally{}
			byKey[key] = t
		}
		return t
	}
	for i := range c.o.Requests {
		r := &c.o.Requests[i]
		rs := c.final(r)
		t := get(r.Key)
		t.runs = append(t.runs, r.RunID)
		sp := span{from: r.PublishedAt, settled: c.o.End}
		switch {
		case len(rs) > 0:
			t.expected += rs[0].ProviderAnswers
			t.skipped = t.skipped || rs[0].ErrorCode == codeProviderUnavailable
			first := firstAt(c.replies[r.RunID])
			if first.After(t.settled) {
				t.settled = first
			}
			if rs[0].CacheHit && first.After(t.lastHit) {
				t.lastHit = first
			}
			sp.settled = first
		case r.Kind == KindHold:
			t.unreleased++
			t.open = true
		default:
			t.open = true
		}
		t.spans = append(t.spans, sp)
		from, to := c.window(r)
		if t.from.IsZero() || from.Before(t.from) {
			t.from = from
		}
		if to.After(t.to) {
			t.to = to
		}
	}
	for _, b := range c.o.Batches {
		status, skipped := map[string]string{}, map[string]bool{}
		for _, l := range b.Lines {
			status[l.CustomID] = l.Status
			skipped[l.CustomID] = l.ErrorCode == codeProviderUnavailable
		}
		for _, it := range b.Items {
			t := get(it.Key)
			t.runs = append(t.runs, b.ID+":"+it.CustomID)
			switch {
			case !b.Finished:
				t.unreleased++ // no result line to judge by: one answer may have been used
			case status[it.CustomID] == "success":
				t.expected++ // batch items are never cache hits: a success is one answer used
			}
			t.skipped = t.skipped || skipped[it.CustomID]
			t.from, t.to, t.open = b.Started, b.Ended, true // the batch's replies are its own
			t.spans = append(t.spans, span{from: b.Started, settled: c.o.End})
		}
	}
	for _, call := range c.o.Calls {
		t := get(call.Key)
		t.asked = append(t.asked, call)
		if call.Answered {
			t.calls = append(t.calls, call)
		}
	}
	excusedTotal := 0
	keys := make([]string, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, key := range keys {
		t := byKey[key]
		if len(t.runs) == 0 {
			if len(t.calls) > 0 {
				res.Violations = append(res.Violations, Violation{Check: res.Check, RunIDs: []string{key}, From: t.calls[0].Started, To: t.calls[len(t.calls)-1].Ended,
					Detail: fmt.Sprintf("the model answered %d calls for %q, which no request of the load carried", len(t.calls), key)})
			}
			continue
		}
		res.Checked += len(t.runs)
		extra := len(t.calls) - t.expected
		if t.unreleased > 0 {
			extra -= min(extra, t.unreleased)
		}
		if extra < 0 {
			res.Violations = append(res.Violations, Violation{Check: res.Check, RunIDs: t.runs, From: t.from, To: t.to,
				Detail: fmt.Sprintf("the replies used %d answers of the model, but it gave only %d", t.expected, len(t.calls))})
			continue
		}
		if extra == 0 {
			continue
		}
		settled := t.settled
		if t.open {
			settled = c.o.End
		}
		excused := 0
		for _, call := range t.calls {
			if died, ok := c.killedHolding(call, settledFor(t.spans, call, settled)); ok && (askedAgainAfter(t.asked, call, died) || t.skipped || !t.lastHit.Before(died)) {
				excused++
			}
		}
		excused = min(excused, extra)
		excusedTotal += excused
		if extra > excused {
			var at []string
			for _, call := range t.calls {
				at = append(at, fmt.Sprintf("w%d at %s", call.Slot, offset(c.o.Start, call.Started)))
			}
			res.Violations = append(res.Violations, Violation{Check: res.Check, RunIDs: t.runs, From: t.from, To: t.to,
				Detail: fmt.Sprintf("scored %d times (the replies used %d answers; %d extra answers excused by a worker killed holding them): %s",
					len(t.calls), t.expected, excused, strings.Join(at, ", "))})
		}
	}
	if excusedTotal > 0 {
		res.Notes = append(res.Notes, fmt.Sprintf("%d runs were scored again because the worker holding the model's answer was killed before it could store it (the documented exception)", excusedTotal))
	}
	sortViolations(res.Violations)
	return res
}

// killedHolding reports whether the worker incarnation that made call was SIGKILLed (or died)
// while it may still have held the answer — after the call started, before the run's outcome
// was stored (settled: its first final reply), and within StoreRetry of the answer — and when
// it died. A worker killed after the outcome was stored excuses nothing: the run's next
// delivery finds it.
func (c *checker) killedHolding(call Call, settled time.Time) (time.Time, bool) {
	for _, w := range c.o.Workers {
		if w.Slot != call.Slot || w.Started.After(call.Started) || w.Ended.IsZero() || w.Ended.Before(call.Started) {
			continue
		}
		if (w.Killed || w.OnItsOwn()) && !w.Ended.After(settled) && w.Ended.Sub(call.Ended) <= StoreRetry {
			return w.Ended, true
		}
	}
	return time.Time{}, false
}

// codeProviderUnavailable is the error of a run no provider was let to answer (every circuit
// open): the run's last delivery was refused by the breakers before reaching the model.
const codeProviderUnavailable = "SYS1_PROVIDER_UNAVAILABLE"

// askedAgainAfter reports whether the model got another call for the same key that started
// after died: the redelivery the lost answer made necessary. That call may have failed (the
// model down meanwhile) and the run with it: the lost answer was still the only one scored.
func askedAgainAfter(calls []Call, lost Call, died time.Time) bool {
	for _, other := range calls {
		if other != lost && !other.Started.Before(died) {
			return true
		}
	}
	return false
}

// span is one run of a key: published at from, its outcome stored by settled.
type span struct{ from, settled time.Time }

// settledFor is when the runs open at call's start had all stored their outcomes: the answer
// it got was for one of them, so a worker killed later held nothing of it. Without such a
// run (a call made for no run open then) it is fallback, the key's last outcome.
func settledFor(spans []span, call Call, fallback time.Time) time.Time {
	var settled time.Time
	for _, sp := range spans {
		if !sp.from.After(call.Started) && !sp.settled.Before(call.Started) && sp.settled.After(settled) {
			settled = sp.settled
		}
	}
	if settled.IsZero() {
		return fallback
	}
	return settled
}

func firstAt(rs []Reply) time.Time {
	var t time.Time
	for _, r := range rs {
		if t.IsZero() || r.At.Before(t) {
			t = r.At
		}
	}
	return t
}

func (c *checker) holds() CheckResult {
	res := CheckResult{Check: CheckHolds}
	failedUnheld := 0
	for i := range c.o.Requests {
		r := &c.o.Requests[i]
		if r.Kind != KindHold || !r.Acked() {
			continue
		}
		res.Checked++
		if c.failedUnheld(r) {
			failedUnheld++
			continue
		}
		from, to := c.window(r)
		bad := func(format string, args ...any) {
			res.Violations = append(res.Violations, Violation{Check: res.Check, RunIDs: []string{r.RunID}, From: from, To: to, Detail: fmt.Sprintf(format, args...)})
		}
		all := c.replies[r.RunID]
		for _, x := range all {
			if x.Review != "reviewed" {
				bad("a reply went out while the run was held: %s", describe(x, c.o.Start))
				break
			}
		}
		released := distinct(c.final(r))
		if len(released) > 1 {
			var outcomes []string
			for _, x := range released {
				outcomes = append(outcomes, describe(x, c.o.Start)+" labels "+fmt.Sprint(x.Reviewed))
			}
			bad("released %d times with different replies: %s", len(released), strings.Join(outcomes, "; "))
		}
		if len(released) == 0 {
			// Which questions did reviewers label? A held run with no label never reached a
			// reviewer (the page did not show it); with labels it was never released.
			var labelled []string
			for k, ls := range c.labels {
				if k[0] == r.RunID && ls[0].Source == "review" {
					labelled = append(labelled, k[1])
				}
			}
			if len(labelled) == 0 {
				bad("held and never labelled: the review page never offered it, or the reviewer never got to it")
			} else {
				sort.Strings(labelled)
				bad("labelled (%s) but never released", strings.Join(labelled, ", "))
			}
			continue
		}
		rel := released[0]
		for q, value := range rel.Reviewed {
			ls := c.reviewLabels(r.RunID, q)
			if len(ls) == 0 {
				bad("released with a label for %s that no accepted review label gave", q)
				continue
			}
			first := ls[0]
			if all[0].At.Before(first.At) {
				bad("released at %s, before its label for %s was accepted at %s", offset(c.o.Start, all[0].At), q, offset(c.o.Start, first.At))
			}
			if value != first.Value {
				bad("released with label %s for %s, but the first accepted label was %s (by %s)", value, q, first.Value, first.Reviewer)
			}
		}
	}
	sortViolations(res.Violations)
	if failedUnheld > 0 {
		res.Notes = append(res.Notes, fmt.Sprintf("%d held caller's runs failed before they had an answer to hold (answered with their error, as any run)", failedUnheld))
	}
	return res
}

func (c *checker) reviewLabels(runID, question string) []Label {
	var out []Label
	for _, l := range c.labels[[2]string{runID, question}] {
		if l.Source == "review" {
			out = append(out, l)
		}
	}
	return out
}

// budgets: a caller with a day budget of N decisions gets exactly N answers from the model
// when it asks for more — never N+1, and none refused while some budget is left. A run is
// charged from its admission until it ends, so budget held by a run that failed in the end
// (a model outage outlasting its deliveries) may have refused others before it was refunded:
// refusals with fewer than N admitted are excused up to the number of such runs.
func (c *checker) budgets() CheckResult {
	res := CheckResult{Check: CheckBudgets}
	for _, b := range c.o.Budgets {
		res.Checked++
		admitted, refused, failed := 0, 0, 0
		var runs []string
		var from, to time.Time
		for i := range c.o.Requests {
			r := &c.o.Requests[i]
			if r.Caller != b.Caller || !r.Acked() {
				continue
			}
			d := distinct(c.final(r))
			if len(d) == 0 {
				continue // lost: the answered check reports it
			}
			switch {
			case d[0].Status == "success" && !d[0].CacheHit:
				admitted++
			case d[0].ErrorCode == "SYS1_BUDGET_EXCEEDED":
				refused++
			case d[0].Status == "failed":
				failed++ // admitted, held its charge while it ran, refunded when it failed
				continue
			default:
				continue
			}
			runs = append(runs, r.RunID)
			if from.IsZero() || r.PublishedAt.Before(from) {
				from = r.PublishedAt
			}
			if d[0].At.After(to) {
				to = d[0].At
			}
		}
		if utcDay(c.o.Start) != utcDay(c.o.End) {
			res.Notes = append(res.Notes, fmt.Sprintf("caller %s: the soak crossed midnight UTC, when day budgets reset; %d admitted, %d refused", b.Caller, admitted, refused))
			continue
		}
		switch {
		case admitted > b.Limit:
			res.Violations = append(res.Violations, Violation{Check: res.Check, RunIDs: firstN(runs, 20), From: from, To: to,
				Detail: fmt.Sprintf("caller %s: %d decisions admitted under a budget of %d", b.Caller, admitted, b.Limit)})
		case admitted < b.Limit && refused > 0 && admitted+failed >= b.Limit:
			res.Notes = append(res.Notes, fmt.Sprintf("caller %s: %d admitted, %d refused while %d runs that failed in the end still held their charge", b.Caller, admitted, refused, failed))
		case admitted < b.Limit && refused > 0:
			res.Violations = append(res.Violations, Violation{Check: res.Check, RunIDs: firstN(runs, 20), From: from, To: to,
				Detail: fmt.Sprintf("caller %s: %d refused SYS1_BUDGET_EXCEEDED with only %d of its %d decisions admitted", b.Caller, refused, admitted, b.Limit)})
		case admitted < b.Limit:
			res.Notes = append(res.Notes, fmt.Sprintf("caller %s asked for fewer decisions than its budget (%d admitted of %d)", b.Caller, admitted, b.Limit))
		default:
			res.Notes = append(res.Notes, fmt.Sprintf("caller %s: %d admitted, %d refused", b.Caller, admitted, refused))
		}
	}
	return res
}

func utcDay(t time.Time) string { return t.UTC().Format("2006-01-02") }

func (c *checker) batch() CheckResult {
	res := CheckResult{Check: CheckBatch}
	if len(c.o.Batches) == 0 {
		res.Notes = append(res.Notes, "no batch ran")
		return res
	}
	for _, b := range c.o.Batches {
		c.batchOne(&res, b)
	}
	return res
}

func (c *checker) batchOne(res *CheckResult, b BatchOutcome) {
	res.Checked += len(b.Items)
	bad := func(ids []string, format string, args ...any) {
		res.Violations = append(res.Violations, Violation{Check: res.Check, RunIDs: firstN(ids, 20), From: b.Started, To: b.Ended,
			Detail: fmt.Sprintf("batch %s: ", b.ID) + fmt.Sprintf(format, args...)})
	}
	if b.Restarts > 0 {
		res.Notes = append(res.Notes, fmt.Sprintf("batch %s: its command was killed and run again %d times (resumed)", b.ID, b.Restarts))
	}
	if !b.Finished {
		bad(nil, "sys1 batch never wrote its result file (exit status %d)", b.ExitCode)
		return
	}
	if b.ExitCode != 0 && b.ExitCode != 1 {
		bad(nil, "sys1 batch exited %d (0: every item succeeded, 1: some failed)", b.ExitCode)
	}
	lines := map[string][]BatchLine{}
	for _, l := range b.Lines {
		lines[l.CustomID] = append(lines[l.CustomID], l)
	}
	var missing, doubled, unknownStatus []string
	for _, it := range b.Items {
		ls := lines[it.CustomID]
		switch {
		case len(ls) == 0:
			missing = append(missing, it.CustomID)
		case len(ls) > 1:
			doubled = append(doubled, it.CustomID)
		case ls[0].Status != "success" && ls[0].Status != "failed":
			unknownStatus = append(unknownStatus, it.CustomID+" ("+ls[0].Status+")")
		}
		delete(lines, it.CustomID)
	}
	if len(missing) > 0 {
		bad(missing, "%d items have no result line", len(missing))
	}
	if len(doubled) > 0 {
		bad(doubled, "%d items have more than one result line", len(doubled))
	}
	if len(unknownStatus) > 0 {
		bad(unknownStatus, "%d items ended neither succeeded nor failed", len(unknownStatus))
	}
	if len(lines) > 0 {
		var extra []string
		for id := range lines {
			extra = append(extra, id)
		}
		sort.Strings(extra)
		bad(extra, "%d result lines for items the input did not have", len(extra))
	}
	if len(b.Lines) != len(b.Items) {
		bad(nil, "%d result lines for %d input lines", len(b.Lines), len(b.Items))
	}
}

// records: every run that was answered has exactly one row under FINAL, with the status its
// reply said; held runs too (their record is written when they finish, before the hold).
func (c *checker) records() CheckResult {
	res := CheckResult{Check: CheckRecords}
	if !c.o.RowsRead {
		res.Violations = append(res.Violations, Violation{Check: res.Check, From: c.o.Start, To: c.o.End, Detail: "ClickHouse could not be read"})
		return res
	}
	rows := map[string][]Row{}
	for _, r := range c.o.Rows {
		rows[r.RunID] = append(rows[r.RunID], r)
	}
	want := map[string]string{} // run id → the status its answer had
	for i := range c.o.Requests {
		r := &c.o.Requests[i]
		if d := distinct(c.final(r)); len(d) > 0 {
			want[r.RunID] = d[0].Status
		} else if r.Kind == KindHold && len(c.replies[r.RunID]) == 0 && r.Acked() {
			want[r.RunID] = "" // held and never released: recorded all the same, any status
		}
	}
	unjudged := map[string]bool{} // run-id prefixes of batches that wrote no result file
	for _, b := range c.o.Batches {
		for _, l := range b.Lines {
			want[l.RunID] = l.Status
		}
		if !b.Finished {
			unjudged[b.ID+":"] = true
		}
	}
	var missing, doubled, wrong []string
	for id, status := range want {
		res.Checked++
		rs := rows[id]
		switch {
		case len(rs) == 0:
			missing = append(missing, id)
		case len(rs) > 1:
			doubled = append(doubled, id)
		case status != "" && rs[0].Status != status:
			wrong = append(wrong, fmt.Sprintf("%s (record %s, reply %s)", id, rs[0].Status, status))
		}
		delete(rows, id)
	}
	bad := func(ids []string, format string, args ...any) {
		sort.Strings(ids)
		res.Violations = append(res.Violations, Violation{Check: res.Check, RunIDs: firstN(ids, 20), From: c.o.Start, To: c.o.End, Detail: fmt.Sprintf(format, args...)})
	}
	if len(missing) > 0 {
		bad(missing, "%d answered runs have no record in ClickHouse", len(missing))
	}
	if len(doubled) > 0 {
		bad(doubled, "%d runs have more than one record under FINAL", len(doubled))
	}
	if len(wrong) > 0 {
		bad(wrong, "%d records say another status than the run's reply", len(wrong))
	}
	var stray []string
	for id := range rows {
		if r := c.requests[id]; r != nil && !r.Acked() {
			continue // stored though its ack was lost, and never answered: recorded, fine
		}
		if group, _, ok := strings.Cut(id, ":"); ok && unjudged[group+":"] {
			continue // an item of a batch that wrote no result file: the batch check says so
		}
		stray = append(stray, id)
	}
	if len(stray) > 0 {
		bad(stray, "%d records of runs the soak never saw answered", len(stray))
	}
	return res
}

// labels: every accepted label has its row under FINAL (the latest of its run and question),
// every producer label JetStream acknowledged was accepted, and no review item was accepted
// twice (the first label wins).
func (c *checker) labelRows() CheckResult {
	res := CheckResult{Check: CheckLabels}
	bad := func(ids []string, format string, args ...any) {
		sort.Strings(ids)
		res.Violations = append(res.Violations, Violation{Check: res.Check, RunIDs: firstN(ids, 20), From: c.o.Start, To: c.o.End, Detail: fmt.Sprintf(format, args...)})
	}
	accepted := map[[2]string]bool{}
	for k := range c.labels {
		accepted[k] = true
	}
	var lost []string
	for _, l := range c.o.SentLabels {
		res.Checked++
		if !accepted[[2]string{l.RunID, l.Question}] {
			lost = append(lost, l.RunID+"/"+l.Question)
		}
	}
	if len(lost) > 0 {
		bad(lost, "%d producer labels acknowledged by JetStream were never accepted", len(lost))
	}
	var twice []string
	for k, ls := range c.labels {
		// The same label published again (a retried publish) is one label; two reviewers, or
		// two values, are two.
		reviewers, values := map[string]bool{}, map[string]bool{}
		for _, l := range ls {
			if l.Source == "review" {
				reviewers[l.Reviewer] = true
				values[l.Value] = true
			}
		}
		if len(reviewers) > 1 || len(values) > 1 {
			twice = append(twice, fmt.Sprintf("%s/%s (%d labels by %d reviewers)", k[0], k[1], len(ls), len(reviewers)))
		}
	}
	if len(twice) > 0 {
		bad(twice, "%d review items were labelled twice (the first label must win)", len(twice))
	}
	if !c.o.RowsRead {
		bad(nil, "ClickHouse could not be read")
		return res
	}
	rows := map[[2]string][]LabelRow{}
	for _, r := range c.o.LabelRows {
		k := [2]string{r.RunID, r.Question}
		rows[k] = append(rows[k], r)
	}
	var missing, doubled, wrong []string
	for k, ls := range c.labels {
		res.Checked++
		rs := rows[k]
		last := ls[len(ls)-1]
		switch {
		case len(rs) == 0:
			missing = append(missing, k[0]+"/"+k[1])
		case len(rs) > 1:
			doubled = append(doubled, k[0]+"/"+k[1])
		case rs[0].Value != last.Value:
			wrong = append(wrong, fmt.Sprintf("%s/%s (row %s, last accepted %s)", k[0], k[1], rs[0].Value, last.Value))
		}
		delete(rows, k)
	}
	if len(missing) > 0 {
		bad(missing, "%d accepted labels have no row in ClickHouse", len(missing))
	}
	if len(doubled) > 0 {
		bad(doubled, "%d labels have more than one row under FINAL", len(doubled))
	}
	if len(wrong) > 0 {
		bad(wrong, "%d label rows hold another value than the last accepted label", len(wrong))
	}
	if len(rows) > 0 {
		var stray []string
		for k := range rows {
			stray = append(stray, k[0]+"/"+k[1])
		}
		bad(stray, "%d label rows for labels the labels stream never accepted", len(stray))
	}
	return res
}

func (c *checker) consumers() CheckResult {
	res := CheckResult{Check: CheckConsumers}
	for _, cs := range c.o.Consumers {
		res.Checked++
		switch {
		case cs.Err != "":
			res.Violations = append(res.Violations, Violation{Check: res.Check, From: c.o.End, To: c.o.End,
				Detail: fmt.Sprintf("consumer %s on %s: cannot be read: %s", cs.Name, cs.Stream, cs.Err)})
		case cs.Pending > 0 || cs.AckPending > 0:
			res.Violations = append(res.Violations, Violation{Check: res.Check, From: c.o.End, To: c.o.End,
				Detail: fmt.Sprintf("consumer %s on %s: %d pending, %d unacknowledged at the end", cs.Name, cs.Stream, cs.Pending, cs.AckPending)})
		}
	}
	for _, l := range c.o.Leftovers {
		res.Violations = append(res.Violations, Violation{Check: res.Check, From: c.o.End, To: c.o.End,
			Detail: fmt.Sprintf("work queue %s still holds %d messages at the end (the first at sequence %d): no consumer finished them", l.Stream, l.Msgs, l.FirstSeq)})
	}
	return res
}

func (c *checker) processes() CheckResult {
	res := CheckResult{Check: CheckProcesses}
	for _, p := range append(append([]Incarnation(nil), c.o.Workers...), c.o.Processes...) {
		res.Checked++
		if p.OnItsOwn() {
			tail := strings.TrimSpace(p.LogTail)
			if tail != "" {
				tail = "; its log ends:\n" + indent(tail, "      ")
			}
			res.Violations = append(res.Violations, Violation{Check: res.Check, From: p.Started, To: p.Ended,
				Detail: fmt.Sprintf("%s (incarnation %d, pid %d) exited on its own with status %d at %s%s", p.Name, p.Gen, p.PID, p.ExitCode, offset(c.o.Start, p.Ended), tail)})
		}
	}
	return res
}

func indent(s, prefix string) string {
	return prefix + strings.ReplaceAll(s, "\n", "\n"+prefix)
}

func firstN(ids []string, n int) []string {
	if len(ids) <= n {
		return ids
	}
	return append(append([]string(nil), ids[:n]...), fmt.Sprintf("… %d more", len(ids)-n))
}

func sortViolations(vs []Violation) {
	sort.SliceStable(vs, func(i, j int) bool { return vs[i].From.Before(vs[j].From) })
}
