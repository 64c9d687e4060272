package sink

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/contract/wire"
)

// labelColumns is the INSERT column list of <db>.labels, in the order labelRow.values returns
// them. inserted_at is left to its DEFAULT.
var labelColumns = []string{
	"run_id", "question", "caller", "label", "value", "reviewer", "source", "item",
	"labelled_at", "accepted_at", "labels_stream", "labels_seq",
}

// errInvalidLabel marks an accepted label that decoded but can never be stored as a row.
var errInvalidLabel = errors.New("invalid label")

// labelRow is one accepted label in the column layout of <db>.labels.
type labelRow struct {
	runID, question, caller, label, value string
	reviewer, source, item                string
	labelledAt, acceptedAt                time.Time
	stream                                string
	seq                                   uint64
}

func (r *labelRow) values() []any {
	return []any{r.runID, r.question, r.caller, r.label, r.value, r.reviewer, r.source, r.item,
		r.labelledAt, r.acceptedAt, r.stream, r.seq}
}

// toLabelRow checks an accepted label and lays it out as a row. accepted_at, the row's
// version under FINAL, is the time the checked label reached SYS1_LABELS (from.published):
// stamped by the NATS server, so a submitter cannot make its label outlive a later one by
// claiming a future labelled_at. A label without labelled_at is dated by its acceptance.
func toLabelRow(l *contract.Label, from origin) (*labelRow, error) {
	if l.Caller == "" {
		return nil, fmt.Errorf("%w: an accepted label must carry the run's caller", errInvalidLabel)
	}
	if l.Source != contract.LabelSourceReview && l.Source != contract.LabelSourceProducer {
		return nil, fmt.Errorf("%w: an accepted label must say its source (review or producer)", errInvalidLabel)
	}
	text, ok := contract.LabelText(l.Value)
	if !ok {
		return nil, fmt.Errorf("%w: label %s is not an option key, true/false or a level index", errInvalidLabel, clipBytes(l.Value, 64))
	}
	accepted, err := storableTime(from.published)
	if err != nil {
		return nil, fmt.Errorf("%w: accepted at %v", errInvalidLabel, err)
	}
	labelled := l.LabelledAt
	if labelled.IsZero() {
		labelled = accepted
	}
	if labelled, err = storableTime(labelled); err != nil {
		return nil, fmt.Errorf("%w: labelled_at: %v", errInvalidLabel, err)
	}
	value, _ := json.Marshal(json.RawMessage(l.Value)) // compact; LabelText proved it is JSON
	return &labelRow{
		runID: l.RunID, question: l.Question, caller: l.Caller, label: text, value: string(value),
		reviewer: l.Reviewer, source: l.Source, item: l.Item,
		labelledAt: labelled, acceptedAt: accepted, stream: from.stream, seq: from.seq,
	}, nil
}

func clipBytes(b []byte, n int) string {
	if len(b) <= n {
		return string(b)
	}
	return string(b[:n]) + "…"
}

// prepareLabels splits a batch of checked labels: accepted ones (sys1.labels.<caller>.accepted,
// contract.Label JSON with Caller set) become label rows; rejected ones
// (sys1.labels.<caller>.rejected, a contract.LabelRejection) become dead letters with the
// workers' reason; anything that cannot be either is a dead letter too. Nothing is dropped.
func (s *Sink) prepareLabels(msgs []jetstream.Msg) prepared {
	p := prepared{rows: make([]insertable, 0, len(msgs))}
	for _, m := range msgs {
		from := origin{stream: s.topo.LabelsStream}
		var deliveries uint64
		meta, err := m.Metadata()
		if err != nil {
			p.dead = append(p.dead, s.labelDeadLetter(m.Data(), from, m.Subject(), deliveries, deadLabel, "no JetStream metadata: "+err.Error()))
			continue
		}
		from.seq, from.published, deliveries, from.stream = meta.Sequence.Stream, meta.Timestamp, meta.NumDelivered, meta.Stream
		switch {
		case strings.HasSuffix(m.Subject(), "."+wire.RejectedToken):
			var rj contract.LabelRejection
			reason := ""
			if err := json.Unmarshal(m.Data(), &rj); err != nil {
				reason = "a rejected label that is not a label rejection: " + err.Error()
				s.log.Error().Str("subject", m.Subject()).Uint64("labels_seq", from.seq).Str("reason", reason).
					Msg("sink: parking an undecodable label rejection in the dead-letter table")
			} else {
				reason = "label rejected: " + rj.Reason()
				p.refused++
			}
			p.dead = append(p.dead, s.labelDeadLetter(m.Data(), from, m.Subject(), deliveries, deadRejectedLabel, reason))
		case strings.HasSuffix(m.Subject(), "."+wire.AcceptedToken):
			l, derr := contract.DecodeLabel(m.Data())
			var r *labelRow
			if derr == nil {
				r, err = toLabelRow(l, from)
			} else {
				err = derr
			}
			if err != nil {
				reason := "accepted label cannot be stored: " + err.Error()
				s.log.Error().Str("subject", m.Subject()).Uint64("labels_seq", from.seq).Str("reason", reason).
					Msg("sink: parking a label in the dead-letter table")
				p.dead = append(p.dead, s.labelDeadLetter(m.Data(), from, m.Subject(), deliveries, deadLabel, reason))
				continue
			}
			p.rows = append(p.rows, r)
			p.rowSrc = append(p.rowSrc, source{data: m.Data(), subject: m.Subject(), runID: r.runID, deliveries: deliveries, from: from, kind: deadLabel})
		default:
			p.dead = append(p.dead, s.labelDeadLetter(m.Data(), from, m.Subject(), deliveries, deadLabel,
				"not a checked label: subject "+m.Subject()+" is neither sys1.labels.<caller>.accepted nor .rejected"))
		}
	}
	p.deadDone = len(p.dead) == 0
	return p
}

// labelDeadLetter is the dead letter of a label-lane message. Labels carry no caller content,
// but a refused submission may hold anything its producer sent: under SYS1_RECORD_STATE hash
// or none its body is left out of the payload (its size and hash stay in the rejection, and
// the submission itself on SYS1_LABELS at its seq), as is any payload that is not JSON.
func (s *Sink) labelDeadLetter(data []byte, from origin, subject string, deliveries uint64, kind, reason string) *deadLetter {
	d := newDeadLetter(data, from, subject, deliveries, reason, RecordFull)
	d.kind = kind
	if s.cfg.RecordState == RecordFull {
		return d
	}
	var rj contract.LabelRejection
	switch {
	case kind == deadRejectedLabel && json.Unmarshal(data, &rj) == nil:
		rj.Submission = nil
		b, _ := rj.MarshalJSON()
		d.payload = string(b)
	case !json.Valid(data):
		d.payload = ""
		d.reason += " (payload not stored: it is not JSON, and SYS1_RECORD_STATE=" + string(s.cfg.RecordState) + ")"
	}
	return d
}
