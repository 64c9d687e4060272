// Command sys1 is the one binary of sys1: worker, producer CLI, sink, migrations, schemas and
// the load generator, each a subcommand.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"syscall"

	"github.com/sys1hq/sys1/worker"
)

// version is set at build time with -ldflags "-X main.version=…" (deploy/Dockerfile). main
// reads it through worker.ProductVersion once, so every place shows the same SemVer spelling:
// a development build is 0.0.0-dev in micro info, health, records and sys1 status alike.
var version = "0.0.0-dev"

// Exit statuses shared by every subcommand (SPEC §7).
const (
	exitOK     = 0
	exitFailed = 1 // the run (or the command's work) failed
	exitUsage  = 2 // usage, configuration or connection error
)

// command is one subcommand. run gets a context cancelled on SIGINT/SIGTERM.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) int
}

var commands = map[string]command{}

// register adds a subcommand; each subcommand lives in its own file and registers in init.
func register(c command) { commands[c.name] = c }

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func init() { version = worker.ProductVersion(version) }

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stderr)
		if len(args) == 0 {
			return exitUsage
		}
		return exitOK
	}
	if args[0] == "version" || args[0] == "--version" {
		fmt.Fprintln(stdout, "sys1", version)
		return exitOK
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "sys1: unknown command %q\n\n", args[0])
		usage(stderr)
		return exitUsage
	}
	return c.run(ctx, args[1:], stdout, stderr)
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: sys1 <command> [flags]\n\ncommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-8s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(w, "\nConfiguration is by environment (SYS1_*); see README.md.")
}
