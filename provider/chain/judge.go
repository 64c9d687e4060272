package chain

import "github.com/sys1hq/sys1/contract"

// fault is whose problem a call's result shows: the breakers it counts against.
type fault int

const (
	// saysNothing: cancelled, expired, or a bug (SYS1_INTERNAL): nobody's health.
	saysNothing fault = iota
	// answered: a success, or a refusal of the request itself (400, 413): all is well.
	answered
	// providerFault: the provider did not answer or would not (connection refused or reset,
	// DNS, TLS, timeouts, 429/503 busy): every model on it is affected.
	providerFault
	// modelFault: the provider answered, but this model failed (a 5xx for it, a malformed
	// answer, a refused key or model): its route's problem.
	modelFault
	// modelMissing: the provider does not have the model (404): try elsewhere, remember it.
	modelMissing
)

// judge sorts a call's error by the codes the adapters give (provider/ollama,
// provider/systemone: transport failures SYS1_PROVIDER_UNAVAILABLE, their own deadline
// and 408 SYS1_TIMEOUT, 429/503/529 SYS1_PROVIDER_BUSY, 404 SYS1_MODEL_UNAVAILABLE, other 5xx
// and malformed or oversized answers SYS1_UPSTREAM_ERROR).
//
// SYS1_NOT_CONFIGURED from a call is a model's fault too: systemone says it for a model the
// key may not use (403) as well as for a refused key (401) or a redirect; a provider-wide
// fault of that kind fails every model, and the spread of failing models opens the provider.
func judge(err error) fault {
	if err == nil {
		return answered
	}
	e, ok := contract.AsError(err)
	if !ok {
		return saysNothing // the caller's cancellation or deadline: never a provider verdict
	}
	switch e.Code {
	case contract.CodeProviderUnavailable, contract.CodeTimeout, contract.CodeProviderBusy:
		return providerFault
	case contract.CodeUpstreamError, contract.CodeNotConfigured:
		return modelFault
	case contract.CodeModelUnavailable:
		return modelMissing
	case contract.CodeInternal, contract.CodeExpired:
		return saysNothing
	}
	return answered
}
