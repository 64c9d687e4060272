package contract

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"unicode/utf8"
)

// withQuestions builds a request body with the given questions object contents.
func withQuestions(questions string) string {
	return `{"state":"s","questions":{` + questions + `}}`
}

const choiceQ = `"label":{"type":"choice","instructions":"Pick","criteria":{"a":"A","b":"B"}}`

func options(n int) string {
	var parts []string
	for i := 0; i < n; i++ {
		parts = append(parts, fmt.Sprintf(`"o%d":"option %d"`, i, i))
	}
	return "{" + strings.Join(parts, ",") + "}"
}

func levels(n int) string {
	var parts []string
	for i := 0; i < n; i++ {
		parts = append(parts, fmt.Sprintf(`"level %d"`, i))
	}
	return "[" + strings.Join(parts, ",") + "]"
}

func nQuestions(n int) string {
	var parts []string
	for i := 0; i < n; i++ {
		parts = append(parts, fmt.Sprintf(`"q%d":{"type":"noul","instructions":"?"}`, i))
	}
	return strings.Join(parts, ",")
}

var (
	pngBytes, _ = base64.StdEncoding.DecodeString("iVBORw0KGgoAAAANSUhEUgAAAAIAAAACCAIAAAD91JpzAAAAEElEQVR4nGP4z8AARAwQCgAf7gP9i18U1AAAAABJRU5ErkJggg==")
	pngB64      = base64.StdEncoding.EncodeToString(pngBytes)
	jpegB64     = base64.StdEncoding.EncodeToString([]byte{0xFF, 0xD8, 0xFF, 0xE0, 0, 0x10, 'J', 'F', 'I', 'F'})
	webpB64     = base64.StdEncoding.EncodeToString([]byte("RIFF\x1a\x00\x00\x00WEBPVP8 rest"))
	gifB64      = base64.StdEncoding.EncodeToString([]byte("GIF89a\x01\x00\x01\x00"))
)

func withImages(images string) string {
	return `{"state":"s","questions":{` + choiceQ + `},"images":` + images + `}`
}

