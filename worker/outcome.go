package worker

import (
	"time"

	"github.com/sys1hq/sys1/contract"
)

// replyFor builds the reply of a run that ended with resp (success) or cerr (failure).
func (r *run) replyFor(resp *contract.Response, cerr *contract.Error, finished time.Time) contract.Reply {
	started := r.startedAt()
	published := r.publishedAt()
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
	if cerr == nil && resp != nil {
		// Probabilities are model-specific: the result names who answered with what — the
		// model the provider reports it ran, else the one sent to it.
		model := resp.Model
		if model == "" {
			model = r.answeredModel
		}
		if model == "" && r.resolved != nil {
			model = r.resolved.Model
		}
		reply.Status = contract.StatusSuccess
		reply.Result = &contract.Result{Provider: r.provider(), Model: model, Answers: resp.Answers, Usage: resp.Usage}
		reply.Verdicts, reply.Review = r.verdicts, r.review
		return reply
	}
	if cerr == nil {
		cerr = contract.Errorf(contract.CodeInternal, "the run ended without an answer or an error")
	}
	reply.Status, reply.Error = contract.StatusFailed, cerr
	return reply
}

// provenance is what a record says about who finished the run, where, and for whom: the
// run's own when it finishes now, the stored one when its record is written again (replay).
type provenance struct {
	identity   contract.RunRecord // Caller, CallerKind, Roles, Scopes only
	costUSD    *float64
	cacheHit   bool
	deliveries int
	provider   string
	worker     string
	version    string
	replyTo    string
}

// provenanceNow is the provenance of a run finishing in this delivery.
func (r *run) provenanceNow() provenance {
	p := provenance{provider: r.provider(), worker: r.p.cfg.ID, version: r.p.version, replyTo: r.replyTo,
		costUSD: r.costUSD(), cacheHit: r.cacheHit}
	p.identity.Caller, p.identity.CallerKind = r.identity.Caller, r.identity.Kind
	p.identity.Roles, p.identity.Scopes = r.identity.Roles, r.identity.Scopes
	if r.meta != nil {
		p.deliveries = int(r.meta.NumDelivered)
	}
	return p
}

// recordFor builds the run record that goes with reply.
func (r *run) recordFor(reply *contract.Reply, finished time.Time, p provenance) contract.RunRecord {
	var seq uint64
	if r.meta != nil {
		seq = r.meta.Sequence.Stream
	}
	rec := contract.RunRecord{
		SchemaVersion:  contract.RecordSchemaVersion,
		RunID:          r.recordID,
		Caller:         p.identity.Caller,
		CallerKind:     p.identity.CallerKind,
		Roles:          p.identity.Roles,
		Scopes:         p.identity.Scopes,
		Subject:        r.msg.Subject(),
		StreamSeq:      seq,
		Deliveries:     p.deliveries,
		PublishedAt:    r.publishedAt().UTC(),
		StartedAt:      r.startedAt().UTC(),
		FinishedAt:     finished.UTC(),
		QueuedMS:       reply.QueuedMS,
		LatencyMS:      reply.LatencyMS,
		Provider:       p.provider,
		RequestedModel: r.requested,
		Attempts:       reply.Attempts,
		ReplyTo:        p.replyTo,
		Worker:         p.worker,
		Version:        p.version,
		Status:         reply.Status,
		Result:         reply.Result,
		Verdicts:       reply.Verdicts,
		Review:         reply.Review,
		CostUSD:        p.costUSD,
		CacheHit:       p.cacheHit,
		BatchID:        r.batchID,
		ItemID:         r.itemID,
		TraceID:        r.obs.traceID,
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
	if rec.Attempts == nil {
		rec.Attempts = []contract.Attempt{}
	}
	if r.resolved != nil {
		redacted := contract.Redact(r.resolved)
		rec.Model = r.resolved.Model
		rec.Images = make([]contract.ImageRef, 0, len(redacted.Images))
		for _, im := range redacted.Images {
			rec.Images = append(rec.Images, im.Ref())
		}
		if !r.omitRequest {
			rec.Request = redacted
		}
	}
	if reply.Result != nil && reply.Result.Model != "" {
		rec.Model = reply.Result.Model // who answered with what, like the reply
	}
	if reply.Error != nil {
		rec.ErrorCode, rec.ErrorStatus, rec.ErrorMessage = reply.Error.Code, reply.Error.Status, reply.Error.Message
	}
	// SYS1_RECORD_STATE applies where the record is made: SYS1_RUNS holds the form ClickHouse
	// will (the sink applies it again, which changes nothing).
	return *rec.RedactContent(r.p.cfg.RecordState)
}

// provider is the provider the record names: the one that answered, else the last one
// called, else the chain's first.
func (r *run) provider() string {
	if r.answeredBy != "" {
		return r.answeredBy
	}
	for i := len(r.attempts) - 1; i >= 0; i-- {
		if a := r.attempts[i]; a.Outcome != contract.OutcomeSkipped && a.Provider != "" {
			return a.Provider
		}
	}
	return r.p.chain.Names()[0]
}

// startedAt is when the run first started (its first delivery's claim), or this delivery's
// start when it never reached the gate.
func (r *run) startedAt() time.Time {
	if r.state != nil && !r.state.StartedAt.IsZero() {
		return r.state.StartedAt
	}
	if r.finished != nil && !r.finished.StartedAt.IsZero() {
		return r.finished.StartedAt
	}
	return r.start
}

func (r *run) publishedAt() time.Time {
	if r.meta == nil {
		return time.Time{}
	}
	return r.meta.Timestamp
}
