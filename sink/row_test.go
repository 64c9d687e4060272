package sink

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/sys1hq/sys1/contract"
)

func TestToRowFlattensTheRecord(t *testing.T) {
	rec := makeRecord(2) // a success that needed a retry
	r, err := toRow(&rec, origin{stream: "SYS1_RUNS", seq: 42, published: time.Now()}, RecordFull)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.values()) != len(runColumns) {
		t.Fatalf("row has %d values for %d columns", len(r.values()), len(runColumns))
	}
	if r.runsSeq != 42 || r.runID != rec.RunID || r.status != "success" || r.inputTokens != uint64(rec.Result.Usage.InputTokens) {
		t.Errorf("identity/outcome columns wrong: %+v", r)
	}
	if got := strings.Join(r.attOutcome, ","); got != "busy,ok" || r.attErrorCode[0] != "SYS1_PROVIDER_BUSY" {
		t.Errorf("attempts = %v / %v", r.attOutcome, r.attErrorCode)
	}
	if strings.Join(r.ansName, ",") != "label,urgent,severity" || strings.Join(r.ansType, ",") != "choice,noul,score" {
		t.Fatalf("answers = %v %v", r.ansName, r.ansType)
	}
	if r.ansChoice[0] != "spam" || r.ansNoul[0] != nil || r.ansScore[0] != nil || r.ansConf[0] == nil {
		t.Errorf("choice answer columns wrong")
	}
	if r.ansChoice[1] != "" || r.ansNoul[1] == nil || *r.ansNoul[1] != 0.2 || r.ansConf[1] != nil {
		t.Errorf("noul answer columns wrong")
	}
	if r.ansScore[2] == nil || *r.ansScore[2] != 2 || r.ansNoul[2] != nil {
		t.Errorf("score answer columns wrong")
	}
	if ps := r.ansProbs[0].ps; len(ps) != 2 || ps[0].Key != "spam" || ps[1].Key != "ham" || ps[0].P+ps[1].P != 1 {
		t.Errorf("probabilities = %v, want spam then ham, summing to 1", ps)
	}
	// The JSON columns are the contract's encoding, valid JSON, answers in request order.
	if !json.Valid([]byte(r.request)) || !json.Valid([]byte(r.result)) {
		t.Fatalf("request/result columns are not JSON:\n%s\n%s", r.request, r.result)
	}
	if strings.Index(r.result, `"label"`) > strings.Index(r.result, `"severity"`) {
		t.Errorf("result answers out of order: %s", r.result)
	}
	if !strings.Contains(r.request, `"sha256"`) || strings.Contains(r.request, `"data"`) {
		t.Errorf("request images not in redacted form: %s", r.request)
	}
}

func TestToRowTimes(t *testing.T) {
	published := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	from := origin{stream: "SYS1_RUNS", seq: 1, published: published}

	rec := contract.RunRecord{RunID: "r1", Status: contract.StatusFailed}
	r, err := toRow(&rec, from, RecordFull)
	if err != nil {
		t.Fatal(err)
	}
	// No finished_at: dated by its publication (partition, TTL), other zero times are epoch.
	if !r.finishedAt.Equal(published) || !r.startedAt.Equal(time.Unix(0, 0)) || r.request != "" || r.result != "" {
		t.Errorf("finished_at %v started_at %v request %q result %q", r.finishedAt, r.startedAt, r.request, r.result)
	}

	for _, tc := range []struct {
		name string
		mut  func(*contract.RunRecord)
		want string
	}{
		{"empty run id", func(r *contract.RunRecord) { r.RunID = "" }, "run_id is empty"},
		{"finished after 2299", func(r *contract.RunRecord) { r.FinishedAt = time.Date(2300, 1, 1, 0, 0, 0, 0, time.UTC) }, "finished_at"},
		{"published before 1900", func(r *contract.RunRecord) { r.PublishedAt = time.Date(1850, 1, 1, 0, 0, 0, 0, time.UTC) }, "published_at"},
		{"attempt time", func(r *contract.RunRecord) {
			r.Attempts = []contract.Attempt{{StartedAt: time.Date(2500, 1, 1, 0, 0, 0, 0, time.UTC)}}
		}, "attempts[0].started_at"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := contract.RunRecord{RunID: "r1", FinishedAt: published}
			tc.mut(&rec)
			if _, err := toRow(&rec, from, RecordFull); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to name %q", err, tc.want)
			}
		})
	}
}

