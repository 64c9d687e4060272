package batch_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sys1hq/sys1/cmd/sys1/internal/batch"
	"github.com/sys1hq/sys1/contract"
)

func scanAll(t *testing.T, in batch.Input) ([]batch.Entry, *batch.Plan, error) {
	t.Helper()
	var es []batch.Entry
	p, err := batch.Scan(context.Background(), in, func(e *batch.Entry) { es = append(es, *e) })
	return es, p, err
}

const oneQuestion = `{"q":{"type":"noul","instructions":"Is it urgent?"}}`

func TestBatchJSONLLines(t *testing.T) {
	lines := []string{
		`{"state":"a","questions":` + oneQuestion + `}`, // 1: a request, named by its line
		``, // 2: blank: not an item
		`  {"custom_id":"x-1","body":{"state":"b","questions":` + oneQuestion + `}}  `,       // 3
		"{\"state\":\"crlf\",\"questions\":" + oneQuestion + "}\r",                           // 4: CRLF line ending
		`{"custom_id":"x-2","body":{"state":"b","questions":` + oneQuestion + `},"body":{}}`, // 5: duplicate key
		`{"custom_id":"","body":{"state":"b","questions":` + oneQuestion + `}}`,              // 6: empty custom id
		`{"custom_id":"x-3"}`, // 7: no body
		"{\"state\":\"\xff\",\"questions\":" + oneQuestion + "}",                                   // 8: invalid UTF-8
		`{"state":"a","questions":` + oneQuestion + `} {"x":1}`,                                    // 9: two values
		`{"custom_id":"x-4","body":{"state":"b","questions":` + oneQuestion + `,"temperature":1}}`, // 10: unknown request field
		`{"custom_id":"has space/and more","body":{"state":"b","questions":` + oneQuestion + `}}`,  // 11: hashed id
	}
	path := writeLines(t, "in.jsonl", lines)
	es, p, err := scanAll(t, batch.Input{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	if p.Entries != 10 || p.Valid != 4 || p.Invalid != 6 {
		t.Fatalf("plan %+v", p)
	}
	want := []struct {
		line   int
		custom string
		ok     bool
		msg    string
	}{
		{1, "1", true, ""},
		{3, "x-1", true, ""},
		{4, "4", true, ""},
		{5, "x-2", false, `duplicate key "body"`}, // the custom id read before the fault names it
		{6, "6", false, "custom_id: must not be empty"},
		{7, "x-3", false, "body: required"},
		{8, "8", false, "invalid UTF-8 at byte 10"},
		{9, "9", false, "body"},
		{10, "x-4", false, "temperature"},
		{11, "has space/and more", true, ""},
	}
	for i, w := range want {
		e := es[i]
		if e.Line != w.line || e.CustomID != w.custom || e.Valid() != w.ok || e.Ord != i {
			t.Errorf("entry %d: line %d id %q valid %v ord %d; want line %d id %q valid %v", i, e.Line, e.CustomID, e.Valid(), e.Ord, w.line, w.custom, w.ok)
			continue
		}
		if !w.ok && (e.Err == nil || e.Err.Code != contract.CodeInvalidInput || !strings.Contains(e.Err.Message, w.msg)) {
			t.Errorf("line %d: %v, want SYS1_INVALID_INPUT with %q", w.line, e.Err, w.msg)
		}
		if w.ok && (e.Questions != 1 || len(e.Body) == 0) {
			t.Errorf("line %d: %d questions, %d body bytes", w.line, e.Questions, len(e.Body))
		}
	}
	if got := es[9].ItemID; got == es[9].CustomID || !strings.HasPrefix(got, "h-") || len(got) != 34 {
		t.Errorf("a custom id with spaces and '/' becomes item id %q; want h- and 32 hex digits", got)
	}
	if string(es[1].Body) != `{"state":"b","questions":`+oneQuestion+`}` {
		t.Errorf("a wrapped body is sent verbatim; got %s", es[1].Body)
	}
}

func TestBatchIDs(t *testing.T) {
	if batch.ItemID("t-1:a.b_c") != "t-1:a.b_c" {
		t.Error("a custom id of run-id characters is used verbatim")
	}
	long := strings.Repeat("a", batch.MaxItemIDLen+1)
	if id := batch.ItemID(long); id == long || batch.ItemID(long) != id || !strings.HasPrefix(id, "h-") {
		t.Errorf("a too-long custom id is hashed deterministically, got %q", id)
	}
	if batch.ItemID(strings.Repeat("a", batch.MaxItemIDLen)) != strings.Repeat("a", batch.MaxItemIDLen) {
		t.Error("a custom id at the length limit is used verbatim")
	}
	for _, id := range []string{"", "a.b", "a:b", "a b", strings.Repeat("x", 65), "é"} {
		if batch.ValidBatchID(id) == nil {
			t.Errorf("batch id %q accepted", id)
		}
	}
	for _, id := range []string{"b-1", "Q4_tickets", strings.Repeat("x", 64)} {
		if err := batch.ValidBatchID(id); err != nil {
			t.Errorf("batch id %q refused: %v", id, err)
		}
	}
	var h [32]byte
	a := batch.DeriveBatchID(h, "svc", []string{"format=jsonl"})
	if a != batch.DeriveBatchID(h, "svc", []string{"format=jsonl"}) || batch.ValidBatchID(a) != nil {
		t.Errorf("derived id %q is not stable or not valid", a)
	}
	h[0] = 1
	for _, other := range []string{batch.DeriveBatchID(h, "svc", []string{"format=jsonl"}), batch.DeriveBatchID([32]byte{}, "svc2", []string{"format=jsonl"}), batch.DeriveBatchID([32]byte{}, "svc", []string{"format=csv"})} {
		if other == a {
			t.Error("another input, caller or option must name another batch")
		}
	}
	// Every run id of a batch is within SPEC §3 (1–128 of A-Za-z0-9._:-).
	if id := batch.RunID(strings.Repeat("b", batch.MaxBatchIDLen), batch.ItemID(strings.Repeat("é", 40))); len(id) > 128 {
		t.Errorf("run id %q is %d bytes", id, len(id))
	}
}

func TestBatchDuplicatesAreReportedWithTheirLines(t *testing.T) {
	req := `{"state":"a","questions":` + oneQuestion + `}`
	path := writeLines(t, "dup.jsonl", []string{
		`{"custom_id":"a","body":` + req + `}`,
		`{"custom_id":"b","body":` + req + `}`,
		`{"custom_id":"a","body":` + req + `}`,
		`{"custom_id":"3","body":` + req + `}`, // collides with line 3's... no: line 3 has custom id "a"
		req,                                    // line 5: custom id "5"
		`{"custom_id":"5","body":` + req + `}`, // the explicit "5" meets line 5's implicit one
		`{"custom_id":"a","body":` + req + `}`,
	})
	_, p, err := scanAll(t, batch.Input{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	derr := p.DuplicatesError()
	if derr == nil || p.DuplicateGroups != 2 {
		t.Fatalf("duplicates: %v (%d groups)", derr, p.DuplicateGroups)
	}
	for _, want := range []string{`"a": lines 1, 3, 7`, `"5": lines 5, 6`, "nothing was sent"} {
		if !strings.Contains(derr.Error(), want) {
			t.Errorf("duplicates error lacks %q:\n%v", want, derr)
		}
	}
}

func TestBatchTemplateWithCSVAndJSONLRows(t *testing.T) {
	tpl, err := batch.ParseTemplate([]byte(`{"model":"nimble","questions":` + oneQuestion + `,"state":"replaced"}`))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	csvPath := filepath.Join(dir, "rows.csv")
	os.WriteFile(csvPath, []byte("\xef\xbb\xbfid,text,lang\n"+
		"t1,\"My order, it never came\",en\n"+
		"t2,\"two\nlines\",fr\n"+
		"t3,too,many,fields\n"+
		",no id,de\n"), 0o600)
	es, p, err := scanAll(t, batch.Input{Path: csvPath, Template: tpl, StateFields: []string{"text", "lang"}, IDField: "id"})
	if err != nil {
		t.Fatal(err)
	}
	if p.Entries != 4 || p.Valid != 3 {
		t.Fatalf("plan %+v", p)
	}
	if got := string(es[0].Body); got != `{"state":{"text":"My order, it never came","lang":"en"},"model":"nimble","questions":`+oneQuestion+`}` {
		t.Errorf("CSV row 1 built %s", got)
	}
	if es[0].CustomID != "t1" || es[1].CustomID != "t2" || es[1].Line != 3 || !strings.Contains(string(es[1].Body), `"two\nlines"`) {
		t.Errorf("row 2 (a quoted newline): %+v %s", es[1], es[1].Body)
	}
	if es[2].Valid() || es[2].Line != 5 || !strings.Contains(es[2].Err.Message, "4 fields, the header has 3") {
		t.Errorf("a row with too many fields: %+v", es[2])
	}
	if es[3].CustomID != "6" {
		t.Errorf("a row with an empty id is named by its line: %q", es[3].CustomID)
	}

	// The whole row as the state, and a column the header lacks.
	es, _, err = scanAll(t, batch.Input{Path: csvPath, Template: tpl, IDField: "id"})
	if err != nil || !strings.HasPrefix(string(es[0].Body), `{"state":{"id":"t1","text":"My order, it never came","lang":"en"},`) {
		t.Fatalf("whole row: %v %s", err, es[0].Body)
	}
	if _, _, err := scanAll(t, batch.Input{Path: csvPath, Template: tpl, StateFields: []string{"body"}}); err == nil || !strings.Contains(err.Error(), `--state-field "body": no such column`) {
		t.Errorf("a missing column is refused before anything is sent: %v", err)
	}

	rows := writeLines(t, "rows.jsonl", []string{
		`{"custom_id":"r1","text":"hello","meta":{"n":1}}`,
		`{"custom_id":7,"text":"seven"}`,
		`{"text":"no id"}`,
		`{"custom_id":"r4"}`,
	})
	es, _, err = scanAll(t, batch.Input{Path: rows, Template: tpl, StateFields: []string{"text"}})
	if err != nil {
		t.Fatal(err)
	}
	if string(es[0].Body) != `{"state":{"text":"hello"},"model":"nimble","questions":`+oneQuestion+`}` || es[1].CustomID != "7" || es[2].CustomID != "3" {
		t.Errorf("JSONL rows: %s / %q / %q", es[0].Body, es[1].CustomID, es[2].CustomID)
	}
	if es[3].Valid() || !strings.Contains(es[3].Err.Message, `no field "text"`) {
		t.Errorf("a row without the state field: %+v", es[3])
	}
	es, _, _ = scanAll(t, batch.Input{Path: rows, Template: tpl})
	if !strings.HasPrefix(string(es[0].Body), `{"state":{"custom_id":"r1","text":"hello","meta":{"n":1}},`) {
		t.Errorf("a whole JSONL row is the state verbatim: %s", es[0].Body)
	}
}

func TestBatchTemplateThatCannotWork(t *testing.T) {
	for name, tpl := range map[string]string{
		"no questions":  `{"model":"nimble"}`,
		"not an object": `["x"]`,
		"bad question":  `{"questions":{"q":{"type":"maybe","instructions":"x"}}}`,
		"broken JSON":   `{"questions":`,
	} {
		if _, err := batch.ParseTemplate([]byte(tpl)); err == nil {
			t.Errorf("%s: template accepted", name)
		}
	}
	_, err := batch.ParseTemplate([]byte(`{"questions":{}}`))
	if err == nil || !strings.Contains(err.Error(), "the template does not make a valid request") || !strings.Contains(err.Error(), "questions") {
		t.Errorf("the reason names the problem and its path: %v", err)
	}
}

func TestBatchGzipInputByMagicBytes(t *testing.T) {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	for i := range 50 {
		zw.Write([]byte(request(i) + "\n"))
	}
	zw.Close()
	// The name says nothing: gzip is told by its magic bytes.
	path := filepath.Join(t.TempDir(), "tickets.data")
	os.WriteFile(path, buf.Bytes(), 0o600)
	_, p, err := scanAll(t, batch.Input{Path: path})
	if err != nil || p.Entries != 50 || p.Valid != 50 {
		t.Fatalf("gzip: %v %+v", err, p)
	}
	// The batch id names the bytes as stored.
	plain := writeLines(t, "plain.jsonl", func() []string {
		var ls []string
		for i := range 50 {
			ls = append(ls, request(i))
		}
		return ls
	}())
	_, p2, _ := scanAll(t, batch.Input{Path: plain})
	if p2.InputHash == p.InputHash {
		t.Error("the compressed and the plain file have one hash")
	}
	// A corrupt stream after a good header ends the pass with a clear error.
	bad := append([]byte(nil), buf.Bytes()[:len(buf.Bytes())/2]...)
	os.WriteFile(path, bad, 0o600)
	if _, _, err := scanAll(t, batch.Input{Path: path}); err == nil || !strings.Contains(err.Error(), "unexpected EOF") {
		t.Errorf("truncated gzip: %v", err)
	}
}

func TestBatchBadFiles(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty.jsonl")
	os.WriteFile(empty, nil, 0o600)
	blank := filepath.Join(dir, "blank.jsonl")
	os.WriteFile(blank, []byte("\n  \n\r\n"), 0o600)
	binary := filepath.Join(dir, "image.png")
	os.WriteFile(binary, []byte("\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"), 0o600)
	headerOnly := filepath.Join(dir, "h.csv")
	os.WriteFile(headerOnly, []byte("a,b\n"), 0o600)
	tpl, _ := batch.ParseTemplate([]byte(`{"questions":` + oneQuestion + `}`))
	for name, tc := range map[string]struct {
		in   batch.Input
		want string
	}{
		"empty":          {batch.Input{Path: empty}, "the input is empty"},
		"blank lines":    {batch.Input{Path: blank}, "the input is empty"},
		"missing":        {batch.Input{Path: filepath.Join(dir, "absent.jsonl")}, "no such file"},
		"directory":      {batch.Input{Path: dir}, "is a directory"},
		"binary":         {batch.Input{Path: binary}, "is not text: a NUL byte at offset 8"},
		"csv, no rows":   {batch.Input{Path: headerOnly, Template: tpl}, "the input is empty"},
		"csv, no tpl":    {batch.Input{Path: headerOnly}, "add --template"},
		"fields, no tpl": {batch.Input{Path: empty, StateFields: []string{"x"}}, "--state-field needs --template"},
		"bad format":     {batch.Input{Path: empty, Format: "xml"}, "format must be"},
	} {
		_, _, err := scanAll(t, tc.in)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", name, err, tc.want)
		}
		if name == "empty" && !errors.Is(err, batch.ErrEmpty) {
			t.Errorf("empty: %v is not ErrEmpty", err)
		}
	}
}
