package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/rogpeppe/go-internal/testscript"

	"github.com/sys1hq/sys1/provider/ollamatest"
	"github.com/sys1hq/sys1/sink/chtest"
	"github.com/sys1hq/sys1/worker/loopback"
)

// The README's flows as script tests (testdata/script/*.txtar), the way the Go toolchain tests
// its commands: each script runs the commands a reader would type, in a fresh directory, and
// checks what they print. `sys1` in a script is this test binary re-executed as the command
// (testscript.Main), so nothing is built twice; the `nats` CLI is the real one
// (go install github.com/nats-io/natscli/nats@v0.5.0; .ci/run installs it).
//
// Every script runs twice: in the default auth mode (none) and in mode subject
// (SYS1_AUTH_MODE, set for the whole script). Each run gets its own directory, its own
// embedded NATS port (SYS1_NATS_LISTEN, which client commands follow when SYS1_NATS_URL is
// unset; NATS_URL for the nats CLI), free ports for HTTP ($HTTP_PORT, $REVIEW_PORT), HOME
// set to that directory, contract/examples copied in, and OLLAMA_API_URL pointing at one fake
// Ollama (provider/ollamatest) shared by the test binary. readme_test.go keeps the README's
// command blocks and these scripts from drifting apart.
//
//	go test -run TestScripts ./cmd/sys1/                      # all, both modes
//	go test -run 'TestScripts/none/batch' ./cmd/sys1/ -v      # one
//	SYS1_SCRIPT_WORK=1 go test -run … ./cmd/sys1/             # keep each script's directory

func TestMain(m *testing.M) {
	if filepath.Base(os.Args[0]) != "sys1" { // not this binary re-executed as a script's sys1
		// The scripts spend most of their time waiting on workers, so more of them run at
		// once than the machine has cores (no other test of this package is parallel); an
		// explicit -parallel wins.
		flag.Parse()
		explicit := false
		flag.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "test.parallel" })
		if !explicit {
			_ = flag.Set("test.parallel", strconv.Itoa(scriptParallel))
		}
	}
	testscript.Main(m, map[string]func(){"sys1": main})
}

// scriptParallel is how many scripts run at once unless -parallel says otherwise.
const scriptParallel = 6

// scriptModes are the auth modes every script runs in.
var scriptModes = []string{"none", "subject"}

// fakeOllama answers every script's worker that runs with the default provider.
var fakeOllama *ollamatest.Server

func TestScripts(t *testing.T) {
	if testing.Short() {
		t.Skip("script tests start workers: skipped with -short")
	}
	fakeOllama = ollamatest.NewServer()
	t.Cleanup(fakeOllama.Close)
	natsCLI := findNATSCLI()
	if natsCLI == "" && os.Getenv("SYS1_TEST_REQUIRE_NATS_CLI") == "1" {
		t.Fatal("SYS1_TEST_REQUIRE_NATS_CLI=1 but the nats CLI is not installed (go install github.com/nats-io/natscli/nats@v0.5.0)")
	}
	if natsCLI == "" {
		t.Log("the nats CLI is not installed: the scripts that use it skip (go install github.com/nats-io/natscli/nats@v0.5.0)")
	}
	examples, err := filepath.Abs(filepath.Join("..", "..", "contract", "examples"))
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range scriptModes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			testscript.Run(t, testscript.Params{
				Dir:                 filepath.Join("testdata", "script"),
				RequireExplicitExec: true,
				RequireUniqueNames:  true,
				TestWork:            os.Getenv("SYS1_SCRIPT_WORK") != "",
				Setup:               func(env *testscript.Env) error { return setupScript(env, mode, natsCLI, examples) },
				Condition:           scriptCondition,
				Cmds: map[string]func(ts *testscript.TestScript, neg bool, args []string){
					"waitfor": cmdWaitFor,
					"review":  cmdReview,
				},
			})
		})
	}
}

