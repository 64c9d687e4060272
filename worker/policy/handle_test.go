package policy

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sys1hq/sys1/contract"
)

// writeFile replaces path atomically (write, then rename), as operators should: a reader
// never sees a half-written policy.
func writeFile(t *testing.T, path, s string, mtime time.Time) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
	// Distinct mtimes: some filesystems keep only seconds.
	if err := os.Chtimes(tmp, mtime, mtime); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

const (
	policyA   = "rules:\n  - name: a\n    min_confidence: 0.5\n"
	policyB   = "rules:\n  - name: b\n    min_confidence: 0.9\n"
	policyBad = "rules:\n  - name: b\n    min_confidence: 9\n    review: later\n"
)

// ruleFor is the rule that judges a 0.7-confidence choice answer under h's current policy.
func ruleFor(h *Handle) (string, contract.VerdictStatus) {
	out := h.Current().Evaluate(single(q("c", contract.TypeChoice), choiceA("c", "x", f64(0.7))))
	return out.Verdicts[0].Rule, out.Verdicts[0].Status
}

func TestHandleReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policy.yaml")
	base := time.Now().Add(-time.Hour)
	writeFile(t, path, policyA, base)
	h, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if h.Path() != path {
		t.Fatalf("path %q", h.Path())
	}
	if rule, status := ruleFor(h); rule != "a" || status != contract.VerdictDecided {
		t.Fatalf("loaded: %s %s", rule, status)
	}
	if changed, err := h.Check(); changed || err != nil {
		t.Fatalf("unchanged file: %v %v", changed, err)
	}

	// A good edit is in force at the next check.
	writeFile(t, path, policyB, base.Add(time.Second))
	if changed, err := h.Check(); !changed || err != nil {
		t.Fatalf("good edit: %v %v", changed, err)
	}
	if rule, status := ruleFor(h); rule != "b" || status != contract.VerdictAbstained {
		t.Fatalf("after the edit: %s %s", rule, status)
	}

	// A bad edit is refused with every problem named, and the last good policy stays.
	writeFile(t, path, policyBad, base.Add(2*time.Second))
	changed, err := h.Check()
	if changed || err == nil {
		t.Fatalf("bad edit: %v %v", changed, err)
	}
	for _, want := range []string{path, "line 3: rule 1 (\"b\"): min_confidence: 9 is not in [0, 1]", "line 4: rule 1 (\"b\"): review: \"later\""} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	if h.Err() == nil {
		t.Fatal("Err must hold the refused edit")
	}
	if rule, _ := ruleFor(h); rule != "b" {
		t.Fatalf("the bad edit replaced the policy: rule %s", rule)
	}

	// Mended: in force again, and the error is gone.
	writeFile(t, path, policyA, base.Add(3*time.Second))
	if changed, err := h.Check(); !changed || err != nil || h.Err() != nil {
		t.Fatalf("mended: %v %v %v", changed, err, h.Err())
	}
	if rule, _ := ruleFor(h); rule != "a" {
		t.Fatalf("mended: rule %s", rule)
	}

	// Truncated (an in-place write caught half way): refused, the policy stays.
	writeFile(t, path, "", base.Add(4*time.Second))
	if changed, err := h.Check(); changed || err == nil || h.Current().Len() != 1 {
		t.Fatalf("truncated: %v %v %d", changed, err, h.Current().Len())
	}
	// All rules off, said explicitly: in force.
	writeFile(t, path, "rules: []  # all off for now\n", base.Add(5*time.Second))
	if changed, err := h.Check(); !changed || err != nil || h.Current().Len() != 0 {
		t.Fatalf("no rules: %v %v %d", changed, err, h.Current().Len())
	}
}

func TestLoadRefusesBadOrMissingFiles(t *testing.T) {
	dir := t.TempDir()
	if _, err := Load(filepath.Join(dir, "missing.yaml")); err == nil || !strings.Contains(err.Error(), "missing.yaml") {
		t.Fatalf("missing file: %v", err)
	}
	path := filepath.Join(dir, "bad.yaml")
	writeFile(t, path, policyBad, time.Now())
	_, err := Load(path)
	if err == nil || !strings.Contains(err.Error(), path+": policy has 2 problems: line 3: ") {
		t.Fatalf("bad file: %v", err)
	}
}

func TestHandleWatch(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policy.yaml")
	base := time.Now().Add(-time.Hour)
	writeFile(t, path, policyA, base)
	h, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var changes []*Policy
	var errs []error
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.Watch(ctx, time.Millisecond,
			func(p *Policy) { mu.Lock(); changes = append(changes, p); mu.Unlock() },
			func(err error) { mu.Lock(); errs = append(errs, err); mu.Unlock() })
	}()
	defer func() { cancel(); <-done }()
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			mu.Lock()
			ok := cond()
			mu.Unlock()
			if ok {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(time.Millisecond)
		}
	}
	writeFile(t, path, policyBad, base.Add(time.Second))
	waitFor("the refused edit", func() bool { return len(errs) == 1 })
	if rule, _ := ruleFor(h); rule != "a" {
		t.Fatalf("bad edit in force: %s", rule)
	}
	writeFile(t, path, policyB, base.Add(2*time.Second))
	waitFor("the good edit", func() bool { return len(changes) == 1 })
	mu.Lock()
	got := changes[0]
	mu.Unlock()
	if got != h.Current() || got.Rules()[0].Name != "b" {
		t.Fatalf("onChange got %+v", got.Rules())
	}
}

// Evaluate on the current policy from many goroutines while the file changes: the race
// detector checks that the hot path shares nothing mutable.
func TestHandleConcurrentUse(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policy.yaml")
	base := time.Now().Add(-time.Hour)
	writeFile(t, path, policyA, base)
	h, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if rule, _ := ruleFor(h); rule != "a" && rule != "b" {
					t.Errorf("rule %q", rule)
					return
				}
			}
		}()
	}
	for i := 1; i <= 20; i++ {
		src := policyA
		if i%2 == 1 {
			src = policyB
		}
		writeFile(t, path, src, base.Add(time.Duration(i)*time.Second))
		if _, err := h.Check(); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
}
