package provider

import (
	"errors"

	"github.com/sys1hq/sys1/contract"
)

// ErrMalformed marks an answer that broke the response contract (the provider answered, but
// not in a shape the contract accepts). Providers put it in the chain of the
// SYS1_UPSTREAM_ERROR they return, so the attempt is recorded as "malformed" rather than as an
// upstream failure.
var ErrMalformed = errors.New("provider answer breaks the response contract")

// Outcome maps an Evaluate error to the attempt outcome of SPEC §4: ok, timeout, error,
// malformed, busy or unavailable. A caller's own cancellation (context.Canceled or the
// caller's deadline, not wrapped in a *contract.Error) is "error": the provider did not fail,
// the attempt was abandoned.
func Outcome(err error) string {
	if err == nil {
		return contract.OutcomeOK
	}
	if errors.Is(err, ErrMalformed) {
		return contract.OutcomeMalformed
	}
	e, ok := contract.AsError(err)
	if !ok {
		return contract.OutcomeError // a cancellation, or a bug: never a provider verdict
	}
	switch e.Code {
	case contract.CodeTimeout:
		return contract.OutcomeTimeout
	case contract.CodeProviderBusy:
		return contract.OutcomeBusy
	case contract.CodeProviderUnavailable, contract.CodeModelUnavailable, contract.CodeNotConfigured:
		return contract.OutcomeUnavailable
	}
	return contract.OutcomeError
}
