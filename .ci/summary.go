//go:build ignore

// summary reads `go test -json` on stdin and prints what go test prints without -v — each
// package's result, and the whole output of every test that failed — then the slowest tests
// and packages, so a slow suite says where its time went. It exits 1 when any test or package
// failed (or the stream broke off), so .ci/test can rely on it.
//
//	go test -json ./... | go run .ci/summary.go
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"
)

type event struct {
	Action  string
	Package string
	Test    string
	Elapsed float64
	Output  string
}

type timing struct {
	name    string
	elapsed float64
}

func main() {
	const slowest = 20
	var tests, packages []timing
	failed := map[string]bool{}
	// A test's output is kept until it ends: shown if it failed, dropped if it passed.
	held := map[string][]string{}
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 64<<20)
	out := bufio.NewWriter(os.Stdout)
	for in.Scan() {
		var e event
		if err := json.Unmarshal(in.Bytes(), &e); err != nil {
			// Not test2json: a build error or go's own message. Show it as it is.
			fmt.Fprintln(out, in.Text())
			continue
		}
		key := e.Package + " " + e.Test
		switch e.Action {
		case "output":
			if e.Test == "" {
				fmt.Fprint(out, e.Output) // the package's own lines: ok, FAIL, build errors, panics
			} else {
				held[key] = append(held[key], e.Output)
			}
		case "skip":
			delete(held, key)
		case "pass", "fail":
			if e.Test != "" {
				if e.Action == "fail" {
					fmt.Fprint(out, strings.Join(held[key], ""))
				}
				delete(held, key)
			}
			name := e.Package
			if e.Test != "" {
				name += " " + e.Test
				// Subtests count inside their parent; only top-level tests are listed.
				if !strings.Contains(e.Test, "/") {
					tests = append(tests, timing{name, e.Elapsed})
				}
			} else {
				packages = append(packages, timing{name, e.Elapsed})
			}
			if e.Action == "fail" {
				failed[name] = true
			}
		}
		if e.Test == "" || e.Action == "fail" {
			out.Flush()
		}
	}
	if err := in.Err(); err != nil {
		fmt.Fprintf(out, "summary: reading go test's output: %v\n", err)
		failed["(the output)"] = true
	}
	for _, list := range []*[]timing{&tests, &packages} {
		sort.Slice(*list, func(i, j int) bool { return (*list)[i].elapsed > (*list)[j].elapsed })
	}
	fmt.Fprintf(out, "\n== the %d slowest tests\n", min(slowest, len(tests)))
	for _, t := range tests[:min(slowest, len(tests))] {
		fmt.Fprintf(out, "%8s  %s\n", dur(t.elapsed), t.name)
	}
	fmt.Fprintf(out, "\n== packages by wall time (%d)\n", len(packages))
	for _, p := range packages[:min(slowest, len(packages))] {
		fmt.Fprintf(out, "%8s  %s\n", dur(p.elapsed), p.name)
	}
	if len(failed) > 0 {
		names := make([]string, 0, len(failed))
		for n := range failed {
			names = append(names, n)
		}
		sort.Strings(names)
		fmt.Fprintf(out, "\nFAILED:\n  %s\n", strings.Join(names, "\n  "))
		out.Flush()
		os.Exit(1)
	}
	out.Flush()
}

func dur(s float64) string {
	return (time.Duration(s * float64(time.Second))).Round(100 * time.Millisecond).String()
}
