package batch

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/sys1hq/sys1/contract"
)

// Input formats.
const (
	FormatAuto  = "auto"
	FormatJSONL = "jsonl"
	FormatCSV   = "csv"
	FormatTSV   = "tsv"
)

// DefaultIDField is the row field that holds a row's custom id in template mode.
const DefaultIDField = "custom_id"

// MaxCustomIDBytes bounds a custom id; longer ids are refused (they travel in every output
// line). Ids up to MaxItemIDLen of A-Za-z0-9._:- are used verbatim in run ids, others hashed.
const MaxCustomIDBytes = 512

// Input says where a batch's requests come from and how they are built.
type Input struct {
	// Path is the input file: JSONL (each line a System One request or {"custom_id": "…",
	// "body": {…}}), or with Template rows of CSV/TSV/JSONL. Gzip is detected by its magic bytes.
	Path string
	// Format is auto (by the file name, .csv and .tsv optionally followed by .gz; else JSONL),
	// jsonl, csv or tsv. CSV and TSV need a Template.
	Format string
	// Template is a System One request whose "state" each row fills; nil means every line is a
	// request.
	Template *Template
	// StateFields are the row fields that make the state object, in this order; empty means the
	// whole row (a JSONL row verbatim; a CSV row as an object of every column in header order).
	StateFields []string
	// IDField is the row field holding the custom id (default DefaultIDField); rows without it
	// are named by their line number.
	IDField string
}

// Entry is one item of a batch, in input order.
type Entry struct {
	Ord      int    // position among the input's items, 0-based: the order of output lines
	Line     int    // the input line it came from, 1-based (CSV: the line its record starts on)
	CustomID string // the caller's id, or the line number
	ItemID   string // ItemID(CustomID)
	// Body is the request to send (valid entries only).
	Body []byte
	// Questions is the request's question count (valid entries only).
	Questions int
	// Err says why the entry is invalid (it is reported and never sent); nil when valid.
	Err *contract.Error
}

// Valid reports whether the entry can be sent.
func (e *Entry) Valid() bool { return e.Err == nil }

// format resolves FormatAuto from the file name.
func (in Input) format() string {
	if in.Format != "" && in.Format != FormatAuto {
		return in.Format
	}
	name := strings.ToLower(strings.TrimSuffix(strings.ToLower(in.Path), ".gz"))
	switch filepath.Ext(name) {
	case ".csv":
		return FormatCSV
	case ".tsv":
		return FormatTSV
	}
	return FormatJSONL
}

// Check reports a configuration that cannot work, before any file is read.
func (in Input) Check() error {
	switch in.Format {
	case "", FormatAuto, FormatJSONL, FormatCSV, FormatTSV:
	default:
		return fmt.Errorf("format must be auto, jsonl, csv or tsv, got %q", in.Format)
	}
	f := in.format()
	if in.Template == nil {
		if f != FormatJSONL {
			return fmt.Errorf("%s rows build requests from a template: add --template request.json (and --state-field for the columns that make the state)", strings.ToUpper(f))
		}
		if len(in.StateFields) > 0 {
			return errors.New("--state-field needs --template (it picks the row fields that fill the template's state)")
		}
	}
	seen := map[string]bool{}
	for _, s := range in.StateFields {
		if s == "" {
			return errors.New("--state-field must not be empty")
		}
		if seen[s] {
			return fmt.Errorf("--state-field %q is given twice", s)
		}
		seen[s] = true
	}
	return nil
}

// Fingerprint lists the options that change the requests built from the same bytes, for
// DeriveBatchID.
func (in Input) Fingerprint() []string {
	fp := []string{"format=" + in.format()}
	if in.Template != nil {
		fp = append(fp, "template="+string(in.Template.raw), "id-field="+in.idField())
		for _, s := range in.StateFields {
			fp = append(fp, "state-field="+s)
		}
	}
	return fp
}

func (in Input) idField() string {
	if in.IDField == "" {
		return DefaultIDField
	}
	return in.IDField
}

