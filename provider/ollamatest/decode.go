package ollamatest

import (
	"encoding/base64"
	"fmt"
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
	KeepAlive []byte
}

// badRequest is a 400 with Ollama's {"error": "..."} body.
type badRequest struct{ msg string }

func (e *badRequest) Error() string { return e.msg }

func badf(format string, args ...any) error { return &badRequest{msg: fmt.Sprintf(format, args...)} }

// decodeRequest decodes and validates body by Ollama's rules, keeping questions and options
// in the order they arrived.
func decodeRequest(body []byte) (*decoded, error) {
	s := &scanner{data: body}
	if c := s.peek(); c != '{' {
		if c == 0 {
			return nil, badf("invalid JSON: empty body")
		}
		if c == '[' || c == '"' || c == 't' || c == 'f' || c == 'n' || c == '-' || (c >= '0' && c <= '9') {
			return nil, badf("request body: must be an object")
		}
		return nil, s.fail("unexpected character %q", c)
	}
	var req decoded
	var seen [5]bool // model, state, questions, images, keep_alive
	once := func(i int, key string) error {
		if seen[i] {
			return badf("duplicate field %q", key)
		}
		seen[i] = true
		return nil
	}
	err := s.object(func(key string) error {
		switch key {
		case "model":
			if err := once(0, key); err != nil {
				return err
			}
			if s.peek() != '"' {
				return badf("model: must be a string")
			}
			m, err := s.str()
			req.Model = m
			return err
		case "state":
			if err := once(1, key); err != nil {
				return err
			}
			if !isContent(s.peek()) {
				return badf("state: must be a string, an object or an array")
			}
			raw, err := s.raw()
			req.State = raw
			return err
		case "questions":
			if err := once(2, key); err != nil {
				return err
			}
			qs, err := decodeQuestions(s)
			req.Questions = qs
			return err
		case "images":
			if err := once(3, key); err != nil {
				return err
			}
			n, err := decodeImages(s)
			req.Images = n
			return err
		case "keep_alive":
			if err := once(4, key); err != nil {
				return err
			}
			raw, err := checkKeepAlive(s)
			req.KeepAlive = raw
			return err
		default:
			return badf("unknown field %q", key)
		}
	})
	if err != nil {
		return nil, err
	}
	if err := s.end(); err != nil {
		return nil, err
	}
	switch {
	case strings.TrimSpace(req.Model) == "":
		return nil, badf("model is required")
	case req.State == nil:
		return nil, badf("state is required")
	case !seen[2]:
		return nil, badf("questions is required")
	}
	return &req, nil
}

