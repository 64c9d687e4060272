package calibration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// maxValueBytes bounds a value Decode reads: a fit is about 3 KB; anything far larger is not
// one, and decoding it would only cost memory.
const maxValueBytes = 1 << 20

// Encode is the KV value of f: its JSON after Validate, with every metric finite.
func Encode(f *Fit) ([]byte, error) {
	if err := f.Validate(); err != nil {
		return nil, fmt.Errorf("fit %s: %w", f.Key(), err)
	}
	for _, m := range []Metrics{f.Before, f.After} {
		for _, v := range []float64{m.ECE, m.Brier, m.NLL, m.Accuracy} {
			if math.IsNaN(v) || math.IsInf(v, 0) {
				return nil, fmt.Errorf("fit %s: a metric is %v", f.Key(), v)
			}
		}
	}
	return json.Marshal(f)
}

// Decode reads the value stored under key: the JSON of a Fit that passes Validate and whose
// model, caller and question are the ones the key names (a value copied under another key
// would apply one model's fit to another).
func Decode(key string, value []byte) (*Fit, error) {
	model, caller, question, err := ParseKey(key)
	if err != nil {
		return nil, err
	}
	if len(value) > maxValueBytes {
		return nil, fmt.Errorf("value of %d bytes is no fit (at most %d)", len(value), maxValueBytes)
	}
	var f Fit
	if err := json.Unmarshal(value, &f); err != nil {
		return nil, fmt.Errorf("value is not a fit: %w", err)
	}
	if err := f.Validate(); err != nil {
		return nil, err
	}
	if f.Model != model || f.Caller != caller || f.Question != question {
		return nil, fmt.Errorf("value is the fit of model %q, caller %q, question %q, not of its key", f.Model, f.Caller, f.Question)
	}
	if f.Risk != nil {
		f.Risk.prepare()
	}
	return &f, nil
}

// Put stores f under f.Key() and returns the entry's revision.
func Put(ctx context.Context, kv jetstream.KeyValue, f *Fit) (uint64, error) {
	b, err := Encode(f)
	if err != nil {
		return 0, err
	}
	rev, err := kv.Put(ctx, f.Key(), b)
	if err != nil {
		return 0, fmt.Errorf("store fit %s in %s: %w", f.Key(), kv.Bucket(), err)
	}
	return rev, nil
}

// Entry is one key of the bucket as List read it: a fit, or the error that made its value
// unusable.
type Entry struct {
	Key      string
	Revision uint64
	Created  time.Time
	Fit      *Fit
	Err      error
}

// List reads every current fit in the bucket, sorted by key. Unusable values are returned
// with their error, not dropped: `sys1 calibrate --list` shows them so an operator can delete
// them.
func List(ctx context.Context, kv jetstream.KeyValue) ([]Entry, error) {
	w, err := kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, fmt.Errorf("read bucket %s: %w", kv.Bucket(), err)
	}
	defer func() { _ = w.Stop() }()
	var out []Entry
	for {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("read bucket %s: %w", kv.Bucket(), ctx.Err())
		case e, ok := <-w.Updates():
			if !ok {
				return nil, fmt.Errorf("read bucket %s: the watch ended early", kv.Bucket())
			}
			if e == nil { // every current value has been delivered
				slices.SortFunc(out, func(a, b Entry) int {
					switch {
					case a.Key < b.Key:
						return -1
					case a.Key > b.Key:
						return 1
					}
					return 0
				})
				return out, nil
			}
			f, err := Decode(e.Key(), e.Value())
			out = append(out, Entry{Key: e.Key(), Revision: e.Revision(), Created: e.Created(), Fit: f, Err: err})
		}
	}
}

// Delete removes the fit under key (a delete marker: the bucket's history keeps what it
// replaced). A key that holds no fit is jetstream.ErrKeyNotFound.
func Delete(ctx context.Context, kv jetstream.KeyValue, key string) error {
	if _, err := kv.Get(ctx, key); err != nil {
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return fmt.Errorf("no fit under %s: %w", key, err)
		}
		return fmt.Errorf("read %s: %w", key, err)
	}
	if err := kv.Delete(ctx, key); err != nil {
		return fmt.Errorf("delete %s: %w", key, err)
	}
	return nil
}