// Reader reads an input's entries once, in order. It holds one line at a time.
type Reader struct {
	in   Input
	file *file
	next func() (Entry, error)
	ord  int
	sum  [32]byte
	done bool
}

// Open opens the input for one pass over its entries.
func (in Input) Open() (*Reader, error) {
	if err := in.Check(); err != nil {
		return nil, err
	}
	f, err := openFile(in.Path)
	if err != nil {
		return nil, err
	}
	r := &Reader{in: in, file: f}
	switch fm := in.format(); {
	case in.Template == nil:
		lr := newLineReader(f.text, MaxLineBytes)
		r.next = func() (Entry, error) { return nextLine(lr, parseRequestLine) }
	case fm == FormatJSONL:
		lr := newLineReader(f.text, MaxLineBytes)
		r.next = func() (Entry, error) {
			return nextLine(lr, func(line []byte, n int) Entry { return in.jsonRow(line, n) })
		}
	default:
		next, err := in.csvRows(f, fm)
		if err != nil {
			_ = f.close()
			return nil, err
		}
		r.next = next
	}
	return r, nil
}

// Next returns the next entry, io.EOF after the last, or an error that ends the pass (an
// unreadable file, a corrupt gzip stream, an oversized CSV record).
func (r *Reader) Next() (Entry, error) {
	if r.done {
		return Entry{}, io.EOF
	}
	e, err := r.next()
	if errors.Is(err, io.EOF) {
		r.done = true
		if r.sum, err = r.file.finish(); err != nil {
			return Entry{}, err
		}
		return Entry{}, io.EOF
	}
	if err != nil {
		return Entry{}, fmt.Errorf("%s: %w", r.in.Path, err)
	}
	e.Ord = r.ord
	r.ord++
	if e.CustomID == "" {
		e.CustomID = strconv.Itoa(e.Line)
	}
	e.ItemID = ItemID(e.CustomID)
	return e, nil
}

// Hash is the SHA-256 of the input file as stored; valid once Next returned io.EOF.
func (r *Reader) Hash() [32]byte { return r.sum }

// Close closes the file.
func (r *Reader) Close() error { return r.file.close() }

// nextLine reads lines until one is not blank and parses it. Blank lines are not items.
func nextLine(lr *lineReader, parse func([]byte, int) Entry) (Entry, error) {
	for {
		line, err := lr.next()
		var tooLong *LineTooLongError
		if errors.As(err, &tooLong) {
			return Entry{Line: tooLong.Line, Err: contract.Errorf(contract.CodeRequestTooLarge, "line: %s", tooLong.Error())}, nil
		}
		if err != nil {
			return Entry{}, err
		}
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		return parse(line, lr.line), nil
	}
}

func invalid(line int, customID string, format string, args ...any) Entry {
	return Entry{Line: line, CustomID: customID, Err: contract.Errorf(contract.CodeInvalidInput, format, args...)}
}

// member is one top-level member of a JSON object, its value verbatim.
type member struct {
	key   string
	value json.RawMessage
}

// members splits a JSON object into its top-level members, in order. It reports duplicate keys
// and anything after the object; on an error it returns the members read before it.
func members(b []byte) ([]member, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil {
		return nil, jsonError("", err)
	}
	if tok != json.Delim('{') {
		return nil, errors.New("not a JSON object")
	}
	var out []member
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return out, jsonError("", err)
		}
		key, _ := tok.(string)
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return append(out, member{key, nil}), jsonError(key, err)
		}
		if seen[key] {
			return out, fmt.Errorf("duplicate key %q", truncate(key, 64))
		}
		seen[key] = true
		out = append(out, member{key, v})
	}
	if _, err := dec.Token(); err != nil {
		return out, jsonError("", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return out, errors.New("more than one JSON value on the line")
	}
	return out, nil
}

