// Package budget enforces the limits file's rate limits, day budgets and in-flight caps across
// every worker replica exactly: the counters live in the JetStream KV bucket sys1-limits and
// every change is a compare-and-set on the counter's revision, so N replicas admitting at once
// can never admit more than the limit between them (no replica-local approximation).
//
// # Counters
//
// One key per caller, rule and UTC day holds that day's input tokens and USD (charged at
// admission with the caller's estimate, corrected by Ticket.Settle) and the current minute's
// admitted decisions: the minute window lives inside its day's key, so one compare-and-set
// decides the rate and both budgets of an admission together, never one without the others.
// Minute windows are fixed UTC minutes (a burst of up to twice the rate can straddle a minute
// boundary, as with any fixed window); day windows reset at 00:00 UTC.
//
// In-flight caps use a second key per caller and rule holding leases, one per call in flight,
// each with an expiry. The replica holding a lease extends it every LeaseTTL/3; a replica that
// dies stops extending, and its leases lapse after LeaseTTL, when the next admission prunes
// them. So a slot is never lost for longer than LeaseTTL, at the price of trusting replica
// clocks to agree within 2/3 of LeaseTTL (NTP keeps them within milliseconds). The
// alternative, one key per slot with a server-side per-key TTL, needs no clock agreement but
// costs up to one round trip per slot to find a free one and cannot be decided in one
// compare-and-set; the lease list costs one.
//
// # Contention
//
// A replica never races itself: its operations on one key queue up and are written in
// batches, one compare-and-set for everything queued (see kv.go), and it remembers the last
// revision it wrote, so an uncontended admission is one round trip (the compare-and-set)
// instead of two (read, then write). Only replicas race each other; a lost compare-and-set
// re-reads and retries the batch after a jittered, growing backoff, at most
// Config.MaxAttempts times (four times that for settlements and releases, which must land).
// Past that an admission is delayed briefly (KindContention) rather than failed.
//
// # Failure
//
// Without NATS nothing is admitted: Admit returns the error (fail closed). A write whose
// outcome is unknown (a timeout after the server may have applied it) is not retried: an
// admission may then have been counted without being used (the budget errs on the safe
// side), and a Settle may be missing (the estimate stands).
package budget

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"github.com/rs/zerolog"

	"github.com/sys1hq/sys1/worker/limits"
)

// Kind names a limit, as the limits file's field does.
type Kind string

// The limits a decision can be refused or delayed by.
const (
	KindDecisions   Kind = "decisions_per_minute"
	KindInputTokens Kind = "input_tokens_per_day"
	KindUSD         Kind = "usd_per_day"
	KindInFlight    Kind = "in_flight"
	// KindContention delays an admission whose compare-and-set kept losing to other
	// replicas; it is no limit of the caller's.
	KindContention Kind = "contention"
)

// Label is the limit's name in messages.
func (k Kind) Label() string {
	switch k {
	case KindDecisions:
		return "decisions per minute"
	case KindInputTokens:
		return "input tokens per day"
	case KindUSD:
		return "USD per day"
	case KindInFlight:
		return "calls in flight"
	}
	return string(k)
}

// Config configures a Budget.
type Config struct {
	// KV is the limits bucket (topology.Config.LimitsBucketConfig).
	KV jetstream.KeyValue
	// Now is the clock; nil means time.Now. Windows are UTC minutes and days of it.
	Now func() time.Time
	// LeaseTTL is how long an in-flight slot outlives the replica holding it [30s].
	LeaseTTL time.Duration
	// InFlightRetry is how soon a call delayed by a full in-flight cap tries again [250ms,
	// jittered by ±50%]: a slot frees when any call ends, which no one announces.
	InFlightRetry time.Duration
	// MaxAttempts bounds the compare-and-set attempts of one operation [12].
	MaxAttempts int
	Log         zerolog.Logger

	// manualRefresh leaves lease refreshes to the test (refresh), whose clock is not the
	// ticker's.
	manualRefresh bool
}

