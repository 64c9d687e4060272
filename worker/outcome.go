package worker

import (
	"time"

	"github.com/sys1hq/sys1/contract"
)

// outcome builds the reply and the run record.
func (r *run) outcome(resp *contract.Response, cerr *contract.Error, finished time.Time) (contract.Reply, contract.RunRecord) {
	w := r.w
	started := r.start
	if r.state != nil && !r.state.StartedAt.IsZero() {
		started = r.state.StartedAt
	}
	var published time.Time
	var seq uint64
	var deliveries int
	if r.meta != nil {
		published, seq, deliveries = r.meta.Timestamp, r.meta.Sequence.Stream, int(r.meta.NumDelivered)
	}
	queued := max(started.Sub(published).Milliseconds(), 0)
	if published.IsZero() {
		queued = 0
	}
	reply := contract.Reply{
		RunID:     r.runID,
		Attempts:  r.attempts,
		QueuedMS:  queued,
		LatencyMS: max(finished.Sub(started).Milliseconds(), 0),
	}
	if reply.Attempts == nil {
		reply.Attempts = []contract.Attempt{}
	}
	rec := contract.RunRecord{
		SchemaVersion:  contract.RecordSchemaVersion,
		RunID:          r.recordID,
		Caller:         r.identity.Caller,
		CallerKind:     r.identity.Kind,
		Roles:          r.identity.Roles,
		Scopes:         r.identity.Scopes,
		Subject:        r.msg.Subject(),
		StreamSeq:      seq,
		Deliveries:     deliveries,
		PublishedAt:    published.UTC(),
		StartedAt:      started.UTC(),
		FinishedAt:     finished.UTC(),
		QueuedMS:       reply.QueuedMS,
		LatencyMS:      reply.LatencyMS,
		Provider:       w.opt.Provider.Name(),
		RequestedModel: r.requested,
		Attempts:       reply.Attempts,
		ReplyTo:        r.replyTo,
		Worker:         w.cfg.ID,
		Version:        w.opt.Version,
	}
	if rec.CallerKind == "" {
		// Refused before any caller was verified: SPEC §6 knows only subject, jwt and
		// anonymous, and an unverified caller is anonymous (its caller stays empty).
		rec.CallerKind = contract.CallerKindAnonymous
	}
	if rec.Roles == nil {
		rec.Roles = []string{}
	}
	if rec.Scopes == nil {
		rec.Scopes = []string{}
	}
	if r.resolved != nil {
		redacted := contract.Redact(r.resolved)
		rec.Request = redacted
		rec.Model = r.resolved.Model
		rec.Images = make([]contract.ImageRef, 0, len(redacted.Images))
		for _, im := range redacted.Images {
			rec.Images = append(rec.Images, im.Ref())
		}
	}
	if cerr == nil && resp != nil {
		model := resp.Model
		if model == "" && r.resolved != nil {
			model = r.resolved.Model
		}
		res := &contract.Result{Provider: w.opt.Provider.Name(), Model: model, Answers: resp.Answers, Usage: resp.Usage}
		reply.Status, reply.Result = contract.StatusSuccess, res
		rec.Status, rec.Result = contract.StatusSuccess, res
		return reply, rec
	}
	if cerr == nil {
		cerr = contract.Errorf(contract.CodeInternal, "the run ended without an answer or an error")
	}
	reply.Status, reply.Error = contract.StatusFailed, cerr
	rec.Status = contract.StatusFailed
	rec.ErrorCode, rec.ErrorStatus, rec.ErrorMessage = cerr.Code, cerr.Status, cerr.Message
	return reply, rec
}
