package worker

import (
	"context"
	"errors"
	"strings"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/contract/wire"
	"github.com/sys1hq/sys1/worker/auth"
)

// errNotJetStream is a message without JetStream metadata: nothing to reply to, nothing to
// record under. settle terminates it (a permanent error), and publish skips it.
var errNotJetStream = contract.Errorf(contract.CodeInvalidInput, "message without JetStream metadata")

// admit establishes who sent the request and where it may be answered. Identity comes first:
// nothing else about a request matters until we know who sent it.
func (r *run) admit(ctx context.Context) error {
	p := r.p
	meta, err := r.msg.Metadata()
	if err != nil {
		r.log.Error().Err(err).Msg("message without JetStream metadata; terminating it")
		return errNotJetStream
	}
	r.meta = meta
	hdr := r.msg.Headers()
	r.derived = derivedRunID(p.topo.RequestsStream, meta.Sequence.Stream, p.epoch())
	r.runID = runIDOf(hdr, r.derived)
	r.recordID = r.runID
	r.log = p.log.With().Str("run_id", r.runID).Uint64("stream_seq", meta.Sequence.Stream).Uint64("delivery", meta.NumDelivered).Logger()

	// The authenticator logs through the context's logger (a JWKS refresh a token caused), so
	// its lines carry this run's run_id.
	identity, aerr := p.auth.Authenticate(r.log.WithContext(ctx), r.msg.Subject(), hdr)
	if aerr != nil && (aerr.Code != contract.CodeForbidden || identity.Kind != contract.CallerKindJWT || identity.Caller == "") {
		// Only a verified jwt caller refused for its roles and scopes keeps its identity (the
		// record says who was refused); any other refusal has no verified caller.
		identity = auth.Identity{}
	}
	if identity.Subject == "" {
		// A refused caller comes back without an identity; its subject still bounds where it
		// may be answered (CheckReplyTo).
		identity.Subject = r.msg.Subject()
	}
	r.identity = identity
	r.replyTo = hdr.Get(wire.HeaderReplyTo)
	if aerr != nil && identity.Kind == "" {
		// Nobody verified sent this: answering it would let anyone make the worker publish a
		// reply, with a run id of their choosing, to a subject of their choosing. The refusal
		// is recorded (under the derived id), never sent.
		r.replyTo = ""
	}
	if cerr := auth.CheckReplyTo(identity, r.replyTo, auth.ReplyPolicy{AnyInbox: p.cfg.AllowAnyInbox}); cerr != nil {
		r.replyTo = "" // never answer on a subject we refused
		r.recordID = r.derived
		return cerr
	}
	if aerr != nil {
		// The caller is unverified or not allowed, so it cannot own the run id it sent: record
		// under the derived id so a forged or refused request can never overwrite a real run's
		// record.
		r.recordID = r.derived
		return aerr
	}
	r.log = r.log.With().Str("caller", identity.Caller).Logger()
	if id := hdr.Get(wire.HeaderRunID); id != "" && !ValidRunID(id) {
		return contract.Errorf(contract.CodeInvalidInput, "%s: must be 1–128 of A-Za-z0-9._:- (got %d bytes); the run was recorded as %s", wire.HeaderRunID, len(id), r.derived)
	}
	return r.admitBatch()
}

// admitBatch names a batch item's batch and item. A batch request is published on
// sys1.batch.<caller>.<batch id> with run id <batch id>:<item id>; anything else there is
// refused (and recorded under the derived id, so it cannot overwrite a real run's record).
func (r *run) admitBatch() error {
	rest, ok := strings.CutPrefix(r.msg.Subject(), wire.BatchPrefix)
	if !ok {
		return nil
	}
	_, batchID, _ := strings.Cut(rest, ".")
	if batchID == "" || strings.Contains(batchID, ".") {
		r.recordID = r.derived
		return contract.Errorf(contract.CodeInvalidInput, "batch requests go to %s<caller>.<batch id>, not %q", wire.BatchPrefix, contract.Echo(r.msg.Subject()))
	}
	item, ok := strings.CutPrefix(r.runID, batchID+":")
	if !ok || item == "" || r.runID == r.derived {
		r.recordID = r.derived
		return contract.Errorf(contract.CodeInvalidInput, "%s: a batch item's run id is <batch id>:<item id> (%s:…), got %q", wire.HeaderRunID, batchID, contract.Echo(r.runID))
	}
	r.batchID, r.itemID = batchID, item
	return nil
}

// isNotJetStream reports whether err is admit's refusal of a message without metadata.
func isNotJetStream(err error) bool { return errors.Is(err, errNotJetStream) }
