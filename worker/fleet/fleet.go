// Package fleet asks the worker replicas about themselves over their NATS micro service
// (wire.ServiceName): every replica answers every request on wire.HealthSubject and
// wire.CapabilitiesSubject, so one request gathers the whole fleet. sys1 status, sys1 batch
// (its time estimate) and anything else that wants the fleet's view use it; it needs a NATS
// connection and nothing of the worker.
package fleet

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sys1hq/sys1/contract/wire"
)

// Ask asks every replica on subject (wire.HealthSubject or wire.CapabilitiesSubject) and
// returns their answers, raw. It first pings the service to learn how many replicas there
// are, then waits for that many answers or until wait passes. No replica: no answer, no error.
func Ask(ctx context.Context, nc *nats.Conn, subject string, wait time.Duration) ([][]byte, error) {
	// Pings come back fast; the wait only bounds a slow replica.
	pings, err := Gather(ctx, nc, wire.PingSubject, 0, min(wait, 500*time.Millisecond))
	if err != nil || len(pings) == 0 {
		return nil, err
	}
	return Gather(ctx, nc, subject, len(pings), wait)
}

// Gather sends one request to subject and collects the answers until want have arrived (0:
// until wait passes) or wait passes. Its error is ctx's, or the connection's.
func Gather(ctx context.Context, nc *nats.Conn, subject string, want int, wait time.Duration) ([][]byte, error) {
	inbox := nc.NewRespInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return nil, fmt.Errorf("subscribe to %s: %w", inbox, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishRequest(subject, inbox, nil); err != nil {
		return nil, fmt.Errorf("ask %s: %w", subject, err)
	}
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	var out [][]byte
	for want == 0 || len(out) < want {
		m, err := sub.NextMsgWithContext(wctx)
		if err != nil {
			break // wait passed, no responders, or ctx ended (reported below)
		}
		if len(m.Data) == 0 && m.Header.Get("Status") == "503" {
			break // no responders: no replica is there to answer
		}
		out = append(out, m.Data)
	}
	return out, ctx.Err()
}
