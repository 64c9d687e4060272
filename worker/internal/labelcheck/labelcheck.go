// Package labelcheck checks producer labels. A producer that learns the truth about one of its runs later (the refund
// really was requested) publishes a contract.Label on sys1.labels.<caller>. Every replica
// reads those from one shared consumer (topology.LabelsConsumer) and checks each like a
// request: who sent it (the authenticator, exactly as for requests), where it may be answered
// (Sys1-Reply-To, auth.CheckReplyTo), then the label against the run's stored outcome in the
// run-id gate: the run is the sender's (modes subject and jwt), it has finished with answers,
// the question is one of them and the value fits its type (contract.CheckLabel). The outcome
// is published, awaiting JetStream's ack, before anything else:
//
//   - accepted: the checked label on sys1.labels.<token>.accepted (Caller the run's caller,
//     Source "producer"), which the sink stores in ClickHouse sys1.labels;
//   - rejected: contract.LabelRejection on sys1.labels.<token>.rejected, which the sink parks
//     in the dead-letter table with its reason.
//
// Then the sender is answered on Sys1-Reply-To (contract.LabelReply) and the submission is
// acked. Both outcomes carry a Nats-Msg-Id derived from the submission's stream sequence and
// time, so a redelivered submission (a crash before the ack) is not stored twice. NATS or KV
// trouble naks the submission with a growing delay; its last delivery (the consumer's max
// deliver) is answered with the error, so nothing waits without bound and every submission
// ends accepted or rejected. A sender nobody could verify is never answered (like requests),
// but its submission is still recorded as rejected.
//
// Submissions wait on SYS1_LABEL_SUBMISSIONS, a work queue: once checked a submission is
// gone, and only its outcome stays, on SYS1_LABELS (a rejection for SYS1_LABELS_REJECTED_MAX_AGE,
// not the labels' 30 days). A producer with SYS1_LABELS_MAX_PER_CALLER submissions waiting is
// refused at publish by JetStream.
//
// Producer labels are ground truth for analysis only: they never release a held reply (see
// worker/internal/holds); only a person on the review page can.

package labelcheck

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/contract/wire"
	"github.com/sys1hq/sys1/worker/auth"
	"github.com/sys1hq/sys1/worker/internal/outbox"
	"github.com/sys1hq/sys1/worker/rungate"
)

// Checker checks the label submissions a replica is delivered.
type Checker struct {
	Auth auth.Authenticator
	Gate rungate.Gate
	Out  *outbox.Config
	Log  zerolog.Logger
	// AllowAnyInbox lets a verified sender be answered on any _INBOX. subject
	// (SYS1_ALLOW_ANY_INBOX), as requests are.
	AllowAnyInbox bool
	// MaxDeliver is the submissions consumer's: its last delivery is answered with the error.
	MaxDeliver int
	// Retry is the delay before a submission that met NATS or KV trouble comes back.
	Retry func(delivery int) time.Duration
	// RunIDTTL is how long the gate remembers runs (said in a rejection).
	RunIDTTL time.Duration
	// LabelsStream stores the outcomes; a rejection is kept there for RejectedMaxAge.
	LabelsStream   string
	RejectedMaxAge time.Duration
}

// labelSubmission is one delivery of one submitted label, filled in as it is checked.
type labelSubmission struct {
	c    *Checker
	msg  jetstream.Msg
	meta *jetstream.MsgMetadata
	log  zerolog.Logger
	// token is the caller token of the subject: the outcome goes to sys1.labels.<token>.….
	token    string
	identity auth.Identity
	// verified: somebody verified sent it (only then may it be answered).
	verified bool
	replyTo  string
	label    *contract.Label // as submitted, once decoded
}

// Check settles one submitted label: acked once its outcome is stored and its sender
// answered, nak'ed with the retry delay on NATS or KV trouble, answered with that error on its
// last delivery.
func (c *Checker) Check(ctx context.Context, msg jetstream.Msg) {
	meta, err := msg.Metadata()
	if err != nil {
		c.Log.Error().Err(err).Str("subject", msg.Subject()).Msg("label without JetStream metadata; terminated")
		_ = msg.Term()
		return
	}
	s := &labelSubmission{c: c, msg: msg, meta: meta,
		log: c.Log.With().Str("subject", msg.Subject()).Uint64("labels_seq", meta.Sequence.Stream).Uint64("delivery", meta.NumDelivered).Logger()}
	token, terr := auth.CallerFromSubject(msg.Subject())
	if terr != nil || !strings.HasPrefix(msg.Subject(), wire.LabelsPrefix) {
		// The consumer's filter makes this unreachable: nowhere to record an outcome.
		s.log.Error().Msg("label on a subject without a caller token; terminated")
		_ = msg.Term()
		return
	}
	s.token = token
	out, cerr, err := s.check(ctx)
	last := int(meta.NumDelivered) >= c.MaxDeliver
	if err != nil {
		if !last {
			delay := c.Retry(int(meta.NumDelivered))
			s.log.Warn().Err(err).Dur("retry_in", delay).Msg("could not check a label; redelivering")
			_ = msg.NakWithDelay(delay)
			return
		}
		s.log.Error().Err(err).Msg("could not check a label on its last delivery; rejecting it")
		out, cerr = nil, contract.Wrap(contract.CodeInternal, err,
			"the label could not be checked: its run could not be read in %d deliveries (NATS or its KV store unavailable); nothing was stored: submit it again", meta.NumDelivered)
	}
	if err := s.conclude(ctx, out, cerr); err != nil {
		if !last {
			delay := c.Retry(int(meta.NumDelivered))
			s.log.Warn().Err(err).Dur("retry_in", delay).Msg("could not record a label's outcome; redelivering")
			_ = msg.NakWithDelay(delay)
			return
		}
		// Terminated, the submission leaves the work queue: the log line is what remains.
		s.log.Error().Err(err).Msg("could not record a label's outcome on its last delivery; the submission is dropped unchecked")
		_ = msg.Term()
		return
	}
	_ = msg.Ack()
}