// TestDecodeRequestRules covers every rule of the contract, valid and invalid. want lists
// substrings that must each appear as a problem ("path: message"); empty means valid.
func TestDecodeRequestRules(t *testing.T) {
	tests := []struct {
		name string
		body string
		want []string
	}{
		// shape
		{"minimal valid", withQuestions(choiceQ), nil},
		{"not an object", `[1]`, []string{"body: invalid JSON at byte 0: the request must be a JSON object"}},
		{"empty body", ``, []string{"body: invalid JSON at byte 0: empty body"}},
		{"trailing data", withQuestions(choiceQ) + `x`, []string{"unexpected data after the top-level value"}},
		{"syntax error", `{"state":"s",}`, []string{"body: invalid JSON"}},
		{"invalid UTF-8", "{\"state\":\"\xff\",\"questions\":{" + choiceQ + "}}", []string{"body: invalid UTF-8 at byte 10"}},
		{"lone surrogate escape", `{"state":"\ud800","questions":{` + choiceQ + `}}`, []string{"invalid UTF-16 surrogate"}},
		{"surrogate pair ok", `{"state":"\ud83d\ude00","questions":{` + choiceQ + `}}`, nil},
		{"control char", "{\"state\":\"a\x01\",\"questions\":{" + choiceQ + "}}", []string{"control character in string"}},
		{"unknown field", `{"state":"s","stream":true,"questions":{` + choiceQ + `}}`, []string{"stream: unknown field"}},
		{"keep_alive accepted", `{"state":"s","keep_alive":"5m","questions":{` + choiceQ + `}}`, nil},
		{"keep_alive number accepted", `{"state":"s","keep_alive":-1,"questions":{` + choiceQ + `}}`, nil},
		{"duplicate top-level key", `{"state":"s","state":"t","questions":{` + choiceQ + `}}`, []string{"state: duplicate key"}},
		{"duplicate key deep in state", `{"state":{"a":{"b":[{"c":1,"c":2}]}},"questions":{` + choiceQ + `}}`, []string{`state.a.b[0]: duplicate key "c"`}},
		{"duplicate key in instructions", withQuestions(`"q":{"type":"noul","instructions":{"x":1,"x":1}}`), []string{`questions.q.instructions: duplicate key "x"`}},
		{"duplicate question", withQuestions(choiceQ + "," + choiceQ), []string{`questions: duplicate key "label"`}},
		{"duplicate option", withQuestions(`"l":{"type":"choice","instructions":"i","criteria":{"a":"A","a":"B","b":"C"}}`), []string{`questions.l.criteria: duplicate key "a"`}},
		// model
		{"model ok", `{"model":"nimble","state":"s","questions":{` + choiceQ + `}}`, nil},
		{"model null is absent", `{"model":null,"state":"s","questions":{` + choiceQ + `}}`, nil},
		{"model blank", `{"model":"  ","state":"s","questions":{` + choiceQ + `}}`, []string{"model: must not be blank"}},
		{"model wrong type", `{"model":7,"state":"s","questions":{` + choiceQ + `}}`, []string{"model: must be a string, got a number"}},
		// state
		{"state object", `{"state":{"a":1},"questions":{` + choiceQ + `}}`, nil},
		{"state array", `{"state":[1,2],"questions":{` + choiceQ + `}}`, nil},
		{"state missing", `{"questions":{` + choiceQ + `}}`, []string{"state: required"}},
		{"state null", `{"state":null,"questions":{` + choiceQ + `}}`, []string{"state: must be a non-blank string, an object or an array, got null"}},
		{"state number", `{"state":1,"questions":{` + choiceQ + `}}`, []string{"state: must be a non-blank string, an object or an array, got a number"}},
		{"state boolean", `{"state":true,"questions":{` + choiceQ + `}}`, []string{"got a boolean"}},
		{"state blank", `{"state":" \n\t ","questions":{` + choiceQ + `}}`, []string{"state: must not be blank"}},
		{"state blank escaped", `{"state":"\n\u0020","questions":{` + choiceQ + `}}`, []string{"state: must not be blank"}},
		// questions
		{"questions missing", `{"state":"s"}`, []string{"questions: required"}},
		{"questions not object", `{"state":"s","questions":[]}`, []string{"questions: must be an object of named questions, got an array"}},
		{"zero questions", `{"state":"s","questions":{}}`, []string{"questions: must have 1–64 questions, got 0"}},
		{"64 questions", withQuestions(nQuestions(64)), nil},
		{"65 questions", withQuestions(nQuestions(65)), []string{"questions: must have 1–64 questions, got 65"}},
		{"blank name", withQuestions(`"  ":{"type":"noul","instructions":"?"}`), []string{"questions: question name must not be blank"}},
		{"names unique after trim", withQuestions(`"a":{"type":"noul","instructions":"?"}," a ":{"type":"noul","instructions":"?"}`), []string{"questions.a: duplicate question name"}},
		{"question not object", withQuestions(`"q":"what?"`), []string{"questions.q: must be an object with type, instructions and criteria, got a string"}},
		{"question unknown field", withQuestions(`"q":{"type":"noul","instructions":"?","weight":2}`), []string{"questions.q.weight: unknown field"}},
		// type
		{"type missing", withQuestions(`"q":{"instructions":"?"}`), []string{"questions.q.type: required"}},
		{"type unknown", withQuestions(`"q":{"type":"rank","instructions":"?","criteria":[1]}`), []string{`questions.q.type: must be one of choice, noul, score, got "rank"`}},
		{"type wrong kind", withQuestions(`"q":{"type":1,"instructions":"?"}`), []string{"questions.q.type: must be one of choice, noul, score, got a number"}},
		// instructions
		{"instructions object", withQuestions(`"q":{"type":"noul","instructions":{"a":[1]}}`), nil},
		{"instructions array", withQuestions(`"q":{"type":"noul","instructions":["a"]}`), nil},
		{"instructions missing", withQuestions(`"q":{"type":"noul"}`), []string{"questions.q.instructions: required"}},
		{"instructions blank", withQuestions(`"q":{"type":"noul","instructions":""}`), []string{"questions.q.instructions: must not be blank"}},
		{"instructions null", withQuestions(`"q":{"type":"noul","instructions":null}`), []string{"questions.q.instructions: must be a non-blank string, an object or an array, got null"}},
		{"instructions number", withQuestions(`"q":{"type":"noul","instructions":3}`), []string{"got a number"}},
		// choice criteria
		{"choice 2 options", withQuestions(`"l":{"type":"choice","instructions":"i","criteria":` + options(2) + `}`), nil},
		{"choice 26 options", withQuestions(`"l":{"type":"choice","instructions":"i","criteria":` + options(26) + `}`), nil},
		{"choice 1 option", withQuestions(`"l":{"type":"choice","instructions":"i","criteria":` + options(1) + `}`), []string{"questions.l.criteria: must have 2–26 options, got 1"}},
		{"choice 27 options", withQuestions(`"label":{"type":"choice","instructions":"i","criteria":` + options(27) + `}`), []string{"questions.label.criteria: must have 2–26 options, got 27"}},
		{"choice null description", withQuestions(`"l":{"type":"choice","instructions":"i","criteria":{"a":null,"b":null}}`), nil},
		{"choice criteria before type", withQuestions(`"l":{"criteria":{"a":null,"b":"B"},"instructions":"i","type":"choice"}`), nil},
		{"choice criteria before type, bad", withQuestions(`"l":{"criteria":{"a":1,"b":"B"},"instructions":"i","type":"choice"}`), []string{"questions.l.criteria.a: must be a string or null, got a number"}},
		{"choice description number", withQuestions(`"l":{"type":"choice","instructions":"i","criteria":{"a":1,"b":"B"}}`), []string{"questions.l.criteria.a: must be a string or null, got a number"}},
		{"choice criteria array", withQuestions(`"l":{"type":"choice","instructions":"i","criteria":["a","b"]}`), []string{"questions.l.criteria: must be an object mapping option keys to descriptions"}},
		{"choice criteria missing", withQuestions(`"l":{"type":"choice","instructions":"i"}`), []string{"questions.l.criteria: required for a choice question"}},
		{"choice blank key", withQuestions(`"l":{"type":"choice","instructions":"i","criteria":{" ":"A","b":"B"}}`), []string{"questions.l.criteria: option key must not be blank"}},
		{"choice keys unique after trim", withQuestions(`"l":{"type":"choice","instructions":"i","criteria":{"a":"A"," a":"B"}}`), []string{"questions.l.criteria.a: duplicate option key"}},
		// score criteria
		{"score 2 levels", withQuestions(`"s":{"type":"score","instructions":"i","criteria":` + levels(2) + `}`), nil},
		{"score 26 levels", withQuestions(`"s":{"type":"score","instructions":"i","criteria":` + levels(26) + `}`), nil},
		{"score 1 level", withQuestions(`"s":{"type":"score","instructions":"i","criteria":` + levels(1) + `}`), []string{"questions.s.criteria: must have 2–26 levels, got 1"}},
		{"score 27 levels", withQuestions(`"s":{"type":"score","instructions":"i","criteria":` + levels(27) + `}`), []string{"questions.s.criteria: must have 2–26 levels, got 27"}},
		{"score null level", withQuestions(`"s":{"type":"score","instructions":"i","criteria":["a",null]}`), []string{"questions.s.criteria[1]: must be a string, got null"}},
		{"score criteria object", withQuestions(`"s":{"type":"score","instructions":"i","criteria":{"a":"b"}}`), []string{"questions.s.criteria: must be an array of 2–26 level descriptions, got an object"}},
		{"score criteria null", withQuestions(`"s":{"type":"score","instructions":"i","criteria":null}`), []string{"questions.s.criteria: must be an array of 2–26 level descriptions, got null"}},
		{"score criteria missing", withQuestions(`"s":{"type":"score","instructions":"i"}`), []string{"questions.s.criteria: required for a score question"}},
		// noul criteria
		{"noul without criteria", withQuestions(`"n":{"type":"noul","instructions":"i"}`), nil},
		{"noul null criteria", withQuestions(`"n":{"type":"noul","instructions":"i","criteria":null}`), nil},
		{"noul true/false", withQuestions(`"n":{"type":"noul","instructions":"i","criteria":{"true":"yes","false":"no"}}`), nil},
		{"noul only true", withQuestions(`"n":{"type":"noul","instructions":"i","criteria":{"true":"yes"}}`), nil},
		{"noul other key", withQuestions(`"n":{"type":"noul","instructions":"i","criteria":{"yes":"y"}}`), []string{`questions.n.criteria.yes: unknown key; a noul question's criteria may only hold "true" and "false"`}},
		{"noul null description", withQuestions(`"n":{"type":"noul","instructions":"i","criteria":{"true":null}}`), []string{"questions.n.criteria.true: must be a string, got null"}},
		{"noul criteria array", withQuestions(`"n":{"type":"noul","instructions":"i","criteria":["a"]}`), []string{`questions.n.criteria: must be an object with optional "true" and "false" descriptions, got an array`}},
		// images
		{"png", withImages(`["` + pngB64 + `"]`), nil},
		{"jpeg", withImages(`["` + jpegB64 + `"]`), nil},
		{"webp", withImages(`["` + webpB64 + `"]`), nil},
		{"images null", withImages(`null`), nil},
		{"images not array", withImages(`"` + pngB64 + `"`), []string{"images: must be an array of base64 strings, got a string"}},
		{"image not string", withImages(`["` + pngB64 + `",{"sha256":"x","bytes":1}]`), []string{"images[1]: must be a base64 string, got an object"}},
		{"image data URL", withImages(`["data:image/png;base64,` + pngB64 + `"]`), []string{"images[0]: must be raw base64, not a data: URL"}},
		{"image bad base64", withImages(`["` + pngB64 + `","iVBO$$$"]`), []string{"images[1]: is not valid base64"}},
		{"image gif", withImages(`["` + gifB64 + `"]`), []string{"images[0]: must be a PNG, JPEG or WebP image"}},
		{"image empty", withImages(`[""]`), []string{"images[0]: must not be empty"}},
		{"64 images", withImages(`[` + strings.TrimSuffix(strings.Repeat(`"`+pngB64+`",`, 64), ",") + `]`), nil},
		{"65 images", withImages(`[` + strings.TrimSuffix(strings.Repeat(`"`+pngB64+`",`, 65), ",") + `]`), []string{"images: must have at most 64 images, got 65"}},
		// several problems at once, each listed
		{"every problem listed", `{"model":"","state":null,"extra":1,"questions":{"l":{"type":"choice","instructions":"","criteria":` + options(27) + `},"s":{"type":"score","instructions":"i","criteria":[null,"a"]}}}`,
			[]string{"model: must not be blank", "extra: unknown field", "state: must be a non-blank string", "questions.l.instructions: must not be blank", "questions.l.criteria: must have 2–26 options, got 27", "questions.s.criteria[0]: must be a string, got null"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req, err := DecodeRequest([]byte(tc.body))
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("want valid, got %v", err)
				}
				if req == nil || len(req.Questions) == 0 {
					t.Fatal("valid request decoded to nothing")
				}
				return
			}
			if err == nil {
				t.Fatalf("want problems %q, got a valid request", tc.want)
			}
			if err.Code != CodeInvalidInput || err.Status != 400 || !strings.HasPrefix(err.Message, "[SYS1_INVALID_INPUT] ") {
				t.Fatalf("want SYS1_INVALID_INPUT/400, got %s/%d %q", err.Code, err.Status, err.Message)
			}
			expectProblems(t, err, tc.want)
		})
	}
}

