package limits

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/sys1hq/sys1/contract"
)

const goodPrices = `# USD
providers:
  ollama:
    nimble:
      input_per_million: 0.10
      output_per_million: 0.40
    local-free: {input_per_million: 0, output_per_million: 0}
  hosted:
    sys1-large:
      input_per_million: 3
      output_per_million: 15
      per_request: 0.001
    quoted:
      input_per_million: "2.5"
      output_per_million: 10
`

func TestPricesCost(t *testing.T) {
	p, err := ParsePrices([]byte(goodPrices))
	if err != nil {
		t.Fatal(err)
	}
	if p.Len() != 4 {
		t.Fatalf("priced %d models, want 4", p.Len())
	}
	u := contract.Usage{InputTokens: 2_000_000, OutputTokens: 500_000}
	for _, c := range []struct {
		provider, model string
		want            float64
	}{
		{"ollama", "nimble", 0.2 + 0.2},
		{"ollama", "nimble:latest", 0.4}, // Ollama's default tag is the same model
		{"ollama", "local-free", 0},      // priced at 0: a real 0
		{"hosted", "sys1-large", 6 + 7.5 + 0.001},
		{"hosted", "quoted", 5 + 5},
	} {
		got := p.Cost(c.provider, c.model, u)
		if got == nil || math.Abs(*got-c.want) > 1e-12 {
			t.Errorf("Cost(%s, %s) = %v, want %g", c.provider, c.model, got, c.want)
		}
	}
	// Unpriced: nil, never a made-up 0.
	for _, c := range [][2]string{{"ollama", "other"}, {"hosted", "nimble"}, {"simulator", "nimble"}, {"ollama", "nimble:7b"}} {
		if got := p.Cost(c[0], c[1], u); got != nil {
			t.Errorf("Cost(%s, %s) = %g, want nil (unpriced)", c[0], c[1], *got)
		}
	}
	var none *Prices
	if none.Cost("ollama", "nimble", u) != nil || none.Len() != 0 {
		t.Error("no prices file must price nothing")
	}
	// A call with no tokens still pays per request.
	if got := p.Cost("hosted", "sys1-large", contract.Usage{}); got == nil || *got != 0.001 {
		t.Errorf("per-request price: %v", got)
	}
	if got := strings.Join(p.Providers(), ","); got != "hosted,ollama" {
		t.Errorf("Providers() = %s", got)
	}
	if none.Providers() != nil {
		t.Error("no prices file names no providers")
	}
	pr, ok := p.Lookup("hosted", "sys1-large")
	if !ok || pr.Line != 9 {
		t.Errorf("Lookup: %+v %v, want line 9", pr, ok)
	}
}

func TestPricesEmptyFilePricesNothing(t *testing.T) {
	for _, doc := range []string{"", "# nothing yet\n", "providers:\n", "providers: {}\n", "providers:\n  ollama:\n"} {
		p, err := ParsePrices([]byte(doc))
		if err != nil || p.Len() != 0 {
			t.Errorf("%q: %v, %d priced", doc, err, p.Len())
		}
	}
}

func TestPricesErrorNamesEveryBadLine(t *testing.T) {
	doc := `providers:
  ollama:
    nimble:
      input_per_million: abc
      output_per_million: -1
    big:
      input_per_million: 0.1
      output_per_million: 0.2
      per_requests: 1
    nimble:
      input_per_million: 1
      output_per_million: 1
    tagged:
      output_per_million: 1
    tagged:latest:
      input_per_million: 1
      output_per_million: 1
  hosted: 5
currency: EUR
`
	_, err := ParsePrices([]byte(doc))
	var fe *FileError
	if !errors.As(err, &fe) {
		t.Fatalf("want a *FileError, got %v", err)
	}
	msg := err.Error()
	for _, want := range []string{
		`line 4: providers.ollama.nimble.input_per_million: must be a number of USD, got "abc"`,
		`line 5: providers.ollama.nimble.output_per_million: must not be negative, got -1`,
		`line 9: providers.ollama.big.per_requests: unknown field (allowed: input_per_million, output_per_million, per_request)`,
		`line 10: providers.ollama.nimble: duplicate key (first at line 3)`,
		`line 14: providers.ollama.tagged.input_per_million: required`,
		`line 15: providers.ollama.tagged:latest: model priced twice (first at line 13`,
		`line 18: providers.hosted: must map model names to prices, got a number`,
		`line 19: currency: unknown field (allowed: providers)`,
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("error lacks %q:\n%s", want, msg)
		}
	}
	if len(fe.Problems) != 8 {
		t.Errorf("%d problems, want 8:\n%s", len(fe.Problems), msg)
	}
	if !strings.HasPrefix(msg, "prices file: 8 problems: ") {
		t.Errorf("message start: %s", msg)
	}
}

func TestPricesRefuseBadDocuments(t *testing.T) {
	for doc, want := range map[string]string{
		"providers: [1, 2]":                 "providers: must map provider names to their models, got a list",
		"- a\n- b\n":                        "the file must be a mapping with a providers key, got a list",
		"providers:\n  ollama:\n    m: 5\n": "line 3: providers.ollama.m: must be a mapping",
		"providers: {\n":                    "line ",
		"providers:\n  x:\n    m:\n      input_per_million: .nan\n      output_per_million: 1\n": "must be a number of USD",
		"providers:\n  x:\n    m:\n      input_per_million: 1e7\n      output_per_million: 1\n":  "not a plausible price",
		"a: 1\n---\nb: 2\n": "a second YAML document",
		"providers:\n  x:\n    m: &p {input_per_million: 1, output_per_million: 1}\n    n: *p\n":    "",
		"providers:\n  x:\n    m:\n      <<: {input_per_million: 1}\n      output_per_million: 1\n": "merge keys (<<) are not supported",
		"\xff": "invalid UTF-8",
	} {
		_, err := ParsePrices([]byte(doc))
		if want == "" {
			if err != nil {
				t.Errorf("%q: %v", doc, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: got %v, want %q", doc, err, want)
		}
	}
	if _, err := ParsePrices(make([]byte, MaxFileBytes+1)); err == nil || !strings.Contains(err.Error(), "limit is") {
		t.Errorf("oversized file: %v", err)
	}
}

func TestPricesErrorListIsBounded(t *testing.T) {
	var sb strings.Builder
	sb.WriteString("providers:\n  p:\n")
	for i := range 200 {
		sb.WriteString("    m")
		sb.WriteString(strings.Repeat("x", i))
		sb.WriteString(": {input_per_million: x, output_per_million: 1}\n")
	}
	_, err := ParsePrices([]byte(sb.String()))
	var fe *FileError
	if !errors.As(err, &fe) || len(fe.Problems) != maxListed || fe.Dropped != 200-maxListed {
		t.Fatalf("bounded list: %v", err)
	}
	if !strings.HasSuffix(err.Error(), "; and 150 more") || !strings.HasPrefix(err.Error(), "prices file: 200 problems") {
		t.Errorf("message: …%s", err.Error()[len(err.Error())-40:])
	}
}
