package ollamatest

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/sys1hq/sys1/provider/internal/synth"
)

// Ollama's System One limits, enforced the way the real server does so that tests against
// the fake fail where production would.
const (
	MaxBodyNoImages   = 64 << 10 // bytes of JSON without images
	MaxBodyWithImages = 32 << 20 // bytes of JSON with images
	MinOptions        = 2
	MaxOptions        = 26
	MinQuestions      = 1
	MaxQuestions      = 64
)

// decoded is a System One request as the fake understands it. It is decoded independently of
// package contract on purpose: the fake checks the worker's encoding, so it must not share the
// worker's decoder.
type decoded struct {
	Model     string
	State     []byte
	Questions []synth.Question
	Images    int
	KeepAlive json.RawMessage
}

// badRequest is a 400 with Ollama's {"error": "..."} body.
type badRequest struct{ msg string }

func (e *badRequest) Error() string { return e.msg }

func badf(format string, args ...any) error { return &badRequest{msg: fmt.Sprintf(format, args...)} }

// decodeRequest decodes and validates body by Ollama's rules, in order.
func decodeRequest(body []byte) (*decoded, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := expectDelim(dec, '{', "request body"); err != nil {
		return nil, err
	}
	var req decoded
	seen := map[string]bool{}
	for dec.More() {
		key, err := readKey(dec, "request body")
		if err != nil {
			return nil, err
		}
		if seen[key] {
			return nil, badf("duplicate field %q", key)
		}
		seen[key] = true
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, badf("invalid JSON in field %q: %v", key, err)
		}
		switch key {
		case "model":
			if err := json.Unmarshal(raw, &req.Model); err != nil {
				return nil, badf("model: must be a string")
			}
		case "state":
			if !isContent(raw) {
				return nil, badf("state: must be a string, an object or an array")
			}
			req.State = raw
		case "questions":
			qs, err := decodeQuestions(raw)
			if err != nil {
				return nil, err
			}
			req.Questions = qs
		case "images":
			n, err := decodeImages(raw)
			if err != nil {
				return nil, err
			}
			req.Images = n
		case "keep_alive":
			if err := checkKeepAlive(raw); err != nil {
				return nil, err
			}
			req.KeepAlive = raw
		default:
			return nil, badf("unknown field %q", key)
		}
	}
	if err := expectEnd(dec, "request body"); err != nil {
		return nil, err
	}
	switch {
	case strings.TrimSpace(req.Model) == "":
		return nil, badf("model is required")
	case req.State == nil:
		return nil, badf("state is required")
	case !seen["questions"]:
		return nil, badf("questions is required")
	}
	return &req, nil
}

func decodeQuestions(raw json.RawMessage) ([]synth.Question, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if err := expectDelim(dec, '{', "questions"); err != nil {
		return nil, err
	}
	var qs []synth.Question
	seen := map[string]bool{}
	for dec.More() {
		name, err := readKey(dec, "questions")
		if err != nil {
			return nil, err
		}
		if strings.TrimSpace(name) == "" {
			return nil, badf("questions: a question name must not be empty")
		}
		if seen[name] {
			return nil, badf("questions: duplicate question %q", name)
		}
		seen[name] = true
		var body json.RawMessage
		if err := dec.Decode(&body); err != nil {
			return nil, badf("questions.%s: invalid JSON: %v", name, err)
		}
		q, err := decodeQuestion(name, body)
		if err != nil {
			return nil, err
		}
		qs = append(qs, q)
	}
	if err := expectEnd(dec, "questions"); err != nil {
		return nil, err
	}
	if len(qs) < MinQuestions || len(qs) > MaxQuestions {
		return nil, badf("questions: must have %d to %d questions, got %d", MinQuestions, MaxQuestions, len(qs))
	}
	return qs, nil
}

