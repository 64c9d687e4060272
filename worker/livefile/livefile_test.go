package livefile

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

func parseInt(b []byte) (int, error) {
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, errors.New("line 1: not a number")
	}
	return n, nil
}

func write(t *testing.T, path, s string, mtime time.Time) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
	// Distinct mtimes: some filesystems keep only seconds.
	if err := os.Chtimes(path, mtime, mtime); err != nil {
		t.Fatal(err)
	}
}

func TestLoadReloadAndKeepLastGood(t *testing.T) {
	path := filepath.Join(t.TempDir(), "n")
	base := time.Now().Add(-time.Hour)
	write(t, path, "1", base)
	f, err := Load(path, parseInt)
	if err != nil {
		t.Fatal(err)
	}
	if f.Current() != 1 {
		t.Fatalf("current %d", f.Current())
	}
	if changed, err := f.Check(); changed || err != nil {
		t.Fatalf("unchanged file: %v %v", changed, err)
	}
	write(t, path, "2", base.Add(time.Second))
	if changed, err := f.Check(); !changed || err != nil || f.Current() != 2 {
		t.Fatalf("edit: %v %v %d", changed, err, f.Current())
	}
	write(t, path, "two", base.Add(2*time.Second))
	if changed, err := f.Check(); changed || err == nil || !strings.Contains(err.Error(), "line 1") {
		t.Fatalf("bad edit: %v %v", changed, err)
	}
	if f.Current() != 2 || f.Err() == nil {
		t.Fatalf("bad edit must keep the last good value: %d %v", f.Current(), f.Err())
	}
	write(t, path, "3", base.Add(3*time.Second))
	if changed, err := f.Check(); !changed || err != nil || f.Current() != 3 || f.Err() != nil {
		t.Fatalf("mended: %v %v %d", changed, err, f.Current())
	}
	// Replaced by rename (editors, ConfigMap symlink swaps): a new inode, seen by the poll.
	tmp := path + ".tmp"
	write(t, tmp, "4", base.Add(4*time.Second))
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	if changed, err := f.Check(); !changed || err != nil || f.Current() != 4 {
		t.Fatalf("rename: %v %v %d", changed, err, f.Current())
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Check(); err == nil || f.Current() != 4 {
		t.Fatalf("removed file: %v %d", err, f.Current())
	}
}

func TestLoadRefusesBadOrMissingFile(t *testing.T) {
	dir := t.TempDir()
	if _, err := Load(filepath.Join(dir, "missing"), parseInt); err == nil {
		t.Fatal("missing file loaded")
	}
	path := filepath.Join(dir, "bad")
	write(t, path, "x", time.Now())
	if _, err := Load(path, parseInt); err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("bad file: %v", err)
	}
}

func TestWatchReportsChangesAndErrorsOnce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "n")
	base := time.Now().Add(-time.Hour)
	write(t, path, "1", base)
	f, err := Load(path, parseInt)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var changes []int
	var errs []error
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		f.Watch(ctx, time.Millisecond, func(v int) {
			mu.Lock()
			changes = append(changes, v)
			mu.Unlock()
		}, func(err error) {
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
		})
	}()
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
	write(t, path, "bad", base.Add(time.Second))
	waitFor("the error", func() bool { return len(errs) == 1 })
	write(t, path, "7", base.Add(2*time.Second))
	waitFor("the change", func() bool { return len(changes) == 1 && changes[0] == 7 })
	cancel()
	<-done
	mu.Lock()
	defer mu.Unlock()
	if len(errs) != 1 {
		t.Fatalf("errors reported %d times, want once: %v", len(errs), errs)
	}
}
