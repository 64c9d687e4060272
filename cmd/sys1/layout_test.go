package main

import (
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/sys1hq/sys1"

// deps lists a package's dependencies (go list -deps), with whether each is the standard
// library's.
func deps(t *testing.T, pkg string) map[string]bool {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}} {{.Standard}}", pkg).CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
	}
	m := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		path, std, _ := strings.Cut(line, " ")
		m[path] = std == "true"
	}
	return m
}

// TestImportBoundaries keeps producer tools out of the worker: a producer — the Go client,
// sys1 batch, the review page, the load generator — must never depend on the worker root
// (the replica: provider chain, budgets, policy, JWT verification, Prometheus) or on a
// provider. And contract/wire, the names every side shares, is the standard library's alone.
func TestImportBoundaries(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: runs go list over the module (CI runs it)")
	}
	for _, pkg := range []string{"/worker/client", "/cmd/sys1/internal/batch", "/cmd/sys1/review", "/contract/wire", "/contract"} {
		for dep := range deps(t, module+pkg) {
			if dep == module+"/worker" || strings.HasPrefix(dep, module+"/provider") {
				t.Errorf("%s depends on %s: producer tools stay out of the worker and the providers", pkg, dep)
			}
		}
	}
	for dep, std := range deps(t, module+"/contract/wire") {
		if !std && dep != module+"/contract/wire" {
			t.Errorf("contract/wire depends on %s: it must stay the standard library's alone", dep)
		}
	}
}
