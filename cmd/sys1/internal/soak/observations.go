package soak

import (
	"encoding/json"
	"time"
)

// Observations are everything a soak saw from outside the fleet, gathered for Check: what the
// load published and JetStream acknowledged, every reply the fleet stored, every call the
// fake models answered, the labels, what the batch wrote, ClickHouse's rows, the consumers'
// state at the end, and the processes. Nothing here comes from inside a worker.
type Observations struct {
	Start, End time.Time
	// Requests are the interactive requests the load published, acknowledged or not.
	Requests []Request
	// Replies are the replies stored for the soak's callers (the durable replies stream).
	Replies []Reply
	// Calls are the provider calls the fake models saw, each worker slot's on its own fake.
	Calls []Call
	// Workers are the worker processes, every incarnation of every slot.
	Workers []Incarnation
	// Processes are the other processes the soak ran (NATS nodes, the sink, the review page,
	// the batch): any that exited on its own is a violation.
	Processes []Incarnation
	// Labels are the accepted labels in the labels stream (from the review page and from
	// producers); SentLabels the producer labels the load published and JetStream acknowledged.
	Labels     []Label
	SentLabels []SentLabel
	// Budgets are the callers with a day budget and how many decisions it pays for.
	Budgets []Budget
	// Batches are the sys1 batches the soak ran, one after another.
	Batches []BatchOutcome
	// Rows are ClickHouse's run records under FINAL, and LabelRows its labels under FINAL, of
	// the soak's callers. RowsRead is false when ClickHouse could not be read at all.
	Rows      []Row
	LabelRows []LabelRow
	RowsRead  bool
	// Consumers are every durable consumer of every stream at the end.
	Consumers []ConsumerState
	// Leftovers are the work-queue streams still holding messages at the end: a message
	// there is one no consumer finished (finding 11: a consumer can move past one).
	Leftovers []Leftover
	// Timeline is what the soak did to the fleet, and when.
	Timeline *Timeline
}

// Kinds of request, by what the soak checks of them.
const (
	KindPlain  = "plain"  // interactive, no limits
	KindBudget = "budget" // interactive, under a day budget
	KindCache  = "cache"  // interactive, with the exact cache on (bodies repeat)
	KindHold   = "hold"   // interactive, held for a reviewer's label (review: hold)
	KindBatch  = "batch"  // an item of the running sys1 batch
)

// Request is one interactive request of the load.
type Request struct {
	RunID  string
	Caller string
	Kind   string
	// Key is what the model's calls for it are counted under: the tag its state carries (its
	// run id, or for repeated bodies the body's).
	Key         string
	PublishedAt time.Time
	// AckedAt is when JetStream acknowledged it (a duplicate's ack counts: an earlier try was
	// stored); zero when it never did, and then PublishErr says why.
	AckedAt    time.Time
	PublishErr string
}

// Acked reports whether JetStream acknowledged the request.
func (r Request) Acked() bool { return !r.AckedAt.IsZero() }

// Reply is one reply stored for a run, as read from the replies stream.
type Reply struct {
	RunID string
	Seq   uint64    // its sequence in the replies stream
	At    time.Time // when the stream stored it
	// Hash identifies the body: copies of one reply (replies are at least once) hash the same.
	Hash      [32]byte
	Status    string // success or failed
	ErrorCode string
	// Review is the reply's review status: "", "pending" or "reviewed".
	Review string
	// ProviderAnswers counts its attempts a provider answered (outcome ok): how many answers
	// of the model the run used.
	ProviderAnswers int
	CacheHit        bool
	// Reviewed maps each question a person labelled to the label (JSON) the reply carries.
	Reviewed map[string]string
}

