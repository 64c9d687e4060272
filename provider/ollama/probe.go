package ollama

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/provider"
	"github.com/sys1hq/sys1/provider/internal/upstream"
)

// Probe checks reachability and version (GET /api/version, System One needs >= 0.35.0) and
// whether the default model is pulled (GET /api/tags). It never fails: findings go into
// Problems, which carry no secrets and no host (Endpoint names where it probed, for logs). A
// successful tags check also refreshes Capabilities().Models and the digests ModelDigest
// serves.
func (c *Client) Probe(ctx context.Context) provider.ProbeResult {
	var res provider.ProbeResult
	if c == nil || c.endpoint == "" {
		res.Problems = append(res.Problems, "the ollama provider is not configured: set SYS1_OLLAMA_BASE_URL or OLLAMA_API_URL")
		return res
	}
	res.Endpoint = c.base
	ctx, cancel := context.WithTimeout(ctx, min(c.timeout, maxProbeTimeout))
	defer cancel()

	var version struct {
		Version string `json:"version"`
	}
	status, err := c.getJSON(ctx, c.version, &version)
	if err != nil {
		res.Problems = append(res.Problems, fmt.Sprintf("ollama is unreachable: %s", c.probeReason(err)))
		return res
	}
	res.Reachable = true
	switch {
	case status != http.StatusOK:
		res.Problems = append(res.Problems, fmt.Sprintf("GET /api/version on ollama answered HTTP %d", status))
	default:
		res.Version = version.Version
		ok, perr := versionAtLeast(version.Version, MinVersion)
		switch {
		case perr != nil:
			res.Problems = append(res.Problems, fmt.Sprintf("ollama reports version %q, which cannot be read: System One needs %s or later", upstream.Clean(version.Version), MinVersion))
		case !ok:
			res.Problems = append(res.Problems, fmt.Sprintf("ollama is version %s: System One needs %s or later", upstream.Clean(version.Version), MinVersion))
		default:
			res.VersionOK = true
		}
	}

	status, err = c.readTags(ctx)
	switch {
	case err != nil:
		res.Problems = append(res.Problems, fmt.Sprintf("GET /api/tags on ollama failed: %s", c.probeReason(err)))
	case status != http.StatusOK:
		res.Problems = append(res.Problems, fmt.Sprintf("GET /api/tags on ollama answered HTTP %d", status))
	default:
		c.mu.Lock()
		_, res.ModelPresent = c.digests[canonicalModel(c.model)]
		c.mu.Unlock()
		if !res.ModelPresent {
			res.Problems = append(res.Problems, fmt.Sprintf("model %q is not pulled on ollama (run: ollama pull %s)", c.model, c.model))
		}
	}
	return res
}

// readTags reads GET /api/tags into the model list and the digests.
func (c *Client) readTags(ctx context.Context) (int, error) {
	var tags struct {
		Models []struct {
			Name   string `json:"name"`
			Model  string `json:"model"`
			Digest string `json:"digest"`
		} `json:"models"`
	}
	status, err := c.getJSON(ctx, c.tags, &tags)
	if err != nil || status != http.StatusOK {
		return status, err
	}
	names := make([]string, 0, len(tags.Models))
	digests := make(map[string]string, 2*len(tags.Models))
	for _, m := range tags.Models {
		name := m.Name
		if name == "" {
			name = m.Model
		}
		names = append(names, name)
		for _, n := range []string{m.Name, m.Model} {
			if n != "" {
				digests[canonicalModel(n)] = strings.TrimSpace(m.Digest)
			}
		}
	}
	c.mu.Lock()
	c.models, c.digests, c.digestsAt = names, digests, c.now()
	c.mu.Unlock()
	return status, nil
}

// ModelDigest implements provider.ModelDigester: the digest GET /api/tags reports for model
// (the content hash of its manifest, so a re-pulled or re-created model under the same name
// has a new one). Digests are read at most every DigestTTL (probes refresh them too), so a
// model replaced under the same name is seen within that time. A model that is not pulled is
// SYS1_MODEL_UNAVAILABLE; one listed without a digest is provider.ErrNoModelDigest.
func (c *Client) ModelDigest(ctx context.Context, model string) (string, error) {
	if c == nil || c.endpoint == "" {
		return "", contract.Errorf(contract.CodeNotConfigured, "the ollama provider is not configured: set SYS1_OLLAMA_BASE_URL or OLLAMA_API_URL")
	}
	if d, found, fresh := c.cachedDigest(model); fresh {
		return digestOrError(model, d, found)
	}
	// One read at a time: a burst of runs after the TTL makes one request, not one each.
	c.refresh.Lock()
	defer c.refresh.Unlock()
	if d, found, fresh := c.cachedDigest(model); fresh {
		return digestOrError(model, d, found)
	}
	caller := ctx
	ctx, cancel := context.WithTimeout(caller, min(c.timeout, maxProbeTimeout))
	defer cancel()
	status, err := c.readTags(ctx)
	switch {
	case err != nil && caller.Err() != nil:
		return "", fmt.Errorf("ollama: model digest abandoned by the caller: %w", caller.Err())
	case err != nil && ctx.Err() != nil:
		return "", contract.Wrap(contract.CodeTimeout, err, "ollama did not list its models within %s", min(c.timeout, maxProbeTimeout))
	case err != nil:
		return "", contract.Wrap(contract.CodeProviderUnavailable, err, "ollama did not list its models: %s", c.probeReason(err))
	case status != http.StatusOK:
		return "", contract.Errorf(contract.CodeUpstreamError, "ollama did not list its models (GET /api/tags answered HTTP %d)", status)
	}
	d, found, _ := c.cachedDigest(model)
	return digestOrError(model, d, found)
}

