package provider_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/provider"
)

func TestOutcome(t *testing.T) {
	malformed := contract.Wrap(contract.CodeUpstreamError, fmt.Errorf("%w: bad sum", provider.ErrMalformed), "bad answer")
	cases := []struct {
		err  error
		want string
	}{
		{nil, "ok"},
		{contract.Errorf(contract.CodeTimeout, "t"), "timeout"},
		{contract.Errorf(contract.CodeProviderBusy, "b"), "busy"},
		{contract.Errorf(contract.CodeProviderUnavailable, "u"), "unavailable"},
		{contract.Errorf(contract.CodeModelUnavailable, "m"), "unavailable"},
		{contract.Errorf(contract.CodeNotConfigured, "n"), "unavailable"},
		{contract.Errorf(contract.CodeUpstreamError, "5xx"), "error"},
		{malformed, "malformed"},
		{fmt.Errorf("worker: %w", malformed), "malformed"},
		{contract.Errorf(contract.CodeInvalidRequest, "400"), "error"},
		{contract.Errorf(contract.CodeRequestTooLarge, "413"), "error"},
		{fmt.Errorf("abandoned: %w", context.Canceled), "error"},
		{errors.New("bug"), "error"},
	}
	for _, tc := range cases {
		if got := provider.Outcome(tc.err); got != tc.want {
			t.Errorf("Outcome(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}
