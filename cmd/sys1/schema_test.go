package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/sys1hq/sys1/contract"
)

func TestSchemaCommand(t *testing.T) {
	tests := []struct {
		name     string
		args     []string
		code     int
		wantKeys []string // all-schemas output: keys of the object
		wantID   string   // one schema: its $id
		stderr   string
	}{
		{name: "all", args: nil, code: exitOK, wantKeys: contract.SchemaNames()},
		{name: "request", args: []string{"request"}, code: exitOK, wantID: contract.SchemaID("request")},
		{name: "reply", args: []string{"reply"}, code: exitOK, wantID: contract.SchemaID("reply")},
		{name: "record", args: []string{"record"}, code: exitOK, wantID: contract.SchemaID("record")},
		{name: "review item", args: []string{"review-item"}, code: exitOK, wantID: contract.SchemaID("review-item")},
		{name: "review message", args: []string{"review-run"}, code: exitOK, wantID: contract.SchemaID("review-run")},
		{name: "label", args: []string{"label"}, code: exitOK, wantID: contract.SchemaID("label")},
		{name: "label reply", args: []string{"label-reply"}, code: exitOK, wantID: contract.SchemaID("label-reply")},
		{name: "label rejection", args: []string{"label-rejection"}, code: exitOK, wantID: contract.SchemaID("label-rejection")},
		{name: "unknown", args: []string{"answer"}, code: exitUsage, stderr: `unknown schema "answer"`},
		{name: "too many", args: []string{"request", "reply"}, code: exitUsage, stderr: "usage: sys1 schema [request|reply|record|review-item|review-run|label|label-reply|label-rejection|health|capabilities]"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			code := run(context.Background(), append([]string{"schema"}, tc.args...), &out, &errOut)
			if code != tc.code {
				t.Fatalf("exit %d, want %d; stderr %s", code, tc.code, errOut.String())
			}
			if tc.stderr != "" {
				if !strings.Contains(errOut.String(), tc.stderr) || !strings.Contains(errOut.String(), "usage:") {
					t.Fatalf("stderr %q lacks %q and usage", errOut.String(), tc.stderr)
				}
				if out.Len() != 0 {
					t.Fatalf("stdout on error: %s", out.String())
				}
				return
			}
			var doc map[string]json.RawMessage
			if err := json.Unmarshal(out.Bytes(), &doc); err != nil {
				t.Fatalf("output is not one JSON document: %v", err)
			}
			if tc.wantID != "" {
				var id string
				_ = json.Unmarshal(doc["$id"], &id)
				if id != tc.wantID {
					t.Fatalf("$id %q, want %q", id, tc.wantID)
				}
				return
			}
			for _, k := range tc.wantKeys {
				var s map[string]any
				if err := json.Unmarshal(doc[k], &s); err != nil || s["$id"] != contract.SchemaID(k) {
					t.Fatalf("schema %q missing or wrong: %v", k, err)
				}
			}
			if len(doc) != len(tc.wantKeys) {
				t.Fatalf("keys %d, want %d", len(doc), len(tc.wantKeys))
			}
		})
	}
}
