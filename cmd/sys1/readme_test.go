package main

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/rogpeppe/go-internal/txtar"
)

// TestREADMEBlocksAreScripts keeps the README's command blocks and the script tests
// (testdata/script, run by TestScripts) from drifting apart. The rules, which a maintainer
// changing either side follows:
//
//   - Every shell block (```sh, ```console) is preceded by a marker naming the scripts that run
//     it, <!-- script: quickstart.txtar [more.txtar …] -->, or saying why none can,
//     <!-- script: none (reason) -->.
//   - Every command of a marked block appears in one of its scripts. A command is a line of an
//     sh block (comments and blank lines dropped, continuation lines joined), or a "$ " line of
//     a console block (the rest is output, not checked). `go run ./cmd/sys1` is the script's
//     `sys1`; a trailing `&` is dropped. Leading assignments (NAME=value …, or `export`) must be
//     the script's `env NAME=value` lines; the command itself must appear, word for word, in a
//     script command: an `exec` line, or `waitfor`'s command, or the text of an `sh -c '…'` (for
//     pipes and redirections). Two things may differ because they are the machine's, not the
//     README's: loopback ports (127.0.0.1:8090 in the README, 127.0.0.1:$REVIEW_PORT in a
//     script) and the ClickHouse address (SYS1_CLICKHOUSE_DSN).
//   - A YAML block marked <!-- file: NAME in SCRIPT [SCRIPT …] --> is byte for byte the file
//     NAME of each of those scripts.
//   - Every script is named by some block: the scripts are the README's flows, nothing else.
func TestREADMEBlocksAreScripts(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	scripts := loadScripts(t)
	named := map[string]bool{}
	blocks := readmeBlocks(string(readme))
	if len(blocks) < 8 {
		t.Fatalf("found %d fenced blocks in README.md; the parser is broken", len(blocks))
	}
	for _, b := range blocks {
		where := "README.md:" + strconv.Itoa(b.line)
		switch {
		case b.lang == "yaml" && strings.HasPrefix(b.marker, "file:"):
			name, in, ok := strings.Cut(strings.TrimSpace(strings.TrimPrefix(b.marker, "file:")), " in ")
			if !ok || len(strings.Fields(in)) == 0 {
				t.Errorf("%s: marker %q: want <!-- file: NAME in SCRIPT … -->", where, b.marker)
				continue
			}
			for _, sn := range strings.Fields(in) {
				named[sn] = true
				sc, ok := scripts[sn]
				if !ok {
					t.Errorf("%s: names script %s, which testdata/script lacks", where, sn)
					continue
				}
				if got, ok := sc.files[name]; !ok || strings.TrimRight(got, "\n") != strings.TrimRight(b.body, "\n") {
					t.Errorf("%s: the YAML block differs from %s in %s (or it has no such file):\nREADME:\n%s\nscript:\n%s", where, name, sn, b.body, got)
				}
			}
		case b.lang == "sh" || b.lang == "console" || b.lang == "bash" || b.lang == "shell":
			marker, ok := strings.CutPrefix(b.marker, "script:")
			if !ok {
				t.Errorf("%s: a %s block without a <!-- script: NAME.txtar --> (or <!-- script: none (reason) -->) marker", where, b.lang)
				continue
			}
			marker = strings.TrimSpace(marker)
			if strings.HasPrefix(marker, "none") {
				if !strings.Contains(marker, "(") {
					t.Errorf("%s: <!-- script: none --> needs a reason in parentheses", where)
				}
				continue
			}
			var in []*script
			for _, sn := range strings.Fields(marker) {
				named[sn] = true
				if sc, ok := scripts[sn]; ok {
					in = append(in, sc)
				} else {
					t.Errorf("%s: names script %s, which testdata/script lacks", where, sn)
				}
			}
			for _, c := range blockCommands(b) {
				env, cmd := splitAssignments(c)
				for _, kv := range env {
					if !slices.ContainsFunc(in, func(s *script) bool { return s.setsEnv(kv) }) {
						t.Errorf("%s: %q: no env %s line in %s", where, c, kv, marker)
					}
				}
				if cmd != "" && !slices.ContainsFunc(in, func(s *script) bool { return s.runs(cmd) }) {
					t.Errorf("%s: %q is not a command of %s (as %q)", where, c, marker, cmd)
				}
			}
		}
	}
	for name := range scripts {
		if !named[name] {
			t.Errorf("testdata/script/%s is not named by any README block: the scripts are the README's flows", name)
		}
	}
}

