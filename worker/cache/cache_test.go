package cache

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/contract/examples"
	"github.com/sys1hq/sys1/provider/simulator"
	"github.com/sys1hq/sys1/worker/natsconn/natstest"
	"github.com/sys1hq/sys1/worker/topology"
)

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

type env struct {
	c   *Cache
	kv  jetstream.KeyValue
	log *natstest.Buffer
}

// start runs a nats-server with the cache bucket as the worker creates it.
func start(t testing.TB, now func() time.Time) env {
	t.Helper()
	srv := natstest.Start(t)
	_, js := natstest.Connect(t, srv)
	kv, err := js.CreateKeyValue(context.Background(), topology.Default().CacheBucketConfig(24*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	log := &natstest.Buffer{}
	c, err := New(Config{KV: kv, JS: js, Now: now, Log: zerolog.New(log)})
	if err != nil {
		t.Fatal(err)
	}
	return env{c: c, kv: kv, log: log}
}

// request decodes an example request as a producer would send it, with its model resolved.
func request(t testing.TB, name string) *contract.Request {
	t.Helper()
	body, err := examples.Request(name)
	if err != nil {
		t.Fatal(err)
	}
	req, cerr := contract.DecodeRequest(body)
	if cerr != nil {
		t.Fatal(cerr)
	}
	if req.Model == "" {
		req.Model = "nimble"
	}
	return req
}

// answer is what a provider answers to req (the simulator, through the response contract).
func answer(t testing.TB, req *contract.Request) *contract.Result {
	t.Helper()
	resp, err := simulator.New(0).Evaluate(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	return &contract.Result{Provider: simulator.Name, Model: resp.Model, Answers: resp.Answers, Usage: resp.Usage}
}

func key(t testing.TB, caller, provider, digest string, req *contract.Request) Key {
	t.Helper()
	k, err := NewKey(caller, provider, digest, req)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

const digest = "sha256:5f2b1c0d"

func TestHitReturnsTheResultVerbatim(t *testing.T) {
	clk := &clock{t: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)}
	e := start(t, clk.Now)
	ctx := context.Background()
	req := request(t, "ticket")
	k := key(t, "billing", "simulator", digest, req)
	if hit, err := e.c.Get(ctx, k, req, time.Hour); hit != nil || err != nil {
		t.Fatalf("empty cache: %+v %v", hit, err)
	}
	res := answer(t, req)
	if err := e.c.Put(ctx, k, res, time.Hour); err != nil {
		t.Fatal(err)
	}
	clk.Add(10 * time.Minute)
	hit, err := e.c.Get(ctx, k, req, time.Hour)
	if err != nil || hit == nil {
		t.Fatalf("hit: %+v %v", hit, err)
	}
	if hit.Age != 10*time.Minute || !hit.StoredAt.Equal(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)) {
		t.Errorf("age %s, stored %s", hit.Age, hit.StoredAt)
	}
	want, _ := res.MarshalJSON()
	got, _ := hit.Result.MarshalJSON()
	if !bytes.Equal(got, want) {
		t.Fatalf("cached result differs:\n got %s\nwant %s", got, want)
	}
	for i, a := range hit.Result.Answers {
		w := res.Answers[i]
		if a.Name != w.Name || a.Type != w.Type || !bytes.Equal(a.Raw, w.Raw) || a.Choice != w.Choice || a.Noul != w.Noul || a.Score != w.Score {
			t.Errorf("answer %d: %+v, want %+v", i, a, w)
		}
	}
	if hit.Result.Usage != res.Usage || hit.Result.Provider != "simulator" || hit.Result.Model != "nimble" {
		t.Errorf("result: %+v", hit.Result)
	}
}

// TestMaxAgeBoundsAHit: an entry older than the request allows is a miss although its TTL
// has not run out; a request allowing more still hits it.
func TestMaxAgeBoundsAHit(t *testing.T) {
	clk := &clock{t: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)}
	e := start(t, clk.Now)
	ctx := context.Background()
	req := request(t, "one")
	k := key(t, "c", "simulator", digest, req)
	if err := e.c.Put(ctx, k, answer(t, req), 24*time.Hour); err != nil {
		t.Fatal(err)
	}
	clk.Add(2 * time.Hour)
	if hit, err := e.c.Get(ctx, k, req, time.Hour); hit != nil || err != nil {
		t.Fatalf("2 h old entry for a 1 h request: %+v %v", hit, err)
	}
	if hit, err := e.c.Get(ctx, k, req, 3*time.Hour); hit == nil || err != nil {
		t.Fatalf("2 h old entry for a 3 h request: %v", err)
	}
	if hit, err := e.c.Get(ctx, k, req, 0); hit != nil || err != nil {
		t.Fatalf("a request with no cache: %+v %v", hit, err)
	}
	// An entry stored by a replica whose clock runs ahead is fresh, not of negative age.
	clk.Add(-3 * time.Hour)
	if hit, err := e.c.Get(ctx, k, req, time.Second); hit == nil || err != nil || hit.Age != 0 {
		t.Fatalf("entry from the future: %+v %v", hit, err)
	}
}

// TestEntryExpiresWithItsTTL: the entry's own TTL, not the bucket's, removes it.
func TestEntryExpiresWithItsTTL(t *testing.T) {
	e := start(t, nil)
	ctx := context.Background()
	req := request(t, "one")
	k := key(t, "c", "simulator", digest, req)
	long := key(t, "c2", "simulator", digest, req)
	if err := e.c.Put(ctx, k, answer(t, req), time.Second); err != nil {
		t.Fatal(err)
	}
	if err := e.c.Put(ctx, long, answer(t, req), time.Hour); err != nil {
		t.Fatal(err)
	}
	if hit, _ := e.c.Get(ctx, k, req, time.Hour); hit == nil {
		t.Fatal("no hit right after the put")
	}
	natstest.WaitFor(t, 10*time.Second, "the 1 s entry to expire", func() bool {
		hit, err := e.c.Get(ctx, k, req, time.Hour)
		return hit == nil && err == nil
	})
	if hit, _ := e.c.Get(ctx, long, req, time.Hour); hit == nil {
		t.Fatal("the 1 h entry went with the 1 s one")
	}
	// Under a second stores nothing (JetStream TTLs are whole seconds).
	other := key(t, "c3", "simulator", digest, req)
	if err := e.c.Put(ctx, other, answer(t, req), 500*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if _, err := e.kv.Get(ctx, other.String()); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("a sub-second TTL stored an entry: %v", err)
	}
}

// TestKeySeparatesWeightsProvidersCallersAndRequests: each part of the key changes it; what is
// not part of what the model sees (keep_alive, whether images are redacted yet) does not.
func TestKeySeparatesWeightsProvidersCallersAndRequests(t *testing.T) {
	e := start(t, nil)
	ctx := context.Background()
	req := request(t, "ticket")
	base := key(t, "billing", "ollama", digest, req)
	if err := e.c.Put(ctx, base, answer(t, req), time.Hour); err != nil {
		t.Fatal(err)
	}
	changedState := *req
	changedState.State = json.RawMessage(`{"ticket_id":1}`)
	reordered := *req
	reordered.Questions = append([]contract.Question{req.Questions[1], req.Questions[0]}, req.Questions[2:]...)
	otherModel := *req
	otherModel.Model = "nimble:7b"
	for name, k := range map[string]Key{
		"new weights":     key(t, "billing", "ollama", "sha256:ffff", req),
		"other provider":  key(t, "billing", "hosted", digest, req),
		"other caller":    key(t, "support", "ollama", digest, req),
		"other state":     key(t, "billing", "ollama", digest, &changedState),
		"question order":  key(t, "billing", "ollama", digest, &reordered),
		"other model":     key(t, "billing", "ollama", digest, &otherModel),
		"caller/provider": key(t, "billingollama", "", digest, req),
	} {
		if k == base {
			t.Errorf("%s: same key", name)
		}
		if hit, err := e.c.Get(ctx, k, req, time.Hour); hit != nil || err != nil {
			t.Errorf("%s: hit %+v %v", name, hit, err)
		}
	}
	withKeepAlive := *req
	withKeepAlive.KeepAlive = json.RawMessage(`"5m"`)
	if key(t, "billing", "ollama", digest, &withKeepAlive) != base {
		t.Error("keep_alive changed the key")
	}
	if hit, _ := e.c.Get(ctx, base, req, time.Hour); hit == nil {
		t.Error("the entry itself is gone")
	}

	img := request(t, "image")
	ik := key(t, "c", "ollama", digest, img)
	if key(t, "c", "ollama", digest, contract.Redact(img)) != ik {
		t.Error("an image keys differently before and after redaction")
	}
	flipped := *img
	flipped.Images = []contract.Image{{SHA256: strings.Repeat("0", 64), Bytes: img.Images[0].Bytes}}
	if key(t, "c", "ollama", digest, &flipped) == ik {
		t.Error("another image, same key")
	}
	if _, err := NewKey("c", "ollama", "", req); !errors.Is(err, ErrNoDigest) {
		t.Errorf("no digest: %v", err)
	}
}

// TestEntryHoldsNoRequest: what is stored is the result, never state, instructions or images.
func TestEntryHoldsNoRequest(t *testing.T) {
	e := start(t, nil)
	ctx := context.Background()
	req := request(t, "image")
	req.State = json.RawMessage(`{"secret":"STATE-7f3a"}`)
	req.Questions[0].Instructions = json.RawMessage(`"INSTRUCTIONS-91bc"`)
	k := key(t, "c", "simulator", digest, req)
	if err := e.c.Put(ctx, k, answer(t, req), time.Hour); err != nil {
		t.Fatal(err)
	}
	kve, err := e.kv.Get(ctx, k.String())
	if err != nil {
		t.Fatal(err)
	}
	raw := string(kve.Value())
	img := req.Images[0].Data
	for _, secret := range []string{"STATE-7f3a", "INSTRUCTIONS-91bc", img[:40], `"state"`} {
		if strings.Contains(raw, secret) {
			t.Errorf("stored entry holds %q: %s", secret, raw)
		}
	}
	if !strings.HasPrefix(raw, entryMagic+"\n") || !strings.Contains(raw, "\n\""+digest+"\"\n{") || !strings.Contains(raw, `"answers":{`) {
		t.Errorf("stored entry: %s", raw)
	}
}

// TestCorruptEntriesAreMisses: an entry that cannot be read, or does not answer the request
// it is looked up for, is a miss and a warning; nothing panics.
func TestCorruptEntriesAreMisses(t *testing.T) {
	e := start(t, nil)
	ctx := context.Background()
	req := request(t, "ticket")
	k := key(t, "c", "simulator", digest, req)
	now := time.Now().UTC().Format(time.RFC3339Nano)
	good, _ := answer(t, req).MarshalJSON()
	other, _ := answer(t, request(t, "one")).MarshalJSON()
	head := func(magic, at, provider, dig string) string {
		return magic + "\n" + at + "\n" + provider + "\n" + dig + "\n"
	}
	ok := head(entryMagic, now, `"simulator"`, `"`+digest+`"`)
	for name, val := range map[string]string{
		"not an entry":      "\x00\xffgarbage",
		"empty":             "",
		"truncated":         ok[:len(ok)-1],
		"no result":         ok,
		"wrong version":     head("sys1-cache/2", now, `"simulator"`, `"`+digest+`"`) + string(good),
		"bad time":          head(entryMagic, "yesterday", `"simulator"`, `"`+digest+`"`) + string(good),
		"unquoted provider": head(entryMagic, now, `simulator`, `"`+digest+`"`) + string(good),
		"other digest":      head(entryMagic, now, `"simulator"`, `"sha256:old"`) + string(good),
		"another's answers": ok + string(other),
		"broken answers":    ok + `{"answers":{"label":{"type":"choice","choice":"nope"}}}`,
		"result not object": ok + `[1,2]`,
		"old JSON format":   `{"v":1,"stored_at":"` + now + `","digest":"` + digest + `","result":` + string(good) + `}`,
	} {
		if _, err := e.kv.Put(ctx, k.String(), []byte(val)); err != nil {
			t.Fatal(err)
		}
		before := strings.Count(e.log.String(), "treated as a miss")
		hit, err := e.c.Get(ctx, k, req, time.Hour)
		if hit != nil || err != nil {
			t.Errorf("%s: %+v %v", name, hit, err)
		}
		if strings.Count(e.log.String(), "treated as a miss") != before+1 {
			t.Errorf("%s: no warning logged", name)
		}
	}
	if !strings.Contains(e.log.String(), `"cache_key":"`+k.String()+`"`) {
		t.Errorf("warnings name the key: %s", e.log.String())
	}
	// The next Put mends the entry.
	if err := e.c.Put(ctx, k, answer(t, req), time.Hour); err != nil {
		t.Fatal(err)
	}
	if hit, err := e.c.Get(ctx, k, req, time.Hour); hit == nil || err != nil {
		t.Fatalf("after a put over a corrupt entry: %v", err)
	}
}

// TestPutReplacesAnOlderEntry: a request that missed an entry too old for it stores a fresh
// one over it, with its own TTL.
func TestPutReplacesAnOlderEntry(t *testing.T) {
	clk := &clock{t: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)}
	e := start(t, clk.Now)
	ctx := context.Background()
	req := request(t, "one")
	k := key(t, "c", "simulator", digest, req)
	if err := e.c.Put(ctx, k, answer(t, req), 24*time.Hour); err != nil {
		t.Fatal(err)
	}
	clk.Add(5 * time.Hour)
	if hit, _ := e.c.Get(ctx, k, req, time.Hour); hit != nil {
		t.Fatal("5 h old entry hit for 1 h")
	}
	if err := e.c.Put(ctx, k, answer(t, req), time.Hour); err != nil {
		t.Fatal(err)
	}
	hit, err := e.c.Get(ctx, k, req, time.Hour)
	if err != nil || hit == nil || hit.Age != 0 {
		t.Fatalf("fresh entry: %+v %v", hit, err)
	}
}