// cachedDigest looks model up in the last tags read; fresh says the read is recent enough to
// answer from.
func (c *Client) cachedDigest(model string) (digest string, found, fresh bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.digests == nil || c.now().Sub(c.digestsAt) >= DigestTTL {
		return "", false, false
	}
	digest, found = c.digests[canonicalModel(model)]
	return digest, found, true
}

func digestOrError(model, digest string, found bool) (string, error) {
	switch {
	case !found:
		return "", contract.Errorf(contract.CodeModelUnavailable, "model %q is not available on ollama", model)
	case digest == "":
		return "", fmt.Errorf("ollama lists model %q without a digest: %w", model, provider.ErrNoModelDigest)
	}
	return digest, nil
}

// getJSON GETs url and decodes a 200 answer into v (bounded). Other statuses are returned
// without decoding.
func (c *Client) getJSON(ctx context.Context, url string, v any) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "sys1")
	c.authorize(req)
	resp, body, err := upstream.Exchange(c.http, req, MaxResponseBytes)
	if err != nil {
		if resp != nil {
			return resp.StatusCode, err
		}
		return 0, err
	}
	if resp.StatusCode != http.StatusOK {
		return resp.StatusCode, nil
	}
	if err := json.Unmarshal(body, v); err != nil {
		return resp.StatusCode, errProbeJSON
	}
	return resp.StatusCode, nil
}

// errProbeJSON is a probe answer that is not the JSON Ollama sends.
var errProbeJSON = errors.New("the answer is not the expected JSON")

// probeReason is a short, secret-free reason for a failed probe request.
func (c *Client) probeReason(err error) string {
	switch {
	case errors.Is(err, errProbeJSON):
		return err.Error()
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

// canonicalModel gives a name the tag Ollama resolves it with: an untagged name means
// ":latest", so "nimble" and "nimble:latest" are the same model.
func canonicalModel(name string) string {
	name = strings.TrimSpace(name)
	last := name
	if i := strings.LastIndexByte(name, '/'); i >= 0 {
		last = name[i+1:]
	}
	if !strings.Contains(last, ":") {
		name += ":latest"
	}
	return name
}

// semver is a parsed MAJOR.MINOR.PATCH[-PRERELEASE][+BUILD].
type semver struct {
	core [3]int64
	pre  []string
}

// parseSemver reads a version leniently: a leading "v" is allowed and missing minor or patch
// numbers are zero ("0.35" is 0.35.0); build metadata is ignored.
func parseSemver(v string) (semver, error) {
	var s semver
	v = strings.TrimPrefix(strings.TrimSpace(v), "v")
	if i := strings.IndexByte(v, '+'); i >= 0 {
		v = v[:i]
	}
	core := v
	if i := strings.IndexByte(v, '-'); i >= 0 {
		core = v[:i]
		pre := v[i+1:]
		if pre == "" {
			return s, fmt.Errorf("empty pre-release in %q", v)
		}
		s.pre = strings.Split(pre, ".")
		for _, id := range s.pre {
			if id == "" {
				return s, fmt.Errorf("empty pre-release identifier in %q", v)
			}
		}
	}
	parts := strings.Split(core, ".")
	if len(parts) == 0 || len(parts) > 3 {
		return s, fmt.Errorf("not a version: %q", v)
	}
	for i, p := range parts {
		n, err := strconv.ParseInt(p, 10, 64)
		if err != nil || n < 0 {
			return s, fmt.Errorf("not a version: %q", v)
		}
		s.core[i] = n
	}
	return s, nil
}

// compare orders versions by semver precedence: a pre-release sorts before its release
// ("0.35.0-rc1" < "0.35.0"), numeric identifiers numerically, alphanumeric ones lexically and
// after numeric ones, and a shorter identifier list first when all else is equal.
func (a semver) compare(b semver) int {
	for i := range a.core {
		if a.core[i] != b.core[i] {
			if a.core[i] < b.core[i] {
				return -1
			}
			return 1
		}
	}
	switch {
	case len(a.pre) == 0 && len(b.pre) == 0:
		return 0
	case len(a.pre) == 0:
		return 1
	case len(b.pre) == 0:
		return -1
	}
	for i := 0; i < len(a.pre) && i < len(b.pre); i++ {
		x, y := a.pre[i], b.pre[i]
		xn, xerr := strconv.ParseUint(x, 10, 64)
		yn, yerr := strconv.ParseUint(y, 10, 64)
		switch {
		case xerr == nil && yerr == nil:
			if xn != yn {
				if xn < yn {
					return -1
				}
				return 1
			}
		case xerr == nil:
			return -1
		case yerr == nil:
			return 1
		default:
			if c := strings.Compare(x, y); c != 0 {
				return c
			}
		}
	}
	switch {
	case len(a.pre) < len(b.pre):
		return -1
	case len(a.pre) > len(b.pre):
		return 1
	}
	return 0
}

// versionAtLeast reports whether version >= minimum.
func versionAtLeast(version, minimum string) (bool, error) {
	v, err := parseSemver(version)
	if err != nil {
		return false, err
	}
	m, err := parseSemver(minimum)
	if err != nil {
		return false, err
	}
	return v.compare(m) >= 0, nil
}
