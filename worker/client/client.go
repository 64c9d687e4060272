// Package client is the Go producer side of sys1: publish a System One request to
// sys1.decide.<caller> and, optionally, await its reply.
//
//	nc, _ := nats.Connect(url, nats.CustomInboxPrefix("_INBOX.billing")) // an inbox this user may read
//	c, _ := client.New(nc)
//	reply, err := c.Decide(ctx, client.Request{Caller: "billing", Body: body})
//	if err != nil { ... }           // no reply: ErrNoStream, ErrNoLeader (publish again), ErrDuplicate (an earlier publish of this run id gets it), ErrQuotaExceeded, ErrStreamFull, transport trouble
//	if reply.Status == "failed" { ... reply.Error.Code ... }
//	runID, err := c.Publish(ctx, client.Request{Caller: "billing", Body: body}) // fire and forget
//
// Every request carries a W3C traceparent: ctx's span context when the producer traces
// (OpenTelemetry), else a fresh trace of its own, so the worker's spans and the run record's
// trace_id join the producer's trace.
//
// See ExampleClient_Decide for a complete, tested program.
package client

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
	"github.com/nats-io/nuid"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/contract/wire"
	"github.com/sys1hq/sys1/worker/topology"
	"github.com/sys1hq/sys1/worker/tracing"
)

// The headers and subjects the client sets and reads are contract/wire's (wire.HeaderRunID,
// wire.Decide, …): one home for every name on the bus, which producers import too.

// ErrNoStream means nothing stores requests on that subject: no worker has created the
// SYS1_REQUESTS stream yet (or NATS permissions hide it).
var ErrNoStream = errors.New("no JetStream stream accepts sys1.decide.*: is a sys1 worker running against this NATS?")

// ErrNoLeader means the stream that stores requests on the subject exists but could not take
// this one: it has no leader right now (a NATS node died and its replicas are electing one,
// which takes seconds). Nothing was stored; publish again.
var ErrNoLeader = errors.New("the request stream has no leader right now (a NATS election); nothing was stored: publish again")

// NoStream tells, for a publish to subject that got no responder (err), whether no stream
// stores that subject at all (ErrNoStream) or the stream is between leaders (ErrNoLeader, a
// retry succeeds in a few seconds), by asking JetStream which stream holds the subject. When
// JetStream cannot say (it is failing over too), it is ErrNoLeader.
func NoStream(ctx context.Context, js jetstream.JetStream, subject string, err error) error {
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if _, lerr := js.StreamNameBySubject(lctx, subject); errors.Is(lerr, jetstream.ErrStreamNotFound) {
		return ErrNoStream
	}
	return fmt.Errorf("publish to %s: %w (%w)", subject, ErrNoLeader, err)
}

// ErrDuplicate means JetStream already stored a request with this de-duplication id (the run
// id) within its window (2 minutes by default): this publish was dropped, and the reply goes
// to the first request's reply subject. Use a fresh run id for a new run.
var ErrDuplicate = errors.New("a request with this run id was already accepted within the de-duplication window; this one was not stored")

// ErrQuotaExceeded means JetStream refused the request: the caller already has as many
// requests waiting on this subject as its quota allows (SYS1_REQUESTS_MAX_PER_CALLER on the
// workers). Nothing was stored; other callers are not affected. Publish again once some have
// been answered.
var ErrQuotaExceeded = errors.New("refused: this caller already has as many requests waiting as its quota allows (SYS1_REQUESTS_MAX_PER_CALLER); nothing was stored: try again once some are answered")

// ErrStreamFull means JetStream refused the request for want of room: SYS1_REQUESTS is at its
// byte limit (SYS1_REQUESTS_MAX_BYTES), or the NATS server has no storage left. Nothing was
// stored; the fleet is behind or stopped, and the operators' alerts say so.
var ErrStreamFull = errors.New("refused: the request stream is full (SYS1_REQUESTS_MAX_BYTES reached, or NATS has no storage left); nothing was stored: try again later")

// Client publishes requests. It is safe for concurrent use.
type Client struct {
	nc *nats.Conn
	js jetstream.JetStream
}

// New returns a client on an established connection.
func New(nc *nats.Conn) (*Client, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	return &Client{nc: nc, js: js}, nil
}

