package contract

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// compileSchemas compiles the three embedded schemas with a real draft 2020-12 validator,
// asserting formats (date-time) too.
func compileSchemas(t testing.TB) map[string]*jsonschema.Schema {
	t.Helper()
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	for _, name := range SchemaNames() {
		b, err := Schema(name)
		if err != nil {
			t.Fatal(err)
		}
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if err := c.AddResource(SchemaID(name), doc); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	out := map[string]*jsonschema.Schema{}
	for _, name := range SchemaNames() {
		s, err := c.Compile(SchemaID(name))
		if err != nil {
			t.Fatalf("compile %s: %v", name, err)
		}
		out[name] = s
	}
	return out
}

func validate(t testing.TB, s *jsonschema.Schema, doc []byte) error {
	t.Helper()
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(doc))
	if err != nil {
		t.Fatalf("not JSON: %v\n%s", err, doc)
	}
	return s.Validate(inst)
}

func TestSchemaNames(t *testing.T) {
	if got := strings.Join(SchemaNames(), ","); got != "request,reply,record,health,capabilities" {
		t.Fatal(got)
	}
	if _, err := Schema("nope"); err == nil {
		t.Fatal("unknown schema accepted")
	}
	for _, n := range SchemaNames() {
		b, _ := Schema(n)
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil || m["$id"] != SchemaID(n) {
			t.Fatalf("%s: $id %v, err %v", n, m["$id"], err)
		}
	}
}

// TestExamplesMatchSchemas: every example validates against its schema.
func TestExamplesMatchSchemas(t *testing.T) {
	schemas := compileSchemas(t)
	for file, schema := range map[string]string{
		"ticket.json": "request", "one.json": "request", "sixty-four.json": "request", "image.json": "request",
		"reply.json": "reply", "reply-failed.json": "reply", "record.json": "record",
	} {
		b, err := os.ReadFile("examples/" + file)
		if err != nil {
			t.Fatal(err)
		}
		if err := validate(t, schemas[schema], b); err != nil {
			t.Errorf("%s against %s: %v", file, schema, err)
		}
	}
}

// TestRequestSchemaAgreesWithDecoder: a sample of invalid requests is rejected by both the
// schema and DecodeRequest (the schema cannot express everything, e.g. duplicate keys, but
// what it says must not contradict the decoder).
func TestRequestSchemaAgreesWithDecoder(t *testing.T) {
	s := compileSchemas(t)["request"]
	bad := []string{
		`{"questions":{` + choiceQ + `}}`,
		`{"state":null,"questions":{` + choiceQ + `}}`,
		`{"state":"  ","questions":{` + choiceQ + `}}`,
		`{"state":"s","questions":{}}`,
		withQuestions(nQuestions(65)),
		withQuestions(`"l":{"type":"choice","instructions":"i","criteria":` + options(27) + `}`),
		withQuestions(`"l":{"type":"choice","instructions":"i","criteria":` + options(1) + `}`),
		withQuestions(`"s":{"type":"score","instructions":"i","criteria":["a",null]}`),
		withQuestions(`"n":{"type":"noul","instructions":"i","criteria":{"yes":"y"}}`),
		withQuestions(`"n":{"type":"noul","instructions":""}`),
		withQuestions(`"n":{"type":"rank","instructions":"i"}`),
		withQuestions(`"n":{"type":"noul","instructions":"i","weight":1}`),
		`{"state":"s","stream":true,"questions":{` + choiceQ + `}}`,
		withImages(`["data:image/png;base64,` + pngB64 + `"]`),
		`{"model":"","state":"s","questions":{` + choiceQ + `}}`,
	}
	for _, b := range bad {
		if err := validate(t, s, []byte(b)); err == nil {
			t.Errorf("schema accepts %s", b)
		}
		if _, err := DecodeRequest([]byte(b)); err == nil {
			t.Errorf("decoder accepts %s", b)
		}
	}
}