// setupScript gives one script its environment (see the file comment).
func setupScript(env *testscript.Env, mode, natsCLI, examples string) error {
	ports := map[string]int{}
	free, err := loopback.Ports(3)
	if err != nil {
		return err
	}
	for i, name := range []string{"NATS_PORT", "HTTP_PORT", "REVIEW_PORT"} {
		ports[name] = free[i]
		env.Setenv(name, strconv.Itoa(free[i]))
	}
	nats := fmt.Sprintf("127.0.0.1:%d", ports["NATS_PORT"])
	env.Setenv("SYS1_NATS_LISTEN", nats)
	env.Setenv("NATS_URL", "nats://"+nats)
	env.Setenv("SYS1_AUTH_MODE", mode)
	env.Setenv("HOME", env.WorkDir)
	env.Setenv("OLLAMA_API_URL", fakeOllama.URL())
	// A race-instrumented command would sleep a second at every exit.
	env.Setenv("GORACE", strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	for _, name := range []string{chtest.DSNVar, chtest.RequireVar} {
		if v := os.Getenv(name); v != "" {
			env.Setenv(name, v)
		}
	}
	if dsn := os.Getenv(chtest.DSNVar); dsn != "" {
		// A database of its own, dropped afterwards: scripts share the test ClickHouse.
		var b [6]byte
		_, _ = rand.Read(b[:])
		name := "sys1_script_" + hex.EncodeToString(b[:])
		env.Setenv("SYS1_CLICKHOUSE_DATABASE", name)
		env.Defer(func() { dropDatabase(dsn, name) })
	}
	if natsCLI != "" {
		env.Setenv("PATH", filepath.Dir(natsCLI)+string(os.PathListSeparator)+env.Getenv("PATH"))
	}
	env.Values[reviewSlot{}] = &reviewSlot{}
	return copyDir(examples, filepath.Join(env.WorkDir, "contract", "examples"))
}

// dropDatabase drops a script's ClickHouse database (best effort: the server may be gone).
func dropDatabase(dsn, name string) {
	opts, err := clickhouse.ParseDSN(dsn)
	if err != nil {
		return
	}
	conn, err := clickhouse.Open(opts)
	if err != nil {
		return
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = conn.Exec(ctx, "DROP DATABASE IF EXISTS `"+name+"`")
}

// scriptCondition: [clickhouse] is true when the tests have a ClickHouse
// (SYS1_TEST_CLICKHOUSE_DSN); with SYS1_TEST_REQUIRE_CLICKHOUSE=1 its absence fails instead.
func scriptCondition(cond string) (bool, error) {
	switch cond {
	case "clickhouse":
		if os.Getenv(chtest.DSNVar) != "" {
			return true, nil
		}
		if os.Getenv(chtest.RequireVar) == "1" {
			return false, fmt.Errorf("%s=1 but %s is unset", chtest.RequireVar, chtest.DSNVar)
		}
		return false, nil
	}
	return false, fmt.Errorf("unknown condition %q", cond)
}

// findNATSCLI is the nats CLI on PATH, or where go install puts it.
func findNATSCLI() string {
	if p, err := exec.LookPath("nats"); err == nil {
		return p
	}
	gopath := os.Getenv("GOPATH")
	if gopath == "" {
		home, _ := os.UserHomeDir()
		gopath = filepath.Join(home, "go")
	}
	p := filepath.Join(strings.Split(gopath, string(os.PathListSeparator))[0], "bin", "nats")
	if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
		return p
	}
	return ""
}

func copyDir(from, to string) error {
	if err := os.MkdirAll(to, 0o755); err != nil {
		return err
	}
	entries, err := os.ReadDir(from)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(from, e.Name()))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(to, e.Name()), b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// cmdWaitFor: waitfor [-timeout 30s] REGEXP COMMAND [ARGS...] runs the command (as exec
// does) every 100ms until its standard output matches REGEXP, or fails after the timeout
// showing its last output. It waits on what a person would look at (sys1 status, sys1 batch
// status, a log file) instead of sleeping. Its stdout and stderr are the last run's.
func cmdWaitFor(ts *testscript.TestScript, neg bool, args []string) {
	if neg {
		ts.Fatalf("unsupported: ! waitfor")
	}
	fs := flag.NewFlagSet("waitfor", flag.ContinueOnError)
	timeout := fs.Duration("timeout", 30*time.Second, "")
	if err := fs.Parse(args); err != nil || fs.NArg() < 2 {
		ts.Fatalf("usage: waitfor [-timeout D] REGEXP COMMAND [ARGS...]")
	}
	re, err := regexp.Compile(fs.Arg(0))
	ts.Check(err)
	deadline := time.Now().Add(*timeout)
	for {
		err := ts.Exec(fs.Arg(1), fs.Args()[2:]...)
		if re.MatchString(ts.ReadFile("stdout")) {
			return
		}
		if time.Now().After(deadline) {
			ts.Fatalf("waited %s for %s to print %q (last error: %v)", *timeout, fs.Arg(1), fs.Arg(0), err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// reviewSession is one reviewer's browser, as far as the review page can tell: cookies and
// the session's CSRF token.
type reviewSession struct {
	base string
	http *http.Client
	csrf string
}

var csrfInPage = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// cmdReview drives the review page as a reviewer's browser does, for the review flow's
// script (the page itself is tested in Chromium in cmd/sys1/review):
//
//	review login URL USER PASSWORD   sign in (stdout: the queue)
//	review get PATH                  a page (stdout: its HTML)
//	review wait REGEXP PATH          the page, once it matches REGEXP (within 30s)
//	review label ITEM VALUE          label an item as the form's button does (stdout: the next page)
//
// ITEM "first" is the queue's first item.
func cmdReview(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) == 0 {
		ts.Fatalf("usage: review login URL USER PASSWORD | review get PATH | review label ITEM VALUE")
	}
	slot, _ := ts.Value(reviewSlot{}).(*reviewSlot)
	if slot == nil {
		ts.Fatalf("no review session slot (setupScript makes it)")
	}
	sess := slot.sess
	show := func(body string) { _, _ = io.WriteString(ts.Stdout(), body) }
	switch {
	case args[0] == "login" && len(args) == 4:
		jar, _ := cookiejar.New(nil)
		sess = &reviewSession{base: strings.TrimSuffix(args[1], "/"), http: &http.Client{Jar: jar, Timeout: 30 * time.Second}}
		slot.sess = sess
		page, err := sess.do(http.MethodGet, "/login", nil)
		ts.Check(err)
		m := csrfInPage.FindStringSubmatch(page)
		if m == nil {
			ts.Fatalf("the login page has no form:\n%s", page)
		}
		queue, err := sess.do(http.MethodPost, "/login", url.Values{"csrf": {m[1]}, "user": {args[2]}, "password": {args[3]}})
		ts.Check(err)
		if m := csrfInPage.FindStringSubmatch(queue); m != nil {
			sess.csrf = m[1]
		}
		show(queue)
	case args[0] == "get" && len(args) == 2 && sess != nil:
		page, err := sess.do(http.MethodGet, args[1], nil)
		ts.Check(err)
		show(page)
	case args[0] == "wait" && len(args) == 3 && sess != nil:
		re, err := regexp.Compile(args[1])
		ts.Check(err)
		deadline := time.Now().Add(30 * time.Second)
		for {
			page, err := sess.do(http.MethodGet, args[2], nil)
			if err == nil && re.MatchString(page) {
				show(page)
				return
			}
			if time.Now().After(deadline) {
				ts.Fatalf("waited 30s for %s to show %q (%v); last page:\n%s", args[2], args[1], err, page)
			}
			time.Sleep(100 * time.Millisecond)
		}
	case args[0] == "label" && len(args) == 3 && sess != nil:
		item := args[1]
		if item == "first" {
			queue, err := sess.do(http.MethodGet, "/", nil)
			ts.Check(err)
			m := regexp.MustCompile(`href="/items/(rv-[0-9a-f]{32})`).FindStringSubmatch(queue)
			if m == nil {
				ts.Fatalf("the queue has no item:\n%s", queue)
			}
			item = m[1]
		}
		page, err := sess.do(http.MethodPost, "/items/"+item+"/label", url.Values{"csrf": {sess.csrf}, "value": {args[2]}})
		ts.Check(err)
		show(page)
	default:
		ts.Fatalf("usage: review login URL USER PASSWORD | review get PATH | review wait REGEXP PATH | review label ITEM VALUE (login first)")
	}
}

// reviewSlot holds a script's review session between its review commands (a testscript
// value, also its key).
type reviewSlot struct{ sess *reviewSession }

func (s *reviewSession) do(method, path string, form url.Values) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequestWithContext(ctx, method, s.base+path, body)
	if err != nil {
		return "", err
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	res, err := s.http.Do(req)
	if err != nil {
		return "", err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if res.StatusCode >= 400 {
		return string(b), fmt.Errorf("%s %s: %s", method, path, res.Status)
	}
	return string(b), err
}
