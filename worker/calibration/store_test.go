package calibration

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/worker/natsconn/natstest"
	"github.com/sys1hq/sys1/worker/topology"
)

func bucket(t *testing.T) (jetstream.KeyValue, context.Context) {
	t.Helper()
	srv := natstest.Start(t)
	_, js := natstest.Connect(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	kv, err := js.CreateKeyValue(ctx, topology.Default().CalibrationBucketConfig())
	if err != nil {
		t.Fatal(err)
	}
	return kv, ctx
}

func fitFor(model, caller, question string, T float64) *Fit {
	f := validFit()
	f.Model, f.Caller, f.Question, f.Temperature = model, caller, question, T
	return f
}

func TestCalibrationStoreFollowsTheBucket(t *testing.T) {
	kv, ctx := bucket(t)
	// Present before the store starts: loaded by NewStore itself.
	if _, err := Put(ctx, kv, fitFor("nimble", "billing", "label", 1.5)); err != nil {
		t.Fatal(err)
	}
	// A corrupt value and a value under the key of another model: skipped, with warnings.
	if _, err := kv.Put(ctx, Key("nimble", "billing", "urgency"), []byte(`{"temperature": "hot"`)); err != nil {
		t.Fatal(err)
	}
	stolen, _ := Encode(fitFor("nimble", "billing", "refund", 3))
	if _, err := kv.Put(ctx, Key("gemma", "billing", "refund"), stolen); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "not-a-fit-key", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	var logs natstest.Buffer
	s, err := NewStore(ctx, kv, zerolog.New(&logs))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Stop() })

	if f, ok := s.Lookup("nimble", "billing", "label"); !ok || f.Temperature != 1.5 {
		t.Fatalf("Lookup after start = %+v, %v", f, ok)
	}
	if _, ok := s.Lookup("nimble", "billing", "urgency"); ok {
		t.Error("a corrupt value was loaded")
	}
	// The model is part of the lookup: nimble's fit never serves gemma, and the value stored
	// under gemma's key (naming nimble) serves nobody.
	if _, ok := s.Lookup("gemma", "billing", "label"); ok {
		t.Error("nimble's fit returned for gemma")
	}
	if _, ok := s.Lookup("gemma", "billing", "refund"); ok {
		t.Error("a value under gemma's key naming nimble was loaded")
	}
	if _, ok := s.Lookup("nimble", "billing", "refund"); ok {
		t.Error("a value under gemma's key was loaded as nimble's")
	}
	if _, ok := s.Lookup("nimble", "other-caller", "label"); ok {
		t.Error("another caller's fit returned")
	}
	for _, want := range []string{Key("nimble", "billing", "urgency"), Key("gemma", "billing", "refund"), "not-a-fit-key"} {
		if !strings.Contains(logs.String(), `"key":"`+want+`"`) || !strings.Contains(logs.String(), "calibration value skipped") {
			t.Errorf("no warning for %s in:\n%s", want, logs.String())
		}
	}

	// A new fit applies from the next lookup on.
	rev, err := Put(ctx, kv, fitFor("nimble", "billing", "urgency", 0.7))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.WaitRevision(ctx, rev); err != nil {
		t.Fatal(err)
	}
	if f, ok := s.Lookup("nimble", "billing", "urgency"); !ok || f.Temperature != 0.7 {
		t.Errorf("after Put: %+v, %v", f, ok)
	}

	// A corrupt edit over a good fit keeps the good one, and says so.
	rev, err = kv.Put(ctx, Key("nimble", "billing", "urgency"), []byte(`garbage`))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.WaitRevision(ctx, rev); err != nil {
		t.Fatal(err)
	}
	if f, ok := s.Lookup("nimble", "billing", "urgency"); !ok || f.Temperature != 0.7 {
		t.Errorf("after a corrupt edit: %+v, %v; want the last good fit", f, ok)
	}
	if !strings.Contains(logs.String(), "the previous fit of this key stays in use") {
		t.Errorf("no warning about keeping the last good fit:\n%s", logs.String())
	}

	// List: every loaded fit, sorted.
	list := s.List()
	if len(list) != 2 || list[0].Question != "label" || list[1].Question != "urgency" {
		t.Errorf("List = %+v", list)
	}

	// A deleted fit stops applying.
	if err := Delete(ctx, kv, Key("nimble", "billing", "label")); err != nil {
		t.Fatal(err)
	}
	natstest.WaitFor(t, 10*time.Second, "the delete to reach the store", func() bool {
		_, ok := s.Lookup("nimble", "billing", "label")
		return !ok
	})
	if s.Len() != 1 {
		t.Errorf("Len = %d after the delete, want 1", s.Len())
	}
	if err := Delete(ctx, kv, Key("nimble", "billing", "label")); err == nil || !strings.Contains(err.Error(), "no fit under") {
		t.Errorf("deleting twice: %v", err)
	}

	// Stop ends the watch; the last fits stay readable and later puts do not arrive.
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	rev, _ = Put(ctx, kv, fitFor("nimble", "billing", "late", 2))
	wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if err := s.WaitRevision(wctx, rev); err == nil {
		t.Error("a stopped store still follows the bucket")
	}
	if _, ok := s.Lookup("nimble", "billing", "urgency"); !ok {
		t.Error("a stopped store forgot its fits")
	}
}