// Defaults of Config.
const (
	DefaultLeaseTTL      = 30 * time.Second
	DefaultInFlightRetry = 250 * time.Millisecond
	DefaultMaxAttempts   = 12
)

// Budget admits calls against the limits. It is safe for concurrent use; each replica has one.
type Budget struct {
	kv          jetstream.KeyValue
	now         func() time.Time
	leaseTTL    time.Duration
	retry       time.Duration
	maxAttempts int
	log         zerolog.Logger

	mu     sync.Mutex
	keys   map[string]*keyState
	leases map[string]map[string]*Ticket // in-flight key → lease id → ticket, this replica's

	stop    context.CancelFunc
	stopped chan struct{}

	stats struct {
		ops, batches, attempts, conflicts, exhausted atomic.Int64
	}
}

// New starts a Budget and its lease refresher; Close stops it.
func New(cfg Config) (*Budget, error) {
	if cfg.KV == nil {
		return nil, errors.New("budget: no limits bucket")
	}
	b := &Budget{
		kv: cfg.KV, now: cfg.Now, leaseTTL: cfg.LeaseTTL, retry: cfg.InFlightRetry,
		maxAttempts: cfg.MaxAttempts, log: cfg.Log,
		keys: map[string]*keyState{}, leases: map[string]map[string]*Ticket{},
		stopped: make(chan struct{}),
	}
	if b.now == nil {
		b.now = time.Now
	}
	if b.leaseTTL <= 0 {
		b.leaseTTL = DefaultLeaseTTL
	}
	if b.leaseTTL < 3*time.Millisecond {
		return nil, fmt.Errorf("budget: lease TTL %s is too short to refresh", b.leaseTTL)
	}
	if b.retry <= 0 {
		b.retry = DefaultInFlightRetry
	}
	if b.maxAttempts <= 0 {
		b.maxAttempts = DefaultMaxAttempts
	}
	ctx, cancel := context.WithCancel(context.Background())
	b.stop = cancel
	if cfg.manualRefresh {
		close(b.stopped)
	} else {
		go b.refreshLoop(ctx)
	}
	return b, nil
}

// Close stops extending this replica's leases; it does not release them (Ticket.Release
// does), so after a Close they lapse within LeaseTTL, as a dead replica's do.
func (b *Budget) Close() {
	b.stop()
	<-b.stopped
}

// Estimate is what an admission charges before the call: its input tokens, and its USD at
// the model's price (0 for an unpriced model: calls with no price are not charged to USD
// budgets, since their cost is unknown).
type Estimate struct {
	InputTokens int64
	USD         float64
	// ID names the admission: the run's id. An admission that is never settled — its replica
	// died during the call, or the answer to its write was lost in a NATS election — stays
	// open in the day's counter under this id, and the run's next delivery is admitted on
	// that same charge instead of paying a second time; settling it closes it. So a budget of
	// N pays for exactly N runs however often replicas crash. Empty: every admission charges.
	ID string
}

// Actual is what the call used, reported after it: the provider's input tokens and the cost
// computed from them (nil when the model is unpriced, charged as 0).
type Actual struct {
	InputTokens int64
	USD         *float64
}

// Outcome is what Admit decided.
type Outcome int

// Outcomes of Admit.
const (
	// Admitted: make the call, then Settle and Release the ticket.
	Admitted Outcome = iota + 1
	// Delayed: over a rate limit or in-flight cap; try again at Until (the worker
	// redelivers then, if that is within the request's deadline).
	Delayed
	// Exceeded: a day budget is spent; SYS1_BUDGET_EXCEEDED, not retried.
	Exceeded
)