// check decides the submission: the label to accept, or why it is rejected. err is NATS or KV
// trouble (nothing decided).
func (s *labelSubmission) check(ctx context.Context) (*contract.Label, *contract.Error, error) {
	c, hdr := s.c, s.msg.Headers()
	identity, aerr := c.Auth.Authenticate(s.log.WithContext(ctx), s.msg.Subject(), hdr)
	if aerr != nil && (aerr.Code != contract.CodeForbidden || identity.Kind != contract.CallerKindJWT || identity.Caller == "") {
		identity = auth.Identity{} // as in admit: only a verified jwt caller refused for its roles is known
	}
	if identity.Subject == "" {
		identity.Subject = s.msg.Subject()
	}
	s.identity, s.verified = identity, identity.Kind != ""
	s.replyTo = hdr.Get(wire.HeaderReplyTo)
	if !s.verified {
		s.replyTo = "" // never answer anyone unverified: recorded as rejected, not answered
	}
	if cerr := auth.CheckReplyTo(identity, s.replyTo, auth.ReplyPolicy{AnyInbox: c.AllowAnyInbox}); cerr != nil {
		s.replyTo = ""
		return nil, cerr, nil
	}
	if aerr != nil {
		return nil, aerr, nil
	}
	l, derr := contract.DecodeLabel(s.msg.Data())
	if derr != nil {
		return nil, derr, nil
	}
	s.label = l
	s.log = s.log.With().Str("caller", identity.Caller).Str("run_id", l.RunID).Logger()
	if l.Source == contract.LabelSourceReview {
		return nil, labelProblem("source", fmt.Sprintf("producers submit labels with source %q (or none); %q labels come from the review page only", contract.LabelSourceProducer, contract.LabelSourceReview)), nil
	}
	st, _, err := c.Gate.Lookup(ctx, l.RunID)
	if errors.Is(err, rungate.ErrUnreadable) {
		return nil, contract.Wrap(contract.CodeInternal, err, "the stored outcome of run %q cannot be read; the label was not stored", l.RunID), nil
	}
	if err != nil {
		return nil, nil, err
	}
	// Another caller's run reads exactly like no run: a label must not tell anyone which
	// run ids others use.
	if st == nil || !auth.SameOwner(st.Caller, identity) {
		return nil, labelProblem("run_id", fmt.Sprintf("no run %q of yours is known (the run-id gate remembers runs for %s)", l.RunID, c.RunIDTTL)), nil
	}
	if st.Status != rungate.StatusDone {
		return nil, labelProblem("run_id", fmt.Sprintf("run %q has not finished yet; label it once it has been answered", l.RunID)), nil
	}
	var reply contract.Reply
	if err := json.Unmarshal(st.Reply, &reply); err != nil {
		return nil, contract.Wrap(contract.CodeInternal, err, "the stored outcome of run %q cannot be read; the label was not stored", l.RunID), nil
	}
	if reply.Result == nil {
		code := "an error"
		if reply.Error != nil {
			code = string(reply.Error.Code)
		}
		return nil, labelProblem("run_id", fmt.Sprintf("run %q failed (%s): it has no answers to label", l.RunID, code)), nil
	}
	answer := contract.AnswerNamed(reply.Result.Answers, l.Question)
	if answer == nil {
		return nil, labelProblem("question", fmt.Sprintf("run %q has no question %q (its questions: %s)", l.RunID, contract.Echo(l.Question), questionNames(reply.Result.Answers))), nil
	}
	text, cerr := contract.CheckLabel(*answer, l.Value)
	if cerr != nil {
		return nil, cerr, nil
	}
	out := &contract.Label{
		RunID: l.RunID, Question: answer.Name, Value: canonicalLabel(answer.Type, l.Value, text),
		Reviewer: l.Reviewer, LabelledAt: l.LabelledAt, Source: contract.LabelSourceProducer, Caller: st.Caller,
	}
	if out.Reviewer == "" {
		out.Reviewer = identity.Caller
	}
	if out.LabelledAt.IsZero() {
		// The submission's own time, not now: a redelivery builds the very same label.
		out.LabelledAt = s.meta.Timestamp.UTC()
	}
	return out, nil, nil
}

