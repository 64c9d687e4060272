package loadtest

import (
	"embed"
	"fmt"
	"os"
	"sort"
	"strings"
)

// The built-in request templates are copies of contract/examples (go:embed cannot reach a
// parent directory); a test keeps them byte-identical to the originals.
//
//go:embed templates/*.json
var templates embed.FS

// TemplateNames lists the built-in templates.
func TemplateNames() []string {
	entries, _ := templates.ReadDir("templates")
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		names = append(names, strings.TrimSuffix(e.Name(), ".json"))
	}
	sort.Strings(names)
	return names
}

// Template returns a request body: a built-in template by name (one, ticket, sixty-four) or
// the contents of a file. A name that is neither is an error listing the built-ins.
func Template(nameOrPath string) ([]byte, error) {
	if nameOrPath == "" {
		return nil, fmt.Errorf("empty template: use one of %s or a file path", strings.Join(TemplateNames(), ", "))
	}
	if !strings.ContainsAny(nameOrPath, `/\.`) {
		b, err := templates.ReadFile("templates/" + nameOrPath + ".json")
		if err != nil {
			return nil, fmt.Errorf("unknown template %q: use one of %s or a file path", nameOrPath, strings.Join(TemplateNames(), ", "))
		}
		return b, nil
	}
	b, err := os.ReadFile(nameOrPath)
	if err != nil {
		return nil, fmt.Errorf("read template: %w", err)
	}
	if len(strings.TrimSpace(string(b))) == 0 {
		return nil, fmt.Errorf("template %s is empty", nameOrPath)
	}
	return b, nil
}