func (o Outcome) String() string {
	switch o {
	case Admitted:
		return "admitted"
	case Delayed:
		return "delayed"
	case Exceeded:
		return "exceeded"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// Decision is the outcome of one Admit.
type Decision struct {
	Outcome Outcome
	// Ticket is the admitted call's (Admitted only).
	Ticket *Ticket
	// Until is when to try again (Delayed only).
	Until time.Time
	// Reason is the limit that delayed or refused the call.
	Reason Kind
	// Exceeded says which budget is spent, its limit and when it resets (Exceeded only).
	Exceeded *ExceededError
}

// ExceededError is a spent day budget: the message of SYS1_BUDGET_EXCEEDED.
type ExceededError struct {
	Caller   string
	Rule     string
	Kind     Kind    // KindInputTokens or KindUSD
	Limit    float64 // tokens or USD
	Used     float64 // charged so far today, estimates of calls in flight included
	Estimate float64 // what this call would have added
	ResetsAt time.Time
}

// Error is the message a caller sees, e.g. "caller billing: USD per day budget 5.00 spent
// (5.02); resets 2026-12-02T00:00:00Z", or, when some budget is left but not enough for this
// call's estimate, "caller billing: USD per day budget 5.00 would be exceeded: 4.99 spent,
// this call is estimated at 0.02; resets 2026-12-02T00:00:00Z".
func (e *ExceededError) Error() string {
	amount := func(v float64) string {
		if e.Kind == KindUSD {
			return formatUSD(v)
		}
		return fmt.Sprintf("%.0f", v)
	}
	resets := e.ResetsAt.UTC().Format(time.RFC3339)
	if e.Used >= e.Limit {
		return fmt.Sprintf("caller %s: %s budget %s spent (%s); resets %s",
			e.Caller, e.Kind.Label(), amount(e.Limit), amount(e.Used), resets)
	}
	unit := ""
	if e.Kind == KindInputTokens {
		unit = " tokens"
	}
	return fmt.Sprintf("caller %s: %s budget %s would be exceeded: %s spent, this call is estimated at %s%s; resets %s",
		e.Caller, e.Kind.Label(), amount(e.Limit), amount(e.Used), amount(e.Estimate), unit, resets)
}

// formatUSD writes an amount with two decimals, up to four when they matter (5.0212), and
// three significant digits below a cent (0.000412), so no amount shows as a misleading 0.00.
func formatUSD(v float64) string {
	a := math.Abs(v)
	if a >= 0.01 || a == 0 {
		s := strings.TrimRight(strconv.FormatFloat(v, 'f', 4, 64), "0")
		if decimals := len(s) - strings.IndexByte(s, '.') - 1; decimals < 2 {
			s += strings.Repeat("0", 2-decimals)
		}
		return s
	}
	digits := 2 - int(math.Floor(math.Log10(a)))
	return strings.TrimRight(strconv.FormatFloat(v, 'f', digits, 64), "0")
}

// nano converts USD to the counters' nano-dollars: exact integers, so sums across replicas and
// corrections never drift. Past maxCount it saturates: an absurd figure (a provider reporting
// 10^30 tokens, a price typo) must spend the budget, never wrap it around to nothing — a float
// beyond int64 converts to whatever the CPU makes of it, on amd64 the most negative int64.
func nano(usd float64) int64 {
	if !(usd > 0) {
		return 0
	}
	if v := usd * 1e9; !(v < maxCount) {
		return maxCount
	}
	return int64(math.Round(usd * 1e9))
}

// maxCount is where the counters saturate: far above any budget (9.2 billion dollars in
// nano-dollars, 2^61 tokens), and far enough below int64's end that a sum of two stays exact.
const maxCount = math.MaxInt64 / 4

// satAdd adds two counter amounts, saturating at 0 and maxCount instead of wrapping.
func satAdd(a, b int64) int64 {
	a, b = min(max(a, -maxCount), maxCount), min(max(b, -maxCount), maxCount)
	return min(max(a+b, 0), maxCount)
}

// ---- keys and values ----

// The KV keys: d.<caller>.<rule>.<YYYYMMDD> for a day's counters, f.<caller>.<rule> for the
// leases of calls in flight. Callers (JWT subjects among them) and rule names may hold any
// character, KV keys only a few, so both are hex-encoded (with a letter in front, since a
// token may not be empty).
func token(s string) string { return "x" + hex.EncodeToString([]byte(s)) }

func untoken(t string) (string, bool) {
	if !strings.HasPrefix(t, "x") {
		return "", false
	}
	b, err := hex.DecodeString(t[1:])
	return string(b), err == nil
}

func dayKey(caller, rule string, day time.Time) string {
	return "d." + token(caller) + "." + token(rule) + "." + day.Format("20060102")
}

func flightKey(caller, rule string) string {
	return "f." + token(caller) + "." + token(rule)
}

// dayCounter is the value of a day key.
type dayCounter struct {
	Minute    int64 `json:"minute"`    // the Unix minute Decisions counts
	Decisions int64 `json:"decisions"` // admitted in Minute
	Admitted  int64 `json:"admitted"`  // admitted this day
	Tokens    int64 `json:"input_tokens"`
	NanoUSD   int64 `json:"nano_usd"`
	// Open are the admissions charged and not yet settled, by id (Estimate.ID): at most the
	// calls in flight, plus those whose replica died and whose run never came back.
	Open []openCharge `json:"open,omitempty"`
}

// openCharge is one admission not yet settled: what it charged.
type openCharge struct {
	ID      string `json:"id"`
	Tokens  int64  `json:"t,omitempty"`
	NanoUSD int64  `json:"u,omitempty"`
	At      int64  `json:"at"` // Unix milliseconds
}

// maxOpen bounds a day counter's open admissions. Past it the oldest is forgotten (its
// charge stays; only its run's next delivery would pay again), so a flood of runs that never
// come back cannot grow the counter without bound.
const maxOpen = 512

// open returns the index of the open admission id, or -1.
func (c *dayCounter) open(id string) int {
	if id == "" {
		return -1
	}
	for i, o := range c.Open {
		if o.ID == id {
			return i
		}
	}
	return -1
}

// flights is the value of an in-flight key.
type flights struct {
	Leases []lease `json:"leases"`
}

type lease struct {
	ID      string `json:"id"`
	Expires int64  `json:"exp"` // Unix milliseconds
}

// live drops the leases that lapsed by now.
func (f *flights) live(now time.Time) {
	ms := now.UnixMilli()
	kept := f.Leases[:0]
	for _, l := range f.Leases {
		if l.Expires > ms {
			kept = append(kept, l)
		}
	}
	f.Leases = kept
}

func utcDay(t time.Time) time.Time {
	t = t.UTC()
	return time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC)
}

func minuteOf(t time.Time) int64 { return t.Unix() / 60 }

// ---- Admit ----

// Admit decides whether caller may make one call under rule (the rule limits.Limits.Match
// gave), charging est to the day budgets when it may. A caller no rule limits is admitted
// without a round trip. Errors are NATS failures: nothing was admitted.
func (b *Budget) Admit(ctx context.Context, caller string, rule limits.Rule, est Estimate) (Decision, error) {
	t := &Ticket{b: b, caller: caller, rule: rule}
	if !rule.Limited() {
		return Decision{Outcome: Admitted, Ticket: t}, nil
	}
	est.InputTokens = min(max(est.InputTokens, 0), maxCount)
	now := b.now()
	if rule.InFlight > 0 {
		d, err := b.takeSlot(ctx, t, now)
		if err != nil || d.Outcome != Admitted {
			return d, err
		}
	}
	if rule.DayLimited() {
		d, err := b.charge(ctx, t, est, now)
		if err != nil || d.Outcome != Admitted {
			if t.leaseID != "" {
				// Hand the slot back; if that fails too it lapses within LeaseTTL.
				if rerr := t.Release(context.WithoutCancel(ctx)); rerr != nil {
					b.log.Warn().Err(rerr).Str("caller", caller).Msg("budget: could not hand back an in-flight slot; it lapses with its lease")
				}
			}
			return d, err
		}
	}
	return Decision{Outcome: Admitted, Ticket: t}, nil
}

// charge decides and charges the day counters in one compare-and-set.
func (b *Budget) charge(ctx context.Context, t *Ticket, est Estimate, now time.Time) (Decision, error) {
	rule := t.rule
	day := utcDay(now)
	key := dayKey(t.caller, rule.Name, day)
	estNano := nano(est.USD)
	if rule.USDPerDay <= 0 {
		estNano = 0
	}
	estTokens := est.InputTokens
	if rule.InputTokensPerDay <= 0 {
		estTokens = 0
	}
	var dec Decision
	var chargedTokens, chargedNano int64 // what the admission stands for (from the last run of fn)
	err := b.update(ctx, key, b.maxAttempts, func(cur []byte) ([]byte, error) {
		var c dayCounter
		if cur != nil {
			if err := json.Unmarshal(cur, &c); err != nil {
				return nil, fmt.Errorf("budget: counter %s is unreadable: %w", key, err)
			}
		}
		if i := c.open(est.ID); i >= 0 {
			// This run was admitted before and never settled: its earlier delivery's replica
			// died, or that admission's answer was lost. It runs on the same charge.
			dec = Decision{Outcome: Admitted}
			chargedTokens, chargedNano = c.Open[i].Tokens, c.Open[i].NanoUSD
			return nil, nil
		}
		dec = decide(&c, t.caller, rule, estTokens, estNano, now, day)
		if dec.Outcome != Admitted {
			return nil, nil
		}
		c.Admitted++
		c.Decisions++
		c.Tokens = satAdd(c.Tokens, estTokens)
		c.NanoUSD = satAdd(c.NanoUSD, estNano)
		chargedTokens, chargedNano = estTokens, estNano
		if est.ID != "" {
			c.Open = append(c.Open, openCharge{ID: est.ID, Tokens: estTokens, NanoUSD: estNano, At: now.UnixMilli()})
			if len(c.Open) > maxOpen {
				c.Open = slices.Delete(c.Open, 0, len(c.Open)-maxOpen)
			}
		}
		return json.Marshal(c)
	})
	if errors.Is(err, errContention) {
		return b.contended(now), nil
	}
	if err != nil {
		return Decision{}, err
	}
	if dec.Outcome == Admitted {
		// What this admission stands for: its own estimate, or the open charge it reused.
		t.dayKey, t.estTokens, t.estNano, t.id = key, chargedTokens, chargedNano, est.ID
	}
	if dec.Outcome == Delayed {
		// Everyone delayed in one minute would come back at the same instant: spread them
		// over the first second of the next.
		dec.Until = dec.Until.Add(rand.N(time.Second))
	}
	return dec, nil
}

// decide is the admission rule on one day's counters (minute rolled over as needed): a spent
// budget refuses, a full minute delays, anything else admits. Budgets come first, since no
// delay mends a spent budget.
func decide(c *dayCounter, caller string, rule limits.Rule, estTokens, estNano int64, now, day time.Time) Decision {
	m := minuteOf(now)
	if c.Minute < m {
		// A new minute. A counter ahead of this clock (another replica's clock runs a little
		// fast) keeps its minute: windows only move forward.
		c.Minute, c.Decisions = m, 0
	}
	resets := day.Add(24 * time.Hour)
	over := func(kind Kind, limit, used, est float64) Decision {
		return Decision{Outcome: Exceeded, Reason: kind, Exceeded: &ExceededError{
			Caller: caller, Rule: rule.Name, Kind: kind, Limit: limit, Used: used, Estimate: est, ResetsAt: resets,
		}}
	}
	if lim := rule.InputTokensPerDay; lim > 0 && (c.Tokens >= lim || satAdd(c.Tokens, estTokens) > lim) {
		return over(KindInputTokens, float64(lim), float64(c.Tokens), float64(estTokens))
	}
	if rule.USDPerDay > 0 {
		if lim := nano(rule.USDPerDay); c.NanoUSD >= lim || satAdd(c.NanoUSD, estNano) > lim {
			return over(KindUSD, rule.USDPerDay, float64(c.NanoUSD)/1e9, float64(estNano)/1e9)
		}
	}
	if lim := rule.DecisionsPerMinute; lim > 0 && c.Decisions >= lim {
		return Decision{Outcome: Delayed, Reason: KindDecisions, Until: time.Unix((c.Minute+1)*60, 0)}
	}
	return Decision{Outcome: Admitted}
}

// takeSlot takes an in-flight slot for t, or says when to try again.
func (b *Budget) takeSlot(ctx context.Context, t *Ticket, now time.Time) (Decision, error) {
	key := flightKey(t.caller, t.rule.Name)
	id := nuid.Next()
	var dec Decision
	err := b.update(ctx, key, b.maxAttempts, func(cur []byte) ([]byte, error) {
		var f flights
		if cur != nil {
			if err := json.Unmarshal(cur, &f); err != nil {
				return nil, fmt.Errorf("budget: in-flight leases %s are unreadable: %w", key, err)
			}
		}
		f.live(now)
		if int64(len(f.Leases)) >= t.rule.InFlight {
			// Try again soon, or when the first lease lapses if that is sooner.
			wait := b.retry/2 + rand.N(b.retry)
			until := now.Add(wait)
			for _, l := range f.Leases {
				if exp := time.UnixMilli(l.Expires); exp.Before(until) {
					until = exp
				}
			}
			dec = Decision{Outcome: Delayed, Reason: KindInFlight, Until: until}
			return nil, nil
		}
		f.Leases = append(f.Leases, lease{ID: id, Expires: now.Add(b.leaseTTL).UnixMilli()})
		dec = Decision{Outcome: Admitted}
		return json.Marshal(f)
	})
	if errors.Is(err, errContention) {
		return b.contended(now), nil
	}
	if err != nil {
		return Decision{}, err
	}
	if dec.Outcome == Admitted {
		t.flightKey, t.leaseID = key, id
		b.mu.Lock()
		if b.leases[key] == nil {
			b.leases[key] = map[string]*Ticket{}
		}
		b.leases[key][id] = t
		b.mu.Unlock()
	}
	return dec, nil
}

// contended is the decision when the compare-and-set kept losing: try again shortly.
func (b *Budget) contended(now time.Time) Decision {
	return Decision{Outcome: Delayed, Reason: KindContention, Until: now.Add(5*time.Millisecond + rand.N(20*time.Millisecond))}
}

// ---- Ticket ----

// Ticket is one admitted call. Settle it with what the call used and Release it when the call
// is over (both, in either order; each at most once has an effect).
type Ticket struct {
	b      *Budget
	caller string
	rule   limits.Rule

	dayKey             string
	estTokens, estNano int64
	id                 string // the open admission's id (Estimate.ID)

	flightKey, leaseID string

	mu       sync.Mutex
	settled  bool
	released bool
}

// Settle corrects the day budgets from the estimate to what the call actually used, in the
// day the call was admitted, and closes the admission. A call that failed without using
// anything settles with a zero Actual, which refunds the estimate; its decision still counts
// against the rate. An admission with an id settles once: a second Settle of it (another
// delivery of the same run, or a retried write that had landed) finds it closed and changes
// nothing, so a write whose answer was lost is tried again.
func (t *Ticket) Settle(ctx context.Context, actual Actual) error {
	if !t.closeOnce() {
		return nil
	}
	dTokens, dNano := int64(0), int64(0)
	if t.rule.InputTokensPerDay > 0 {
		dTokens = min(max(actual.InputTokens, 0), maxCount) - t.estTokens
	}
	if t.rule.USDPerDay > 0 && actual.USD != nil {
		dNano = nano(*actual.USD) - t.estNano
	} else if t.rule.USDPerDay > 0 {
		dNano = -t.estNano
	}
	if dTokens == 0 && dNano == 0 && t.id == "" {
		return nil // the estimate was right and nothing is open: nothing to write
	}
	key := t.dayKey
	write := func() error {
		return t.b.update(ctx, key, mustLand*t.b.maxAttempts, func(cur []byte) ([]byte, error) {
			if cur == nil {
				return nil, nil // the day's counters are gone (48 h later): nothing to correct
			}
			var c dayCounter
			if err := json.Unmarshal(cur, &c); err != nil {
				return nil, fmt.Errorf("budget: counter %s is unreadable: %w", key, err)
			}
			if t.id != "" {
				i := c.open(t.id)
				if i < 0 {
					return nil, nil // closed already: this settlement landed, or another's did
				}
				c.Open = slices.Delete(c.Open, i, i+1)
			}
			c.Tokens = satAdd(c.Tokens, dTokens)
			c.NanoUSD = satAdd(c.NanoUSD, dNano)
			return json.Marshal(c)
		})
	}
	err := write()
	// Without an id a retry could correct twice; with one it is safe, and a settlement lost
	// in a NATS election would otherwise leave the estimate charged for the day.
	for try := 1; err != nil && t.id != "" && !errors.Is(err, errContention) && try < settleTries; try++ {
		if serr := sleep(ctx, time.Duration(try)*250*time.Millisecond); serr != nil {
			break
		}
		err = write()
	}
	if err != nil {
		return fmt.Errorf("budget: settle %s: %w", t.caller, err)
	}
	return nil
}

// Hold keeps the admission open for the run's next delivery (this one was handed back): that
// delivery is admitted on it — never refused for a budget spent meanwhile, never charged a
// second estimate — and settles it in the end. The admission stays charged at least its
// estimate (more if this delivery used more) while it is open: the run is paid for until it
// ends, so the budget it holds is not admitted to another run in between. (Refunding a
// failed call's estimate here, as an earlier version did, let both the waiting run and the
// one the refund admitted finish: the 60-minute soak's budget paid for 5,444 decisions of
// 5,400.) Without an id (nothing to keep open) it settles.
func (t *Ticket) Hold(ctx context.Context, actual Actual) error {
	if t.id == "" {
		return t.Settle(ctx, actual)
	}
	if !t.closeOnce() {
		return nil
	}
	usedTokens, usedNano := int64(0), int64(0)
	if t.rule.InputTokensPerDay > 0 {
		usedTokens = min(max(actual.InputTokens, 0), maxCount)
	}
	if t.rule.USDPerDay > 0 && actual.USD != nil {
		usedNano = nano(*actual.USD)
	}
	key := t.dayKey
	err := t.b.update(ctx, key, mustLand*t.b.maxAttempts, func(cur []byte) ([]byte, error) {
		if cur == nil {
			return nil, nil
		}
		var c dayCounter
		if err := json.Unmarshal(cur, &c); err != nil {
			return nil, fmt.Errorf("budget: counter %s is unreadable: %w", key, err)
		}
		i := c.open(t.id)
		if i < 0 {
			return nil, nil // closed already: nothing open to correct
		}
		o := &c.Open[i]
		holdTokens, holdNano := max(o.Tokens, usedTokens), max(o.NanoUSD, usedNano)
		if holdTokens == o.Tokens && holdNano == o.NanoUSD {
			return nil, nil // it stays charged as it is
		}
		c.Tokens = satAdd(c.Tokens, holdTokens-o.Tokens)
		c.NanoUSD = satAdd(c.NanoUSD, holdNano-o.NanoUSD)
		o.Tokens, o.NanoUSD = holdTokens, holdNano
		return json.Marshal(c)
	})
	if err != nil {
		return fmt.Errorf("budget: hold %s: %w", t.caller, err)
	}
	return nil
}

// closeOnce marks the ticket settled, reporting whether this call is the one that writes its
// correction (the first, on a ticket with a day charge).
func (t *Ticket) closeOnce() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	first := !t.settled && t.dayKey != ""
	t.settled = true
	return first
}

