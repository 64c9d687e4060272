// Package examples holds the contract's example messages: requests (one, ticket, sixty-four,
// image), replies, a run record, a review item, a label and the replies to label submissions. The contract's tests validate every one against the JSON
// Schemas and the decoders, and `sys1 bench` uses the requests as its templates, so the bench
// always sends exactly what the documentation shows.
package examples

import (
	"embed"
	"fmt"
	"sort"
	"strings"
)

//go:embed *.json
var files embed.FS

// Requests are the example request bodies, by name (the file name without .json).
var requests = []string{"one", "ticket", "sixty-four", "image"}

// RequestNames lists the example requests, sorted.
func RequestNames() []string {
	names := append([]string(nil), requests...)
	sort.Strings(names)
	return names
}

// Request returns the example request body with this name (see RequestNames).
func Request(name string) ([]byte, error) {
	for _, n := range requests {
		if n == name {
			return files.ReadFile(name + ".json")
		}
	}
	return nil, fmt.Errorf("no example request %q: use one of %s", name, strings.Join(RequestNames(), ", "))
}
