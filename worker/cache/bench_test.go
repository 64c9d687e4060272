package cache

import (
	"context"
	"slices"
	"testing"
	"time"
)

func reportLatency(b *testing.B, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1e3, "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds())/1e3, "p99-µs")
}

// BenchmarkCache is the cache stage of one decision: computing the key (hashing the
// redacted request) and looking it up, for a miss and for a hit (which also checks the cached
// answers against the request).
func BenchmarkCache(b *testing.B) {
	e := start(b, nil)
	ctx := context.Background()
	req := request(b, "ticket")
	hitKey := key(b, "bench", "ollama", digest, req)
	if err := e.c.Put(ctx, hitKey, answer(b, req), time.Hour); err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		caller string
		hit    bool
	}{{"miss", "nobody", false}, {"hit", "bench", true}} {
		b.Run(c.name, func(b *testing.B) {
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for range b.N {
				start := time.Now()
				k, err := NewKey(c.caller, "ollama", digest, req)
				if err != nil {
					b.Fatal(err)
				}
				hit, err := e.c.Get(ctx, k, req, time.Hour)
				if err != nil || (hit != nil) != c.hit {
					b.Fatal(hit, err)
				}
				lat = append(lat, time.Since(start))
			}
			b.StopTimer()
			reportLatency(b, lat)
		})
	}
	b.Run("key-only", func(b *testing.B) {
		for range b.N {
			if _, err := NewKey("bench", "ollama", digest, req); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("put", func(b *testing.B) {
		res := answer(b, req)
		lat := make([]time.Duration, 0, b.N)
		b.ResetTimer()
		for range b.N {
			start := time.Now()
			if err := e.c.Put(ctx, hitKey, res, time.Hour); err != nil {
				b.Fatal(err)
			}
			lat = append(lat, time.Since(start))
		}
		b.StopTimer()
		reportLatency(b, lat)
	})
}