// settleTries bounds how often a settlement whose write failed is tried (over about 10 s).
const settleTries = 8

// Release frees the call's in-flight slot (a no-op without one). If it fails, the slot is
// freed all the same when its lease lapses, within LeaseTTL: it is no longer extended.
func (t *Ticket) Release(ctx context.Context) error {
	t.mu.Lock()
	if t.released || t.leaseID == "" {
		t.released = true
		t.mu.Unlock()
		return nil
	}
	t.released = true
	t.mu.Unlock()
	b, key, id := t.b, t.flightKey, t.leaseID
	b.mu.Lock()
	delete(b.leases[key], id)
	if len(b.leases[key]) == 0 {
		delete(b.leases, key)
	}
	b.mu.Unlock()
	err := b.update(ctx, key, mustLand*b.maxAttempts, func(cur []byte) ([]byte, error) {
		if cur == nil {
			return nil, nil
		}
		var f flights
		if err := json.Unmarshal(cur, &f); err != nil {
			return nil, fmt.Errorf("budget: in-flight leases %s are unreadable: %w", key, err)
		}
		for i, l := range f.Leases {
			if l.ID == id {
				f.Leases = append(f.Leases[:i], f.Leases[i+1:]...)
				f.live(b.now())
				return json.Marshal(f)
			}
		}
		return nil, nil // lapsed and pruned already
	})
	if err != nil {
		return fmt.Errorf("budget: release %s: %w", t.caller, err)
	}
	return nil
}

