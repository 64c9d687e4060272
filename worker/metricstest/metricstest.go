// Package metricstest checks what sys1's /metrics endpoints serve, for tests: Parse checks the
// Prometheus text exposition format (version 0.0.4) strictly (stricter than a scraper: a
// duplicate series or a scattered family is an error), and Check adds that every family is
// documented in deploy/README.md and passes client_golang's promlint. It is not a parser for
// production use.
package metricstest

import (
	"errors"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

var (
	metricName = regexp.MustCompile(`^[a-zA-Z_:][a-zA-Z0-9_:]*$`)
	labelName  = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]*$`)
)

// Sample is one series and its value.
type Sample struct {
	Name   string
	Labels map[string]string
	Value  float64
}

// Family is one metric family: its HELP, TYPE and samples, in the order served.
type Family struct {
	Name, Help, Type string
	Samples          []Sample
}

// Parse checks text and returns its families in order, or an error listing every problem:
// malformed lines, bad metric or label names, bad escapes in HELP or label values, a second
// HELP or TYPE for a family, a TYPE after the family's samples, an unknown type, a counter not
// named *_total, a family whose samples are not contiguous, a duplicate series, a value that
// is not a float, and a text not ending in a newline.
func Parse(text string) ([]Family, error) {
	var problems []string
	bad := func(n int, format string, args ...any) {
		problems = append(problems, fmt.Sprintf("line %d: %s", n, fmt.Sprintf(format, args...)))
	}
	if text != "" && !strings.HasSuffix(text, "\n") {
		problems = append(problems, "the last line does not end in a newline")
	}
	if !utf8.ValidString(text) {
		problems = append(problems, "the text is not valid UTF-8")
	}
	var fams []*Family
	byName := map[string]*Family{}
	closed := map[string]bool{} // families another family's lines followed
	series := map[string]int{}
	var current string
	family := func(n int, name string) *Family {
		if current != "" && current != name {
			closed[current] = true
		}
		if closed[name] {
			bad(n, "lines of family %s are not contiguous", name)
		}
		current = name
		f := byName[name]
		if f == nil {
			f = &Family{Name: name}
			byName[name] = f
			fams = append(fams, f)
		}
		return f
	}
	for i, line := range strings.Split(strings.TrimSuffix(text, "\n"), "\n") {
		n := i + 1
		switch {
		case strings.TrimSpace(line) == "":
			continue
		case strings.HasPrefix(line, "#"):
			fields := strings.SplitN(strings.TrimLeft(line[1:], " \t"), " ", 3)
			if len(fields) < 2 || (fields[0] != "HELP" && fields[0] != "TYPE") {
				continue // a plain comment
			}
			name := fields[1]
			if !metricName.MatchString(name) {
				bad(n, "metric name %q is not valid", name)
				continue
			}
			rest := ""
			if len(fields) == 3 {
				rest = fields[2]
			}
			f := family(n, name)
			if fields[0] == "HELP" {
				if f.Help != "" {
					bad(n, "second HELP for %s", name)
				}
				h, err := unescape(rest, false)
				if err != nil {
					bad(n, "HELP of %s: %v", name, err)
				}
				f.Help = h
				if h == "" {
					bad(n, "empty HELP for %s", name)
				}
				continue
			}
			if f.Type != "" {
				bad(n, "second TYPE for %s", name)
			}
			if len(f.Samples) > 0 {
				bad(n, "TYPE for %s after its samples", name)
			}
			switch rest {
			case "counter", "gauge", "histogram", "summary", "untyped":
			default:
				bad(n, "TYPE of %s is %q, not counter, gauge, histogram, summary or untyped", name, rest)
			}
			if rest == "counter" && !strings.HasSuffix(name, "_total") {
				bad(n, "counter %s is not named *_total", name)
			}
			f.Type = rest
		default:
			s, err := parseSample(line)
			if err != nil {
				bad(n, "%v: %q", err, line)
				continue
			}
			f := family(n, familyOf(s.Name, byName))
			if f.Type == "" {
				bad(n, "sample of %s before (or without) its TYPE", s.Name)
			}
			key := seriesKey(s)
			if prev, dup := series[key]; dup {
				bad(n, "duplicate series %s (first on line %d)", key, prev)
			}
			series[key] = n
			f.Samples = append(f.Samples, s)
		}
	}
	out := make([]Family, len(fams))
	for i, f := range fams {
		out[i] = *f
		if f.Help == "" {
			problems = append(problems, fmt.Sprintf("family %s has no HELP", f.Name))
		}
		if len(f.Samples) == 0 {
			problems = append(problems, fmt.Sprintf("family %s has no samples", f.Name))
		}
	}
	if len(problems) > 0 {
		return out, errors.New(strings.Join(problems, "\n"))
	}
	return out, nil
}

// familyOf maps a histogram's or summary's _bucket, _sum and _count series to its family.
func familyOf(name string, known map[string]*Family) string {
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok {
			if f := known[base]; f != nil && (f.Type == "histogram" || f.Type == "summary") {
				return base
			}
		}
	}
	return name
}

func seriesKey(s Sample) string {
	names := make([]string, 0, len(s.Labels))
	for k := range s.Labels {
		names = append(names, k)
	}
	slices.Sort(names)
	var b strings.Builder
	b.WriteString(s.Name)
	b.WriteByte('{')
	for i, k := range names {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%s=%q", k, s.Labels[k])
	}
	b.WriteByte('}')
	return b.String()
}

// parseSample reads `name{label="value",...} value [timestamp]`.
func parseSample(line string) (Sample, error) {
	s := Sample{Labels: map[string]string{}}
	end := strings.IndexAny(line, "{ \t")
	if end < 0 {
		return s, errors.New("sample without a value")
	}
	s.Name = line[:end]
	if !metricName.MatchString(s.Name) {
		return s, fmt.Errorf("metric name %q is not valid", s.Name)
	}
	rest := line[end:]
	if strings.HasPrefix(rest, "{") {
		rest = rest[1:]
		for {
			rest = strings.TrimLeft(rest, " \t")
			if strings.HasPrefix(rest, "}") {
				rest = rest[1:]
				break
			}
			eq := strings.IndexByte(rest, '=')
			if eq < 0 {
				return s, errors.New("label without =")
			}
			name := strings.TrimSpace(rest[:eq])
			if !labelName.MatchString(name) || strings.HasPrefix(name, "__") {
				return s, fmt.Errorf("label name %q is not valid", name)
			}
			if _, dup := s.Labels[name]; dup {
				return s, fmt.Errorf("label %s twice", name)
			}
			rest = strings.TrimLeft(rest[eq+1:], " \t")
			if !strings.HasPrefix(rest, `"`) {
				return s, fmt.Errorf("value of label %s is not quoted", name)
			}
			closeAt := -1
			for j := 1; j < len(rest); j++ {
				if rest[j] == '\\' {
					j++
					continue
				}
				if rest[j] == '"' {
					closeAt = j
					break
				}
			}
			if closeAt < 0 {
				return s, fmt.Errorf("value of label %s is not terminated", name)
			}
			v, err := unescape(rest[1:closeAt], true)
			if err != nil {
				return s, fmt.Errorf("value of label %s: %v", name, err)
			}
			s.Labels[name] = v
			rest = strings.TrimLeft(rest[closeAt+1:], " \t")
			if strings.HasPrefix(rest, ",") {
				rest = rest[1:]
				continue
			}
			if !strings.HasPrefix(rest, "}") {
				return s, errors.New("labels are not separated by commas")
			}
		}
	}
	if rest == "" || (rest[0] != ' ' && rest[0] != '\t') {
		return s, errors.New("no blank between the series and its value")
	}
	fields := strings.Fields(rest)
	if len(fields) < 1 || len(fields) > 2 {
		return s, errors.New("want a value and at most a timestamp after the series")
	}
	v, err := parseValue(fields[0])
	if err != nil {
		return s, err
	}
	s.Value = v
	if len(fields) == 2 {
		if _, err := strconv.ParseInt(fields[1], 10, 64); err != nil {
			return s, fmt.Errorf("timestamp %q is not an integer", fields[1])
		}
	}
	return s, nil
}

