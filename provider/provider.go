// Package provider is the narrow seam between the worker and a System One backend.
//
// A Provider evaluates one resolved request and returns an answer that has already passed the
// contract's response validation, or a *contract.Error whose code says whether the worker may
// retry. Providers never retry: retry policy belongs to the worker.
package provider

import (
	"context"
	"errors"

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

// ModelDigester is implemented by providers that can name the exact weights behind a model
// name, so an exact result cache keys on what answers and never serves one model's answers
// for another's. The digest is opaque and changes whenever the model behind the name
// changes. Errors are *contract.Error (the model is not there, the provider is down), or wrap
// ErrNoModelDigest when the provider exposes no version for the model: then results must not
// be cached.
type ModelDigester interface {
	ModelDigest(ctx context.Context, model string) (string, error)
}

// ErrNoModelDigest marks a model the provider serves without telling its version.
var ErrNoModelDigest = errors.New("the provider reports no version for this model")

// ProbeResult is a health snapshot.
type ProbeResult struct {
	// Endpoint is where the provider was probed (scheme://host/path, no credentials), for
	// operators' logs only: Problems never name hosts, because they reach health endpoints.
	Endpoint     string
	Reachable    bool
	Version      string // upstream version, when reported
	VersionOK    bool   // the version supports System One (Ollama >= 0.35.0)
	ModelPresent bool   // the default model is available
	// Problems lists human-readable findings, empty when healthy. Never carries secrets or
	// hosts.
	Problems []string
}

// Healthy reports whether the backend can serve requests for the default model.
func (p ProbeResult) Healthy() bool { return p.Reachable && p.VersionOK && p.ModelPresent }