// jsonError says what is wrong with a line's JSON (in the value of key, when set).
func jsonError(key string, err error) error {
	where := ""
	if key != "" {
		where = fmt.Sprintf(" in %q", truncate(key, 64))
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("invalid JSON%s: the line ends before the JSON does", where)
	}
	return fmt.Errorf("invalid JSON%s: %w", where, err)
}

// parseRequestLine reads one JSONL line: a System One request, or {"custom_id": "…", "body":
// {…}}. A line is the wrapper when its top level has custom_id or body; the request itself is
// validated by the contract (contract.DecodeRequest), exactly as a worker would.
func parseRequestLine(line []byte, n int) Entry {
	line = bytes.TrimSpace(line)
	if !utf8.Valid(line) {
		return invalid(n, "", "line: invalid UTF-8 at byte %d", firstInvalidUTF8(line))
	}
	if len(line) == 0 || line[0] != '{' {
		return invalid(n, "", `line: not a JSON object (each line is a System One request or {"custom_id": "…", "body": {…}})`)
	}
	ms, err := members(line)
	wrapper := false
	for _, m := range ms {
		if m.key == "custom_id" || m.key == "body" {
			wrapper = true
		}
	}
	if !wrapper {
		// A request (or broken JSON): the contract's decoder says precisely what is wrong.
		return validated(Entry{Line: n}, line)
	}
	if err != nil {
		// Name the line by its custom id when that much could be read.
		custom := ""
		for _, m := range ms {
			if m.key == "custom_id" && json.Unmarshal(m.value, &custom) == nil && len(custom) <= MaxCustomIDBytes {
				break
			}
			custom = ""
		}
		return invalid(n, custom, "line: %v", err)
	}
	var custom string
	var body json.RawMessage
	var problems []string
	for _, m := range ms {
		switch m.key {
		case "custom_id":
			if err := json.Unmarshal(m.value, &custom); err != nil {
				problems = append(problems, "custom_id: must be a string")
				custom = ""
			} else if custom == "" {
				problems = append(problems, "custom_id: must not be empty")
			} else if len(custom) > MaxCustomIDBytes {
				problems = append(problems, fmt.Sprintf("custom_id: %d bytes, at most %d", len(custom), MaxCustomIDBytes))
				custom = ""
			}
		case "body":
			body = m.value
		default:
			problems = append(problems, fmt.Sprintf(`%s: unknown field (a wrapped line has only "custom_id" and "body")`, truncate(m.key, 64)))
		}
	}
	if body == nil {
		problems = append(problems, `body: required (the System One request)`)
	}
	if len(problems) > 0 {
		return invalid(n, custom, "%s", strings.Join(problems, "; "))
	}
	return validated(Entry{Line: n, CustomID: custom}, body)
}

// validated checks body with the contract as a worker would, except the model allow-list,
// which only the workers know (SYS1_MODEL, SYS1_ALLOWED_MODELS): a model they do not allow is
// reported by them (SYS1_MODEL_NOT_ALLOWED). The size limits of resolution (64 KiB of JSON
// without images, 32 MiB with) are checked here too.
func validated(e Entry, body []byte) Entry {
	req, cerr := contract.DecodeRequest(body)
	if cerr == nil {
		model := req.Model
		if model == "" {
			model = "nimble" // the usual default; its length is all the size check needs
		}
		_, cerr = contract.Policy{DefaultModel: model}.Resolve(req)
	}
	if cerr != nil {
		e.Err = cerr
		return e
	}
	e.Body = append([]byte(nil), body...)
	e.Questions = len(req.Questions)
	return e
}

func firstInvalidUTF8(b []byte) int {
	for i := 0; i < len(b); {
		r, size := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && size == 1 {
			return i
		}
		i += size
	}
	return len(b)
}

