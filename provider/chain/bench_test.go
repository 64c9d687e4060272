package chain_test

import (
	"context"
	"testing"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/provider"
	"github.com/sys1hq/sys1/provider/chain"
	"github.com/sys1hq/sys1/provider/ollamatest"
	"github.com/sys1hq/sys1/provider/simulator"
)

// The chain's overhead per call against calling the provider directly, side by side: with a
// provider that answers a fixed response (no work at all: the chain's own cost in full), the
// simulator (no I/O) and the fake Ollama over HTTP (what a call really costs). Compare the
// Direct and Chain lines of each pair.
func BenchmarkChainOverhead(b *testing.B) {
	local := ollamatest.New(b, ollamatest.WithRecordLimit(0))
	fixedResp, err := simulator.New(0).Evaluate(context.Background(), request(b, "nimble"))
	if err != nil {
		b.Fatal(err)
	}
	fixed := &scripted{name: "fixed", fn: func(context.Context, *contract.Request) (*contract.Response, error) { return fixedResp, nil }}
	for _, p := range []struct {
		name string
		prov provider.Provider
	}{
		{"fixed", fixed},
		{"simulator", simulator.New(0)},
		{"ollama-http", ollamaAt(b, local.URL(), "5000")},
	} {
		req := request(b, "nimble")
		ctx := context.Background()
		b.Run(p.name+"/Direct", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := p.prov.Evaluate(ctx, req); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(p.name+"/Chain", func(b *testing.B) {
			c, err := chain.New(chain.Config{}, chain.Link{Provider: p.prov, Models: models(b, "nimble=nimble:latest")})
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.Evaluate(ctx, req, 1); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