func TestRedactPayload(t *testing.T) {
	body := []byte(`{"run_id":"r","request":{"state":{"secret":1},"questions":{"q":{"type":"noul","instructions":"private"}}}}`)
	sum := sha256.Sum256([]byte(`{"secret":1}`))
	hashed := []byte(`{"run_id":"r","record_state":"hash","request":{"state":"` + hex.EncodeToString(sum[:]) + `","questions":{"q":{"type":"noul","instructions":null}}}}`)
	for _, tc := range []struct {
		mode    RecordState
		in      []byte
		ok      bool
		want    []string
		notWant []string
	}{
		// Already in the sink's form: kept as it is (never a hash of the hash) …
		{RecordHash, hashed, true, []string{string(hashed)}, nil},
		// … and made stricter when the sink is stricter, saying so.
		{RecordNone, hashed, true, []string{`"state":null`, `"record_state":"none"`}, []string{hex.EncodeToString(sum[:])}},
		{RecordHash, body, true, []string{`"record_state":"hash"`}, nil},
		{RecordFull, []byte("garbage"), true, []string{"garbage"}, nil},
		{RecordHash, body, true, []string{hex.EncodeToString(sum[:]), `"run_id":"r"`}, []string{"secret", "private"}},
		{RecordNone, body, true, []string{`"state":null`, `"instructions":null`}, []string{"secret", "private"}},
		{RecordHash, []byte("garbage"), false, nil, nil},
		{RecordNone, []byte(`{"request":{"questions":["not","an","object"]}}`), false, nil, nil},
		{RecordNone, []byte(`{"run_id":"r","request":null}`), true, []string{`"request":null`}, nil},
	} {
		got, ok := redactPayload(tc.in, tc.mode)
		if ok != tc.ok {
			t.Errorf("%s %q: ok = %v", tc.mode, tc.in, ok)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: %q lacks %q", tc.mode, got, w)
			}
		}
		for _, w := range tc.notWant {
			if strings.Contains(got, w) {
				t.Errorf("%s: %q contains %q", tc.mode, got, w)
			}
		}
	}
}

func TestDedupTokenIsStable(t *testing.T) {
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	msgs := func(seqs ...uint64) []origin {
		out := make([]origin, len(seqs))
		for i, q := range seqs {
			out[i] = origin{stream: "SYS1_RUNS", seq: q, published: at.Add(time.Duration(q) * time.Millisecond)}
		}
		return out
	}
	a := dedupToken("SYS1_RUNS", "runs", msgs(1, 2, 3))
	if a != dedupToken("SYS1_RUNS", "runs", msgs(1, 2, 3)) {
		t.Fatal("same batch, different tokens")
	}
	// The same sequences published at another time: a recreated stream numbering from 1 again.
	recreated := msgs(1, 2, 3)
	for i := range recreated {
		recreated[i].published = recreated[i].published.Add(time.Hour)
	}
	for _, other := range []string{
		dedupToken("SYS1_RUNS", "runs", msgs(1, 2, 4)),
		dedupToken("SYS1_RUNS", "runs_dead_letter", msgs(1, 2, 3)),
		dedupToken("OTHER", "runs", msgs(1, 2, 3)),
		dedupToken("SYS1_RUNS", "runs", recreated),
	} {
		if other == a {
			t.Fatal("different batches share a token")
		}
	}
}

