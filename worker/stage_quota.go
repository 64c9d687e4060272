package worker

import (
	"context"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/worker/auth"
	"github.com/sys1hq/sys1/worker/metrics"
)

// quota is the backstop of a caller's pending-request quota. JetStream bounds each subject of
// SYS1_REQUESTS at publish (SYS1_REQUESTS_MAX_PER_CALLER messages), which bounds a caller on
// its own sys1.decide.<caller> exactly; but sys1.decide.<caller>.<more> and every
// sys1.batch.<caller>.<batch id> are subjects of their own, so a caller spreading requests
// over many of them would get the quota once per subject. The fleet watcher counts what each
// caller holds on those further subjects together (storage.go), and as many of them as are
// over the quota are refused as they come, SYS1_QUOTA_EXCEEDED, without calling the model:
// each refusal frees what it held, and other callers are untouched. (Each replica refuses the
// excess it counted, so with several replicas a little more can be refused; never anything
// of a caller under its quota.) Its own subject stays bounded by JetStream alone.
func (r *run) quota(context.Context) error {
	subject := r.msg.Subject()
	if primarySubject(subject) {
		return nil
	}
	token, err := auth.CallerFromSubject(subject)
	if err != nil {
		return nil // admit has judged the subject already
	}
	n, over := r.p.room.overQuota(token)
	if !over {
		return nil
	}
	r.p.metrics.QuotaRefused(metrics.QuotaRequests)
	// Recorded under the derived id: the run id was never claimed, and the caller may send
	// it again once under its quota.
	r.recordID = r.derived
	return contract.Errorf(contract.CodeQuotaExceeded,
		"caller %q has %d requests waiting on subjects other than %s%s (further subject tokens, batches), more than its quota of %d (SYS1_REQUESTS_MAX_PER_CALLER); this one was not run: send fewer at once and try again",
		token, n, "sys1.decide.", token, r.p.topo.RequestsPerCaller)
}
