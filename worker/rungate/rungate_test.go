package rungate

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/sys1hq/sys1/contract"
)

func TestKeyIsInjectiveValidAndGroupsBatches(t *testing.T) {
	ids := []string{"a", "a:b", "a:", ":b", ":", "a:b:c", "ab", "a.b", "SYS1_REQUESTS~7~abc", "batch1:item-1", "batch1:item-2", "batch10:item-1"}
	seen := map[string]string{}
	for _, id := range ids {
		k := Key(id)
		if other, dup := seen[k]; dup {
			t.Fatalf("%q and %q share key %q", id, other, k)
		}
		seen[k] = id
		if strings.HasPrefix(k, ".") || strings.HasSuffix(k, ".") || strings.Contains(k, "..") {
			t.Fatalf("%q: invalid KV key %q", id, k)
		}
		for _, c := range k {
			if !(c == '.' || c == '-' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z') {
				t.Fatalf("%q: key %q has %q", id, k, c)
			}
		}
	}
	filter := strings.TrimSuffix(GroupFilter("batch1"), "*")
	for _, id := range ids {
		in := strings.HasPrefix(Key(id), filter) && !strings.Contains(strings.TrimPrefix(Key(id), filter), ".")
		if want := strings.HasPrefix(id, "batch1:"); in != want {
			t.Errorf("%q in group batch1 = %v, want %v", id, in, want)
		}
	}
}

// TestEncodeIsJSON: the hand-written encoder (the gate's hot path) writes what encoding/json
// reads back as the same State, every field set.
func TestEncodeIsJSON(t *testing.T) {
	at := time.Date(2026, 12, 3, 10, 0, 0, 123, time.UTC)
	cost := 0.25
	st := State{Caller: "svc-a", Status: StatusDone, StreamSeq: 42, StartedAt: at, Waits: 2, Owner: "w/1", LeaseUntil: at.Add(time.Minute),
		Attempts: []contract.Attempt{{Provider: "ollama", Model: "nimble", Outcome: contract.OutcomeOK, Delivery: 1, StartedAt: at}},
		ReplyTo:  "_INBOX.svc-a.x", Reply: json.RawMessage(`{"run_id":"r","status":"success"}`), Subject: "sys1.runs.success",
		Held: []string{"label"}, Answer: &Answer{Response: json.RawMessage(`{"model":"nimble","answers":{}}`), Provider: "ollama", Model: "nimble", At: at},
		Finished: &Finished{At: at, Deliveries: 2, CallerKind: "subject", Provider: "ollama", Worker: "w", Version: "1", CostUSD: &cost}}
	b, err := st.Encode()
	if err != nil {
		t.Fatal(err)
	}
	var back State
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
	want, _ := json.Marshal(st)
	got, _ := json.Marshal(back)
	if string(got) != string(want) {
		t.Fatalf("encoded\n%s\nread back as\n%s\nwant\n%s", b, got, want)
	}
}
