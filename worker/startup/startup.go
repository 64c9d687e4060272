// Package startup lets a component's start-up ride out a NATS failover. What a worker, a sink
// or the review page sets up before it can work — streams, buckets, consumers — is retried with
// a growing, jittered back-off while JetStream answers "not now" (a timeout, no responders, a
// stream or the meta group without a leader, too few peers while a node is down), and given up
// at once when it answers "never" (a permission the server refuses, a configuration JetStream
// cannot accept). The first is a passing leader election and must not look like a
// misconfiguration to an operator (exit status 2) nor crash-loop a pod exactly when the fleet
// needs its replicas; the second is one and should stop the process with its reason.
package startup

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// Transient reports whether err is one a later try can get past without anyone changing
// anything: the API timed out or had no responder (a stream or meta leader being elected, a
// node down), the connection is reconnecting, or JetStream said it is temporarily unable
// (cluster unavailable, no leader, an asset offline, too few peers for an R3 placement while
// a node is down). Everything else — a permission refused, a configuration JetStream rejects,
// sys1's own "exists with another retention" — is permanent.
//
// A context that ended is not transient: the caller's own context ending means stop.
func Transient(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, nats.ErrPermissionViolation) || errors.Is(err, nats.ErrAuthorization) {
		return false
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		return transientCodes[apiErr.ErrorCode]
	}
	for _, e := range []error{
		context.DeadlineExceeded, // one API call's own timeout (jetstream's 5 s default)
		nats.ErrTimeout, nats.ErrNoResponders, jetstream.ErrNoStreamResponse,
		nats.ErrConnectionReconnecting, nats.ErrDisconnected, nats.ErrStaleConnection, nats.ErrNoServers,
	} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// transientCodes are the JetStream API errors (server/errors.json) that say "not now".
var transientCodes = map[jetstream.ErrorCode]bool{
	10004: true, // incomplete results
	10005: true, // no suitable peers for placement: an R3 asset with a node down
	10007: true, // JetStream cluster not assigned to this server (yet)
	10008: true, // JetStream system temporarily unavailable: no meta leader
	10009: true, // JetStream cluster can not handle request: not the leader
	10023: true, // insufficient resources: too few peers up to place an asset
	10041: true, // a raft error
	10075: true, // peer remap failed
	10077: true, // stream store failed (a node's store recovering)
	10118: true, // stream is offline
	10119: true, // consumer is offline
	10163: true, // expected last sequence per subject temporarily unavailable
	10194: true, // stream is offline: reason
	10195: true, // consumer is offline: reason
	10202: true, // cluster member change in progress
}

// Retry runs a set-up step until it succeeds, fails permanently or its context ends.
type Retry struct {
	// What names the step in the log ("the JetStream topology").
	What string
	// Log receives one warning per failed try, saying what failed and when the next try is.
	Log zerolog.Logger
	// Min and Max bound the back-off between tries [500ms, 10s]; it doubles each time, ±20%.
	Min, Max time.Duration
	// PerTry, when set, bounds one whole try. Unset, each JetStream API call inside a try is
	// bounded by jetstream's own timeout (5 s), which is what cuts a hung request short: a
	// deadline over the whole try would let one unanswered request hold up the retry that
	// long (two replicas creating the same R3 bucket at once on a fresh cluster, one got no
	// answer for as long as the caller was willing to wait).
	PerTry time.Duration
	// LastError, when set, is the connection's last asynchronous error (nats.Conn.LastError).
	// A request the server refused for permissions is never answered, so it ends as a
	// timeout: with this, a timeout behind a permissions violation is permanent, as it is.
	LastError func() error
	// OnWait, when set, is told of each transient failure and the wait before the next try
	// (the command layer shows it on /readyz).
	OnWait func(err error, wait time.Duration)
}

// Do runs step until it returns nil (Do returns nil), a permanent error (returned at once), or
// ctx ends (the last error, wrapped with ctx's).
func (r Retry) Do(ctx context.Context, step func(ctx context.Context) error) error {
	lo, hi := r.Min, r.Max
	if lo <= 0 {
		lo = 500 * time.Millisecond
	}
	if hi < lo {
		hi = max(10*time.Second, lo)
	}
	wait := lo
	started := time.Now()
	for attempt := 1; ; attempt++ {
		tctx, cancel := ctx, context.CancelFunc(func() {})
		if r.PerTry > 0 {
			tctx, cancel = context.WithTimeout(ctx, r.PerTry)
		}
		err := step(tctx)
		cancel()
		if err == nil {
			if attempt > 1 {
				r.Log.Info().Int("attempts", attempt).Dur("waited", time.Since(started).Round(time.Millisecond)).Msg(r.What + " set up after waiting for NATS")
			}
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%s: %w (gave up: %w)", r.What, err, ctx.Err())
		}
		if !Transient(err) {
			return err
		}
		if r.LastError != nil && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout)) {
			if last := r.LastError(); errors.Is(last, nats.ErrPermissionViolation) {
				return fmt.Errorf("%w (the NATS server refused: %v; check this user's permissions)", err, last)
			}
		}
		d := jitter(wait)
		r.Log.Warn().Err(err).Int("attempt", attempt).Dur("retry_in", d).
			Msg("cannot set up " + r.What + " yet (NATS is failing over or a node is down); not ready, retrying")
		if r.OnWait != nil {
			r.OnWait(err, d)
		}
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%s: %w (gave up: %w)", r.What, err, ctx.Err())
		case <-t.C:
		}
		wait = min(2*wait, hi)
	}
}

// jitter spreads d by ±20%, so replicas started together do not retry in lockstep.
func jitter(d time.Duration) time.Duration {
	return d + time.Duration((rand.Float64()*0.4-0.2)*float64(d))
}