// Request is one request to publish.
type Request struct {
	// Caller is the subject token after sys1.decide. (with optional further tokens,
	// "billing.eu"); under auth mode subject it is the caller's identity.
	Caller string
	// Body is the System One request JSON, sent verbatim.
	Body []byte
	// RunID is the run's id; empty means a fresh one. Reusing an id returns the first run's
	// outcome (same caller) or SYS1_RUN_ID_CONFLICT (another caller).
	RunID string
	// Deadline, when set, is the time after which the provider must not be called.
	Deadline time.Time
	// Token is a bearer JWT for auth mode jwt.
	Token string
	// MsgID is the JetStream de-duplication id (Nats-Msg-Id); empty means the run id, as
	// SPEC §3 asks, so a producer's retried publish is stored once.
	MsgID string
	// ReplyTo overrides the reply subject of Decide (e.g. a durable sys1.replies.<caller>.x);
	// for Publish it asks for a reply there instead of fire-and-forget.
	ReplyTo string
	// MinConfidence, when positive, tightens the abstention policy's confidence threshold for
	// this request (Sys1-Min-Confidence); it never loosens it.
	MinConfidence float64
	// Cache, when positive, allows an answer from the exact result cache up to that age
	// (Sys1-Cache), never longer than the caller's rule allows.
	Cache time.Duration
	// Header holds further headers to send as they are (e.g. traceparent).
	Header nats.Header
}

// Reply is a run's reply: the SPEC §4 envelope plus the raw bytes and headers.
type Reply struct {
	contract.Reply
	Raw    []byte
	Header nats.Header
	// TraceID is the W3C trace id the request was sent under (Decide sets it): the trace to
	// look up in the tracing backend, and the run record's trace_id.
	TraceID string
}

func (r Request) message(runID, replyTo string) (*nats.Msg, error) {
	caller := strings.TrimSpace(r.Caller)
	if caller == "" {
		return nil, errors.New("caller is required (the subject token after sys1.decide.)")
	}
	for _, tok := range strings.Split(caller, ".") {
		if tok == "" || strings.ContainsAny(tok, "*> \t\r\n") {
			return nil, fmt.Errorf("caller %q is not a valid subject token", caller)
		}
	}
	m := &nats.Msg{Subject: wire.Decide(caller), Data: r.Body, Header: nats.Header{}}
	for k, vs := range r.Header {
		for _, v := range vs {
			m.Header.Add(k, v)
		}
	}
	m.Header.Set(wire.HeaderRunID, runID)
	if r.MinConfidence > 0 {
		m.Header.Set(wire.HeaderMinConfidence, strconv.FormatFloat(r.MinConfidence, 'f', -1, 64))
	}
	if r.Cache > 0 {
		m.Header.Set(wire.HeaderCache, r.Cache.String())
	}
	if r.MsgID != "" {
		m.Header.Set(nats.MsgIdHdr, r.MsgID)
	} else {
		m.Header.Set(nats.MsgIdHdr, runID)
	}
	if replyTo != "" {
		m.Header.Set(wire.HeaderReplyTo, replyTo)
	}
	if !r.Deadline.IsZero() {
		m.Header.Set(wire.HeaderDeadline, r.Deadline.UTC().Format(time.RFC3339Nano))
	}
	if r.Token != "" {
		m.Header.Set(wire.HeaderAuthorization, "Bearer "+r.Token)
	}
	return m, nil
}

// NewRunID returns a fresh run id.
func NewRunID() string { return "r-" + nuid.Next() }

// Publish publishes req and returns its run id once JetStream has stored it.
func (c *Client) Publish(ctx context.Context, req Request) (string, error) {
	runID := req.RunID
	if runID == "" {
		runID = NewRunID()
	}
	m, err := req.message(runID, req.ReplyTo)
	if err != nil {
		return "", err
	}
	tracing.InjectOrStart(ctx, m.Header)
	if err := c.publish(ctx, m); err != nil {
		return "", err
	}
	return runID, nil
}

func (c *Client) publish(ctx context.Context, m *nats.Msg) error {
	ack, err := c.js.PublishMsg(ctx, m)
	if err != nil {
		if errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders) {
			return NoStream(ctx, c.js, m.Subject, err)
		}
		switch topology.Refused(err) {
		case topology.RefusedQuota:
			return fmt.Errorf("publish to %s: %w (JetStream: %v)", m.Subject, ErrQuotaExceeded, err)
		case topology.RefusedFull, topology.RefusedStorage:
			return fmt.Errorf("publish to %s: %w (JetStream: %v)", m.Subject, ErrStreamFull, err)
		}
		if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) {
			// A refused subscription's -ERR precedes the PONG: after this, LastError has it.
			_ = c.nc.FlushTimeout(time.Second)
		}
		inbox := c.nc.Opts.InboxPrefix
		if inbox == "" {
			inbox = "_INBOX"
		}
		if last := c.nc.LastError(); errors.Is(last, nats.ErrPermissionViolation) && strings.Contains(last.Error(), "Subscription to \""+inbox+".") {
			// The ack goes to an inbox this connection may not read: it never arrives.
			return fmt.Errorf("publish to %s: %w (no JetStream ack could arrive: %w; the request may have been stored; "+
				"connect with an inbox prefix this user may read: nats.CustomInboxPrefix(\"_INBOX.<user>\"), for sys1 commands SYS1_NATS_INBOX_PREFIX)",
				m.Subject, err, last)
		}
		return fmt.Errorf("publish to %s: %w", m.Subject, err)
	}
	if ack.Duplicate {
		return ErrDuplicate
	}
	return nil
}

