package budget

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sys1hq/sys1/worker/limits"
)

// Use is one limit of a caller and how much of it is used.
type Use struct {
	Kind  Kind
	Limit float64 // decisions, tokens, USD or calls
	Used  float64 // this minute's decisions, today's tokens or USD (estimates in flight included), calls in flight
	// ResetsAt is when the window ends (the next minute, the next UTC midnight); zero for
	// calls in flight, which have no window.
	ResetsAt time.Time
}

// Usage is a caller's use against the limits of its rule.
type Usage struct {
	Caller string
	Rule   string
	// AdmittedToday counts the calls admitted since 00:00 UTC (under a rule with a rate or
	// a day budget; in-flight caps alone keep no day count).
	AdmittedToday int64
	Uses          []Use
}

// Usage reads caller's counters under rule (for sys1 status). It reads without locking or
// writing: a snapshot, exact as of its reads.
func (b *Budget) Usage(ctx context.Context, caller string, rule limits.Rule) (Usage, error) {
	now := b.now()
	u := Usage{Caller: caller, Rule: rule.Name}
	if rule.DayLimited() {
		day := utcDay(now)
		var c dayCounter
		if err := b.read(ctx, dayKey(caller, rule.Name, day), &c); err != nil {
			return Usage{}, err
		}
		if c.Minute < minuteOf(now) {
			c.Decisions = 0
		}
		u.AdmittedToday = c.Admitted
		if rule.DecisionsPerMinute > 0 {
			u.Uses = append(u.Uses, Use{Kind: KindDecisions, Limit: float64(rule.DecisionsPerMinute), Used: float64(c.Decisions),
				ResetsAt: time.Unix((max(c.Minute, minuteOf(now))+1)*60, 0).UTC()})
		}
		if rule.InputTokensPerDay > 0 {
			u.Uses = append(u.Uses, Use{Kind: KindInputTokens, Limit: float64(rule.InputTokensPerDay), Used: float64(c.Tokens), ResetsAt: day.Add(24 * time.Hour)})
		}
		if rule.USDPerDay > 0 {
			u.Uses = append(u.Uses, Use{Kind: KindUSD, Limit: rule.USDPerDay, Used: float64(c.NanoUSD) / 1e9, ResetsAt: day.Add(24 * time.Hour)})
		}
	}
	if rule.InFlight > 0 {
		var f flights
		if err := b.read(ctx, flightKey(caller, rule.Name), &f); err != nil {
			return Usage{}, err
		}
		f.live(now)
		u.Uses = append(u.Uses, Use{Kind: KindInFlight, Limit: float64(rule.InFlight), Used: float64(len(f.Leases))})
	}
	return u, nil
}

func (b *Budget) read(ctx context.Context, key string, into any) error {
	entry, err := b.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("budget: read %s: %w", key, err)
	}
	if err := json.Unmarshal(entry.Value(), into); err != nil {
		return fmt.Errorf("budget: counter %s is unreadable: %w", key, err)
	}
	return nil
}

// Counted is a caller and rule with counters in the bucket.
type Counted struct {
	Caller string
	Rule   string
}

// Counted lists the callers with counters today or calls in flight, sorted, each with the
// name of the rule its counters are kept under.
func (b *Budget) Counted(ctx context.Context) ([]Counted, error) {
	today := utcDay(b.now()).Format("20060102")
	lister, err := b.kv.ListKeysFiltered(ctx, "d.*.*."+today, "f.*.*")
	if errors.Is(err, jetstream.ErrNoKeysFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("budget: list counters: %w", err)
	}
	defer func() { _ = lister.Stop() }()
	seen := map[Counted]bool{}
	for key := range lister.Keys() {
		parts := strings.Split(key, ".")
		if len(parts) < 3 {
			continue
		}
		caller, ok1 := untoken(parts[1])
		rule, ok2 := untoken(parts[2])
		if ok1 && ok2 {
			seen[Counted{Caller: caller, Rule: rule}] = true
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("budget: list counters: %w", err) // the list stopped short
	}
	out := make([]Counted, 0, len(seen))
	for c := range seen {
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Caller != out[j].Caller {
			return out[i].Caller < out[j].Caller
		}
		return out[i].Rule < out[j].Rule
	})
	return out, nil
}

// Report is every counted caller's use against its rule in l, for sys1 status. Counters kept
// under a rule that is no longer in the file (renamed or removed) are left out: nothing
// limits them any more.
func (b *Budget) Report(ctx context.Context, l *limits.Limits) ([]Usage, error) {
	counted, err := b.Counted(ctx)
	if err != nil {
		return nil, err
	}
	var out []Usage
	for _, c := range counted {
		rule, ok := l.Rule(c.Rule)
		if !ok {
			continue
		}
		u, err := b.Usage(ctx, c.Caller, rule)
		if err != nil {
			return nil, err
		}
		out = append(out, u)
	}
	return out, nil
}
