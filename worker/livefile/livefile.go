// Package livefile keeps a parsed configuration file current while the process runs: it
// re-reads the file when its content changes, and when an edit does not parse it keeps the
// last good version and reports the error.
//
// It polls (stat, then a hash of the content when size or mtime moved) instead of using
// inotify: Kubernetes updates a mounted ConfigMap by swapping a symlink two directories up,
// which file-level watches miss, and editors that save by rename replace the watched inode.
// A poll every couple of seconds sees every one of those, costs one stat, and needs no
// platform-specific code.
package livefile

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// Parser turns a file's bytes into its value, or returns an error naming every bad line.
type Parser[T any] func(data []byte) (T, error)

// File is one watched file holding a value of type T.
type File[T any] struct {
	path  string
	parse Parser[T]
	cur   atomic.Pointer[T]

	mu      sync.Mutex // guards the fields below (the poller's state)
	sum     [32]byte
	size    int64
	modTime time.Time
	lastErr error
}

// Load reads and parses path once. An error (missing file, bad content) is a start-up error:
// there is no last good version yet.
func Load[T any](path string, parse Parser[T]) (*File[T], error) {
	f := &File[T]{path: path, parse: parse}
	if _, err := f.reload(); err != nil {
		return nil, err
	}
	return f, nil
}

// Path is the file's path.
func (f *File[T]) Path() string { return f.path }

// Current is the last good value. It never blocks and is safe from any goroutine.
func (f *File[T]) Current() T { return *f.cur.Load() }

// Err is the error of the last reload attempt that failed and has not been mended since, or nil.
func (f *File[T]) Err() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lastErr
}

// Check re-reads the file if it changed. It reports whether a new value is in place; a bad
// edit returns its error and leaves the last good value current.
func (f *File[T]) Check() (changed bool, err error) {
	return f.reload()
}

func (f *File[T]) reload() (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fi, err := os.Stat(f.path)
	if err != nil {
		f.lastErr = fmt.Errorf("%s: %w", f.path, err)
		return false, f.lastErr
	}
	if f.cur.Load() != nil && fi.Size() == f.size && fi.ModTime().Equal(f.modTime) && f.lastErr == nil {
		return false, nil
	}
	data, err := os.ReadFile(f.path)
	if err != nil {
		f.lastErr = fmt.Errorf("%s: %w", f.path, err)
		return false, f.lastErr
	}
	f.size, f.modTime = fi.Size(), fi.ModTime()
	sum := sha256.Sum256(data)
	if f.cur.Load() != nil && sum == f.sum {
		f.lastErr = nil // touched, or edited back to what is in force
		return false, nil
	}
	v, err := f.parse(data)
	if err != nil {
		f.lastErr = fmt.Errorf("%s: %w", f.path, err)
		return false, f.lastErr
	}
	f.sum, f.lastErr = sum, nil
	f.cur.Store(&v)
	return true, nil
}

// Watch polls the file every interval until ctx ends, calling onChange after each new value
// and onError after each failed reload (once per distinct error, so a file left broken does
// not flood the log).
func (f *File[T]) Watch(ctx context.Context, interval time.Duration, onChange func(T), onError func(error)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	var reported string
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		changed, err := f.Check()
		switch {
		case err != nil:
			if err.Error() != reported && onError != nil {
				onError(err)
			}
			reported = err.Error()
		case changed:
			reported = ""
			if onChange != nil {
				onChange(f.Current())
			}
		default:
			reported = ""
		}
	}
}
