package systemone

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/provider"
	"github.com/sys1hq/sys1/provider/internal/upstream"
)

// listedModel is one entry of a model list.
type listedModel struct {
	ID      string
	Version string
}

// errNotAList is a 200 answer to GET /v1/models that is not a model list.
var errNotAList = errors.New("the answer is not a model list")

// parseModelList reads the model lists hosted APIs and gateways serve: OpenAI's
// {"object":"list","data":[{"id":…}]} (TypeSafe, LiteLLM, most gateways), {"models":[…]}
// with "id", "name" or "model" entries, or a bare array. An entry's version is its "version",
// else its "digest", else its "revision" (a string); OpenAI's "created" is not a version
// (gateways report one fixed number for every model), so an entry without those has none.
func parseModelList(body []byte) ([]listedModel, error) {
	type entry struct {
		ID       string          `json:"id"`
		Name     string          `json:"name"`
		Model    string          `json:"model"`
		Version  json.RawMessage `json:"version"`
		Digest   json.RawMessage `json:"digest"`
		Revision json.RawMessage `json:"revision"`
	}
	var entries []entry
	trimmed := strings.TrimSpace(string(body))
	switch {
	case strings.HasPrefix(trimmed, "["):
		if err := json.Unmarshal(body, &entries); err != nil {
			return nil, errNotAList
		}
	case strings.HasPrefix(trimmed, "{"):
		var list struct {
			Data   *[]entry `json:"data"`
			Models *[]entry `json:"models"`
		}
		if err := json.Unmarshal(body, &list); err != nil {
			return nil, errNotAList
		}
		switch {
		case list.Data != nil:
			entries = *list.Data
		case list.Models != nil:
			entries = *list.Models
		default:
			return nil, errNotAList
		}
	default:
		return nil, errNotAList
	}
	out := make([]listedModel, 0, len(entries))
	for _, e := range entries {
		id := strings.TrimSpace(firstNonEmpty(e.ID, e.Name, e.Model))
		if id == "" {
			continue
		}
		version := ""
		for _, raw := range []json.RawMessage{e.Version, e.Digest, e.Revision} {
			var s string
			if json.Unmarshal(raw, &s) == nil && strings.TrimSpace(s) != "" {
				version = strings.TrimSpace(s)
				break
			}
		}
		out = append(out, listedModel{ID: id, Version: version})
	}
	return out, nil
}

func firstNonEmpty(ss ...string) string {
	for _, s := range ss {
		if s != "" {
			return s
		}
	}
	return ""
}

// Probe checks the server: GET /v1/models (is the key accepted, is the model listed), or GET
// the configured probe path (any 2xx is healthy) for a server that does not offer the list.
// It never fails: findings go into Problems, which carry no secret and no host (Endpoint names
// where it probed). A model list read refreshes Capabilities().Models and the versions
// ModelDigest serves.
func (c *Client) Probe(ctx context.Context) provider.ProbeResult {
	var res provider.ProbeResult
	if c == nil || c.endpoint == "" {
		res.Problems = append(res.Problems, fmt.Sprintf("the systemone provider is not configured: set %s and %s", VarBaseURL, VarAPIKey))
		return res
	}
	res.Endpoint = c.base
	ctx, cancel := context.WithTimeout(ctx, min(c.timeout, maxProbeTimeout))
	defer cancel()

	path, url := ModelsPath, c.modelsURL
	if c.probeURL != "" {
		path, url = c.probePath, c.probeURL
	}
	status, body, err := c.get(ctx, url)
	if err != nil {
		res.Problems = append(res.Problems, fmt.Sprintf("systemone is unreachable: %s", probeReason(err)))
		return res
	}
	res.Reachable = true
	switch {
	case status == http.StatusUnauthorized || status == http.StatusForbidden:
		res.Problems = append(res.Problems, fmt.Sprintf("systemone refused the API key on GET %s (HTTP %d); check %s", path, status, VarAPIKey))
		return res
	case status == http.StatusNotFound && c.probeURL == "":
		c.noteList(http.StatusNotFound, nil)
		res.Problems = append(res.Problems, fmt.Sprintf("systemone does not offer GET %s (HTTP 404); set %s to a path that answers 2xx (e.g. /health)", ModelsPath, VarProbePath))
		return res
	case status < 200 || status > 299:
		res.Problems = append(res.Problems, fmt.Sprintf("GET %s on systemone answered HTTP %d", path, status))
		return res
	}
	res.VersionOK = true // a hosted server reports no version the contract depends on
	if c.probeURL != "" {
		res.ModelPresent = true // a custom probe cannot tell; a missing model is a 404 per call
		return res
	}
	models, perr := parseModelList(body)
	if perr != nil {
		res.Problems = append(res.Problems, fmt.Sprintf("GET %s on systemone: %v", ModelsPath, perr))
		return res
	}
	c.noteList(status, models)
	if c.model == "" {
		res.ModelPresent = true
		return res
	}
	for _, m := range models {
		if m.ID == c.model {
			res.ModelPresent = true
		}
	}
	if !res.ModelPresent {
		res.Problems = append(res.Problems, fmt.Sprintf("model %q is not in systemone's model list; check %s", c.model, VarModels))
	}
	return res
}

