package ollamatest

import (
	"encoding/json"
	"strings"
	"testing"
)

var scanSeeds = []string{
	`{}`, `[]`, `""`, `"a\"b\\c\/\b\f\n\r\t\u00e9\ud83d\ude80"`, `"\ud800"`, `"\u12"`, `"\x"`,
	`0`, `-0`, `-`, `01`, `1.`, `1.5e+10`, `1e`, `-12.5E-3`, `true`, `tru`, `null`, `nul`, `false`,
	`{"a":1,"b":[1,2,{"c":null}]}`, `{"a" 1}`, `{"a":1,}`, `[1,]`, `[1 2]`, `{,}`, `{"a":1}x`,
	"\"ctl\x01\"", "\"bad utf8 \xff\"", `  {"a" : [ ] }  `, `{"a":"b"`, `[`, `"`, strings.Repeat("[", 200) + strings.Repeat("]", 200),
}

// The scanner must accept exactly what encoding/json accepts (within its depth bound), and
// decode strings to the same text.
func FuzzScannerAgreesWithEncodingJSON(f *testing.F) {
	for _, s := range scanSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		sc := &scanner{data: data}
		err := sc.skip()
		if err == nil {
			err = sc.end()
		}
		deep := strings.Count(string(data), "[")+strings.Count(string(data), "{") > maxDepth
		if valid := json.Valid(data); valid != (err == nil) && !deep {
			t.Fatalf("json.Valid=%v scanner err=%v for %q", valid, err, data)
		}
		if err == nil && len(data) > 0 && sc.peekFirst() == '"' {
			var want string
			_ = json.Unmarshal(data, &want)
			got, serr := (&scanner{data: data}).str2()
			if serr != nil || got != want {
				t.Fatalf("string %q: got %q (%v), want %q", data, got, serr, want)
			}
		}
	})
}

func (s *scanner) peekFirst() byte { return (&scanner{data: s.data}).peek() }

func (s *scanner) str2() (string, error) {
	s.peek()
	return s.str()
}

func TestValidBase64(t *testing.T) {
	for in, want := range map[string]bool{
		"QUJD": true, "QUI=": true, "QQ==": true, "": true,
		"QUJ": false, "QQ==QUJD": false, "QU=D": false, "%%%%": false, "QUJD\n": false,
		strings.Repeat("QUJD", 5000): true, strings.Repeat("QUJD", 5000) + "QQ=": false,
	} {
		if got := validBase64([]byte(in)); got != want {
			t.Errorf("validBase64(%.20q…) = %v, want %v", in, got, want)
		}
	}
}