// TestDecodeRequestFillsImages: each image gets the hash and length of its decoded bytes.
func TestDecodeRequestFillsImages(t *testing.T) {
	req, err := DecodeRequest([]byte(withImages(`["` + pngB64 + `","` + jpegB64 + `"]`)))
	if err != nil {
		t.Fatal(err)
	}
	if req.Images[0].Bytes != len(pngBytes) || req.Images[1].Bytes != 10 {
		t.Fatalf("bytes: %+v", req.Images)
	}
	// sha256 of the 2×2 PNG above, computed independently (sha256sum).
	const want = "97a3a410c9bca540512251c37ce63982edccbed54c6f2e1d06ec717b9f753e29"
	if req.Images[0].SHA256 != want {
		t.Fatalf("sha256 %q, want %q", req.Images[0].SHA256, want)
	}
}

// TestDecodeRequestDepth: nesting is bounded before anything is built, whatever the size.
func TestDecodeRequestDepth(t *testing.T) {
	ok := `{"state":` + strings.Repeat("[", 63) + strings.Repeat("]", 63) + `,"questions":{` + choiceQ + `}}`
	if _, err := DecodeRequest([]byte(ok)); err != nil {
		t.Fatalf("depth 64 rejected: %v", err)
	}
	deep := `{"state":` + strings.Repeat("[", 64) + strings.Repeat("]", 64) + `,"questions":{` + choiceQ + `}}`
	_, err := DecodeRequest([]byte(deep))
	if err == nil || !strings.Contains(err.Message, "body: nesting deeper than 64 levels") {
		t.Fatalf("depth 65: %v", err)
	}
	// Brackets inside strings do not count.
	str := `{"state":"` + strings.Repeat("[", 1000) + `","questions":{` + choiceQ + `}}`
	if _, err := DecodeRequest([]byte(str)); err != nil {
		t.Fatalf("brackets in a string: %v", err)
	}
	huge := []byte(`{"state":` + strings.Repeat("[", 10000))
	allocs := testing.AllocsPerRun(5, func() {
		if _, err := DecodeRequest(huge); err == nil {
			t.Fatal("10,000-deep body accepted")
		}
	})
	if allocs > 20 {
		t.Fatalf("rejecting a 10,000-deep body cost %v allocations", allocs)
	}
}