func TestCalibrationListReportsCorruptEntries(t *testing.T) {
	kv, ctx := bucket(t)
	if _, err := Put(ctx, kv, fitFor("nimble", "b", "q", 2)); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, Key("nimble", "a", "q"), []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	entries, err := List(ctx, kv)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 2 || entries[0].Key != "nimble.a.q" || entries[0].Err == nil || entries[1].Fit == nil || entries[1].Fit.Temperature != 2 {
		t.Errorf("List = %+v", entries)
	}
	// An empty bucket lists nothing, without error.
	if err := Delete(ctx, kv, "nimble.a.q"); err != nil {
		t.Fatal(err)
	}
	if err := Delete(ctx, kv, "nimble.b.q"); err != nil {
		t.Fatal(err)
	}
	if entries, err := List(ctx, kv); err != nil || len(entries) != 0 {
		t.Errorf("empty bucket: %+v, %v", entries, err)
	}
}

// Lookup and Apply run on every decision with a fit; they stay cheap with many fits loaded.
func BenchmarkLookupApply(b *testing.B) {
	s := &Store{fits: map[fitID]*Fit{}}
	for i := range 1000 {
		f := fitFor("nimble", "billing", "q"+string(rune('a'+i%26))+string(rune('a'+i/26)), 1.8)
		s.fits[fitID{f.Model, f.Caller, f.Question}] = f
	}
	a := choiceAnswer(contract.Probability{Key: "bug", P: 0.2}, contract.Probability{Key: "billing", P: 0.7}, contract.Probability{Key: "account", P: 0.1})
	b.ReportAllocs()
	for b.Loop() {
		f, ok := s.Lookup("nimble", "billing", "qaa")
		if !ok {
			b.Fatal("no fit")
		}
		if _, err := Apply(f, a); err != nil {
			b.Fatal(err)
		}
	}
}

// TestCalibrationStoreOutlivesItsLoadContext: ctx bounds the initial load only; fits put
// after it ended still reach the store (a worker loads with a timeout and runs for days).
func TestCalibrationStoreOutlivesItsLoadContext(t *testing.T) {
	kv, ctx := bucket(t)
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	s, err := NewStore(lctx, kv, zerolog.Nop())
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Stop() })
	rev, err := Put(ctx, kv, fitFor("nimble", "billing", "label", 2))
	if err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()
	if err := s.WaitRevision(wctx, rev); err != nil {
		t.Fatalf("a fit put after the load context ended never arrived: %v", err)
	}
	if f, ok := s.Lookup("nimble", "billing", "label"); !ok || f.Temperature != 2 {
		t.Fatalf("lookup: %+v %v", f, ok)
	}
}
