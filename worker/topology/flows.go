package topology

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sys1hq/sys1/contract/wire"
)

// Fair share (worker/fair): each flow — a caller's interactive requests, one batch of a
// caller, a caller's label submissions — is read through a durable pull consumer of its own,
// filtered to the flow's subjects and shared by every replica, so a replica can serve callers
// in turn instead of in arrival order. Work-queue streams allow such consumers side by side
// because their filters never overlap; they do not allow the one shared consumer of all of a
// lane beside them, so a fleet runs one way or the other (SYS1_FAIR_SHARE).

// The request and label-submission streams republish the headers of every message they
// store on sys1.arrivals.<original subject> (wire.ArrivalsPrefix; no body): how an idle
// replica learns of a new caller at once. Only workers need to read it.

// Lane is one kind of work a flow belongs to.
type Lane string

// Lanes.
const (
	LaneInteractive Lane = "interactive" // sys1.decide.<caller>[.<more>]
	LaneBatch       Lane = "batch"       // sys1.batch.<caller>.<batch id>
	LaneLabels      Lane = "labels"      // sys1.labels.<caller> (label submissions)
)

// Flow is one caller's work in one lane (and, in the batch lane, one batch of it).
type Flow struct {
	Lane   Lane
	Caller string // the subject's caller token
	Batch  string // the batch id, in the batch lane only
}

// FlowOf is the flow a message on subject belongs to; ok is false for a subject outside the
// three lanes (or without a caller, or a batch subject without a batch id).
func FlowOf(subject string) (Flow, bool) {
	var lane Lane
	var rest string
	switch {
	case strings.HasPrefix(subject, wire.DecidePrefix):
		lane, rest = LaneInteractive, subject[len(wire.DecidePrefix):]
	case strings.HasPrefix(subject, wire.BatchPrefix):
		lane, rest = LaneBatch, subject[len(wire.BatchPrefix):]
	case strings.HasPrefix(subject, wire.LabelsPrefix):
		lane, rest = LaneLabels, subject[len(wire.LabelsPrefix):]
	default:
		return Flow{}, false
	}
	caller, more, _ := strings.Cut(rest, ".")
	if !validToken(caller) {
		return Flow{}, false
	}
	f := Flow{Lane: lane, Caller: caller}
	switch lane {
	case LaneBatch:
		id, tail, _ := strings.Cut(more, ".")
		if !validToken(id) || tail != "" {
			return Flow{}, false
		}
		f.Batch = id
	case LaneLabels:
		if more != "" {
			return Flow{}, false // sys1.labels.<caller>.accepted|rejected: checked labels, not submissions
		}
	}
	return f, true
}

// validToken is a literal subject token, by the rule the caller token is read with
// (CallerToken): a flow exists for every caller a request can have.
func validToken(s string) bool { return wire.ValidToken(s) }

// Subjects are the subjects a flow's consumer reads.
func (f Flow) Subjects() []string {
	switch f.Lane {
	case LaneBatch:
		return []string{wire.Batch(f.Caller, f.Batch)}
	case LaneLabels:
		return []string{wire.Label(f.Caller)}
	}
	return []string{wire.Decide(f.Caller), wire.Decide(f.Caller) + ".>"}
}

// Key names the flow within its lane (the scheduler's flow key).
func (f Flow) Key() string {
	if f.Lane == LaneBatch {
		return f.Caller + "." + f.Batch // neither has a dot: unambiguous
	}
	return f.Caller
}

// flowSep separates a lane's consumer name from the flow's part. Neither a configured name
// (validName) nor a plain caller token (plainToken) can hold it, so names never collide.
const (
	flowSep    = "~"
	hashedMark = "=" // starts the flow part of a name made from a hash
)

// FlowConsumer is the durable name of a flow's consumer: the lane's shared-consumer name
// (SYS1_WORKER_CONSUMER, SYS1_BATCH_CONSUMER, SYS1_LABELS_CONSUMER), "~", and the caller
// token (and batch id), readable in nats consumer ls — or, for a token a consumer name
// cannot hold or that is too long, "=" and a hash of it.
func (c Config) FlowConsumer(f Flow) string {
	base := c.laneConsumer(f.Lane)
	part := f.Caller
	if f.Lane == LaneBatch {
		part += flowSep + f.Batch
	}
	if plainToken(f.Caller) && (f.Lane != LaneBatch || plainToken(f.Batch)) && len(part) <= 128 {
		return base + flowSep + part
	}
	sum := sha256.Sum256([]byte(f.Key()))
	return base + flowSep + hashedMark + hex.EncodeToString(sum[:16])
}

// FlowConsumerPattern names a lane's flow consumers as a whole (sys1-worker~*), for health
// and sys1 status.
func (c Config) FlowConsumerPattern(l Lane) string { return c.laneConsumer(l) + flowSep + "*" }