// ParseReply summarises a reply body for the checks. The fields read are the reply's public
// schema (sys1 schema reply).
func ParseReply(runID string, seq uint64, at time.Time, hash [32]byte, body []byte) (Reply, error) {
	var b struct {
		RunID  string `json:"run_id"`
		Status string `json:"status"`
		Error  *struct {
			Code string `json:"code"`
		} `json:"error"`
		Review *struct {
			Status string `json:"status"`
		} `json:"review"`
		Attempts []struct {
			Outcome string `json:"outcome"`
		} `json:"attempts"`
		Verdicts map[string]struct {
			Status string          `json:"status"`
			Label  json.RawMessage `json:"label"`
		} `json:"verdicts"`
	}
	if err := json.Unmarshal(body, &b); err != nil {
		return Reply{}, err
	}
	r := Reply{RunID: runID, Seq: seq, At: at, Hash: hash, Status: b.Status}
	if r.RunID == "" {
		r.RunID = b.RunID
	}
	if b.Error != nil {
		r.ErrorCode = b.Error.Code
	}
	if b.Review != nil {
		r.Review = b.Review.Status
	}
	for _, a := range b.Attempts {
		switch a.Outcome {
		case "ok":
			r.ProviderAnswers++
		case "cache":
			r.CacheHit = true
		}
	}
	for q, v := range b.Verdicts {
		if v.Status == "reviewed" {
			if r.Reviewed == nil {
				r.Reviewed = map[string]string{}
			}
			r.Reviewed[q] = string(v.Label)
		}
	}
	return r, nil
}

// Call is one provider call a fake model saw.
type Call struct {
	Key  string // the tag of the request's state ("" when it carried none)
	Slot int    // the worker slot whose fake it reached
	// Started and Ended bound the call at the fake.
	Started, Ended time.Time
	// Answered: the model scored the request and its answer went out to a client still there.
	Answered bool
	Fault    string
}

// Incarnation is one run of one process.
type Incarnation struct {
	Name string // "w1", "n2", "sink", "review", "batch"
	Slot int    // worker slot (workers), node index (NATS nodes)
	Gen  int    // 1 for the first start, then one more per restart
	PID  int
	// Started and Ended bound the process; Ended is zero while it runs.
	Started, Ended time.Time
	// Killed is true when the soak SIGKILLed it (a fault); Stopped when the soak ended it at
	// the end. An incarnation that Ended neither way exited on its own.
	Killed, Stopped bool
	ExitCode        int
	// LogTail is the end of its log, kept for processes that exited on their own.
	LogTail string
}

// OnItsOwn reports whether the process exited without the soak ending it.
func (i Incarnation) OnItsOwn() bool { return !i.Ended.IsZero() && !i.Killed && !i.Stopped }

// Label is one accepted label in the labels stream.
type Label struct {
	RunID, Question string
	Value           string // the label as JSON
	Source          string // review or producer
	Reviewer        string
	Item            string // the review item (source review)
	At              time.Time
	Seq             uint64
}

// SentLabel is one producer label the load published, acknowledged by JetStream.
type SentLabel struct {
	RunID, Question, Value string
	AckedAt                time.Time
}

// Budget is a caller's day budget, in decisions (its USD limit over the per-decision price).
type Budget struct {
	Caller string
	Limit  int
}

// BatchOutcome is what one sys1 batch was given and wrote.
type BatchOutcome struct {
	// ID is the batch id (--id); Restarts how often its command was killed and run again.
	ID       string
	Restarts int
	// Started and Ended bound its command's runs.
	Started, Ended time.Time
	// Items are the custom ids of its input lines, in order, with the key each item's state
	// carries.
	Items []BatchItem
	// Lines are the result file's lines; Finished is false when the command never wrote its
	// result file (killed, or still running at the end).
	Lines    []BatchLine
	Finished bool
	ExitCode int
}

// BatchItem is one input line of the batch.
type BatchItem struct{ CustomID, Key string }

// BatchLine is one line of the batch's result file.
type BatchLine struct {
	CustomID, RunID, Status, ErrorCode string
	Line                               int
}

// Leftover is a work-queue stream that still holds messages.
type Leftover struct {
	Stream         string
	Msgs, FirstSeq uint64
}

// Row is one run's record in ClickHouse under FINAL.
type Row struct {
	RunID, Caller, Status string
}

// LabelRow is one label row in ClickHouse under FINAL.
type LabelRow struct {
	RunID, Question, Value, Source string
}

// ConsumerState is one durable consumer at the end.
type ConsumerState struct {
	Stream, Name           string
	Pending, AckPending    uint64
	Redelivered            int
	Paused                 bool
	Err                    string // its info could not be read
	FilterSubjects         []string
	WaitingPulls, Replicas int
}