// TestDecodeRequestHostileBodiesCostNoMemory: an 8 MiB body of brackets, or one that is
// 10,000 levels deep inside a valid prefix, is rejected without building anything: the bytes
// allocated stay far below the body's size.
func TestDecodeRequestHostileBodiesCostNoMemory(t *testing.T) {
	bodies := map[string][]byte{
		"8 MiB of brackets":    bytes.Repeat([]byte("["), 8<<20),
		"10,000 deep in state": []byte(`{"questions":{` + choiceQ + `},"state":` + strings.Repeat(`{"a":`, 10000) + `1` + strings.Repeat(`}`, 10000) + `}`),
	}
	for name, body := range bodies {
		t.Run(name, func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			_, err := DecodeRequest(body)
			runtime.ReadMemStats(&after)
			if err == nil || !strings.Contains(err.Message, "nesting deeper than 64 levels") {
				t.Fatalf("got %v", err)
			}
			if got := after.TotalAlloc - before.TotalAlloc; got > 16<<10 {
				t.Fatalf("rejecting a %d-byte body allocated %d bytes", len(body), got)
			}
		})
	}
}

// TestDecodeRequestTooLarge: a body over the hard limit is refused before it is read.
func TestDecodeRequestTooLarge(t *testing.T) {
	body := make([]byte, MaxBodyBytes+1)
	_, err := DecodeRequest(body)
	if err == nil || err.Code != CodeRequestTooLarge || err.Status != 413 {
		t.Fatalf("got %v", err)
	}
}

