package limits

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"
)

// Problem is one bad line of a configuration file.
type Problem struct {
	Line    int    // 1-based; 0 when the problem is the file as a whole
	Field   string // the field's path, like "rules[2].usd_per_day"; empty for the file
	Message string
}

func (p Problem) String() string {
	var sb strings.Builder
	if p.Line > 0 {
		sb.WriteString("line ")
		sb.WriteString(strconv.Itoa(p.Line))
		sb.WriteString(": ")
	}
	if p.Field != "" {
		sb.WriteString(p.Field)
		sb.WriteString(": ")
	}
	sb.WriteString(p.Message)
	return sb.String()
}

// FileError is every problem found in one file, in file order: one error that names every bad
// line and field, so an operator fixes them all in one edit.
type FileError struct {
	What     string // "limits file", "prices file"
	Problems []Problem
	// Dropped counts problems past the listed ones (a hostile or badly broken file has
	// thousands; the message stays readable).
	Dropped int
}

func (e *FileError) Error() string {
	var sb strings.Builder
	sb.WriteString(e.What)
	n := len(e.Problems) + e.Dropped
	if n == 1 {
		sb.WriteString(": 1 problem: ")
	} else {
		fmt.Fprintf(&sb, ": %d problems: ", n)
	}
	for i, p := range e.Problems {
		if i > 0 {
			sb.WriteString("; ")
		}
		sb.WriteString(p.String())
	}
	if e.Dropped > 0 {
		fmt.Fprintf(&sb, "; and %d more", e.Dropped)
	}
	return sb.String()
}

// MaxFileBytes bounds a limits or prices file: both are a few kilobytes in practice, and the
// bound keeps a mistaken path (a log file, a binary) from being parsed at all.
const MaxFileBytes = 1 << 20

// maxListed bounds the problems an error lists.
const maxListed = 50

// maxQuoted bounds how much of a file's own text a message quotes.
const maxQuoted = 64

type problems struct {
	what    string
	list    []Problem
	dropped int
}

func (p *problems) add(n *yaml.Node, field, format string, args ...any) {
	if len(p.list) >= maxListed {
		p.dropped++
		return
	}
	line := 0
	if n != nil {
		line = n.Line
	}
	p.list = append(p.list, Problem{Line: line, Field: field, Message: fmt.Sprintf(format, args...)})
}

func (p *problems) err() error {
	if len(p.list) == 0 {
		return nil
	}
	// Checks that need a whole rule report after its fields: list in file order all the same.
	sort.SliceStable(p.list, func(i, j int) bool { return p.list[i].Line < p.list[j].Line })
	return &FileError{What: p.what, Problems: p.list, Dropped: p.dropped}
}

// quote renders a value from the file for a message: quoted, clipped and valid UTF-8.
func quote(s string) string {
	if len(s) > maxQuoted {
		cut := maxQuoted
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		return strconv.Quote(s[:cut] + "…")
	}
	return strconv.Quote(s)
}

// parseDocument reads data as exactly one YAML document and returns its root node (nil for
// an empty document: only comments, or nothing). A syntax error is the only problem reported,
// since nothing after it can be trusted.
func parseDocument(data []byte, probs *problems) *yaml.Node {
	if len(data) > MaxFileBytes {
		probs.add(nil, "", "the file is %d bytes; the limit is %d", len(data), MaxFileBytes)
		return nil
	}
	if !utf8.Valid(data) {
		line := 1 + bytes.Count(data[:firstInvalidUTF8(data)], []byte("\n"))
		probs.add(&yaml.Node{Line: line}, "", "invalid UTF-8")
		return nil
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil
		}
		probs.add(nil, "", "%s", strings.TrimPrefix(err.Error(), "yaml: "))
		return nil
	}
	var more yaml.Node
	switch err := dec.Decode(&more); {
	case errors.Is(err, io.EOF):
	case err != nil:
		probs.add(nil, "", "%s", strings.TrimPrefix(err.Error(), "yaml: "))
		return nil
	default:
		probs.add(&more, "", "a second YAML document (after ---); the file must hold one")
		return nil
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) == 0 {
		return nil
	}
	root := deref(doc.Content[0])
	if root.Kind == yaml.ScalarNode && root.ShortTag() == "!!null" {
		return nil
	}
	return root
}

func firstInvalidUTF8(b []byte) int {
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && n == 1 {
			return i
		}
		i += n
	}
	return len(b)
}

// deref follows aliases (*name) to the anchored node. yaml.v3 refuses an anchor that contains
// itself, so the chain ends; the bound is for safety all the same.
func deref(n *yaml.Node) *yaml.Node {
	for i := 0; n != nil && n.Kind == yaml.AliasNode && n.Alias != nil && i < 16; i++ {
		n = n.Alias
	}
	return n
}

// kindName names a node's kind for messages.
func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		switch n.ShortTag() {
		case "!!null":
			return "nothing (null)"
		case "!!bool":
			return "a boolean"
		case "!!int", "!!float":
			return "a number"
		}
		return "a string"
	}
	return "an alias"
}

// eachPair calls fn for every key of mapping n, in file order. Keys must be strings and
// unique: a duplicate would silently override the first in most YAML readers, which is how a
// limit goes missing unnoticed. Merge keys (<<) are refused for the same reason.
func eachPair(n *yaml.Node, path string, probs *problems, fn func(key string, k, v *yaml.Node)) {
	seen := make(map[string]int, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := deref(n.Content[i]), deref(n.Content[i+1])
		field := join(path, k.Value)
		if k.Kind != yaml.ScalarNode {
			probs.add(k, path, "keys must be plain names, got %s", kindName(k))
			continue
		}
		if k.Tag == "!!merge" || k.Value == "<<" {
			probs.add(k, path, "merge keys (<<) are not supported; write the fields out")
			continue
		}
		if line, dup := seen[k.Value]; dup {
			probs.add(k, field, "duplicate key (first at line %d)", line)
			continue
		}
		seen[k.Value] = k.Line
		fn(k.Value, k, v)
	}
}

func join(path, key string) string {
	if len(key) > maxQuoted || strings.ContainsAny(key, " \t\r\n\"") {
		key = quote(key)
	}
	if path == "" {
		return key
	}
	return path + "." + key
}

// number reads a finite number: a YAML int or float, or a string holding one ("5", "0.25").
func number(v *yaml.Node) (float64, bool) {
	if v.Kind != yaml.ScalarNode {
		return 0, false
	}
	var f float64
	switch v.ShortTag() {
	case "!!int", "!!float":
		if err := v.Decode(&f); err != nil {
			return 0, false
		}
	case "!!str":
		s := strings.TrimSpace(v.Value)
		var err error
		if f, err = strconv.ParseFloat(s, 64); err != nil {
			return 0, false
		}
	default:
		return 0, false
	}
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, false
	}
	return f, true
}

// maxWhole is the largest whole number a field accepts: every integer up to it is exact in a
// float64, and it is far beyond any sensible limit.
const maxWhole = 1 << 53

// wholeNumber reads a number that must be an integer (1000 or 1e6; not 2.5).
func wholeNumber(v *yaml.Node) (int64, bool) {
	f, ok := number(v)
	if !ok || f != math.Trunc(f) || math.Abs(f) > maxWhole {
		return 0, false
	}
	return int64(f), true
}
