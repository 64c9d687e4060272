package main

import (
	"context"
	"time"

	"github.com/failsafe-go/failsafe-go/adaptivelimiter"

	"github.com/sys1hq/sys1/provider/limit"
)

// failsafe puts failsafe-go's adaptive limiter behind limit.Limiter, as the worker would use
// it. Its time windows (1 s to 30 s by default) are scaled like the server; tuned also
// shortens its sampling to 10 results, since at 2 slots a replica completes a call only
// every few seconds and the default 50 results would take minutes per adjustment.
//
// What cannot be mapped: the library measures each permit's duration itself (there is no
// way to hand it a latency divided by the call's size), and its Drop releases a permit
// without recording anything, so a timeout or a 429/503 does not decrease its limit.
func failsafe(tuned bool) contender {
	return contender{name: failsafeName(tuned), new: func(o options, _ int) (limit.Limiter, error) {
		scaled := func(d time.Duration) time.Duration { return time.Duration(float64(d) * o.scale) }
		samples := uint(50)
		if tuned {
			samples = 10
		}
		l := adaptivelimiter.NewBuilder[any]().
			WithLimits(1, uint(o.max), 1).
			WithRecentWindow(scaled(time.Second), scaled(30*time.Second), samples).
			Build()
		return &failsafeLimiter{l: l}, nil
	}}
}

func failsafeName(tuned bool) string {
	if tuned {
		return "failsafe-go v0.9.8, 10-sample windows"
	}
	return "failsafe-go v0.9.8, defaults"
}

type failsafeLimiter struct {
	l adaptivelimiter.AdaptiveLimiter[any]
}

func (f *failsafeLimiter) Acquire(ctx context.Context) (limit.Token, error) {
	p, err := f.l.AcquirePermit(ctx)
	if err != nil {
		return nil, err
	}
	return failsafePermit{p}, nil
}

func (f *failsafeLimiter) Limit() int    { return f.l.Limit() }
func (f *failsafeLimiter) InFlight() int { return f.l.Inflight() }

type failsafePermit struct{ p adaptivelimiter.Permit }

func (t failsafePermit) Release(r limit.Result) {
	if r.Ignore || r.Dropped {
		t.p.Drop() // the library's only other outcome: release without a sample
		return
	}
	t.p.Record()
}