// TestExamplesDecode: every request example passes the strict decoder.
func TestExamplesDecode(t *testing.T) {
	for _, name := range []string{"ticket", "one", "sixty-four", "image"} {
		b, err := os.ReadFile("examples/" + name + ".json")
		if err != nil {
			t.Fatal(err)
		}
		req, derr := DecodeRequest(b)
		if derr != nil {
			t.Fatalf("%s: %v", name, derr)
		}
		if name == "sixty-four" && len(req.Questions) != 64 {
			t.Fatalf("sixty-four has %d questions", len(req.Questions))
		}
		if name == "image" && (len(req.Images) != 1 || req.Images[0].SHA256 == "") {
			t.Fatalf("image example: %+v", req.Images)
		}
	}
}

// TestValidateGoBuilt: a request built in Go is checked by the same rules.
func TestValidateGoBuilt(t *testing.T) {
	desc := "A"
	req := &Request{State: []byte(`"s"`), Questions: []Question{{Name: "q", Type: TypeChoice, Instructions: []byte(`"i"`), Options: []Option{{Key: "a", Description: &desc}}}}}
	err := req.Validate()
	var ps Problems
	if !errors.As(err, &ps) || len(ps) != 1 || ps[0].String() != "questions.q.criteria: must have 2–26 options, got 1" {
		t.Fatalf("got %v", err)
	}
	req.Questions[0].Options = append(req.Questions[0].Options, Option{Key: "b"})
	if err := req.Validate(); err != nil {
		t.Fatal(err)
	}

	// Raw values built in Go were never parsed: each must be one JSON value, or the request
	// would encode as invalid JSON. None of these may panic.
	for _, tc := range []struct{ state, instructions, want string }{
		{`"`, `"i"`, "state: invalid JSON at byte 1: unterminated string"},
		{`{`, `"i"`, "state: invalid JSON at byte 1: expected a string key"},
		{`"s"`, `"i" "j"`, "questions.q.instructions: invalid JSON at byte 4: unexpected data after the top-level value"},
		{`{"a":1,"a":2}`, `"i"`, `state: duplicate key "a"`},
		{"\"\xff\"", `"i"`, "state: invalid UTF-8 at byte 1"},
	} {
		req.State, req.Questions[0].Instructions = []byte(tc.state), []byte(tc.instructions)
		err := req.Validate()
		if !errors.As(err, &ps) || len(ps) != 1 || ps[0].String() != tc.want {
			t.Errorf("state %s, instructions %s: got %v, want %s", tc.state, tc.instructions, err, tc.want)
		}
	}
}

