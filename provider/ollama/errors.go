package ollama

import (
	"fmt"
	"net/http"
	"time"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/provider/internal/upstream"
)

// checkStatus maps a non-2xx answer to its SPEC §5 code (the table in SPEC §5 and issue 3).
// Messages name the provider and the status, never its host, and never quote the answer's
// body: an upstream's error text can name its own internals (a database's address, a
// hostname) and reaches only the operator's log (logCall), never the producer's reply.
func (c *Client) checkStatus(resp *http.Response, model string) error {
	status := resp.StatusCode
	if status >= 200 && status <= 299 {
		return nil
	}
	switch {
	case status == http.StatusBadRequest, status == http.StatusUnprocessableEntity:
		return contract.Errorf(contract.CodeInvalidRequest, "ollama rejected the request (HTTP %d)", status)
	case status == http.StatusNotFound:
		return contract.Errorf(contract.CodeModelUnavailable, "model %q is not available on ollama (HTTP 404)", model)
	case status == http.StatusRequestEntityTooLarge:
		return contract.Errorf(contract.CodeRequestTooLarge, "ollama refused the request as too large (HTTP 413)")
	case status == http.StatusTooManyRequests, status == http.StatusServiceUnavailable:
		after := upstream.RetryAfter(resp.Header, time.Now())
		hint := ""
		if after > 0 {
			hint = fmt.Sprintf("; retry after %s", after)
		}
		e := contract.Errorf(contract.CodeProviderBusy, "ollama is busy (HTTP %d)%s", status, hint)
		e.RetryAfter = after
		return e
	case status == http.StatusUnauthorized, status == http.StatusForbidden:
		return contract.Errorf(contract.CodeUpstreamError, "ollama refused the credentials (HTTP %d); check SYS1_OLLAMA_API_KEY", status)
	case status >= 300 && status <= 399:
		return contract.Errorf(contract.CodeUpstreamError, "ollama answered with a redirect (HTTP %d), which is not followed; check SYS1_OLLAMA_BASE_URL", status)
	default:
		return contract.Errorf(contract.CodeUpstreamError, "ollama failed (HTTP %d)", status)
	}
}

// upstreamText extracts the human message from any upstream error body shape and makes it
// safe to keep: bounded, one line, and carrying neither the API key nor the base URL or host
// (a proxy's error page often names the backend it could not reach).
func (c *Client) upstreamText(body []byte) string {
	return upstream.Text(body, append([]string{c.apiKey.Reveal()}, c.redact...)...)
}
