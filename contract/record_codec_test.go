package contract

import (
	"bytes"
	"encoding/json"
	"os"
	"strings"
	"testing"
)

// DecodeRecord must read exactly what json.Unmarshal reads, field for field.
func TestDecodeRecordMatchesEncodingJSON(t *testing.T) {
	example, err := os.ReadFile("examples/record.json")
	if err != nil {
		t.Fatal(err)
	}
	v1, err := os.ReadFile("testdata/record-v1.json")
	if err != nil {
		t.Fatal(err)
	}
	full, _ := json.Marshal(fullRecord(t))
	deep := strings.Repeat(`{"a":`, 62) + `1` + strings.Repeat(`}`, 62)
	cases := map[string]string{
		"example":                     string(example),
		"a version 1 record":          string(v1),
		"every field set":             string(full),
		"null and repeated v2 fields": `{"run_id":"r","cost_usd":1.5,"cost_usd":null,"cache_hit":true,"cache_hit":null,"verdicts":{"q":{"status":"decided"}},"verdicts":null,"review":{"status":"pending","item":"a"},"review":{"item":"b"},"attempts":[{"model":"m","model":null}]}`,
		"a zero cost is not null":     `{"run_id":"r","cost_usd":0,"cache_hit":true,"record_state":"hash","batch_id":"b","item_id":"1","trace_id":"t"}`,
		"refused run": `{"schema_version":1,"run_id":"SYS1_REQUESTS~7","caller":"","caller_kind":"jwt","roles":[],"scopes":[],` +
			`"subject":"sys1.decide.a","stream_seq":7,"deliveries":1,"published_at":"2026-11-29T10:00:00.123Z",` +
			`"started_at":"2026-11-29T10:00:00.2Z","finished_at":"2026-11-29T10:00:00.3Z","queued_ms":77,"latency_ms":100,` +
			`"status":"failed","error_code":"SYS1_UNAUTHENTICATED","error_status":401,"error_message":"[SYS1_UNAUTHENTICATED] no token",` +
			`"provider":"ollama","model":"","requested_model":"","request":null,"images":[],"result":null,"attempts":[],` +
			`"reply_to":"_INBOX.x","worker":"w","version":"dev"}`,
		"white space, escapes, unknown fields, nulls": "{ \"run_id\" : \"r\\u00e9\\n\" , \"extra\": {\"x\":[1,2]}, \"roles\": null,\n" +
			`"attempts":[{"provider":"ollama","outcome":"busy","latency_ms":3,"detail":"a \"quoted\" detail","delivery":2,"error_code":"SYS1_PROVIDER_BUSY","started_at":"2026-11-29T10:00:00Z","new":true}],` +
			`"images":[{"sha256":"ab","bytes":12},null], "stream_seq": 18446744073709551615, "queued_ms": -1}`,
		"duplicate keys: last wins":                        `{"run_id":"a","run_id":"b","roles":["x"],"roles":["y","z"]}`,
		"a request nested as deep as DecodeRequest allows": `{"run_id":"d","request":{"state":` + deep + `,"questions":{"q":{"type":"noul","instructions":"?"}}}}`,
	}
	for name, in := range cases {
		t.Run(name, func(t *testing.T) {
			var want RunRecord
			if err := json.Unmarshal([]byte(in), &want); err != nil {
				t.Fatalf("json.Unmarshal: %v", err)
			}
			got, err := DecodeRecord([]byte(in))
			if err != nil {
				t.Fatalf("DecodeRecord: %v", err)
			}
			if a, b := want.AppendJSON(nil), got.AppendJSON(nil); !bytes.Equal(a, b) {
				t.Fatalf("differ:\njson.Unmarshal %s\nDecodeRecord   %s", a, b)
			}
		})
	}
}

func TestDecodeRecordRefusesWhatCannotBeARecord(t *testing.T) {
	for _, in := range []string{
		``, `[]`, `"x"`, `{"run_id":5}`, `{"stream_seq":-1}`, `{"deliveries":1.5}`,
		`{"started_at":"yesterday"}`, `{"roles":"admin"}`, `{"run_id":"a"} trailing`,
		`{"request":"x"}`, `{"result":[1]}`,
		`{"cost_usd":"free"}`, `{"cost_usd":1e999}`, `{"cache_hit":1}`, `{"verdicts":[]}`, `{"verdicts":{"q":1}}`,
		`{"review":"pending"}`, `{"review":{"item":3}}`, `{"trace_id":7}`, `{"attempts":[{"model":1}]}`,
	} {
		if _, err := DecodeRecord([]byte(in)); err == nil {
			t.Errorf("%q: accepted", in)
		}
	}
	// Not UTF-8: decoded as json.Unmarshal does (invalid bytes become U+FFFD), not refused.
	rec, err := DecodeRecord([]byte("{\"run_id\":\"a\xffb\"}"))
	if err != nil || rec.RunID != "a\uFFFDb" {
		t.Errorf("invalid UTF-8: %q, %v", rec.RunID, err)
	}
}

// BenchmarkDecodeRecord reads the version 1 record (the figure to compare across versions:
// the same bytes) and the version 2 example, with DecodeRecord and with json.Unmarshal.
func BenchmarkDecodeRecord(b *testing.B) {
	for _, file := range []string{"testdata/record-v1.json", "examples/record.json"} {
		data, err := os.ReadFile(file)
		if err != nil {
			b.Fatal(err)
		}
		name := "v1"
		if strings.HasPrefix(file, "examples") {
			name = "v2"
		}
		b.Run(name+"/DecodeRecord", func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := DecodeRecord(data); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(name+"/json.Unmarshal", func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			b.ReportAllocs()
			for b.Loop() {
				var r RunRecord
				if err := json.Unmarshal(data, &r); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