// fullRequest is a request with every field set.
func fullRequest(t testing.TB) *Request {
	req, err := DecodeRequest([]byte(`{"model":"nimble","state":{"a":1},"questions":{` + choiceQ +
		`,"n":{"type":"noul","instructions":"i","criteria":{"true":"t","false":"f"}},"s":{"type":"score","instructions":["i"],"criteria":["lo","hi"]}},"images":["` + pngB64 + `"]}`))
	if err != nil {
		t.Fatal(err)
	}
	res, err := Policy{DefaultModel: "nimble", KeepAlive: "5m"}.Resolve(req)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func fullResult() *Result {
	c := 0.5
	return &Result{Provider: "ollama", Model: "nimble", Usage: Usage{InputTokens: 10, OutputTokens: 1}, Answers: []Answer{
		{Name: "label", Type: TypeChoice, Choice: "a", Confidence: &c, Probabilities: []Probability{{"a", 0.75}, {"b", 0.25}}},
		{Name: "n", Type: TypeNoul, Noul: 0.3, Probabilities: []Probability{{"true", 0.3}, {"false", 0.7}}},
		{Name: "s", Type: TypeScore, Score: 0.5, Confidence: &c, Probabilities: []Probability{{"0", 0.5}, {"1", 0.5}}, Legend: []LegendEntry{{"0", "lo"}, {"1", "hi"}}},
	}}
}

func fullAttempts() []Attempt {
	at := time.Date(2026, 11, 29, 23, 0, 0, 0, time.UTC)
	return []Attempt{
		{Provider: "ollama", Outcome: OutcomeBusy, LatencyMS: 5, Detail: "upstream 503", Delivery: 1, ErrorCode: CodeProviderBusy, StartedAt: at},
		{Provider: "ollama", Outcome: OutcomeOK, LatencyMS: 40, Delivery: 2, StartedAt: at.Add(time.Second)},
	}
}

// TestSchemasMatchGoTypes is the drift test: fully populated Go values must validate against
// the schemas (which forbid properties they do not list), and every property the schemas list
// must be produced by the Go types. A field added on either side alone fails here.
func TestSchemasMatchGoTypes(t *testing.T) {
	schemas := compileSchemas(t)
	now := time.Date(2026, 11, 29, 23, 0, 0, 0, time.UTC)
	req := fullRequest(t)

	reqJSON, _ := json.Marshal(req)
	check(t, schemas["request"], "request", reqJSON)

	okReply := Reply{RunID: "r1", Status: StatusSuccess, Result: fullResult(), Attempts: fullAttempts(), QueuedMS: 1, LatencyMS: 41}
	b, _ := json.Marshal(okReply)
	check(t, schemas["reply"], "reply", b)
	failed := Reply{RunID: "r2", Status: StatusFailed, Error: Errorf(CodeTimeout, "provider did not answer within 30s")}
	b, _ = json.Marshal(failed)
	check(t, schemas["reply"], "reply", b)

	red := Redact(req)
	rec := RunRecord{
		SchemaVersion: RecordSchemaVersion, RunID: "r1", Caller: "svc", CallerKind: CallerKindJWT,
		Roles: []string{"decider"}, Scopes: []string{"sys1:decide"}, Subject: "sys1.decide.svc",
		StreamSeq: 7, Deliveries: 2, PublishedAt: now, StartedAt: now, FinishedAt: now.Add(time.Second),
		QueuedMS: 1, LatencyMS: 1000, Status: StatusSuccess, ErrorCode: "", ErrorStatus: 0, ErrorMessage: "",
		Provider: "ollama", Model: "nimble", RequestedModel: "nimble", Request: red, Images: red.ImageRefs(),
		Result: fullResult(), Attempts: fullAttempts(), ReplyTo: "sys1.replies.svc", Worker: "w1", Version: "v1",
	}
	b, _ = json.Marshal(rec)
	check(t, schemas["record"], "record", b)
	if bytes.Contains(b, []byte(req.Images[0].Data)) || bytes.Contains(b, []byte("keep_alive")) {
		t.Fatal("record holds image data or keep_alive")
	}
	// A failed record with nothing optional set still validates: nil lists encode as [].
	b, _ = json.Marshal(RunRecord{SchemaVersion: RecordSchemaVersion, RunID: "r3", CallerKind: CallerKindAnonymous,
		Status: StatusFailed, ErrorCode: CodeInvalidInput, ErrorStatus: 400, ErrorMessage: "[SYS1_INVALID_INPUT] x",
		PublishedAt: now, StartedAt: now, FinishedAt: now})
	check(t, schemas["record"], "record", b)

	// Every property of each schema (top level and nested object definitions) is produced.
	schemaProps(t, "request", "", reqJSON)
	okJSON, _ := json.Marshal(okReply)
	schemaProps(t, "reply", "", okJSON)
	recJSON, _ := json.Marshal(rec)
	schemaProps(t, "record", "", recJSON)
	var replyDoc map[string]json.RawMessage
	_ = json.Unmarshal(okJSON, &replyDoc)
	schemaProps(t, "reply", "result", replyDoc["result"])
	var attempts []json.RawMessage
	_ = json.Unmarshal(replyDoc["attempts"], &attempts)
	schemaProps(t, "reply", "attempt", attempts[0])
	failedJSON, _ := json.Marshal(failed)
	var failedDoc map[string]json.RawMessage
	_ = json.Unmarshal(failedJSON, &failedDoc)
	schemaProps(t, "reply", "error", failedDoc["error"])
	var recDoc map[string]json.RawMessage
	_ = json.Unmarshal(recJSON, &recDoc)
	schemaProps(t, "record", "storedRequest", recDoc["request"])
}

func check(t *testing.T, s *jsonschema.Schema, name string, doc []byte) {
	t.Helper()
	if err := validate(t, s, doc); err != nil {
		t.Errorf("Go %s does not match its schema: %v\n%s", name, err, doc)
	}
}

// schemaProps checks that doc has every property the schema (or its $defs entry def) lists.
func schemaProps(t *testing.T, schema, def string, doc []byte) {
	t.Helper()
	b, _ := Schema(schema)
	var s struct {
		Properties map[string]any            `json:"properties"`
		Defs       map[string]map[string]any `json:"$defs"`
	}
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	props := s.Properties
	if def != "" {
		props, _ = s.Defs[def]["properties"].(map[string]any)
	}
	if len(props) == 0 {
		t.Fatalf("%s %s lists no properties", schema, def)
	}
	var got map[string]json.RawMessage
	if err := json.Unmarshal(doc, &got); err != nil {
		t.Fatalf("%s %s: %v", schema, def, err)
	}
	var missing []string
	for p := range props {
		if _, ok := got[p]; !ok {
			missing = append(missing, p)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("schema %s %s lists %v, which the Go type does not produce", schema, def, missing)
	}
}

// TestSchemaCodesMatchTable: the schema's error codes are exactly the Go table, in order.
func TestSchemaCodesMatchTable(t *testing.T) {
	b, _ := Schema("reply")
	var s struct {
		Defs struct {
			Code struct {
				Enum []Code `json:"enum"`
			} `json:"code"`
		} `json:"$defs"`
	}
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	if got, want := fmt.Sprint(s.Defs.Code.Enum), fmt.Sprint(Codes()); got != want {
		t.Fatalf("schema codes %s\n    Go codes %s", got, want)
	}
}