// jsonRow builds the request of one JSONL row.
func (in Input) jsonRow(line []byte, n int) Entry {
	line = bytes.TrimSpace(line)
	if !utf8.Valid(line) {
		return invalid(n, "", "row: invalid UTF-8 at byte %d", firstInvalidUTF8(line))
	}
	ms, err := members(line)
	if err != nil {
		return invalid(n, "", "row: %v", err)
	}
	custom := ""
	byKey := make(map[string]json.RawMessage, len(ms))
	for _, m := range ms {
		byKey[m.key] = m.value
	}
	if v, ok := byKey[in.idField()]; ok {
		var s string
		switch {
		case json.Unmarshal(v, &s) == nil && s != "":
			custom = s
		case isInteger(v):
			custom = string(v)
		default:
			return invalid(n, "", "row.%s: the custom id must be a non-empty string or an integer", truncate(in.idField(), 64))
		}
		if len(custom) > MaxCustomIDBytes {
			return invalid(n, "", "row.%s: %d bytes, at most %d", truncate(in.idField(), 64), len(custom), MaxCustomIDBytes)
		}
	}
	if len(in.StateFields) == 0 {
		return validated(Entry{Line: n, CustomID: custom}, in.Template.Build(line))
	}
	state := []byte{'{'}
	for i, f := range in.StateFields {
		v, ok := byKey[f]
		if !ok {
			return invalid(n, custom, "row: no field %q (--state-field)", truncate(f, 64))
		}
		if i > 0 {
			state = append(state, ',')
		}
		state = contract.AppendJSONString(state, f)
		state = append(append(state, ':'), v...)
	}
	state = append(state, '}')
	return validated(Entry{Line: n, CustomID: custom}, in.Template.Build(state))
}

func isInteger(v []byte) bool {
	if len(v) == 0 {
		return false
	}
	for i, c := range v {
		if !(c >= '0' && c <= '9' || c == '-' && i == 0 && len(v) > 1) {
			return false
		}
	}
	return true
}

// boundedReader fails once more than max bytes were read since the last reset: a CSV record
// (which may span lines) cannot be bounded by a line reader.
type boundedReader struct {
	r   io.Reader
	n   int
	max int
}

var errRecordTooLong = errors.New("record too long")

func (b *boundedReader) Read(p []byte) (int, error) {
	if b.n > b.max {
		return 0, errRecordTooLong
	}
	if len(p) > b.max-b.n+1 {
		p = p[:b.max-b.n+1]
	}
	n, err := b.r.Read(p)
	b.n += n
	return n, err
}

