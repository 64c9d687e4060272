package contract

import (
	"strings"
	"unicode/utf8"
)

// Problem is one way a document breaks the contract, at a path such as
// "questions.label.criteria" or "images[0]".
type Problem struct {
	Path    string
	Message string
}

func (p Problem) String() string {
	if p.Path == "" {
		return p.Message
	}
	return p.Path + ": " + p.Message
}

// Problems is every problem found in one document, in document order. It is the cause
// (Error.Err) of a SYS1_INVALID_INPUT or SYS1_UPSTREAM_ERROR, so callers can list them with
// errors.As.
type Problems []Problem

// Error joins the problems with "; ".
func (ps Problems) Error() string {
	var sb strings.Builder
	for i, p := range ps {
		if i > 0 {
			sb.WriteString("; ")
		}
		sb.WriteString(p.String())
	}
	return sb.String()
}

// maxKeptProblems bounds the problems kept for one document: a hostile body can hold
// millions, and each costs memory; the rest are only counted.
const maxKeptProblems = 1000

// problemList accumulates problems during one decode.
type problemList struct {
	list    Problems
	dropped int
}

// Bounds of one problem's text. Paths and messages quote the document's own keys and names,
// which a hostile body makes megabytes long; the message of the error lists up to
// maxListedProblems of them and travels in replies, records and logs.
const (
	maxProblemPath    = 256
	maxProblemMessage = 512
)

func (l *problemList) add(path, msg string) {
	if len(l.list) >= maxKeptProblems {
		l.dropped++
		return
	}
	l.list = append(l.list, Problem{Path: clip(path, maxProblemPath), Message: clip(msg, maxProblemMessage)})
}

// clip cuts s to at most n bytes on a rune boundary, marking the cut with "…".
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	i := n - len("…")
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i] + "…"
}

// invalidInput builds the SYS1_INVALID_INPUT error listing every problem.
func invalidInput(ps Problems) *Error {
	return Wrap(CodeInvalidInput, ps, "invalid request: %s", ps.Error())
}

// upstreamError builds the SYS1_UPSTREAM_ERROR for an answer that breaks the contract.
func upstreamError(ps Problems) *Error {
	return Wrap(CodeUpstreamError, ps, "provider answer breaks the contract: %s", ps.Error())
}

// take moves the duplicate keys the parser found into the list.
func (l *problemList) take(p *parser) {
	for _, pr := range p.dupes {
		l.add(pr.Path, pr.Message)
	}
	l.dropped += p.dupesDropped
	p.dupes, p.dupesDropped = p.dupes[:0], 0
}