// TestDecodeRequestBoundsHostileCounts: counts far past the limits are reported with their
// full number, but the items past the limit are not kept, so memory stays proportional to the
// body (one copy for strings) rather than to the item count times a struct size.
func TestDecodeRequestBoundsHostileCounts(t *testing.T) {
	const n = 100000
	var manyQuestions, manyOptions, manyLevels, manyImages, manyDupes strings.Builder
	for i := 0; i < n; i++ {
		if i > 0 {
			manyQuestions.WriteByte(',')
			manyOptions.WriteByte(',')
			manyLevels.WriteByte(',')
			manyImages.WriteByte(',')
			manyDupes.WriteByte(',')
		}
		fmt.Fprintf(&manyQuestions, `"q%d":{"type":"noul","instructions":"?"}`, i)
		fmt.Fprintf(&manyOptions, `"o%d":null`, i)
		manyLevels.WriteString(`"l"`)
		manyImages.WriteString(`"` + pngB64 + `"`)
		manyDupes.WriteString(`"k":1`)
	}
	tests := []struct {
		name, body, want string
	}{
		{"questions", withQuestions(manyQuestions.String()), "questions: must have 1–64 questions, got 100000"},
		{"options", withQuestions(`"l":{"type":"choice","instructions":"i","criteria":{` + manyOptions.String() + `}}`), "questions.l.criteria: must have 2–26 options, got 100000"},
		{"levels", withQuestions(`"s":{"type":"score","instructions":"i","criteria":[` + manyLevels.String() + `]}`), "questions.s.criteria: must have 2–26 levels, got 100000"},
		{"images", withImages(`[` + manyImages.String() + `]`), "images: must have at most 64 images, got 100000"},
		{"duplicate keys", `{"state":{` + manyDupes.String() + `},"questions":{` + choiceQ + `}}`, "… and 99899 more problems"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			body := []byte(tc.body)
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			_, err := DecodeRequest(body)
			runtime.ReadMemStats(&after)
			if err == nil || !strings.Contains(err.Message, tc.want) {
				t.Fatalf("want %q, got %v", tc.want, err)
			}
			if got, limit := after.TotalAlloc-before.TotalAlloc, uint64(2*len(tc.body)+1<<20); got > limit {
				t.Fatalf("a %d-byte body allocated %d bytes (limit %d)", len(tc.body), got, limit)
			}
		})
	}
}

// expectProblems checks that err lists exactly the wanted problems (each matched by substring).
func expectProblems(t *testing.T, err *Error, want []string) {
	t.Helper()
	var ps Problems
	if !errors.As(err, &ps) {
		t.Fatalf("cause is not Problems: %#v", err.Err)
	}
	for _, w := range want {
		found := false
		for _, p := range ps {
			if strings.Contains(p.String(), w) {
				found = true
			}
		}
		if !found {
			t.Errorf("problem %q not reported; got %q", w, err.Message)
		}
	}
	if len(ps) != len(want) {
		t.Errorf("want %d problems, got %d: %q", len(want), len(ps), err.Message)
	}
}

// TestProblemTextIsBounded: problems quote the body's own keys and names, so a body of huge
// keys must not become an error message of the body's size (it travels in replies, records
// and logs); each path and message is cut, on a rune boundary.
func TestProblemTextIsBounded(t *testing.T) {
	huge := strings.Repeat("é", 32<<10) // 64 KiB
	var b strings.Builder
	b.WriteString(`{"state":{"` + huge + `":1,"` + huge + `":2},"questions":{` + choiceQ + `}`)
	for i := 0; i < 50; i++ {
		fmt.Fprintf(&b, `,"%s%d":1`, huge, i)
	}
	b.WriteString(`}`)
	_, err := DecodeRequest([]byte(b.String()))
	if err == nil || err.Code != CodeInvalidInput {
		t.Fatalf("got %v", err)
	}
	if len(err.Message) > 64<<10 {
		t.Fatalf("a %d-byte body gave a %d-byte message", b.Len(), len(err.Message))
	}
	if !utf8.ValidString(err.Message) || !strings.Contains(err.Message, "…: unknown field") || !strings.Contains(err.Message, `state: duplicate key "éé`) {
		t.Fatalf("message: %.300s", err.Message)
	}
	_, rerr := Policy{DefaultModel: "nimble"}.Resolve(&Request{Model: huge, State: []byte(`"s"`)})
	if rerr == nil || rerr.Code != CodeModelNotAllowed || len(rerr.Message) > 1024 {
		t.Fatalf("model not allowed: %d bytes", len(rerr.Message))
	}
}