func decodeQuestions(s *scanner) ([]synth.Question, error) {
	if s.peek() != '{' {
		return nil, badf("questions: must be an object")
	}
	qs := make([]synth.Question, 0, 4)
	err := s.object(func(name string) error {
		if strings.TrimSpace(name) == "" {
			return badf("questions: a question name must not be empty")
		}
		for _, q := range qs {
			if q.Name == name {
				return badf("questions: duplicate question %q", name)
			}
		}
		if len(qs) == MaxQuestions {
			return badf("questions: must have %d to %d questions, got %d or more", MinQuestions, MaxQuestions, MaxQuestions+1)
		}
		q, err := decodeQuestion(s, name)
		if err != nil {
			return err
		}
		qs = append(qs, q)
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(qs) < MinQuestions {
		return nil, badf("questions: must have %d to %d questions, got %d", MinQuestions, MaxQuestions, len(qs))
	}
	return qs, nil
}

func decodeQuestion(s *scanner, name string) (synth.Question, error) {
	q := synth.Question{Name: name}
	path := "questions." + name
	if s.peek() != '{' {
		return q, badf("%s: must be an object", path)
	}
	var criteria scanner // a scanner over the criteria value, decoded once the type is known
	hasType, hasInstructions, hasCriteria := false, false, false
	err := s.object(func(key string) error {
		switch key {
		case "type":
			if hasType {
				return badf("%s: duplicate field %q", path, key)
			}
			hasType = true
			if s.peek() != '"' {
				return badf("%s.type: must be a string", path)
			}
			t, err := s.str()
			q.Type = t
			return err
		case "instructions":
			if hasInstructions {
				return badf("%s: duplicate field %q", path, key)
			}
			hasInstructions = true
			if !isContent(s.peek()) {
				return badf("%s.instructions: must be a string, an object or an array", path)
			}
			return s.skip()
		case "criteria":
			if hasCriteria {
				return badf("%s: duplicate field %q", path, key)
			}
			hasCriteria = true
			raw, err := s.raw()
			criteria = scanner{data: raw}
			return err
		default:
			return badf("%s: unknown field %q", path, key)
		}
	})
	if err != nil {
		return q, err
	}
	if !hasInstructions {
		return q, badf("%s.instructions: must be a string, an object or an array", path)
	}
	switch q.Type {
	case synth.TypeChoice:
		if !hasCriteria {
			return q, badf("%s.criteria: required for choice questions", path)
		}
		q.Keys, err = decodeOptions(&criteria, path+".criteria")
		if err == nil && (len(q.Keys) < MinOptions || len(q.Keys) > MaxOptions) {
			err = badf("%s.criteria: choice questions need %d to %d options, got %d", path, MinOptions, MaxOptions, len(q.Keys))
		}
	case synth.TypeNoul:
		if hasCriteria && criteria.peek() != 'n' {
			var keys []string
			keys, err = decodeOptions(&criteria, path+".criteria")
			for _, k := range keys {
				if k != "true" && k != "false" {
					err = badf("%s.criteria: noul criteria may only describe \"true\" and \"false\", got %q", path, k)
					break
				}
			}
		}
	case synth.TypeScore:
		if !hasCriteria {
			return q, badf("%s.criteria: required for score questions", path)
		}
		q.Keys, err = decodeLevels(&criteria, path+".criteria")
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
func decodeOptions(s *scanner, path string) ([]string, error) {
	if s.peek() != '{' {
		return nil, badf("%s: must be an object", path)
	}
	keys := make([]string, 0, 8)
	err := s.object(func(key string) error {
		if strings.TrimSpace(key) == "" {
			return badf("%s: an option key must not be empty", path)
		}
		for _, k := range keys {
			if k == key {
				return badf("%s: duplicate option %q", path, key)
			}
		}
		if c := s.peek(); c != '"' && c != 'n' {
			return badf("%s.%s: must be a string or null", path, key)
		}
		keys = append(keys, key)
		return s.skip()
	})
	return keys, err
}

// decodeLevels reads an array of level descriptions (string or null; null is an empty label).
func decodeLevels(s *scanner, path string) ([]string, error) {
	if s.peek() != '[' {
		return nil, badf("%s: must be an array of strings", path)
	}
	levels := make([]string, 0, 8)
	err := s.array(func(int) error {
		switch s.peek() {
		case '"':
			l, err := s.str()
			levels = append(levels, l)
			return err
		case 'n':
			levels = append(levels, "")
			return s.skip()
		}
		return badf("%s: must be an array of strings", path)
	})
	return levels, err
}

func decodeImages(s *scanner) (int, error) {
	if s.peek() != '[' {
		return 0, badf("images: must be an array of base64 strings")
	}
	n := 0
	err := s.array(func(i int) error {
		if s.peek() != '"' {
			return badf("images: must be an array of base64 strings")
		}
		b, err := s.strBytes()
		if err != nil {
			return err
		}
		if len(b) == 0 {
			return badf("images[%d]: empty image", i)
		}
		if !validBase64(b) {
			return badf("images[%d]: illegal base64 data", i)
		}
		n++
		return nil
	})
	return n, err
}

// validBase64 checks standard, padded base64 without allocating the decoded image: it decodes
// 4 KiB at a time into a scratch array.
func validBase64(b []byte) bool {
	if len(b)%4 != 0 {
		return false
	}
	for i := 0; i < len(b)-2; i++ {
		if b[i] == '=' {
			return false // padding only at the very end
		}
	}
	var scratch [3 * 1024]byte
	for i := 0; i < len(b); i += 4 * 1024 {
		end := min(i+4*1024, len(b))
		if _, err := base64.StdEncoding.Decode(scratch[:], b[i:end]); err != nil {
			return false
		}
	}
	return true
}

// checkKeepAlive applies Ollama's api.Duration rules: a number of seconds or a Go duration
// string.
func checkKeepAlive(s *scanner) ([]byte, error) {
	c := s.peek()
	start := s.pos
	switch {
	case c == '"':
		v, err := s.str()
		if err != nil {
			return nil, err
		}
		if _, err := time.ParseDuration(v); err != nil {
			return nil, badf("keep_alive: time: invalid duration %q", v)
		}
	case c == '-' || (c >= '0' && c <= '9'):
		if _, err := s.number(); err != nil {
			return nil, err
		}
	default:
		if err := s.skip(); err != nil {
			return nil, err
		}
		return nil, badf("keep_alive: unsupported type")
	}
	return s.data[start:s.pos], nil
}

func isContent(c byte) bool { return c == '"' || c == '{' || c == '[' }