// SharedName is the lane's shared-consumer name for a consumer name: a flow consumer's lane
// (sys1-worker~billing → sys1-worker), any other name as it is. Metrics label by it, so a
// label never grows with the callers.
func SharedName(consumer string) string {
	base, _, _ := strings.Cut(consumer, flowSep)
	return base
}

// IsFlowConsumer reports whether name is a flow consumer of lane (made by FlowConsumer).
func (c Config) IsFlowConsumer(lane Lane, name string) bool {
	return strings.HasPrefix(name, c.laneConsumer(lane)+flowSep)
}

func (c Config) laneConsumer(l Lane) string {
	switch l {
	case LaneBatch:
		return c.BatchConsumer
	case LaneLabels:
		return c.LabelsConsumer
	}
	return c.WorkerConsumer
}

// LaneStream is the stream a lane's flows are read from.
func (c Config) LaneStream(l Lane) string {
	if l == LaneLabels {
		return c.LabelSubmissionsStream
	}
	return c.RequestsStream
}

// LaneSubjects are the subjects of a lane, for reading its subject state.
func LaneSubjects(l Lane) string {
	switch l {
	case LaneBatch:
		return wire.BatchSubjects
	case LaneLabels:
		return wire.LabelsSubmitted
	}
	return wire.DecideSubjects
}

// plainToken: letters, digits, '-' and '_' only, as a consumer name may hold anywhere.
func plainToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		ch := s[i]
		if !(ch == '-' || ch == '_' || ch >= '0' && ch <= '9' || ch >= 'a' && ch <= 'z' || ch >= 'A' && ch <= 'Z') {
			return false
		}
	}
	return true
}

// FlowConsumerConfig is a flow's durable pull consumer, shared by every replica: the lane's
// shared consumer's settings (deliveries, ack wait, ack pending) filtered to the flow, and
// removed by JetStream once it has gone FlowInactiveThreshold without a pull and without a
// message in hand (nats-server counts the ack wait of the last delivery before it starts).
func (c Config) FlowConsumerConfig(f Flow) jetstream.ConsumerConfig {
	var cc jetstream.ConsumerConfig
	switch f.Lane {
	case LaneBatch:
		cc = c.BatchConsumerConfig()
		cc.Description = fmt.Sprintf("sys1 worker replicas (shared): batch %s of caller %s", f.Batch, f.Caller)
	case LaneLabels:
		cc = c.LabelsConsumerConfig()
		cc.Description = fmt.Sprintf("sys1 worker replicas (shared): labels submitted by caller %s", f.Caller)
	default:
		cc = c.WorkerConsumerConfig()
		cc.Description = fmt.Sprintf("sys1 worker replicas (shared): interactive requests of caller %s", f.Caller)
	}
	cc.Durable = c.FlowConsumer(f)
	cc.FilterSubject, cc.FilterSubjects = "", nil
	if s := f.Subjects(); len(s) == 1 {
		cc.FilterSubject = s[0]
	} else {
		cc.FilterSubjects = s
	}
	cc.InactiveThreshold = c.FlowInactiveThreshold
	cc.Metadata = map[string]string{"sys1.lane": string(f.Lane), "sys1.caller": f.Caller}
	if f.Batch != "" {
		cc.Metadata["sys1.batch"] = f.Batch
	}
	return cc
}

// RemoveOtherModeConsumers deletes the request and label consumers a fleet running the
// other way left behind: in fair mode the lanes' shared consumers (their filters overlap
// every flow's, which a work queue refuses), otherwise every flow consumer. Their messages
// stay in the stream and are delivered again through this mode's consumers (the run-id gate
// answers a run finished meanwhile from its outcome). It returns what it removed.
func RemoveOtherModeConsumers(ctx context.Context, js jetstream.JetStream, c Config) ([]string, error) {
	var removed []string
	for _, s := range []struct {
		stream string
		lanes  []Lane
	}{{c.RequestsStream, []Lane{LaneInteractive, LaneBatch}}, {c.LabelSubmissionsStream, []Lane{LaneLabels}}} {
		stream, err := js.Stream(ctx, s.stream)
		if err != nil {
			return removed, fmt.Errorf("stream %s: %w", s.stream, err)
		}
		names := stream.ConsumerNames(ctx)
		var doomed []string
		for name := range names.Name() {
			for _, l := range s.lanes {
				if c.FairShare && name == c.laneConsumer(l) || !c.FairShare && c.IsFlowConsumer(l, name) {
					doomed = append(doomed, name)
				}
			}
		}
		if err := names.Err(); err != nil {
			return removed, fmt.Errorf("stream %s: list consumers: %w", s.stream, err)
		}
		for _, name := range doomed {
			if err := stream.DeleteConsumer(ctx, name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
				return removed, fmt.Errorf("stream %s: delete consumer %s: %w", s.stream, name, err)
			}
			removed = append(removed, s.stream+"/"+name)
		}
	}
	return removed, nil
}
