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
	if r.ansProbs[0]["spam"]+r.ansProbs[0]["ham"] != 1 {
		t.Errorf("probabilities = %v", r.ansProbs[0])
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
	for _, tc := range []struct {
		mode    RecordState
		in      []byte
		ok      bool
		want    []string
		notWant []string
	}{
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