func TestNewNeedsBucketAndJetStream(t *testing.T) {
	if _, err := New(Config{}); err == nil {
		t.Fatal("no bucket accepted")
	}
	e := start(t, nil)
	if _, err := New(Config{KV: e.kv}); err == nil {
		t.Fatal("no JetStream accepted")
	}
}

// FuzzDecodeEntry: stored bytes are whatever a bucket holds (an operator's put, a damaged
// file); decoding never panics, and whatever it accepts encodes back to an entry that
// decodes to the same fields.
func FuzzDecodeEntry(f *testing.F) {
	f.Add((&entry{StoredAt: time.Unix(1700000000, 5), Provider: "ollama", Digest: digest, Result: []byte(`{"answers":{}}`)}).encode())
	f.Add([]byte("sys1-cache/1\n\n\n\n"))
	f.Add([]byte("sys1-cache/1\n2026-12-01T12:00:00Z\n\"a\\nb\"\n\"\"\n{}"))
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := decodeEntry(b)
		if err != nil {
			return
		}
		again, err := decodeEntry(e.encode())
		if err != nil || !again.StoredAt.Equal(e.StoredAt) || again.Provider != e.Provider || again.Digest != e.Digest || !bytes.Equal(again.Result, e.Result) {
			t.Fatalf("%q: round trip %+v → %+v (%v)", b, e, again, err)
		}
	})
}
