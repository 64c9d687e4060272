package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/sys1hq/sys1/contract"
)

func init() {
	register(command{
		name:    "schema",
		summary: "print the JSON Schemas (request, reply, run record, review item, label, label replies)",
		run:     runSchema,
	})
}

func schemaUsage(w io.Writer) {
	fmt.Fprintf(w, "usage: sys1 schema [%s]\n\n", strings.Join(contract.SchemaNames(), "|"))
	fmt.Fprintln(w, "Prints one JSON Schema (draft 2020-12), or with no argument all of them as one JSON")
	fmt.Fprintln(w, "object keyed by name.")
}

// runSchema prints one schema verbatim, or all of them in one object so the output is always
// a single JSON document (pipe it into jq or a validator).
func runSchema(_ context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 1 && (args[0] == "-h" || args[0] == "--help") {
		schemaUsage(stdout)
		return exitOK
	}
	if len(args) > 1 {
		fmt.Fprintln(stderr, "sys1 schema: at most one schema name")
		schemaUsage(stderr)
		return exitUsage
	}
	if len(args) == 1 {
		b, err := contract.Schema(args[0])
		if err != nil {
			fmt.Fprintf(stderr, "sys1 schema: unknown schema %q\n", args[0])
			schemaUsage(stderr)
			return exitUsage
		}
		if _, err := stdout.Write(b); err != nil {
			fmt.Fprintf(stderr, "sys1 schema: write: %v\n", err)
			return exitFailed
		}
		return exitOK
	}
	var buf bytes.Buffer
	buf.WriteString("{")
	for i, name := range contract.SchemaNames() {
		b, err := contract.Schema(name)
		if err != nil {
			fmt.Fprintf(stderr, "sys1 schema: %v\n", err)
			return exitFailed
		}
		if i > 0 {
			buf.WriteString(",")
		}
		buf.WriteString("\n  ")
		key, _ := json.Marshal(name)
		buf.Write(key)
		buf.WriteString(": ")
		if err := json.Indent(&buf, bytes.TrimSpace(b), "  ", "  "); err != nil {
			fmt.Fprintf(stderr, "sys1 schema: %s: %v\n", name, err)
			return exitFailed
		}
	}
	buf.WriteString("\n}\n")
	if _, err := stdout.Write(buf.Bytes()); err != nil {
		fmt.Fprintf(stderr, "sys1 schema: write: %v\n", err)
		return exitFailed
	}
	return exitOK
}