func decodeQuestion(name string, raw json.RawMessage) (synth.Question, error) {
	q := synth.Question{Name: name}
	path := "questions." + name
	dec := json.NewDecoder(bytes.NewReader(raw))
	if err := expectDelim(dec, '{', path); err != nil {
		return q, err
	}
	var criteria, instructions json.RawMessage
	seen := map[string]bool{}
	for dec.More() {
		key, err := readKey(dec, path)
		if err != nil {
			return q, err
		}
		if seen[key] {
			return q, badf("%s: duplicate field %q", path, key)
		}
		seen[key] = true
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return q, badf("%s.%s: invalid JSON: %v", path, key, err)
		}
		switch key {
		case "type":
			if err := json.Unmarshal(v, &q.Type); err != nil {
				return q, badf("%s.type: must be a string", path)
			}
		case "instructions":
			instructions = v
		case "criteria":
			criteria = v
		default:
			return q, badf("%s: unknown field %q", path, key)
		}
	}
	if err := expectEnd(dec, path); err != nil {
		return q, err
	}
	if instructions == nil || !isContent(instructions) {
		return q, badf("%s.instructions: must be a string, an object or an array", path)
	}
	var err error
	switch q.Type {
	case synth.TypeChoice:
		if criteria == nil {
			return q, badf("%s.criteria: required for choice questions", path)
		}
		q.Keys, err = decodeOptions(path+".criteria", criteria)
		if err == nil && (len(q.Keys) < MinOptions || len(q.Keys) > MaxOptions) {
			err = badf("%s.criteria: choice questions need %d to %d options, got %d", path, MinOptions, MaxOptions, len(q.Keys))
		}
	case synth.TypeNoul:
		if criteria != nil && !isNull(criteria) {
			var keys []string
			keys, err = decodeOptions(path+".criteria", criteria)
			for _, k := range keys {
				if k != "true" && k != "false" {
					err = badf("%s.criteria: noul criteria may only describe \"true\" and \"false\", got %q", path, k)
					break
				}
			}
		}
	case synth.TypeScore:
		if criteria == nil {
			return q, badf("%s.criteria: required for score questions", path)
		}
		q.Keys, err = decodeLevels(path+".criteria", criteria)
		if err == nil && (len(q.Keys) < MinOptions || len(q.Keys) > MaxOptions) {
			err = badf("%s.criteria: score questions need %d to %d levels, got %d", path, MinOptions, MaxOptions, len(q.Keys))
		}
	case "":
		return q, badf("%s.type: required", path)
	default:
		return q, badf("%s.type: %q is not one of choice, noul, score", path, q.Type)
	}
	return q, err
}

// decodeOptions reads an object of option key → description (string or null), in order.
func decodeOptions(path string, raw json.RawMessage) ([]string, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if err := expectDelim(dec, '{', path); err != nil {
		return nil, err
	}
	var keys []string
	for dec.More() {
		key, err := readKey(dec, path)
		if err != nil {
			return nil, err
		}
		if strings.TrimSpace(key) == "" {
			return nil, badf("%s: an option key must not be empty", path)
		}
		for _, k := range keys {
			if k == key {
				return nil, badf("%s: duplicate option %q", path, key)
			}
		}
		var desc *string
		if err := dec.Decode(&desc); err != nil {
			return nil, badf("%s.%s: must be a string or null", path, key)
		}
		keys = append(keys, key)
	}
	if err := expectEnd(dec, path); err != nil {
		return nil, err
	}
	return keys, nil
}

// decodeLevels reads an array of level descriptions (string or null; null is an empty label).
func decodeLevels(path string, raw json.RawMessage) ([]string, error) {
	var levels []*string
	if err := json.Unmarshal(raw, &levels); err != nil {
		return nil, badf("%s: must be an array of strings", path)
	}
	out := make([]string, len(levels))
	for i, l := range levels {
		if l != nil {
			out[i] = *l
		}
	}
	return out, nil
}

func decodeImages(raw json.RawMessage) (int, error) {
	var images []string
	if err := json.Unmarshal(raw, &images); err != nil {
		return 0, badf("images: must be an array of base64 strings")
	}
	for i, im := range images {
		if im == "" {
			return 0, badf("images[%d]: empty image", i)
		}
		if _, err := base64.StdEncoding.DecodeString(im); err != nil {
			return 0, badf("images[%d]: illegal base64 data", i)
		}
	}
	return len(images), nil
}

// checkKeepAlive applies Ollama's api.Duration rules: a number of seconds or a Go duration
// string.
func checkKeepAlive(raw json.RawMessage) error {
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return badf("keep_alive: invalid JSON")
	}
	switch t := v.(type) {
	case float64:
		return nil
	case string:
		if _, err := time.ParseDuration(t); err != nil {
			return badf("keep_alive: time: invalid duration %q", t)
		}
		return nil
	}
	return badf("keep_alive: unsupported type")
}

func isContent(raw json.RawMessage) bool {
	raw = bytes.TrimLeft(raw, " \t\r\n")
	return len(raw) > 0 && (raw[0] == '"' || raw[0] == '{' || raw[0] == '[')
}

func isNull(raw json.RawMessage) bool { return string(bytes.TrimSpace(raw)) == "null" }

func expectDelim(dec *json.Decoder, want json.Delim, path string) error {
	tok, err := dec.Token()
	if err != nil {
		return badf("%s: invalid JSON: %v", path, err)
	}
	if d, ok := tok.(json.Delim); !ok || d != want {
		if want == '{' {
			return badf("%s: must be an object", path)
		}
		return badf("%s: must be an array", path)
	}
	return nil
}

func readKey(dec *json.Decoder, path string) (string, error) {
	tok, err := dec.Token()
	if err != nil {
		return "", badf("%s: invalid JSON: %v", path, err)
	}
	key, ok := tok.(string)
	if !ok {
		return "", badf("%s: invalid JSON: expected a key", path)
	}
	return key, nil
}

// expectEnd reads the closing brace and checks nothing follows it.
func expectEnd(dec *json.Decoder, path string) error {
	if _, err := dec.Token(); err != nil {
		return badf("%s: invalid JSON: %v", path, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return badf("%s: invalid JSON: data after the end of the value", path)
	}
	return nil
}