// block is one fenced block of the README and the marker comment just above it.
type block struct {
	line         int // of the opening fence
	lang, marker string
	body         string
}

var markerLine = regexp.MustCompile(`^<!--\s*(.*?)\s*-->$`)

func readmeBlocks(readme string) []block {
	var out []block
	lines := strings.Split(readme, "\n")
	for i := 0; i < len(lines); i++ {
		fence, ok := strings.CutPrefix(lines[i], "```")
		if !ok {
			continue
		}
		b := block{line: i + 1, lang: strings.TrimSpace(fence)}
		for j := i - 1; j >= 0; j-- {
			if strings.TrimSpace(lines[j]) == "" {
				continue
			}
			if m := markerLine.FindStringSubmatch(strings.TrimSpace(lines[j])); m != nil {
				b.marker = m[1]
			}
			break
		}
		var body []string
		for i++; i < len(lines) && !strings.HasPrefix(lines[i], "```"); i++ {
			body = append(body, lines[i])
		}
		b.body = strings.Join(body, "\n")
		out = append(out, b)
	}
	return out
}

// blockCommands are the commands of a shell block (see the test's comment), normalised.
func blockCommands(b block) []string {
	var out []string
	lines := strings.Split(b.body, "\n")
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		if b.lang == "console" {
			rest, ok := strings.CutPrefix(line, "$ ")
			if !ok {
				continue
			}
			line = rest
		}
		for strings.HasSuffix(strings.TrimRight(line, " "), "\\") && i+1 < len(lines) {
			line = strings.TrimSuffix(strings.TrimRight(line, " "), "\\") + " " + strings.TrimSpace(lines[i+1])
			i++
		}
		line = strings.TrimSpace(stripComment(line))
		line = strings.TrimSpace(strings.TrimSuffix(line, " &"))
		if line == "" {
			continue
		}
		out = append(out, normalise(strings.ReplaceAll(line, "go run ./cmd/sys1", "sys1")))
	}
	return out
}

// stripComment drops a shell comment: a # that starts a word, outside quotes.
func stripComment(line string) string {
	var quote byte
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case quote != 0:
			if c == quote {
				quote = 0
			}
		case c == '\'' || c == '"':
			quote = c
		case c == '#' && (i == 0 || line[i-1] == ' ' || line[i-1] == '\t'):
			return line[:i]
		}
	}
	return line
}

