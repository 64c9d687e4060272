package migrate

import "strings"

// Statements splits a SQL script into its statements: on ';' outside string literals, quoted
// identifiers and comments. Comment-only and empty statements are dropped; each statement is
// returned trimmed, without its ';'. ClickHouse takes one statement per request, so scripts
// (migrations, deploy/clickhouse/queries.sql) are run statement by statement.
func Statements(script string) []string {
	var (
		out   []string
		cur   strings.Builder
		quote byte // ', " or ` while inside a quoted token
	)
	flush := func() {
		if s := strings.TrimSpace(cur.String()); s != "" && !onlyComments(s) {
			out = append(out, s)
		}
		cur.Reset()
	}
	for i := 0; i < len(script); i++ {
		c := script[i]
		switch {
		case quote != 0:
			cur.WriteByte(c)
			if c == '\\' && i+1 < len(script) {
				i++
				cur.WriteByte(script[i])
			} else if c == quote {
				quote = 0
			}
		case c == '\'' || c == '"' || c == '`':
			quote = c
			cur.WriteByte(c)
		case c == '-' && i+1 < len(script) && script[i+1] == '-':
			end := strings.IndexByte(script[i:], '\n')
			if end < 0 {
				end = len(script) - i
			}
			cur.WriteString(script[i : i+end])
			i += end - 1
		case c == '/' && i+1 < len(script) && script[i+1] == '*':
			end := strings.Index(script[i+2:], "*/")
			if end < 0 {
				end = len(script) - i - 2
			} else {
				end += 2
			}
			cur.WriteString(script[i : i+2+end])
			i += 2 + end - 1
		case c == ';':
			flush()
		default:
			cur.WriteByte(c)
		}
	}
	flush()
	return out
}

// onlyComments reports whether s holds nothing but comments and white space.
func onlyComments(s string) bool {
	for _, line := range strings.Split(s, "\n") {
		line = strings.TrimSpace(line)
		if line != "" && !strings.HasPrefix(line, "--") {
			return false
		}
	}
	return true
}
