package worker

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/contract/wire"
	"github.com/sys1hq/sys1/worker/rungate"
)

// Batch manifests. `sys1 batch run` checks every line before it sends any; the lines that fail
// (invalid) are reported and never sent, so neither the run-id gate nor the request stream ever
// learns of them, and `sys1 batch status`, which counts a batch from those two from any
// machine, could not count them. So the runner also publishes the batch's manifest — how many
// items its input has and how many of them are invalid — before its items, on the producer's
// own sys1.decide.<caller> (which the producer may publish to, and which the interactive lane
// serves first, so it is kept at once even while batch work queues or is paused) with header
// Sys1-Batch-Manifest. A worker checks who sent it like a request and keeps it in the gate's
// bucket under BatchManifestKey, where status reads it. The first caller to name a batch id
// owns its manifest (as with run ids); another caller's manifest for it is dropped.

// wire.HeaderBatchManifest marks a batch manifest on sys1.decide.<caller>; its value is the
// manifest's version, "1".

// maxManifestBytes bounds a manifest body: it holds a few numbers.
const maxManifestBytes = 4096

// isBatchManifest reports whether msg is a batch manifest rather than a request.
func isBatchManifest(msg jetstream.Msg) bool {
	return strings.HasPrefix(msg.Subject(), wire.DecidePrefix) && msg.Headers().Get(wire.HeaderBatchManifest) != ""
}

// storeBatchManifest keeps one manifest delivery's manifest and settles the delivery. NATS or
// KV trouble naks it with a growing delay; its last delivery is terminated.
func (w *Worker) storeBatchManifest(ctx context.Context, msg jetstream.Msg) {
	log := w.log.With().Str("subject", msg.Subject()).Logger()
	meta, err := msg.Metadata()
	if err != nil {
		_ = msg.Term()
		return
	}
	log = log.With().Uint64("stream_seq", meta.Sequence.Stream).Uint64("delivery", meta.NumDelivered).Logger()
	m, why := w.checkBatchManifest(ctx, msg)
	if why != "" {
		log.Warn().Str("reason", why).Msg("batch manifest refused; dropped")
		_ = msg.Term()
		return
	}
	kept, err := w.gate.KeepManifest(ctx, m)
	switch {
	case err != nil && int(meta.NumDelivered) < w.opt.Topology.ConsumerMaxDeliver:
		delay := w.cfg.retry().Delay(int(meta.NumDelivered), 0)
		log.Warn().Err(err).Dur("retry_in", delay).Msg("could not store a batch manifest; redelivering")
		_ = msg.NakWithDelay(delay)
		return
	case err != nil:
		log.Error().Err(err).Msg("could not store a batch manifest on its last delivery; dropped (batch status will not count the batch's invalid lines)")
		_ = msg.Term()
		return
	case !kept:
		log.Warn().Str("batch_id", m.BatchID).Str("caller", m.Caller).Msg("batch manifest for a batch id another caller owns; dropped")
	default:
		log.Debug().Str("batch_id", m.BatchID).Int("items", m.Items).Int("invalid", m.Invalid).Msg("batch manifest stored")
	}
	_ = msg.Ack()
}

// checkBatchManifest authenticates a manifest like a request and decodes it; why says what
// is wrong with it.
func (w *Worker) checkBatchManifest(ctx context.Context, msg jetstream.Msg) (rungate.Manifest, string) {
	var m rungate.Manifest
	id, aerr := w.opt.Auth.Authenticate(ctx, msg.Subject(), msg.Headers())
	if aerr != nil {
		return m, aerr.Message
	}
	if len(msg.Data()) > maxManifestBytes {
		return m, fmt.Sprintf("%d bytes (at most %d)", len(msg.Data()), maxManifestBytes)
	}
	d := json.NewDecoder(bytes.NewReader(msg.Data()))
	d.DisallowUnknownFields()
	if err := d.Decode(&m); err != nil {
		return m, "not a manifest: " + err.Error()
	}
	if !wire.ValidBatchID(m.BatchID) {
		return m, fmt.Sprintf("batch_id %q is not a batch id (1–64 of A-Za-z0-9_-)", contract.Echo(m.BatchID))
	}
	if m.Items < 0 || m.Invalid < 0 || m.Invalid > m.Items {
		return m, fmt.Sprintf("inconsistent: %d invalid of %d items", m.Invalid, m.Items)
	}
	m.Caller, m.UpdatedAt = id.Caller, time.Now().UTC()
	return m, ""
}
