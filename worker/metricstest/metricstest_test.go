package metricstest

import (
	"strings"
	"testing"
)

func TestParseAcceptsValidExposition(t *testing.T) {
	text := "# HELP a_total Things done.\n# TYPE a_total counter\na_total{worker=\"w\\\\1 \\\"x\\\" \\n\"} 3\na_total{worker=\"w2\"} 4 1700000000000\n" +
		"# A comment.\n# HELP g A gauge, with a \\\\ and a \\n.\n# TYPE g gauge\ng 1.5e3\n" +
		"# HELP h A histogram.\n# TYPE h histogram\nh_bucket{le=\"+Inf\"} 1\nh_sum 2\nh_count 1\n"
	fams, err := Parse(text)
	if err != nil {
		t.Fatal(err)
	}
	if len(fams) != 3 || fams[0].Samples[0].Labels["worker"] != "w\\1 \"x\" \n" || fams[1].Help != "A gauge, with a \\ and a \n." || len(fams[2].Samples) != 3 {
		t.Fatalf("%+v", fams)
	}
}

func TestParseRejects(t *testing.T) {
	head := "# HELP a_total A.\n# TYPE a_total counter\n"
	for _, tc := range []struct{ text, want string }{
		{head + "a_total 1", "newline"},
		{head + "a_total{w=\"\\t\"} 1\n", `invalid escape \t`},
		{head + "a_total{w=\"\\x41\"} 1\n", `invalid escape \x`},
		{"# HELP a A.\n# TYPE a counter\na 1\n", "not named *_total"},
		{head + "# TYPE a_total counter\na_total 1\n", "second TYPE"},
		{head + "# HELP a_total B.\na_total 1\n", "second HELP"},
		{head + "a_total 1\na_total 2\n", "duplicate series"},
		{head + "a_total{x=\"1\",y=\"2\"} 1\na_total{y=\"2\",x=\"1\"} 2\n", "duplicate series"},
		{head + "a_total one\n", "not a float"},
		{head + "a-b_total 1\n", "not valid"},
		{head + "a_total{1x=\"\"} 1\n", "label name"},
		{head + "a_total{__x=\"\"} 1\n", "label name"},
		{"a_total 1\n", "without) its TYPE"},
		{"# TYPE a_total counter\na_total 1\n", "no HELP"},
		{head + "# HELP b B.\n# TYPE b gauge\nb 1\na_total{w=\"2\"} 1\n", "not contiguous"},
		{"# HELP a A.\n# TYPE a thing\na 1\n", "not counter, gauge"},
		{head + "a_total 1\n# TYPE a_total counter\n", "after its samples"},
		{"# HELP a \"q\\\" A.\n# TYPE a gauge\na 1\n", "HELP"},
		{head, "no samples"},
	} {
		_, err := Parse(tc.text)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%q) = %v, want an error with %q", tc.text, err, tc.want)
		}
	}
}
