package contract

import (
	"embed"
	"fmt"
	"strings"
)

// The JSON Schemas (draft 2020-12) of what the world sees: the request producers publish, the
// reply they get, the run record analysts query, the review items reviewers see (and the
// message a run sends them in), the labels
// producers and reviewers submit, the reply to a label submission and a rejected label.
// `sys1 schema` prints them.
//
//go:embed schema/*.schema.json
var schemaFS embed.FS

var schemaNames = []string{"request", "reply", "record", "review-item", "review-run", "label", "label-reply", "label-rejection", "health", "capabilities"}

// SchemaNames returns the names Schema accepts, in documentation order.
func SchemaNames() []string { return append([]string(nil), schemaNames...) }

// Schema returns the JSON Schema called name (one of SchemaNames).
func Schema(name string) ([]byte, error) {
	for _, n := range schemaNames {
		if n == name {
			return schemaFS.ReadFile("schema/" + name + ".schema.json")
		}
	}
	return nil, fmt.Errorf("contract: no schema %q (known: %s)", name, strings.Join(schemaNames, ", "))
}

// SchemaID returns the $id of the schema called name; the record and reply schemas refer to
// the others by these ids.
func SchemaID(name string) string {
	return "https://github.com/sys1hq/sys1/contract/schema/" + name + ".schema.json"
}