// noteList keeps a model list read (or that the list is not offered).
func (c *Client) noteList(status int, models []listedModel) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.listStatus, c.versionsAt = status, c.now()
	if status != http.StatusOK {
		c.versions = map[string]string{}
		return
	}
	c.models = make([]string, len(models))
	c.versions = make(map[string]string, len(models))
	for i, m := range models {
		c.models[i] = m.ID
		c.versions[m.ID] = m.Version
	}
}

// ModelDigest implements provider.ModelDigester with what hosted APIs expose: the model's
// version in GET /v1/models ("version", else "digest", else "revision" of its entry),
// returned as "<id>@<version>". The list is read at most every DigestTTL. A model not listed
// is SYS1_MODEL_UNAVAILABLE; a model listed without a version, or a server without the list,
// is provider.ErrNoModelDigest: an alias such as jev-latest moves to new weights without
// changing its name, so without a version nothing may be cached for it.
func (c *Client) ModelDigest(ctx context.Context, model string) (string, error) {
	if c == nil || c.endpoint == "" {
		return "", contract.Errorf(contract.CodeNotConfigured, "the systemone provider is not configured: set %s and %s", VarBaseURL, VarAPIKey)
	}
	if d, fresh, err := c.cachedDigest(model); fresh {
		return d, err
	}
	c.refresh.Lock()
	defer c.refresh.Unlock()
	if d, fresh, err := c.cachedDigest(model); fresh {
		return d, err
	}
	caller := ctx
	ctx, cancel := context.WithTimeout(caller, min(c.timeout, maxProbeTimeout))
	defer cancel()
	status, body, err := c.get(ctx, c.modelsURL)
	switch {
	case err != nil && caller.Err() != nil:
		return "", fmt.Errorf("systemone: model digest abandoned by the caller: %w", caller.Err())
	case err != nil && ctx.Err() != nil:
		return "", contract.Wrap(contract.CodeTimeout, err, "systemone did not list its models within %s", min(c.timeout, maxProbeTimeout))
	case err != nil:
		return "", contract.Wrap(contract.CodeProviderUnavailable, err, "systemone did not list its models: %s", probeReason(err))
	case status == http.StatusNotFound:
		c.noteList(status, nil)
	case status == http.StatusUnauthorized || status == http.StatusForbidden:
		return "", contract.Errorf(contract.CodeNotConfigured, "systemone refused the API key on GET %s (HTTP %d); check %s", ModelsPath, status, VarAPIKey)
	case status != http.StatusOK:
		return "", contract.Errorf(contract.CodeUpstreamError, "systemone did not list its models (GET %s answered HTTP %d)", ModelsPath, status)
	default:
		models, perr := parseModelList(body)
		if perr != nil {
			return "", contract.Wrap(contract.CodeUpstreamError, perr, "systemone did not list its models: GET %s: %v", ModelsPath, perr)
		}
		c.noteList(status, models)
	}
	d, _, err := c.cachedDigest(model)
	return d, err
}

func (c *Client) cachedDigest(model string) (digest string, fresh bool, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.versions == nil || c.now().Sub(c.versionsAt) >= DigestTTL {
		return "", false, nil
	}
	if c.listStatus == http.StatusNotFound {
		return "", true, fmt.Errorf("systemone does not offer GET %s, so model %q has no known version: %w", ModelsPath, model, provider.ErrNoModelDigest)
	}
	version, found := c.versions[model]
	switch {
	case !found:
		return "", true, contract.Errorf(contract.CodeModelUnavailable, "model %q is not in systemone's model list", model)
	case version == "":
		return "", true, fmt.Errorf("systemone lists model %q without a version: %w", model, provider.ErrNoModelDigest)
	}
	return model + "@" + version, true, nil
}

// get GETs url with the key; the body is read (bounded) for 2xx answers only.
func (c *Client) get(ctx context.Context, url string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "sys1")
	c.authorize(req)
	resp, body, err := upstream.Exchange(c.http, req, MaxResponseBytes)
	if err != nil {
		if resp != nil {
			return resp.StatusCode, nil, err
		}
		return 0, nil, err
	}
	return resp.StatusCode, body, nil
}

// probeReason is a short reason for a failed probe request, with no host and no secret.
func probeReason(err error) string {
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return "no answer in time"
	case errors.Is(err, upstream.ErrTooLarge):
		return "the answer is too large"
	}
	reason, timeout := upstream.TransportFailure(err)
	if timeout {
		return "no answer in time"
	}
	return reason
}