// replyInbox is a fresh reply subject for caller. Workers in auth modes subject and jwt
// answer only inside the caller's own inbox namespace, _INBOX.<caller>.… (the one the NATS
// permissions of deploy/nats let producer <caller> read), so a connection on the default
// inbox prefix gets one there; a connection with its own prefix (nats.CustomInboxPrefix) keeps
// it. bound reports the first case.
func (c *Client) replyInbox(caller string) (subject string, bound bool) {
	if c.nc.Opts.InboxPrefix == "" && caller != "" && !strings.ContainsAny(caller, ".*> \t\r\n") {
		return wire.Inbox(caller) + "." + nuid.Next(), true
	}
	return c.nc.NewInbox(), false
}

// Decide publishes req and waits for its reply until ctx ends.
func (c *Client) Decide(ctx context.Context, req Request) (*Reply, error) {
	runID := req.RunID
	if runID == "" {
		runID = NewRunID()
	}
	if req.ReplyTo != "" {
		return nil, errors.New("decide with a custom ReplyTo: consume that subject yourself and use Publish")
	}
	replyTo, bound := c.replyInbox(req.Caller)
	m, err := req.message(runID, replyTo)
	if err != nil {
		return nil, err
	}
	sc := tracing.InjectOrStart(ctx, m.Header)
	// Subscribe before publishing, or a fast worker could answer into the void.
	sub, err := c.nc.SubscribeSync(replyTo)
	if err != nil {
		return nil, fmt.Errorf("subscribe to reply inbox: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	confirm := []string{replyTo}
	if bound {
		ackInbox := c.nc.NewInbox()
		// The reply inbox is the caller's, but JetStream's publish ack still comes to the
		// connection's own inbox prefix: make sure that one is readable too, or the request
		// would be stored while its ack, and so the call, waits out ctx.
		probe, err := c.nc.SubscribeSync(ackInbox)
		if err != nil {
			return nil, fmt.Errorf("subscribe to the ack inbox: %w", err)
		}
		defer func() { _ = probe.Unsubscribe() }()
		confirm = append(confirm, ackInbox)
	}
	if err := c.confirmSubscribed(ctx, confirm...); err != nil {
		return nil, err
	}
	if err := c.publish(ctx, m); err != nil {
		return nil, err
	}
	// The inbox is fresh and private to this call, so whatever arrives on it is this run's
	// reply, even under another run id: a run id the worker refuses (not 1–128 of
	// A-Za-z0-9._:-) is answered under the id it derived instead, and waiting for the one we
	// sent would hang until ctx ends.
	msg, err := sub.NextMsgWithContext(ctx)
	if err != nil {
		return nil, fmt.Errorf("waiting for the reply to run %s: %w", runID, err)
	}
	reply, err := ParseReply(msg)
	if err != nil {
		return nil, err
	}
	reply.TraceID = sc.TraceID().String()
	return reply, nil
}

// confirmSubscribed waits for the server to take the subscription to replyTo (one round trip)
// and reports when it refused it. A connection that may not read its inbox (deploy/nats lets a
// user read only _INBOX.<user>.>) would otherwise store the request and wait out ctx for a
// reply, and a publish ack, that can never arrive.
func (c *Client) confirmSubscribed(ctx context.Context, inboxes ...string) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
	}
	if err := c.nc.FlushWithContext(ctx); err != nil {
		return fmt.Errorf("subscribe to reply inbox: %w", err)
	}
	// The server answers a refused SUB with -ERR before the flush's PONG, so by now the
	// refusal, if any, is the connection's last error; the inbox name is unique to this call.
	err := c.nc.LastError()
	if !errors.Is(err, nats.ErrPermissionViolation) {
		return nil
	}
	for _, inbox := range inboxes {
		if strings.Contains(err.Error(), `"`+inbox+`"`) {
			return fmt.Errorf("%w: this connection may not subscribe to its inbox %s, so no reply could reach it and nothing was published; "+
				"connect with an inbox prefix it may read (nats.CustomInboxPrefix(\"_INBOX.<user>\"); for sys1 commands SYS1_NATS_INBOX_PREFIX)",
				nats.ErrPermissionViolation, inbox)
		}
	}
	return nil
}

// ParseReply decodes a reply message.
func ParseReply(msg *nats.Msg) (*Reply, error) {
	r := &Reply{Raw: msg.Data, Header: msg.Header}
	if err := json.Unmarshal(msg.Data, &r.Reply); err != nil {
		return nil, fmt.Errorf("decode reply: %w", err)
	}
	return r, nil
}
