package loadtest

import (
	"fmt"
	"os"
	"strings"

	"github.com/sys1hq/sys1/contract/examples"
)

// TemplateNames lists the built-in templates: the example requests in contract/examples.
func TemplateNames() []string { return examples.RequestNames() }

// Template returns a request body: a built-in template by name (see TemplateNames) or
// the contents of a file. A name that is neither is an error listing the built-ins.
func Template(nameOrPath string) ([]byte, error) {
	if nameOrPath == "" {
		return nil, fmt.Errorf("empty template: use one of %s or a file path", strings.Join(TemplateNames(), ", "))
	}
	if !strings.ContainsAny(nameOrPath, `/\.`) {
		b, err := examples.Request(nameOrPath)
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
