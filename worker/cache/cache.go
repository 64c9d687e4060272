// Package cache is the exact result cache: a run whose resolved request, provider and model
// weights are byte for byte those of an earlier run can be answered with that run's result,
// without calling the model. System One answers are deterministic for the same request and
// weights, so a hit is the answer the model would give, not an approximation of it.
//
// # Key
//
// The key is SHA-256 over the caller, the provider's name, the model's digest (the identity
// of its weights: Ollama's digest, a hosted provider's model version) and the resolved
// request as sent upstream with images replaced by their hashes (contract.Redact and the
// contract's encoder). A new digest gives new keys, so the cache never answers for other
// weights; without a digest there is no key (ErrNoDigest), since nothing would tell weights
// apart. The caller is part of the key so that callers never share entries: a hit shows in
// the reply (attempt outcome "cache"), and a shared entry would tell one caller what another
// had asked. keep_alive is not part of the key (it is server policy and changes no answer).
//
// # Value
//
// An entry holds the result (the provider's answers verbatim, usage, provider, model), when
// it was stored and the digest, never the request: no state, no instructions, no images. It
// lives in KV bucket sys1-cache with a TTL of its own (the age the storing request allowed).
// A lookup is a hit only if the entry is at most as old as the looking request allows, even
// when its TTL has not run out, and only if its answers still pass the response contract for
// the request: an unreadable entry is a miss and a warning, never a crash or a wrong answer.
package cache

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/sys1hq/sys1/contract"
)

// ErrNoDigest: the model's digest is unknown, so a cached answer could be another model's.
var ErrNoDigest = errors.New("cache: the model has no digest; without one a cached answer could come from other weights")

// Key identifies one cache entry.
type Key struct {
	sum    [sha256.Size]byte
	digest string // stored with the entry, and checked on the way out
}

// String is the entry's KV key.
func (k Key) String() string { return "v1." + hex.EncodeToString(k.sum[:]) }

// NewKey is the key of req (resolved, as it goes upstream) sent by caller to provider's model
// with digest. Images are keyed by their hashes, so a request is keyed the same before and
// after its images are redacted.
func NewKey(caller, provider, digest string, req *contract.Request) (Key, error) {
	if digest == "" {
		return Key{}, ErrNoDigest
	}
	if req == nil {
		return Key{}, errors.New("cache: no request to key")
	}
	h := sha256.New()
	// Length-prefixed fields: no choice of names can make two different tuples hash alike.
	field := func(s string) {
		var n [binary.MaxVarintLen64]byte
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(s)))])
		h.Write([]byte(s))
	}
	field("sys1-cache/v1")
	field(caller)
	field(provider)
	field(digest)
	h.Write(contract.Redact(req).AppendJSON(nil))
	k := Key{digest: digest}
	h.Sum(k.sum[:0])
	return k, nil
}

// Config configures a Cache.
type Config struct {
	// KV is the cache bucket (topology.Config.CacheBucketConfig: per-key TTLs need its
	// limit marker).
	KV jetstream.KeyValue
	// JS is the JetStream context KV was opened with: entries are written as KV messages
	// ($KV.<bucket>.<key>) with a TTL of their own, which the KV API offers only for keys
	// that do not exist yet. The bucket is the local account's (no JetStream domain or API
	// prefix), as all of sys1's are.
	JS jetstream.JetStream
	// Now is the clock; nil means time.Now. Ages are measured with it.
	Now func() time.Time
	Log zerolog.Logger
}

// Cache reads and writes cached results. It is safe for concurrent use.
type Cache struct {
	kv      jetstream.KeyValue
	js      jetstream.JetStream
	subject string // "$KV.<bucket>." (ADR-8: a KV key is the subject after it)
	now     func() time.Time
	log     zerolog.Logger
}

// New returns a Cache on the bucket.
func New(cfg Config) (*Cache, error) {
	if cfg.KV == nil || cfg.JS == nil {
		return nil, errors.New("cache: needs the cache bucket and its JetStream context")
	}
	c := &Cache{kv: cfg.KV, js: cfg.JS, subject: "$KV." + cfg.KV.Bucket() + ".", now: cfg.Now, log: cfg.Log}
	if c.now == nil {
		c.now = time.Now
	}
	return c, nil
}

// entry is a cached value. It is stored as four header lines and the result's JSON:
//
//	sys1-cache/1
//	2026-12-01T12:00:00.123Z     (stored at)
//	"ollama"                     (provider, quoted)
//	"sha256:5f2b…"               (model digest, quoted)
//	{"provider":…,"model":…,"answers":{…},"usage":{…}}
//
// which reads at a glance with `nats kv get` and parses with four cuts: a JSON wrapper cost
// more to decode than the answers themselves.
type entry struct {
	StoredAt time.Time
	Provider string
	Digest   string
	Result   []byte // contract.Result's JSON: answers verbatim, usage
}