func parseValue(v string) (float64, error) {
	switch v {
	case "+Inf":
		return math.Inf(1), nil
	case "-Inf":
		return math.Inf(-1), nil
	case "NaN":
		return math.NaN(), nil
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || strings.ContainsAny(v, "_xXpP") || strings.EqualFold(v, "inf") || strings.EqualFold(v, "infinity") {
		return 0, fmt.Errorf("value %q is not a float", v)
	}
	return f, nil
}

// unescape undoes the escapes the format allows: \\ and \n, and \" in label values only.
// Any other backslash sequence is an error (Prometheus rejects it in label values).
func unescape(s string, label bool) (string, error) {
	if !strings.Contains(s, `\`) {
		if label && strings.ContainsRune(s, '\n') {
			return "", errors.New("raw newline")
		}
		return s, nil
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' {
			b.WriteByte(s[i])
			continue
		}
		if i+1 >= len(s) {
			return "", errors.New("trailing backslash")
		}
		i++
		switch s[i] {
		case '\\':
			b.WriteByte('\\')
		case 'n':
			b.WriteByte('\n')
		case '"':
			if !label {
				return "", errors.New(`\" is not an escape in HELP`)
			}
			b.WriteByte('"')
		default:
			return "", fmt.Errorf(`invalid escape \%c`, s[i])
		}
	}
	return b.String(), nil
}
