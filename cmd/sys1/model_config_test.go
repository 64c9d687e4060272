package main

import (
	"fmt"
	"strings"
	"testing"

	"github.com/caarlos0/env/v11"

	"github.com/sys1hq/sys1/contract"
)

func TestModelConfig(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		want contract.Policy
		errs []string
	}{
		{"defaults", nil, contract.Policy{DefaultModel: "nimble"}, nil},
		{"full", map[string]string{"SYS1_MODEL": "clef", "SYS1_ALLOWED_MODELS": " a , b,", "SYS1_KEEP_ALIVE": "10m"},
			contract.Policy{DefaultModel: "clef", AllowedModels: []string{"a", "b"}, KeepAlive: "10m"}, nil},
		{"seconds", map[string]string{"SYS1_KEEP_ALIVE": "600"}, contract.Policy{DefaultModel: "nimble", KeepAlive: "600"}, nil},
		{"bad", map[string]string{"SYS1_MODEL": " ", "SYS1_KEEP_ALIVE": "5 minutes", "SYS1_ALLOWED_MODELS": "a,,b"}, contract.Policy{},
			[]string{"SYS1_MODEL: must not be blank", "SYS1_ALLOWED_MODELS: entry 2 is blank", `SYS1_KEEP_ALIVE: "5 minutes" is neither a number of seconds nor a duration`}},
		{"negative without unit", map[string]string{"SYS1_KEEP_ALIVE": "-1"}, contract.Policy{}, []string{"SYS1_KEEP_ALIVE:"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var c modelConfig
			if err := env.ParseWithOptions(&c, env.Options{Environment: tc.env}); err != nil {
				t.Fatal(err)
			}
			errs := c.Validate()
			if len(errs) != len(tc.errs) {
				t.Fatalf("errors %v, want %v", errs, tc.errs)
			}
			for i, w := range tc.errs {
				if !strings.Contains(errs[i].Error(), w) {
					t.Errorf("error %q lacks %q", errs[i], w)
				}
			}
			if len(tc.errs) == 0 && fmt.Sprint(c.Policy()) != fmt.Sprint(tc.want) {
				t.Fatalf("policy %+v, want %+v", c.Policy(), tc.want)
			}
		})
	}
}
