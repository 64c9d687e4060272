package batch

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
)

// Plan is what one validation pass over the input learned, before anything is sent.
type Plan struct {
	InputHash [32]byte
	Entries   int // items (non-blank lines or rows)
	Valid     int
	Invalid   int
	// QuestionsPerRequest counts valid requests by their number of questions.
	QuestionsPerRequest map[int]int
	BodyBytes           int64 // the valid requests' bytes
	// Duplicates are custom ids (or run ids) used by more than one line.
	Duplicates      []Duplicate
	DuplicateGroups int // all of them; Duplicates keeps the first maxDuplicateGroups
}

// Duplicate is one item id used by several lines.
type Duplicate struct {
	ItemID    string
	CustomIDs []string // the custom ids of the later lines (the first line's is ItemID's source)
	Lines     []int
}

const maxDuplicateGroups = 1000

// Questions is the total question count of the valid requests.
func (p *Plan) Questions() int {
	n := 0
	for q, c := range p.QuestionsPerRequest {
		n += q * c
	}
	return n
}

// DuplicatesError lists the duplicate ids, each with its lines.
func (p *Plan) DuplicatesError() error {
	if p.DuplicateGroups == 0 {
		return nil
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d custom ids are used by more than one line (every custom id must be unique; nothing was sent):", p.DuplicateGroups)
	for i, d := range p.Duplicates {
		if i == 50 {
			fmt.Fprintf(&b, "\n  … and %d more", p.DuplicateGroups-50)
			break
		}
		lines := make([]string, len(d.Lines))
		for j, l := range d.Lines {
			lines[j] = strconv.Itoa(l)
		}
		ids := map[string]bool{}
		for _, c := range d.CustomIDs {
			ids[c] = true
		}
		if len(ids) == 1 && d.CustomIDs[0] == d.ItemID {
			fmt.Fprintf(&b, "\n  %q: lines %s", d.ItemID, strings.Join(lines, ", "))
		} else {
			names := make([]string, 0, len(ids))
			for c := range ids {
				names = append(names, strconv.Quote(truncate(c, 80)))
			}
			sort.Strings(names)
			fmt.Fprintf(&b, "\n  %s (run id item %s): lines %s", strings.Join(names, ", "), d.ItemID, strings.Join(lines, ", "))
		}
	}
	return errors.New(b.String())
}

// Scan reads the whole input once: it validates every entry with the contract, counts them,
// finds duplicate ids and hashes the file. onEntry, when set, sees every entry (invalid ones
// to report them). Scan holds one line and a 24-byte key per item, never the input.
func Scan(ctx context.Context, in Input, onEntry func(*Entry)) (*Plan, error) {
	r, err := in.Open()
	if err != nil {
		return nil, err
	}
	defer func() { _ = r.Close() }()
	p := &Plan{QuestionsPerRequest: map[int]int{}}
	type first struct{ line int }
	seen := map[[16]byte]first{}
	dups := map[[16]byte]int{} // index into p.Duplicates, or -1 past the cap
	for {
		if p.Entries%1024 == 0 && ctx.Err() != nil {
			return nil, ctx.Err()
		}
		e, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		p.Entries++
		if e.Valid() {
			p.Valid++
			p.QuestionsPerRequest[e.Questions]++
			p.BodyBytes += int64(len(e.Body))
		} else {
			p.Invalid++
		}
		sum := sha256.Sum256([]byte(e.ItemID))
		var key [16]byte
		copy(key[:], sum[:16])
		if f, ok := seen[key]; ok {
			i, known := dups[key]
			if !known {
				p.DuplicateGroups++
				i = -1
				if len(p.Duplicates) < maxDuplicateGroups {
					i = len(p.Duplicates)
					p.Duplicates = append(p.Duplicates, Duplicate{ItemID: e.ItemID, Lines: []int{f.line}})
				}
				dups[key] = i
			}
			if i >= 0 {
				d := &p.Duplicates[i]
				d.Lines = append(d.Lines, e.Line)
				d.CustomIDs = append(d.CustomIDs, e.CustomID)
			}
		} else {
			seen[key] = first{e.Line}
		}
		if onEntry != nil {
			onEntry(&e)
		}
	}
	p.InputHash = r.Hash()
	if p.Entries == 0 {
		return p, fmt.Errorf("%s: %w", in.Path, ErrEmpty)
	}
	return p, nil
}