// TestToRowV2Fields: the version 2 fields land in their columns: batch, cost (NULL stays NULL),
// cache, trace, review, and per answer the verdict, rule, calibrated top probability and
// temperature; attempts name their model.
func TestToRowV2Fields(t *testing.T) {
	rec := makeRecord(3)
	cost := 0.0042
	calConf, calNoul := 0.5, 0.33
	rec.BatchID, rec.ItemID, rec.RunID = "tickets-7", "3", "tickets-7:3"
	rec.CostUSD, rec.CacheHit, rec.TraceID = &cost, true, "4bf92f3577b34da6a3ce929d0e0e4736"
	items := []string{contract.ReviewItemID(rec.RunID, "urgent"), contract.ReviewItemID(rec.RunID, "label")}
	rec.Review = &contract.ReviewRef{Status: contract.ReviewPending, Item: items[0], Items: items}
	rec.Attempts[0].Model = "nimble-q4"
	rec.Verdicts = contract.Verdicts{
		// out of order on purpose: matched by name, not position
		{Question: "urgent", Status: contract.VerdictAbstained, Rule: "urgency", Reason: "P(yes) 0.30 within [0.2, 0.8]",
			Calibrated: &contract.Calibrated{Noul: &calNoul, Temperature: 0.8}},
		{Question: "label", Status: contract.VerdictDecided, Rule: "labels", Reason: "confidence 0.53 ≥ 0.5", AuditShare: 0.05,
			Calibrated: &contract.Calibrated{Probabilities: []contract.Probability{{Key: "spam", P: 0.25}, {Key: "ham", P: 0.75}}, Confidence: &calConf, Temperature: 2}},
		{Question: "severity", Status: contract.VerdictDecided,
			Calibrated: &contract.Calibrated{Probabilities: []contract.Probability{{Key: "0", P: 0.2}, {Key: "1", P: 0.5}, {Key: "2", P: 0.3}}, Temperature: 1.2}},
	}
	r, err := toRow(&rec, origin{stream: "SYS1_RUNS", seq: 9, published: time.Now()}, RecordFull)
	if err != nil {
		t.Fatal(err)
	}
	if r.batchID != "tickets-7" || r.itemID != "3" || r.costUSD == nil || *r.costUSD != cost || !r.cacheHit || r.traceID != rec.TraceID ||
		r.reviewStatus != "pending" || r.reviewItem != rec.Review.Item || strings.Join(r.reviewItems, ",") != strings.Join(items, ",") ||
		r.attModel[0] != "nimble-q4" || r.schemaVersion != contract.RecordSchemaVersion {
		t.Fatalf("v2 columns: %+v", r)
	}
	// A record written before records named every item: review_items is its one item.
	older := rec
	older.Review = &contract.ReviewRef{Status: contract.ReviewPending, Item: items[0]}
	if r, err := toRow(&older, origin{stream: "SYS1_RUNS", seq: 8}, RecordFull); err != nil || strings.Join(r.reviewItems, ",") != items[0] {
		t.Fatalf("review_items of an older record: %v, %v", r.reviewItems, err)
	}
	if got := strings.Join(r.ansVerdict, ","); got != "decided,abstained,decided" || strings.Join(r.ansRule, ",") != "labels,urgency," {
		t.Fatalf("verdict columns %v %v", r.ansVerdict, r.ansRule)
	}
	// The audit share (schema version 3) of the decided answer whose rule samples; 0 elsewhere,
	// and 0 (unknown) for a share that is no probability.
	if len(r.ansAuditShare) != 3 || r.ansAuditShare[0] != 0.05 || r.ansAuditShare[1] != 0 || r.ansAuditShare[2] != 0 {
		t.Errorf("audit shares %v", r.ansAuditShare)
	}
	rec.Verdicts[1].AuditShare = 1.5
	if r, _ := toRow(&rec, origin{stream: "SYS1_RUNS", seq: 9, published: time.Now()}, RecordFull); r.ansAuditShare[0] != 0 {
		t.Errorf("a share of 1.5 stored as %v", r.ansAuditShare[0])
	}
	// label chose "ham" (i=3 is odd): its calibrated probability is 0.75; severity's most
	// probable calibrated level has 0.5; urgent's calibrated P(yes) is 0.33.
	for i, want := range []float64{0.75, 0.33, 0.5} {
		if r.ansCalibrated[i] == nil || *r.ansCalibrated[i] != want {
			t.Errorf("answer %d calibrated top = %v, want %v", i, r.ansCalibrated[i], want)
		}
	}
	if *r.ansTemp[0] != 2 || *r.ansTemp[1] != 0.8 || *r.ansTemp[2] != 1.2 {
		t.Errorf("temperatures %v %v %v", *r.ansTemp[0], *r.ansTemp[1], *r.ansTemp[2])
	}
	if !json.Valid([]byte(r.verdicts)) || !strings.HasPrefix(r.verdicts, `{"urgent":{"status":"abstained"`) {
		t.Errorf("verdicts column %s", r.verdicts)
	}
	if len(r.values()) != len(runColumns) {
		t.Fatalf("row has %d values for %d columns", len(r.values()), len(runColumns))
	}

	// Unpriced stays NULL, never 0; no policy leaves the verdict columns empty but aligned.
	plain := makeRecord(3)
	plain.CostUSD, plain.Verdicts = nil, nil
	r, err = toRow(&plain, origin{stream: "SYS1_RUNS", seq: 10}, RecordFull)
	if err != nil {
		t.Fatal(err)
	}
	if r.costUSD != nil || r.verdicts != "" || len(r.ansVerdict) != 3 || r.ansVerdict[0] != "" || r.ansCalibrated[0] != nil || r.ansTemp[2] != nil {
		t.Fatalf("record without cost or verdicts: cost %v verdicts %q %v", r.costUSD, r.verdicts, r.ansVerdict)
	}
}

