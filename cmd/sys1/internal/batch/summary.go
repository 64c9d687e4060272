package batch

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/sys1hq/sys1/contract"
)

// envelope is the part of a SPEC §4 reply an output line and the summary use.
type envelope struct {
	Status   string          `json:"status"`
	Result   json.RawMessage `json:"result"`
	Error    json.RawMessage `json:"error"`
	Verdicts json.RawMessage `json:"verdicts"`
}

type errorBody struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// parseReply concludes an item from its reply. cancelMark, when the batch was cancelled, is
// the cancel time as the worker writes it into SYS1_EXPIRED messages: an item the worker
// expired at exactly that deadline was cancelled (see Cancel).
func parseReply(data []byte, cancelMark string) *outcome {
	var env envelope
	if err := json.Unmarshal(data, &env); err != nil {
		return localError(StatusFailed, contract.Errorf(contract.CodeInternal, "the reply is not a SPEC §4 envelope: %v", err))
	}
	switch env.Status {
	case string(contract.StatusSuccess):
		if len(env.Result) == 0 || string(env.Result) == "null" {
			return localError(StatusFailed, contract.Errorf(contract.CodeInternal, "the reply says success without a result"))
		}
		return &outcome{status: StatusSuccess, result: env.Result, verdicts: env.Verdicts}
	case string(contract.StatusFailed):
		var eb errorBody
		if len(env.Error) == 0 || json.Unmarshal(env.Error, &eb) != nil || eb.Code == "" {
			return localError(StatusFailed, contract.Errorf(contract.CodeInternal, "the reply says failed without an error"))
		}
		status := StatusFailed
		if cancelMark != "" && eb.Code == string(contract.CodeExpired) && strings.Contains(eb.Message, cancelMark) {
			status = StatusCancelled
		}
		return &outcome{status: status, errJSON: env.Error, code: eb.Code, verdicts: env.Verdicts}
	default:
		return localError(StatusFailed, contract.Errorf(contract.CodeInternal, "the reply has status %q, neither success nor failed", truncate(env.Status, 32)))
	}
}

// Summary is a batch's outcome: counts, answer distributions, tokens and speed.
type Summary struct {
	BatchID      string `json:"batch_id"`
	Caller       string `json:"caller"`
	Input        string `json:"input"`
	Output       string `json:"output"`
	ErrorsOutput string `json:"errors_output"`

	Lines     int `json:"lines"`
	Succeeded int `json:"succeeded"`
	Failed    int `json:"failed"`
	Invalid   int `json:"invalid"`
	Cancelled int `json:"cancelled"`
	// ErrorCodes counts failed, invalid and cancelled items by error code.
	ErrorCodes map[string]int `json:"error_codes"`

	Questions []*QuestionSummary `json:"questions"`

	InputTokens  int64 `json:"input_tokens"`
	OutputTokens int64 `json:"output_tokens"`

	// Sent counts publishes (first sends and re-sends); DuplicateReplies the replies that
	// arrived again for an item already answered (replies are at least once).
	Sent             int `json:"sent"`
	Resent           int `json:"resent"`
	DuplicateReplies int `json:"duplicate_replies"`

	WallMS             int64   `json:"wall_ms"`
	DecisionsPerSecond float64 `json:"decisions_per_second"`

	questions map[string]*QuestionSummary
}

// QuestionSummary is the answer distribution of one question over the batch's successes.
type QuestionSummary struct {
	Name     string `json:"name"`
	Type     string `json:"type"`
	Answered int    `json:"answered"`
	// choice: how often each option was chosen, options in request order.
	Choices *OrderedCounts `json:"choices,omitempty"`
	// noul: the mean P(yes); score: the mean expected level index.
	MeanPYes  *float64 `json:"mean_p_yes,omitempty"`
	MeanScore *float64 `json:"mean_score,omitempty"`
	sum       float64
}

// OrderedCounts is a JSON object of counts that keeps its keys' order.
type OrderedCounts struct {
	Keys   []string
	Counts map[string]int
}

func (o *OrderedCounts) add(k string) {
	if _, ok := o.Counts[k]; !ok {
		o.Keys = append(o.Keys, k)
	}
	o.Counts[k]++
}

func (o *OrderedCounts) declare(k string) {
	if _, ok := o.Counts[k]; !ok {
		o.Keys = append(o.Keys, k)
		o.Counts[k] = 0
	}
}

// MarshalJSON writes the counts in key order.
func (o *OrderedCounts) MarshalJSON() ([]byte, error) {
	b := []byte{'{'}
	for i, k := range o.Keys {
		if i > 0 {
			b = append(b, ',')
		}
		b = contract.AppendJSONString(b, k)
		b = fmt.Appendf(append(b, ':'), "%d", o.Counts[k])
	}
	return append(b, '}'), nil
}

func newSummary() *Summary {
	return &Summary{ErrorCodes: map[string]int{}, questions: map[string]*QuestionSummary{}, Questions: []*QuestionSummary{}}
}

