package chain

import (
	"time"

	"github.com/sys1hq/sys1/contract"
)

// MaxListedRoutes bounds the routes one provider's health lists; the counts cover them all.
const MaxListedRoutes = 50

// RouteSummary is one provider's routes (a model as sent to it, each with its own breaker)
// for health: how many are in each state, and the ones that are not closed.
type RouteSummary struct {
	Counts RouteCounts `json:"counts"`
	// Listed are the routes open, half-open or absent, most recently used first, at most
	// MaxListedRoutes; Unlisted is how many more there are.
	Listed   []RouteHealth `json:"listed"`
	Unlisted int           `json:"unlisted"`
}

// RouteCounts are a provider's routes by state. Closed routes are the models asked for
// lately (the table keeps at most Config.MaxRoutes).
type RouteCounts struct {
	Closed   int `json:"closed"`
	Open     int `json:"open"`
	HalfOpen int `json:"half_open"`
	Absent   int `json:"absent"`
}

// RouteHealth is one route that is not closed.
type RouteHealth struct {
	// Model is the model as sent to the provider (after its model map).
	Model string       `json:"model"`
	State BreakerState `json:"state"`
	// Failures are the consecutive failures counted (0 for an absence).
	Failures int `json:"consecutive_failures"`
	// LastErrorCode is the code of the last failure counted, or SYS1_MODEL_UNAVAILABLE.
	LastErrorCode contract.Code `json:"last_error_code,omitempty"`
	// ReopensAt is when an open route or an absence lets its next trial call through; absent
	// from the JSON once that time has passed (the state then reads half-open).
	ReopensAt *time.Time `json:"reopens_at,omitempty"`
}

// routeSummary reads every route of l now.
func (l *link) routeSummary(now time.Time) RouteSummary {
	s := RouteSummary{Listed: []RouteHealth{}}
	l.routes.each(func(model string, b *breaker) {
		snap := b.snapshot(now)
		switch snap.state {
		case BreakerClosed:
			s.Counts.Closed++
			return
		case BreakerOpen:
			s.Counts.Open++
		case BreakerHalfOpen:
			s.Counts.HalfOpen++
		case BreakerAbsent:
			s.Counts.Absent++
		}
		if len(s.Listed) == MaxListedRoutes {
			s.Unlisted++
			return
		}
		r := RouteHealth{Model: model, State: snap.state, Failures: snap.failures}
		if snap.last != nil {
			r.LastErrorCode = snap.last.Code
		}
		if !snap.reopensAt.IsZero() {
			at := snap.reopensAt.UTC()
			r.ReopensAt = &at
		}
		s.Listed = append(s.Listed, r)
	})
	return s
}