// csvRows reads CSV (or TSV) rows with a header.
func (in Input) csvRows(f *file, fm string) (func() (Entry, error), error) {
	br := &boundedReader{r: f.text, max: MaxLineBytes}
	cr := csv.NewReader(br)
	if fm == FormatTSV {
		cr.Comma = '\t'
	}
	cr.ReuseRecord = true
	header, err := cr.Read()
	if errors.Is(err, io.EOF) {
		return nil, ErrEmpty
	}
	if errors.Is(err, errRecordTooLong) {
		return nil, fmt.Errorf("%s: the header is longer than %d bytes", in.Path, MaxLineBytes)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: the header: %w", in.Path, err)
	}
	header = append([]string(nil), header...)
	col := map[string]int{}
	var problems []string
	for i, h := range header {
		switch {
		case h == "":
			problems = append(problems, fmt.Sprintf("column %d has no name", i+1))
		case !utf8.ValidString(h):
			problems = append(problems, fmt.Sprintf("column %d's name is not valid UTF-8", i+1))
		case col[h] != 0:
			problems = append(problems, fmt.Sprintf("column %q appears twice", truncate(h, 64)))
		}
		col[h] = i + 1
	}
	for _, s := range in.StateFields {
		if col[s] == 0 {
			problems = append(problems, fmt.Sprintf("--state-field %q: no such column (the header has %s)", truncate(s, 64), quoteList(header, 10)))
		}
	}
	if in.IDField != "" && col[in.IDField] == 0 {
		problems = append(problems, fmt.Sprintf("--id-field %q: no such column (the header has %s)", truncate(in.IDField, 64), quoteList(header, 10)))
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("%s: the CSV header: %s", in.Path, strings.Join(problems, "; "))
	}
	idCol := col[in.idField()] - 1
	fields := in.StateFields
	if len(fields) == 0 {
		fields = header
	}
	return func() (Entry, error) {
		br.n = 0
		rec, err := cr.Read()
		line, _ := cr.FieldPos(0)
		var pe *csv.ParseError
		switch {
		case errors.Is(err, io.EOF):
			return Entry{}, io.EOF
		case errors.Is(err, errRecordTooLong):
			return Entry{}, fmt.Errorf("the CSV record after line %d is longer than %d bytes (the contract's largest request is %d bytes); a CSV record cannot be skipped safely, so the input is refused", line, MaxLineBytes, contract.MaxImageRequestBytes)
		case errors.As(err, &pe) && errors.Is(pe.Err, csv.ErrFieldCount):
			return invalid(pe.StartLine, "", "row: %d fields, the header has %d", len(rec), len(header)), nil
		case errors.As(err, &pe):
			return invalid(pe.StartLine, "", "row: %v", pe.Err), nil
		case err != nil:
			return Entry{}, err
		}
		custom := ""
		if idCol >= 0 {
			custom = rec[idCol]
			if len(custom) > MaxCustomIDBytes {
				return invalid(line, "", "row.%s: %d bytes, at most %d", truncate(in.idField(), 64), len(custom), MaxCustomIDBytes), nil
			}
		}
		state := []byte{'{'}
		for i, name := range fields {
			v := rec[col[name]-1]
			if !utf8.ValidString(v) {
				return invalid(line, custom, "row.%s: invalid UTF-8", truncate(name, 64)), nil
			}
			if i > 0 {
				state = append(state, ',')
			}
			state = contract.AppendJSONString(state, name)
			state = contract.AppendJSONString(append(state, ':'), v)
		}
		state = append(state, '}')
		return validated(Entry{Line: line, CustomID: custom}, in.Template.Build(state)), nil
	}, nil
}

func quoteList(ss []string, max int) string {
	var q []string
	for i, s := range ss {
		if i == max {
			q = append(q, fmt.Sprintf("and %d more", len(ss)-max))
			break
		}
		q = append(q, strconv.Quote(truncate(s, 64)))
	}
	return strings.Join(q, ", ")
}

// Template is a System One request whose "state" each row replaces.
type Template struct {
	raw     []byte
	members []member
}

// ParseTemplate reads a template: a System One request (its "state", if any, is replaced by
// each row's). It is checked with the contract at once, with a placeholder state, so a
// template that can only produce invalid requests is refused before anything is read or sent.
func ParseTemplate(b []byte) (*Template, error) {
	b = bytes.TrimSpace(b)
	if bytes.HasPrefix(b, []byte{0xEF, 0xBB, 0xBF}) {
		b = b[3:]
	}
	if !utf8.Valid(b) {
		return nil, fmt.Errorf("invalid UTF-8 at byte %d", firstInvalidUTF8(b))
	}
	ms, err := members(b)
	if err != nil {
		return nil, err
	}
	t := &Template{raw: append([]byte(nil), b...)}
	for _, m := range ms {
		if m.key != "state" {
			t.members = append(t.members, m)
		}
	}
	if _, cerr := contract.DecodeRequest(t.Build([]byte(`"placeholder"`))); cerr != nil {
		return nil, fmt.Errorf("the template does not make a valid request: %s", cerr.Message)
	}
	return t, nil
}

// Build is the template with state as its "state" (first, like a hand-written request).
func (t *Template) Build(state []byte) []byte {
	n := len(state) + 16
	for _, m := range t.members {
		n += len(m.key) + len(m.value) + 4
	}
	out := make([]byte, 0, n)
	out = append(out, `{"state":`...)
	out = append(out, state...)
	for _, m := range t.members {
		out = append(out, ',')
		out = contract.AppendJSONString(out, m.key)
		out = append(append(out, ':'), m.value...)
	}
	return append(out, '}')
}