// add counts one concluded item (in input order, so the summary is deterministic).
func (s *Summary) add(oc *outcome) {
	s.Lines++
	switch oc.status {
	case StatusSuccess:
		s.Succeeded++
		s.addResult(oc.result)
		return
	case StatusFailed:
		s.Failed++
	case StatusInvalid:
		s.Invalid++
	case StatusCancelled:
		s.Cancelled++
	}
	s.ErrorCodes[oc.code]++
}

func (s *Summary) addResult(raw json.RawMessage) {
	var res struct {
		Answers json.RawMessage `json:"answers"`
		Usage   struct {
			InputTokens  int64 `json:"input_tokens"`
			OutputTokens int64 `json:"output_tokens"`
		} `json:"usage"`
	}
	if json.Unmarshal(raw, &res) != nil {
		return
	}
	s.InputTokens += res.Usage.InputTokens
	s.OutputTokens += res.Usage.OutputTokens
	answers, err := members(res.Answers)
	if err != nil {
		return
	}
	for _, a := range answers {
		var ans struct {
			Type          string          `json:"type"`
			Choice        string          `json:"choice"`
			Noul          *float64        `json:"noul"`
			Score         *float64        `json:"score"`
			Probabilities json.RawMessage `json:"probabilities"`
		}
		if json.Unmarshal(a.value, &ans) != nil {
			continue
		}
		key := a.key + "\x00" + ans.Type
		q := s.questions[key]
		if q == nil {
			q = &QuestionSummary{Name: a.key, Type: ans.Type}
			if ans.Type == string(contract.TypeChoice) {
				q.Choices = &OrderedCounts{Counts: map[string]int{}}
			}
			s.questions[key] = q
			s.Questions = append(s.Questions, q)
		}
		q.Answered++
		switch ans.Type {
		case string(contract.TypeChoice):
			// Declare every option in request order first, so unchosen ones show as 0.
			if probs, err := members(ans.Probabilities); err == nil {
				for _, p := range probs {
					q.Choices.declare(p.key)
				}
			}
			q.Choices.add(ans.Choice)
		case string(contract.TypeNoul):
			if ans.Noul != nil {
				q.sum += *ans.Noul
				m := q.sum / float64(q.Answered)
				q.MeanPYes = &m
			}
		case string(contract.TypeScore):
			if ans.Score != nil {
				q.sum += *ans.Score
				m := q.sum / float64(q.Answered)
				q.MeanScore = &m
			}
		}
	}
}

// finish records the wall time.
func (s *Summary) finish(wall time.Duration) {
	s.WallMS = wall.Milliseconds()
	if wall > 0 {
		s.DecisionsPerSecond = float64(s.Succeeded+s.Failed+s.Cancelled) / wall.Seconds()
	}
}

// Print writes the summary for a person.
func (s *Summary) Print(w io.Writer) {
	fmt.Fprintf(w, "batch %s: %d lines: %d succeeded, %d failed, %d invalid, %d cancelled\n",
		s.BatchID, s.Lines, s.Succeeded, s.Failed, s.Invalid, s.Cancelled)
	if len(s.ErrorCodes) > 0 {
		codes := make([]string, 0, len(s.ErrorCodes))
		for c := range s.ErrorCodes {
			codes = append(codes, c)
		}
		sort.Slice(codes, func(i, j int) bool {
			if s.ErrorCodes[codes[i]] != s.ErrorCodes[codes[j]] {
				return s.ErrorCodes[codes[i]] > s.ErrorCodes[codes[j]]
			}
			return codes[i] < codes[j]
		})
		fmt.Fprintf(w, "  by error code:")
		for _, c := range codes {
			fmt.Fprintf(w, " %s %d", c, s.ErrorCodes[c])
		}
		fmt.Fprintln(w)
	}
	for _, q := range s.Questions {
		fmt.Fprintf(w, "  %s (%s, %d answers):", q.Name, q.Type, q.Answered)
		switch {
		case q.Choices != nil:
			for _, k := range q.Choices.Keys {
				fmt.Fprintf(w, " %s %d (%.1f%%)", k, q.Choices.Counts[k], 100*float64(q.Choices.Counts[k])/float64(max(q.Answered, 1)))
			}
		case q.MeanPYes != nil:
			fmt.Fprintf(w, " mean P(yes) %.3f", *q.MeanPYes)
		case q.MeanScore != nil:
			fmt.Fprintf(w, " mean score %.3f", *q.MeanScore)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "  tokens: %d in, %d out\n", s.InputTokens, s.OutputTokens)
	fmt.Fprintf(w, "  wall time %s, %.1f decisions/s; %d sent (%d re-sent), %d duplicate replies ignored\n",
		(time.Duration(s.WallMS) * time.Millisecond).Round(time.Millisecond), s.DecisionsPerSecond, s.Sent, s.Resent, s.DuplicateReplies)
	fmt.Fprintf(w, "  results: %s\n  errors:  %s (%d lines)\n", s.Output, s.ErrorsOutput, s.Failed+s.Invalid+s.Cancelled)
}