const entryMagic = "sys1-cache/1"

func (e *entry) encode() []byte {
	b := make([]byte, 0, 96+len(e.Provider)+len(e.Digest)+len(e.Result))
	b = append(b, entryMagic...)
	b = append(b, '\n')
	b = e.StoredAt.UTC().AppendFormat(b, time.RFC3339Nano)
	b = append(b, '\n')
	b = strconv.AppendQuote(b, e.Provider)
	b = append(b, '\n')
	b = strconv.AppendQuote(b, e.Digest)
	b = append(b, '\n')
	return append(b, e.Result...)
}

func decodeEntry(b []byte) (entry, error) {
	var e entry
	var line [4][]byte
	rest := b
	for i := range line {
		var ok bool
		if line[i], rest, ok = bytes.Cut(rest, []byte{'\n'}); !ok {
			return e, errors.New("truncated")
		}
	}
	if string(line[0]) != entryMagic {
		return e, errors.New("not a sys1-cache/1 entry")
	}
	t, err := time.Parse(time.RFC3339Nano, string(line[1]))
	if err != nil {
		return e, errors.New("bad stored-at time")
	}
	if e.Provider, err = strconv.Unquote(string(line[2])); err != nil {
		return e, errors.New("bad provider")
	}
	if e.Digest, err = strconv.Unquote(string(line[3])); err != nil {
		return e, errors.New("bad digest")
	}
	if len(rest) == 0 {
		return e, errors.New("no result")
	}
	e.StoredAt, e.Result = t, rest
	return e, nil
}

// Hit is a cached result.
type Hit struct {
	Result   *contract.Result
	StoredAt time.Time
	Age      time.Duration
}

// Get looks key up for req (the request the key was computed from, against which the cached
// answers are checked) and returns a hit at most maxAge old, or nil for a miss. An error is
// NATS failing; the caller should carry on as on a miss (the cache is an optimisation, never
// a reason to fail a run).
func (c *Cache) Get(ctx context.Context, key Key, req *contract.Request, maxAge time.Duration) (*Hit, error) {
	if maxAge <= 0 {
		return nil, nil
	}
	kve, err := c.kv.Get(ctx, key.String())
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("cache: get: %w", err)
	}
	e, err := decodeEntry(kve.Value())
	if err == nil && e.Digest != key.digest {
		err = errors.New("stored for another model digest")
	}
	if err != nil {
		c.warn(key, "unreadable", err)
		return nil, nil
	}
	age := max(c.now().Sub(e.StoredAt), 0) // an entry from a replica whose clock runs ahead is fresh
	if age > maxAge {
		return nil, nil // older than this request accepts, though others may still use it
	}
	resp, cerr := contract.DecodeResponse(req, e.Result)
	if cerr != nil {
		// Not an answer to this request (a damaged entry, a hash collision if one ever
		// happened): the model decides instead.
		c.warn(key, "does not answer the request", cerr)
		return nil, nil
	}
	return &Hit{
		Result:   &contract.Result{Provider: e.Provider, Model: resp.Model, Answers: resp.Answers, Usage: resp.Usage},
		StoredAt: e.StoredAt,
		Age:      age,
	}, nil
}

func (c *Cache) warn(key Key, what string, err error) {
	ev := c.log.Warn().Str("cache_key", key.String())
	if err != nil {
		ev = ev.Err(err)
	}
	ev.Msg("cache: entry " + what + "; treated as a miss")
}

// Put stores res (the result of the call made on a miss for key) for ttl: the age the request
// allowed. A TTL under a second stores nothing (JetStream's TTLs are whole seconds); longer
// ones are rounded up to one. A newer entry replaces an older one under the same key.
func (c *Cache) Put(ctx context.Context, key Key, res *contract.Result, ttl time.Duration) error {
	if ttl < time.Second || res == nil || key.digest == "" {
		return nil
	}
	if r := ttl % time.Second; r != 0 {
		ttl += time.Second - r
	}
	e := entry{StoredAt: c.now(), Provider: res.Provider, Digest: key.digest, Result: res.AppendJSON(nil)}
	val := e.encode()
	// A plain KV put with a per-message TTL: kv.Create takes a TTL but refuses an existing
	// key, and an existing entry is one too old for the request that missed it.
	msg := &nats.Msg{Subject: c.subject + key.String(), Data: val}
	if _, err := c.js.PublishMsg(ctx, msg, jetstream.WithMsgTTL(ttl)); err != nil {
		return fmt.Errorf("cache: put: %w", err)
	}
	return nil
}
