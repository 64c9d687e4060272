package main

import (
	"fmt"
	"strings"

	"github.com/sys1hq/sys1/contract"
)

// modelConfig is the server's request policy as operators set it (SPEC §7): the command
// layer's, so the contract package stays free of environment variables.
type modelConfig struct {
	// Model is the default model for requests that name none; it is always allowed.
	Model string `env:"SYS1_MODEL" envDefault:"nimble"`
	// AllowedModels are further models callers may name (comma list).
	AllowedModels []string `env:"SYS1_ALLOWED_MODELS" envSeparator:","`
	// KeepAlive is sent upstream as keep_alive: unset means the server default, all digits a
	// number of seconds, anything else a Go duration such as "5m" (negative: keep forever).
	KeepAlive string `env:"SYS1_KEEP_ALIVE"`
}

// Validate returns one error per bad variable, each naming it.
func (c *modelConfig) Validate() []error {
	var errs []error
	if strings.TrimSpace(c.Model) == "" {
		errs = append(errs, fmt.Errorf("SYS1_MODEL: must not be blank"))
	}
	for i, m := range c.AllowedModels {
		// A trailing comma is harmless; a blank entry in the middle is likely a typo.
		if strings.TrimSpace(m) == "" && i < len(c.AllowedModels)-1 {
			errs = append(errs, fmt.Errorf("SYS1_ALLOWED_MODELS: entry %d is blank", i+1))
		}
	}
	if err := contract.CheckKeepAlive(c.KeepAlive); err != nil {
		errs = append(errs, fmt.Errorf("SYS1_KEEP_ALIVE: %w", err))
	}
	return errs
}

// Policy returns the resolution policy the configuration describes.
func (c modelConfig) Policy() contract.Policy {
	p := contract.Policy{DefaultModel: strings.TrimSpace(c.Model), KeepAlive: strings.TrimSpace(c.KeepAlive)}
	for _, m := range c.AllowedModels {
		if m = strings.TrimSpace(m); m != "" {
			p.AllowedModels = append(p.AllowedModels, m)
		}
	}
	return p
}
