// Package provider is the narrow seam between the worker and a System One backend.
//
// A Provider evaluates one resolved request and returns an answer that has already passed the
// contract's response validation, or a *contract.Error whose code says whether the worker may
// retry. Providers never retry: retry policy belongs to the worker.
package provider

import (
	"context"

	"github.com/sys1hq/sys1/contract"
)

// Provider is a System One backend.
type Provider interface {
	// Name is stable and goes into replies and run records ("ollama", "simulator").
	Name() string
	// Evaluate runs one resolved request. Errors are *contract.Error, except a cancellation of
	// ctx by the caller, which is returned as ctx.Err() (wrapped) so it is never mistaken for
	// a provider timeout.
	Evaluate(ctx context.Context, req *contract.Request) (*contract.Response, error)
	// Capabilities describes what the backend accepts.
	Capabilities() Capabilities
	// Probe checks health for start-up warnings and readiness.
	Probe(ctx context.Context) ProbeResult
}

// Capabilities describes a backend's limits.
type Capabilities struct {
	MaxOptions int      // most options a choice question may have
	MaxLevels  int      // most levels a score question may have
	Images     bool     // whether images are accepted at all
	Models     []string // models known to be available (may be empty when unknown)
}

// ProbeResult is a health snapshot.
type ProbeResult struct {
	Reachable    bool
	Version      string // upstream version, when reported
	VersionOK    bool   // the version supports System One (Ollama >= 0.35.0)
	ModelPresent bool   // the default model is available
	// Problems lists human-readable findings, empty when healthy. Never carries secrets.
	Problems []string
}

// Healthy reports whether the backend can serve requests for the default model.
func (p ProbeResult) Healthy() bool { return p.Reachable && p.VersionOK && p.ModelPresent }
