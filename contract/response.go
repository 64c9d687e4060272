package contract

import "encoding/json"

// Response is a provider's answer to a Request, checked against it (see DecodeResponse).
type Response struct {
	// Model is the model name the provider reports.
	Model string
	// Answers in request order.
	Answers []Answer
	Usage   Usage
	// Extra holds unknown top-level fields verbatim, in arrival order.
	Extra []RawField
}

// Answer is the provider's answer to one question. Raw is the answer object exactly as the
// provider sent it; replies and records carry Raw verbatim. The typed fields are parsed from
// it for validation and for the analysts' flattened columns.
type Answer struct {
	Name string
	Type QuestionType
	Raw  json.RawMessage

	Choice string  // choice: the chosen option key
	Noul   float64 // noul: P(true)
	Score  float64 // score: expected level index in [0, N-1]
	// Confidence is nil when the provider sent none (noul answers usually carry none).
	Confidence *float64
	// Probabilities in arrival order: option keys for choice, "true"/"false" for noul when
	// sent, string level indexes ("0", "1", ...) for score.
	Probabilities []Probability
	// Legend maps score level indexes to labels, in arrival order; it may arrive as an object
	// or an array.
	Legend []LegendEntry
}

// Probability is one entry of an answer's distribution.
type Probability struct {
	Key string
	P   float64
}

// LegendEntry is one score level's label.
type LegendEntry struct {
	Key   string
	Label string
}

// Usage is the provider's token accounting.
type Usage struct {
	InputTokens  int64 `json:"input_tokens"`
	OutputTokens int64 `json:"output_tokens"`
}

// RawField is one unknown JSON field kept verbatim.
type RawField struct {
	Key   string
	Value json.RawMessage
}

// AnswerNamed is the answer to the question named name, or nil.
func AnswerNamed(answers []Answer, name string) *Answer {
	for i := range answers {
		if answers[i].Name == name {
			return &answers[i]
		}
	}
	return nil
}