func TestToRowRefusesWhatItCannotStore(t *testing.T) {
	for _, tc := range []struct {
		name string
		mut  func(*contract.RunRecord)
		want string
	}{
		{"a newer schema", func(r *contract.RunRecord) { r.SchemaVersion = contract.RecordSchemaVersion + 1 }, "schema_version 4 is not one this sink reads (1–3)"},
		{"a negative cost", func(r *contract.RunRecord) { c := -1.0; r.CostUSD = &c }, "cost_usd -1 is not a cost"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := makeRecord(0)
			tc.mut(&rec)
			if _, err := toRow(&rec, origin{}, RecordFull); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
	// Version 1 (and a record without the field) is read.
	for _, v := range []int{0, 1} {
		rec := makeRecord(0)
		rec.SchemaVersion = v
		if r, err := toRow(&rec, origin{}, RecordFull); err != nil || r.schemaVersion != 1 {
			t.Errorf("schema_version %d: %v", v, err)
		}
	}
}

// TestToRowRecordStateIsIdempotent: a record the worker already hashed is stored as it is under
// a hash sink (never a hash of the hash), and record_state says what the row holds.
func TestToRowRecordStateIsIdempotent(t *testing.T) {
	rec := makeRecord(1)
	stateSum := sha256.Sum256(rec.Request.State)
	hashed := rec.RedactContent(RecordHash)
	for _, tc := range []struct {
		rec       *contract.RunRecord
		sink      RecordState
		wantState string
		wantMode  string
	}{
		{hashed, RecordHash, `"` + hex.EncodeToString(stateSum[:]) + `"`, "hash"},
		{hashed, RecordFull, `"` + hex.EncodeToString(stateSum[:]) + `"`, "hash"},
		{hashed, RecordNone, `null`, "none"},
		{&rec, RecordHash, `"` + hex.EncodeToString(stateSum[:]) + `"`, "hash"},
		{&rec, RecordFull, string(rec.Request.State), "full"},
	} {
		r, err := toRow(tc.rec, origin{}, tc.sink)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(r.request, `"state":`+tc.wantState) || r.recordState != tc.wantMode {
			t.Errorf("record %s, sink %s: record_state %s, request %s; want state %s", tc.rec.RecordState, tc.sink, r.recordState, r.request, tc.wantState)
		}
	}
}