var (
	loopbackPort = regexp.MustCompile(`(127\.0\.0\.1|localhost):(\d+|\$\{?[A-Za-z_][A-Za-z0-9_]*\}?)`)
	assignment   = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*=\S*$`)
	spaces       = regexp.MustCompile(`\s+`)
)

// normalise makes the machine's parts of a command comparable: loopback ports, white space.
func normalise(s string) string {
	return spaces.ReplaceAllString(loopbackPort.ReplaceAllString(strings.TrimSpace(s), "127.0.0.1:PORT"), " ")
}

// splitAssignments splits a command into its leading NAME=value assignments (all of it for an
// export) and the command.
func splitAssignments(c string) (env []string, cmd string) {
	words := strings.Fields(c)
	if len(words) > 0 && words[0] == "export" {
		return words[1:], ""
	}
	for len(words) > 0 && assignment.MatchString(words[0]) {
		env, words = append(env, words[0]), words[1:]
	}
	return env, strings.Join(words, " ")
}

// machineSpecific are the variables whose value a script may set differently from the README.
var machineSpecific = map[string]bool{"SYS1_CLICKHOUSE_DSN": true}

// script is one script test: its env assignments and its commands (normalised).
type script struct {
	env      []string
	commands []string
	files    map[string]string
}

func (s *script) setsEnv(kv string) bool {
	name, _, _ := strings.Cut(kv, "=")
	kv = normalise(kv)
	return slices.ContainsFunc(s.env, func(e string) bool {
		n, _, _ := strings.Cut(e, "=")
		return e == kv || (machineSpecific[name] && n == name)
	})
}

// runs reports whether cmd appears, word for word, in one of the script's commands.
func (s *script) runs(cmd string) bool {
	for _, c := range s.commands {
		for i := strings.Index(c, cmd); i >= 0; {
			end := i + len(cmd)
			if (i == 0 || c[i-1] == ' ') && (end == len(c) || strings.ContainsRune(" ;|&)", rune(c[end]))) {
				return true
			}
			next := strings.Index(c[i+1:], cmd)
			if next < 0 {
				break
			}
			i += 1 + next
		}
	}
	return false
}

func loadScripts(t *testing.T) map[string]*script {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join("testdata", "script", "*.txtar"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no scripts in testdata/script (%v)", err)
	}
	out := map[string]*script{}
	for _, p := range paths {
		a, err := txtar.ParseFile(p)
		if err != nil {
			t.Fatal(err)
		}
		s := &script{files: map[string]string{}}
		for _, f := range a.Files {
			s.files[f.Name] = string(f.Data)
		}
		for _, line := range strings.Split(string(a.Comment), "\n") {
			s.add(line)
		}
		out[filepath.Base(p)] = s
	}
	return out
}

// add reads one script line: env assignments, and the command of exec and waitfor lines.
func (s *script) add(line string) {
	words := scriptWords(line)
	for len(words) > 0 && (words[0].raw == "!" || strings.HasPrefix(words[0].raw, "[")) {
		words = words[1:]
	}
	if len(words) == 0 {
		return
	}
	switch words[0].raw {
	case "env":
		for _, w := range words[1:] {
			s.env = append(s.env, normalise(w.raw))
		}
		return
	case "exec":
		words = words[1:]
	case "waitfor":
		words = words[1:]
		if len(words) > 1 && words[0].raw == "-timeout" {
			words = words[2:]
		}
		if len(words) > 0 {
			words = words[1:] // the pattern
		}
	default:
		return
	}
	if n := len(words); n > 0 && strings.HasPrefix(words[n-1].raw, "&") {
		words = words[:n-1] // a background command
	}
	if len(words) >= 3 && words[0].raw == "sh" && words[1].raw == "-c" {
		s.commands = append(s.commands, normalise(words[2].text))
		return
	}
	raw := make([]string, len(words))
	for i, w := range words {
		raw[i] = w.raw
	}
	s.commands = append(s.commands, normalise(strings.Join(raw, " ")))
}

// word is one word of a script line: as written, and unquoted.
type word struct{ raw, text string }

// scriptWords splits a testscript line into words: white space separates them, single quotes
// keep spaces (” is a quote inside them), and # starts a comment at a word's start.
func scriptWords(line string) []word {
	var out []word
	var raw, text strings.Builder
	in, inWord := false, false
	flush := func() {
		if inWord {
			out = append(out, word{raw: raw.String(), text: text.String()})
		}
		raw.Reset()
		text.Reset()
		inWord = false
	}
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case in && c == '\'' && i+1 < len(line) && line[i+1] == '\'':
			raw.WriteString("''")
			text.WriteByte('\'')
			i++
		case c == '\'':
			in = !in
			inWord = true
			raw.WriteByte(c)
		case !in && (c == ' ' || c == '\t'):
			flush()
		case !in && c == '#' && !inWord:
			flush()
			return out
		default:
			inWord = true
			raw.WriteByte(c)
			text.WriteByte(c)
		}
	}
	flush()
	return out
}
