package worker

import (
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/sys1hq/sys1/worker/internal/outbox"
)

// Publishing is the outbox's (worker/internal/outbox): everything a delivery writes — a run's
// outcome in the gate, its record, its reply and its review items, a checked label and the
// label's reply, a released hold's reply — is retried in place there, the delivery kept
// alive, and a refusal for room classified once (storage.go). A run's writer is r.out(); the
// label and hold loops take one for their own deliveries.

// outbox is the writer for msg's delivery, logging to log.
func (p *pipeline) outbox(msg jetstream.Msg, log zerolog.Logger) outbox.Writer {
	return p.out.For(msg, log)
}