// refreshLoop extends this replica's leases every LeaseTTL/3, one compare-and-set per
// in-flight key for all of its leases there.
func (b *Budget) refreshLoop(ctx context.Context) {
	defer close(b.stopped)
	tick := time.NewTicker(b.leaseTTL / 3)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		b.refresh(ctx)
	}
}

// refresh extends every lease this replica holds.
func (b *Budget) refresh(ctx context.Context) {
	b.mu.Lock()
	held := make(map[string][]string, len(b.leases))
	for key, ids := range b.leases {
		for id := range ids {
			held[key] = append(held[key], id)
		}
	}
	b.mu.Unlock()
	for key, ids := range held {
		opCtx, cancel := context.WithTimeout(ctx, b.leaseTTL/3)
		now := b.now()
		var lost []string
		err := b.update(opCtx, key, mustLand*b.maxAttempts, func(cur []byte) ([]byte, error) {
			lost = lost[:0]
			var f flights
			if cur != nil {
				if err := json.Unmarshal(cur, &f); err != nil {
					return nil, fmt.Errorf("budget: in-flight leases %s are unreadable: %w", key, err)
				}
			}
			f.live(now)
			exp := now.Add(b.leaseTTL).UnixMilli()
			for _, id := range ids {
				found := false
				for i := range f.Leases {
					if f.Leases[i].ID == id {
						f.Leases[i].Expires = max(f.Leases[i].Expires, exp)
						found = true
						break
					}
				}
				if !found {
					lost = append(lost, id)
				}
			}
			return json.Marshal(f)
		})
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				b.log.Warn().Err(err).Msg("budget: could not extend in-flight leases; they lapse unless the next try succeeds")
			}
			continue
		}
		if len(lost) > 0 {
			// Lapsed while this replica could not extend them (NATS away for a LeaseTTL): the
			// slots may be someone else's now. Taking them back could break the cap, so the
			// calls run on without a slot and no longer count.
			b.mu.Lock()
			for _, id := range lost {
				delete(b.leases[key], id)
			}
			if len(b.leases[key]) == 0 {
				delete(b.leases, key)
			}
			b.mu.Unlock()
			b.log.Warn().Int("leases", len(lost)).Msg("budget: in-flight leases lapsed before they could be extended")
		}
	}
}
