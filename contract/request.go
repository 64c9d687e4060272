package contract

import (
	"encoding/json"
)

// QuestionType is one of the three System One question types.
type QuestionType string

// The question types of System One.
const (
	TypeChoice QuestionType = "choice" // pick one of N labelled options
	TypeNoul   QuestionType = "noul"   // yes/no, answered as P(yes)
	TypeScore  QuestionType = "score"  // place on an ordered rubric, answered as an expected index
)

// Request is one System One request: the JSON body of Ollama's POST /v1/systemone.
//
// Everything whose order matters upstream (questions, choice options, the caller's state and
// instructions) is kept in arrival order: Go maps are never used, because map encoding sorts
// keys and upstream derives option letters and tie-breaks from order.
type Request struct {
	// Model is the requested model, trimmed; empty means "the server default" until Resolve.
	Model string
	// State is the caller's JSON (a string, object or array) byte for byte.
	State json.RawMessage
	// Questions in request order.
	Questions []Question
	// Images in request order; see Image for the redacted form.
	Images []Image
	// KeepAlive is the keep_alive sent upstream. Decode always drops the caller's value; only
	// Resolve sets it, from server policy. Nil means "omit".
	KeepAlive json.RawMessage

	// contentState is the form State and Instructions are in ("" = as sent); see RedactContent.
	contentState RecordState
}

// Question is one named question.
type Question struct {
	// Name is the question's key in "questions", trimmed.
	Name string
	Type QuestionType
	// Instructions is the caller's JSON (a string, object or array) byte for byte.
	Instructions json.RawMessage
	// Options are the choice criteria in order (key → description, nil description = JSON
	// null), or for noul the optional "true"/"false" descriptions in order.
	Options []Option
	// Levels are the score criteria in order (index i is level i).
	Levels []string
	// HasCriteria records whether a noul question carried a criteria object at all, so
	// encoding reproduces what the caller sent.
	HasCriteria bool
}

// Option is one choice option (or one noul side).
type Option struct {
	Key         string
	Description *string
}

// Image is one input image. A decoded request holds Data (raw base64) and, once validated,
// SHA256 and Bytes. A redacted copy (see Redact) holds only SHA256 and Bytes and encodes as
// {"sha256": hex, "bytes": n}.
type Image struct {
	Data   string
	SHA256 string
	Bytes  int
}

// ImageRef is the stored identity of an image: what run records keep instead of its content.
type ImageRef struct {
	SHA256 string `json:"sha256"`
	Bytes  int    `json:"bytes"`
}

// Ref returns the image's stored identity.
func (im Image) Ref() ImageRef { return ImageRef{SHA256: im.SHA256, Bytes: im.Bytes} }

// Redacted reports whether the image holds no content (only its hash and size).
func (im Image) Redacted() bool { return im.Data == "" }