// labelProblem is a SYS1_INVALID_INPUT naming one problem with its path, worded like
// contract.DecodeLabel's and contract.CheckLabel's.
func labelProblem(path, msg string) *contract.Error {
	ps := contract.Problems{{Path: path, Message: msg}}
	return contract.Wrap(contract.CodeInvalidInput, ps, "invalid label: %s", ps.Error())
}

// questionNames lists a run's question names for an error message, bounded.
func questionNames(answers []contract.Answer) string {
	var sb strings.Builder
	for i, a := range answers {
		if i > 0 {
			sb.WriteString(", ")
		}
		if i == 8 {
			fmt.Fprintf(&sb, "… %d more", len(answers)-i)
			break
		}
		sb.WriteString(contract.Echo(a.Name))
	}
	return sb.String()
}

// canonicalLabel is the stored form of a checked label value (text is what CheckLabel
// returned): a choice key as a JSON string, true/false, a level index as an integer, null.
func canonicalLabel(t contract.QuestionType, value json.RawMessage, text string) json.RawMessage {
	if v := strings.TrimSpace(string(value)); v == "null" {
		return json.RawMessage("null")
	}
	if t == contract.TypeChoice {
		return json.RawMessage(contract.AppendJSONString(nil, text))
	}
	return json.RawMessage(text)
}

// conclude publishes the outcome (accepted label or rejection) and then answers the sender.
func (s *labelSubmission) conclude(ctx context.Context, out *contract.Label, cerr *contract.Error) error {
	c := s.c
	var reply contract.LabelReply
	if s.label != nil {
		reply.RunID, reply.Question = s.label.RunID, s.label.Question
	}
	subject, status := wire.LabelAccepted(s.token), contract.LabelAccepted
	var body []byte
	if out != nil {
		body, _ = out.MarshalJSON()
		reply.Question, reply.Label = out.Question, out.Value
	} else {
		subject, status = wire.LabelRejected(s.token), contract.LabelRejected
		caller := ""
		if s.verified {
			caller = s.identity.Caller
		}
		rej := contract.NewLabelRejection(s.msg.Data(), caller, s.msg.Subject(), s.meta.Sequence.Stream, cerr, time.Now())
		if body, _ = rej.MarshalJSON(); len(body) > contract.MaxLabelBytes {
			// The stream takes nothing larger than a label: keep the rejection, without the
			// submission's copy (its size and SHA-256 still identify it).
			rej.Submission = nil
			body, _ = rej.MarshalJSON()
		}
		reply.Error = cerr
	}
	reply.Status = status
	// One id for either outcome: a submission is recorded once, whichever its redelivery
	// would conclude.
	id := "label:" + strconv.FormatUint(s.meta.Sequence.Stream, 10) + ":" + strconv.FormatInt(s.meta.Timestamp.UnixNano(), 36)
	o := c.Out.For(s.msg, s.log) // retried in place, the delivery kept alive
	m := &nats.Msg{Subject: subject, Data: body, Header: nats.Header{}}
	if s.label != nil {
		m.Header.Set(wire.HeaderRunID, s.label.RunID)
	}
	opts := []jetstream.PublishOpt{jetstream.WithMsgID(id)}
	if out == nil {
		// Kept for the sink's dead-letter table as long as run records wait for the sink,
		// not the labels' 30 days.
		opts = append(opts, jetstream.WithMsgTTL(c.RejectedMaxAge))
	}
	if err := o.Publish(ctx, "publish the checked label", c.LabelsStream, m, opts...); err != nil {
		return fmt.Errorf("publish to %s: %w", subject, err)
	}
	ev := s.log.Info()
	if cerr != nil {
		ev = ev.Str("error_code", string(cerr.Code)).Str("reason", cerr.Message)
	} else {
		ev = ev.Str("question", out.Question)
	}
	ev.Str("status", status).Bool("answered", s.replyTo != "").Msg("label checked")
	if s.replyTo == "" {
		return nil
	}
	rb, _ := reply.MarshalJSON()
	m = &nats.Msg{Subject: s.replyTo, Data: rb, Header: nats.Header{}}
	if reply.RunID != "" {
		m.Header.Set(wire.HeaderRunID, reply.RunID)
	}
	m.Header.Set(wire.HeaderStatus, status)
	if cerr != nil {
		m.Header.Set(wire.HeaderErrorCode, string(cerr.Code))
	}
	if err := o.Reply(ctx, m, "reply:"+id); err != nil {
		return fmt.Errorf("label reply: %w", err)
	}
	return nil
}
