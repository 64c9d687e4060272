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
	if got := strings.Join(SchemaNames(), ","); got != "request,reply,record,review-item,review-run,label,label-reply,label-rejection,health,capabilities" {
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
		"reply.json": "reply", "reply-failed.json": "reply", "reply-held.json": "reply", "record.json": "record",
		"review-item.json": "review-item", "label.json": "label", "label-reply.json": "label-reply",
		"label-reply-rejected.json": "label-reply",
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

// TestLabelSchemaAgreesWithDecoder: labels DecodeLabel refuses, the schema refuses too.
func TestLabelSchemaAgreesWithDecoder(t *testing.T) {
	s := compileSchemas(t)["label"]
	for _, b := range []string{
		`{}`, `{"run_id":"r","question":"q"}`, `{"run_id":"","question":"q","label":1}`, `{"run_id":"a b","question":"q","label":1}`,
		`{"run_id":"r","question":" ","label":1}`, `{"run_id":"r","question":"q","label":{}}`, `{"run_id":"r","question":"q","label":[1]}`,
		`{"run_id":"r","question":"q","label":1,"source":"oracle"}`, `{"run_id":"r","question":"q","label":1,"weight":1}`,
		`{"run_id":"r","question":"q","label":1,"labelled_at":"yesterday"}`, `{"run_id":"r","question":"q","label":1,"reviewer":7}`,
	} {
		if err := validate(t, s, []byte(b)); err == nil {
			t.Errorf("schema accepts %s", b)
		}
		if _, err := DecodeLabel([]byte(b)); err == nil {
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
		{Provider: "ollama", Model: "nimble", Outcome: OutcomeBusy, LatencyMS: 5, Detail: "upstream 503", Delivery: 1, ErrorCode: CodeProviderBusy, StartedAt: at},
		{Provider: "systemone", Model: "jev-1.13.0", Outcome: OutcomeOK, LatencyMS: 40, Delivery: 2, StartedAt: at.Add(time.Second)},
	}
}

// fullVerdicts are verdicts for fullResult's answers with every field of each kind set: a
// decided choice with a calibrated distribution under a rule that audits 5%, an abstained
// noul sampled for audit, a reviewed score with its label.
func fullVerdicts() Verdicts {
	conf, noul := 0.42, 0.61
	return Verdicts{
		{Question: "label", Status: VerdictDecided, Rule: "tickets", Reason: "confidence 0.62 ≥ 0.50", AuditShare: 0.05,
			Calibrated: &Calibrated{Probabilities: []Probability{{"a", 0.7}, {"b", 0.3}}, Confidence: &conf, Temperature: 1.5}},
		{Question: "n", Status: VerdictAbstained, Rule: "refunds", Reason: "P(yes) 0.30 within [0.20, 0.80]", Audit: true,
			Calibrated: &Calibrated{Noul: &noul, Temperature: 0.8}},
		{Question: "s", Status: VerdictReviewed, Rule: "urgency", Reason: "confidence 0.10 < 0.50", Label: json.RawMessage(`1`), Reviewer: "ana"},
	}
}

func fullReview() *ReviewRef {
	return &ReviewRef{Status: ReviewPending, Item: ReviewItemID("r1", "n"), Items: []string{ReviewItemID("r1", "n"), ReviewItemID("r1", "m")}}
}

// fullRecord is a record with every field set.
func fullRecord(t testing.TB) RunRecord {
	now := time.Date(2026, 11, 29, 23, 0, 0, 123456000, time.UTC)
	red := Redact(fullRequest(t))
	cost := 0.000123
	return RunRecord{
		SchemaVersion: RecordSchemaVersion, RunID: "tickets-7:42", Caller: "svc", CallerKind: CallerKindJWT,
		Roles: []string{"decider"}, Scopes: []string{"sys1:decide", "x"}, Subject: "sys1.batch.svc.tickets-7",
		BatchID: "tickets-7", ItemID: "42",
		StreamSeq: 1 << 40, Deliveries: 2, PublishedAt: now, StartedAt: now.Add(time.Millisecond), FinishedAt: now.Add(time.Second),
		QueuedMS: 1, LatencyMS: 1000, Status: StatusFailed, ErrorCode: CodeUpstreamError, ErrorStatus: 502, ErrorMessage: "[SYS1_UPSTREAM_ERROR] é",
		Provider: "ollama", Model: "nimble", RequestedModel: "nimble", Request: red, RecordState: RecordFull, Images: red.ImageRefs(),
		Result: fullResult(), Verdicts: fullVerdicts(), Review: fullReview(), Attempts: fullAttempts(),
		CacheHit: true, CostUSD: &cost, ReplyTo: "sys1.replies.svc", Worker: "w1", Version: "v1",
		TraceID: "4bf92f3577b34da6a3ce929d0e0e4736",
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

	okReply := Reply{RunID: "r1", Status: StatusSuccess, Result: fullResult(), Verdicts: fullVerdicts(), Review: fullReview(),
		Attempts: fullAttempts(), QueuedMS: 1, LatencyMS: 41}
	b, _ := json.Marshal(okReply)
	check(t, schemas["reply"], "reply", b)
	failed := Reply{RunID: "r2", Status: StatusFailed, Error: Errorf(CodeBudgetExceeded, "daily USD budget of caller svc is spent; it resets at 2026-11-30T00:00:00Z")}
	b, _ = json.Marshal(failed)
	check(t, schemas["reply"], "reply", b)

	rec := fullRecord(t)
	rec.Status, rec.ErrorCode, rec.ErrorStatus, rec.ErrorMessage = StatusSuccess, "", 0, ""
	b, _ = json.Marshal(rec)
	check(t, schemas["record"], "record", b)
	if bytes.Contains(b, []byte(req.Images[0].Data)) || bytes.Contains(b, []byte("keep_alive")) {
		t.Fatal("record holds image data or keep_alive")
	}
	// The stored forms of every record state validate too.
	for _, mode := range []RecordState{RecordHash, RecordNone} {
		b, _ = json.Marshal(rec.RedactContent(mode))
		check(t, schemas["record"], "record ("+string(mode)+")", b)
	}
	// A failed record with nothing optional set still validates: nil lists encode as [].
	b, _ = json.Marshal(RunRecord{SchemaVersion: RecordSchemaVersion, RunID: "r3", CallerKind: CallerKindAnonymous,
		Status: StatusFailed, ErrorCode: CodeInvalidInput, ErrorStatus: 400, ErrorMessage: "[SYS1_INVALID_INPUT] x",
		PublishedAt: now, StartedAt: now, FinishedAt: now})
	check(t, schemas["record"], "record", b)

	item := fullReviewItem()
	itemJSON, _ := json.Marshal(item)
	check(t, schemas["review-item"], "review item", itemJSON)
	second := fullReviewItem()
	second.Question, second.ID = "other", ReviewItemID(item.RunID, "other")
	run := ReviewRun{RunID: item.RunID, Caller: item.Caller, Subject: item.Subject, Provider: item.Provider, Model: item.Model, State: item.State,
		Images: item.Images, CreatedAt: item.CreatedAt, Items: []ReviewItem{item, second}}
	runJSON, _ := json.Marshal(run)
	check(t, schemas["review-run"], "review message", runJSON)
	var runDoc struct{ Items []json.RawMessage }
	_ = json.Unmarshal(runJSON, &runDoc)
	notQueued, _ := json.Marshal(ReviewRef{Status: ReviewNotQueued, Item: item.ID, Items: []string{item.ID}, Reason: "caller svc-a holds 5000 review items"})
	lbl := fullLabel()
	labelJSON, _ := json.Marshal(lbl)
	check(t, schemas["label"], "label", labelJSON)
	accepted, _ := json.Marshal(LabelReply{RunID: "r1", Question: "label", Status: LabelAccepted, Label: json.RawMessage(`"a"`)})
	check(t, schemas["label-reply"], "accepted label reply", accepted)
	rejected, _ := json.Marshal(LabelReply{RunID: "r1", Question: "label", Status: LabelRejected,
		Error: Errorf(CodeInvalidInput, "invalid label: label: \"c\" is not one of the options (a, b)")})
	check(t, schemas["label-reply"], "rejected label reply", rejected)
	rejection := NewLabelRejection([]byte(`{"run_id":"r1","question":"label","label":"c"}`), "svc", "sys1.labels.svc", 9,
		Errorf(CodeInvalidInput, "invalid label: label: \"c\" is not one of the options (a, b)"), now)
	rejectionJSON, _ := json.Marshal(rejection)
	check(t, schemas["label-rejection"], "label rejection", rejectionJSON)
	notJSON, _ := json.Marshal(NewLabelRejection([]byte("\xff not json"), "", "sys1.labels.svc", 10, nil, now))
	check(t, schemas["label-rejection"], "label rejection of a body that is not JSON", notJSON)
	// The other way round: what the schemas refuse, the Go side does not produce.
	for name, doc := range map[string]string{
		"accepted reply with an error":    `{"run_id":"r","question":"q","status":"accepted","label":"a","error":{"code":"SYS1_INVALID_INPUT","message":"[SYS1_INVALID_INPUT] x","status":400}}`,
		"rejected reply without an error": `{"run_id":"r","question":"q","status":"rejected","label":null,"error":null}`,
	} {
		if err := validate(t, schemas["label-reply"], []byte(doc)); err == nil {
			t.Errorf("label-reply schema accepts %s", name)
		}
	}

	// Every property of each schema (top level and nested object definitions) is produced.
	schemaProps(t, "request", "", reqJSON)
	okJSON, _ := json.Marshal(okReply)
	schemaProps(t, "reply", "", okJSON)
	recJSON, _ := json.Marshal(rec)
	schemaProps(t, "record", "", recJSON)
	var replyDoc map[string]json.RawMessage
	_ = json.Unmarshal(okJSON, &replyDoc)
	schemaProps(t, "reply", "result", replyDoc["result"])
	schemaProps(t, "reply", "reviewRef", notQueued)
	var attempts []json.RawMessage
	_ = json.Unmarshal(replyDoc["attempts"], &attempts)
	schemaProps(t, "reply", "attempt", attempts[0])
	var verdicts map[string]json.RawMessage
	_ = json.Unmarshal(replyDoc["verdicts"], &verdicts)
	merged := map[string]json.RawMessage{} // each verdict kind sets different optional fields
	for _, v := range verdicts {
		var m map[string]json.RawMessage
		_ = json.Unmarshal(v, &m)
		for k, x := range m {
			merged[k] = x
		}
	}
	mergedJSON, _ := json.Marshal(merged)
	schemaProps(t, "reply", "verdict", mergedJSON)
	choiceCal, _ := json.Marshal(fullVerdicts()[0].Calibrated)
	noulCal, _ := json.Marshal(fullVerdicts()[1].Calibrated)
	var cal map[string]json.RawMessage
	_ = json.Unmarshal(choiceCal, &cal)
	_ = json.Unmarshal(noulCal, &cal)
	calJSON, _ := json.Marshal(cal)
	schemaProps(t, "reply", "calibrated", calJSON)
	failedJSON, _ := json.Marshal(failed)
	var failedDoc map[string]json.RawMessage
	_ = json.Unmarshal(failedJSON, &failedDoc)
	schemaProps(t, "reply", "error", failedDoc["error"])
	var recDoc map[string]json.RawMessage
	_ = json.Unmarshal(recJSON, &recDoc)
	schemaProps(t, "record", "storedRequest", recDoc["request"])
	schemaProps(t, "review-item", "", itemJSON)
	schemaProps(t, "review-run", "", runJSON)
	schemaProps(t, "review-run", "item", runDoc.Items[0])
	schemaProps(t, "label", "", labelJSON)
	schemaProps(t, "label-reply", "", accepted)
	schemaProps(t, "label-rejection", "", rejectionJSON)
}

// fullReviewItem is a review item with every field set.
func fullReviewItem() ReviewItem {
	conf, score := 0.31, 1.2
	desc := "money back"
	return ReviewItem{
		ID: ReviewItemID("r1", "label"), RunID: "r1", Caller: "svc", Subject: "sys1.decide.svc.tickets", Provider: "ollama", Model: "nimble",
		Question: "label", Type: TypeChoice, Instructions: json.RawMessage(`"Pick <b>one</b>"`),
		Options: []Option{{Key: "refund", Description: &desc}, {Key: "other"}}, Levels: []string{"lo", "hi"},
		Probabilities: []Probability{{"refund", 0.55}, {"other", 0.45}}, Confidence: &conf, Noul: &conf, Score: &score,
		Choice: "refund", Verdict: fullVerdicts()[1], Mode: ReviewHold, Audit: true,
		State:  json.RawMessage(`{"ticket":"<script>alert(1)</script>"}`),
		Images: []ImageRef{{SHA256: strings.Repeat("ab", 32), Bytes: 73}}, CreatedAt: time.Date(2026, 11, 29, 23, 0, 0, 0, time.UTC),
	}
}

// fullLabel is a label with every field set.
func fullLabel() Label {
	return Label{RunID: "r1", Question: "label", Value: json.RawMessage(`"refund"`), Reviewer: "ana",
		LabelledAt: time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC), Source: LabelSourceReview, Caller: "svc", Item: ReviewItemID("r1", "label")}
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

// TestSchemaOutcomesMatchGo: the attempt outcomes of the schema are exactly the Go list.
func TestSchemaOutcomesMatchGo(t *testing.T) {
	b, _ := Schema("reply")
	var s struct {
		Defs struct {
			Attempt struct {
				Properties struct {
					Outcome struct {
						Enum []string `json:"enum"`
					} `json:"outcome"`
				} `json:"properties"`
			} `json:"attempt"`
		} `json:"$defs"`
	}
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	if got, want := fmt.Sprint(s.Defs.Attempt.Properties.Outcome.Enum), fmt.Sprint(Outcomes()); got != want {
		t.Fatalf("schema outcomes %s\n    Go outcomes %s", got, want)
	}
}
