package batch

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/sys1hq/sys1/contract"
)

// FuzzParseRequestLine: whatever a line holds, parsing it never panics, a line it accepts is a
// request the contract accepts, a line it refuses has a contract error, and the output line it
// makes is valid JSON.
func FuzzParseRequestLine(f *testing.F) {
	for _, s := range []string{
		`{"state":"a","questions":{"q":{"type":"noul","instructions":"x"}}}`,
		`{"custom_id":"a","body":{"state":"a","questions":{"q":{"type":"noul","instructions":"x"}}}}`,
		`{"custom_id":"a b/c","body":{"state":{"k":[1,2]},"questions":{"q":{"type":"choice","instructions":"x","criteria":{"a":"1","b":"2"}}}}}`,
		`{"custom_id":1,"body":{}}`, `{"body":[]}`, `{"custom_id":"x"}`, `{"custom_id":"x","custom_id":"y","body":{}}`,
		`{"custom_id":"x","body":{"state":`, `[]`, `"x"`, ``, `{}`, "{\"custom_id\":\"\xff\"}", `{"a":1} {"b":2}`,
		`{"custom_id":"\u0000","body":{"state":"a","questions":{"q":{"type":"score","instructions":"x","criteria":["a","b"]}}}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		e := parseRequestLine(line, 7)
		if e.Line != 7 {
			t.Fatalf("line %d", e.Line)
		}
		if len(e.CustomID) > MaxCustomIDBytes || !utf8.ValidString(e.CustomID) {
			t.Fatalf("custom id %q", e.CustomID)
		}
		if e.Err == nil {
			if _, cerr := contract.DecodeRequest(e.Body); cerr != nil || e.Questions < 1 {
				t.Fatalf("accepted a line the contract refuses: %v (%d questions)", cerr, e.Questions)
			}
		} else if e.Err.Code != contract.CodeInvalidInput && e.Err.Code != contract.CodeRequestTooLarge || !strings.HasPrefix(e.Err.Message, "["+string(e.Err.Code)+"] ") {
			t.Fatalf("error %+v", e.Err)
		}
		if e.CustomID == "" {
			e.CustomID = "7"
		}
		id := ItemID(e.CustomID)
		if len(RunID("b-0123456789abcdef01234567", id)) > 128 {
			t.Fatalf("run id too long for %q", e.CustomID)
		}
		oc := &outcome{status: StatusSuccess, result: json.RawMessage(`{}`)}
		if e.Err != nil {
			oc = localError(StatusInvalid, e.Err)
		}
		if out := e.line("b-1:"+id, oc); !json.Valid(out) {
			t.Fatalf("output line is not JSON: %s", out)
		}
	})
}

// FuzzLineReader: the bounded reader returns exactly the input's lines, without their endings,
// and reports every line over the bound by its number instead of returning it.
func FuzzLineReader(f *testing.F) {
	for _, s := range []string{"a\nb\n", "a\r\nb", "\n\n", "", "0123456789abcdef\nx", strings.Repeat("y", 40) + "\nz\n"} {
		f.Add([]byte(s), uint8(8))
	}
	f.Fuzz(func(t *testing.T, data []byte, max uint8) {
		bound := int(max%32) + 1
		lr := newLineReader(bufio.NewReaderSize(bytes.NewReader(data), 16), bound)
		var want [][]byte
		if len(data) > 0 {
			want = bytes.Split(bytes.TrimSuffix(data, []byte("\n")), []byte("\n"))
		}
		for i := 0; ; i++ {
			line, err := lr.next()
			if errors.Is(err, io.EOF) {
				if i != len(want) {
					t.Fatalf("%d lines read, input has %d", i, len(want))
				}
				return
			}
			if i >= len(want) {
				t.Fatalf("line %d beyond the input's %d", i+1, len(want))
			}
			w := bytes.TrimSuffix(want[i], []byte("\r"))
			var tooLong *LineTooLongError
			switch {
			case errors.As(err, &tooLong):
				if len(w) <= bound || tooLong.Line != i+1 || tooLong.Bytes != int64(len(w)) {
					t.Fatalf("line %d (%d bytes, bound %d) reported too long: %+v", i+1, len(w), bound, tooLong)
				}
			case err != nil:
				t.Fatal(err)
			default:
				if !bytes.Equal(line, w) || lr.line != i+1 {
					t.Fatalf("line %d: %q, want %q", i+1, line, w)
				}
			}
		}
	})
}
