// Package simulator is a model-free System One provider for demos without a GPU and for load
// tests (SYS1_PROVIDER=simulator).
//
// Its answers are deterministic and computed by the same rules as the fake Ollama
// (provider/internal/synth): the same request always gets the same answer, and they mean
// nothing. So that a simulated answer is never mistaken for a model's, Name() is always
// "simulator": replies and run records carry provider "simulator", while the reported model
// is the requested one (what a real provider would have been asked for).
package simulator

import (
	"context"
	"fmt"
	"time"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/provider"
	"github.com/sys1hq/sys1/provider/internal/synth"
)

// Name is the provider name of every simulated answer.
const Name = "simulator"

// Simulator answers without a model. It is safe for concurrent use.
type Simulator struct {
	latency time.Duration
}

// New returns a simulator that takes latency to answer each call (0: answer at once).
func New(latency time.Duration) *Simulator {
	return &Simulator{latency: max(latency, 0)}
}

// Name is always "simulator".
func (s *Simulator) Name() string { return Name }

// Capabilities are Ollama's limits, so load tests exercise the same shapes.
func (s *Simulator) Capabilities() provider.Capabilities {
	return provider.Capabilities{MaxOptions: 26, MaxLevels: 26, Images: true}
}

// Probe always reports healthy, with Version "simulator".
func (s *Simulator) Probe(context.Context) provider.ProbeResult {
	return provider.ProbeResult{Reachable: true, Version: Name, VersionOK: true, ModelPresent: true}
}

// Evaluate waits the configured latency (returning the caller's cancellation, wrapped, if ctx
// ends first) and answers deterministically. The answer goes through the response contract
// like any provider's, so Raw answers are exactly what a real provider's would look like.
func (s *Simulator) Evaluate(ctx context.Context, req *contract.Request) (*contract.Response, error) {
	if req == nil {
		return nil, contract.Errorf(contract.CodeInternal, "simulator: Evaluate called without a request")
	}
	if err := s.wait(ctx); err != nil {
		return nil, fmt.Errorf("simulator: evaluate abandoned by the caller: %w", err)
	}
	qs := make([]synth.Question, len(req.Questions))
	for i, q := range req.Questions {
		sq := synth.Question{Name: q.Name, Type: string(q.Type)}
		switch q.Type {
		case contract.TypeChoice:
			sq.Keys = make([]string, len(q.Options))
			for j, o := range q.Options {
				sq.Keys[j] = o.Key
			}
		case contract.TypeScore:
			sq.Keys = q.Levels
		}
		qs[i] = sq
	}
	body := synth.Append(make([]byte, 0, 256+len(qs)*256), synth.Response{
		Model:        req.Model,
		State:        req.State,
		Questions:    qs,
		InputTokens:  estimateTokens(req),
		OutputTokens: 1,
	})
	resp, derr := contract.DecodeResponse(req, body)
	if derr != nil {
		// the simulator answering outside the contract is a bug, not an upstream fault
		return nil, contract.Wrap(contract.CodeInternal, derr, "the simulator produced an invalid answer: %s", derr.Message)
	}
	return resp, nil
}

func (s *Simulator) wait(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if s.latency <= 0 {
		return nil
	}
	t := time.NewTimer(s.latency)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// estimateTokens approximates Ollama's input token count (about 4 bytes a token) from the
// request's text without encoding it; images count 0 here, as the simulator sees none.
func estimateTokens(req *contract.Request) int64 {
	n := 32 + len(req.Model) + len(req.State)
	for _, q := range req.Questions {
		n += 32 + len(q.Name) + len(q.Instructions)
		for _, o := range q.Options {
			n += 6 + len(o.Key)
			if o.Description != nil {
				n += len(*o.Description)
			}
		}
		for _, l := range q.Levels {
			n += 4 + len(l)
		}
	}
	return max(int64(n/4), 1)
}

var _ provider.Provider = (*Simulator)(nil)
