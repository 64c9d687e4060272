package worker

import (
	"unicode/utf8"

	"github.com/sys1hq/sys1/contract"
)

// Sizing a run's outcome before the model is called: a request the contract accepts can
// still produce a record (the request once, the answers once) or a stored reply larger than
// NATS can store. Such a run could never be answered; calling the model for it would pay for
// an answer that is then thrown away, on every delivery. prepare refuses it up front with
// SYS1_REQUEST_TOO_LARGE instead (publish still catches the rare answer that outgrows the
// estimate).

// Per-item allowances of the estimate, generous on purpose: a number is at most 24 bytes, and
// each JSON member adds its quotes, colon and comma.
const (
	perAnswer      = 192       // "name":{"type":…,"confidence":…} around an answer's parts
	perProbability = 40        // "key":0.12345678901234567, beyond the key itself
	perAttempt     = 2 << 10   // an attempt with its (bounded) detail
	perImage       = 128       // {"sha256":"…","bytes":n} in place of the image
	recordOverhead = 8 << 10   // identity, timings, provenance, usage
	sizingFloor    = 256 << 10 // requests smaller than limit/16 need no sizing (see storable)
)

// storable reports whether the outcome of req (decoded from a body of n bytes) fits in limit
// bytes, and the record size it estimated. maxAttempts bounds the attempts the record can
// carry.
func storable(req *contract.Request, n, limit, maxAttempts int) (bool, int) {
	// Small requests cannot come near the limit: their answers are bounded by their options,
	// which are part of the n bytes, so 16 n covers request, answers and escaping.
	if 16*n+recordOverhead+maxAttempts*perAttempt < limit {
		return true, 0
	}
	answers := answersBound(req)
	request := n + 64 // the resolved model, keep_alive
	for _, im := range req.Images {
		request += perImage - len(im.Data)
	}
	record := max(request, 0) + answers + maxAttempts*perAttempt + recordOverhead
	return record <= limit, record
}

// answersBound is the most bytes the provider's answers to req's questions can take, as an
// upstream written with encoding/json (Ollama) encodes them: every option key (choice: in
// "choice" and in "probabilities"), every level (score: its probability and its legend entry).
func answersBound(req *contract.Request) int {
	total := 2
	for _, q := range req.Questions {
		total += perAnswer + jsonLen(q.Name)
		switch q.Type {
		case contract.TypeChoice:
			longest := 0
			for _, o := range q.Options {
				l := jsonLen(o.Key)
				total += l + perProbability
				longest = max(longest, l)
			}
			total += longest // the chosen key
		case contract.TypeScore:
			for i, level := range q.Levels {
				total += 2*perProbability + jsonLen(level) + 2*digits(i)
			}
		default:
			total += 2 * perProbability
		}
	}
	return total
}

// jsonLen is the length of s as encoding/json writes it: quotes, and six bytes for control
// characters and for '<', '>', '&' (which it escapes for HTML), three for invalid UTF-8.
func jsonLen(s string) int {
	n := 2
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c < 0x20 || c == '<' || c == '>' || c == '&':
				n += 6
			case c == '"' || c == '\\':
				n += 2
			default:
				n++
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			n += 6
		case r == '\u2028' || r == '\u2029':
			n += 6
		default:
			n += size
		}
		i += size
	}
	return n
}

func digits(i int) int {
	n := 1
	for ; i >= 10; i /= 10 {
		n++
	}
	return n
}
