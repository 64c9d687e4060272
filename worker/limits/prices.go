package limits

import (
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/sys1hq/sys1/contract"
	"github.com/sys1hq/sys1/worker/livefile"
)

// Price is what one model costs, in USD.
type Price struct {
	InputPerMillion  float64 // per million input tokens
	OutputPerMillion float64 // per million output tokens
	PerRequest       float64 // per call, on top of the tokens
	Line             int     // where the model is priced in the file
}

// Cost is the price of one call that used u.
func (p Price) Cost(u contract.Usage) float64 {
	in, out := max(u.InputTokens, 0), max(u.OutputTokens, 0)
	return float64(in)*p.InputPerMillion/1e6 + float64(out)*p.OutputPerMillion/1e6 + p.PerRequest
}

// Prices is a parsed prices file: a price per provider and model. The nil *Prices (no file
// configured) prices nothing.
type Prices struct {
	byModel map[string]Price // priceKey(provider, model)
}

// maxPrice bounds every price field: a million USD per million tokens (or per call) is no
// real price, and a typo of that size would exhaust every budget at the first call.
const maxPrice = 1e6

// priceKey identifies a model of a provider. Ollama names a model without a tag as its
// ":latest" tag, and reports either spelling, so both price the same.
func priceKey(provider, model string) string {
	return provider + "\x00" + strings.TrimSuffix(model, ":latest")
}

// Lookup is the price of provider's model, and whether it is priced at all.
func (p *Prices) Lookup(provider, model string) (Price, bool) {
	if p == nil {
		return Price{}, false
	}
	pr, ok := p.byModel[priceKey(provider, model)]
	return pr, ok
}

// Cost is what one call of provider's model that used usage cost, in USD: nil when the model
// is unpriced, never a made-up 0. Pass the provider, model and usage of the attempt that
// answered, not of the run's failed attempts.
func (p *Prices) Cost(provider, model string, usage contract.Usage) *float64 {
	pr, ok := p.Lookup(provider, model)
	if !ok {
		return nil
	}
	c := pr.Cost(usage)
	return &c
}

// Len is how many models are priced.
func (p *Prices) Len() int {
	if p == nil {
		return 0
	}
	return len(p.byModel)
}

// Providers lists the providers the file prices, sorted, so that start-up can warn about a
// name that matches no configured provider (a typo would leave every model unpriced).
func (p *Prices) Providers() []string {
	if p == nil {
		return nil
	}
	seen := map[string]bool{}
	for k := range p.byModel {
		provider, _, _ := strings.Cut(k, "\x00")
		seen[provider] = true
	}
	out := make([]string, 0, len(seen))
	for name := range seen {
		out = append(out, name)
	}
	sort.Strings(out)
	return out
}

// LoadPrices reads the prices file at path and keeps it current (see livefile): call Watch on
// the result to follow edits; a bad edit keeps the last good prices.
func LoadPrices(path string) (*livefile.File[*Prices], error) {
	return livefile.Load(path, ParsePrices)
}

// ParsePrices parses a prices file:
//
//	providers:
//	  ollama:
//	    nimble:
//	      input_per_million: 0.10   # USD per million input tokens
//	      output_per_million: 0.40  # USD per million output tokens
//	      per_request: 0.0001       # optional: USD per call
//
// Both token prices are required (write 0 for free); prices are non-negative numbers. The
// error, a *FileError, names every bad line: non-numeric or negative prices, unknown fields,
// a model priced twice (also as name and name:latest).
func ParsePrices(data []byte) (*Prices, error) {
	probs := &problems{what: "prices file"}
	out := &Prices{byModel: map[string]Price{}}
	root := parseDocument(data, probs)
	if root == nil {
		if err := probs.err(); err != nil {
			return nil, err
		}
		return out, nil
	}
	if root.Kind != yaml.MappingNode {
		probs.add(root, "", "the file must be a mapping with a providers key, got %s", kindName(root))
		return nil, probs.err()
	}
	eachPair(root, "", probs, func(key string, k, v *yaml.Node) {
		if key != "providers" {
			probs.add(k, key, "unknown field (allowed: providers)")
			return
		}
		parseProviders(v, probs, out)
	})
	if err := probs.err(); err != nil {
		return nil, err
	}
	return out, nil
}

func parseProviders(v *yaml.Node, probs *problems, out *Prices) {
	if v.Kind == yaml.ScalarNode && v.ShortTag() == "!!null" {
		return
	}
	if v.Kind != yaml.MappingNode {
		probs.add(v, "providers", "must map provider names to their models, got %s", kindName(v))
		return
	}
	firstLine := map[string]int{}
	eachPair(v, "providers", probs, func(provider string, pk, models *yaml.Node) {
		path := join("providers", provider)
		if strings.TrimSpace(provider) == "" {
			probs.add(pk, path, "a provider name must not be blank")
			return
		}
		if models.Kind == yaml.ScalarNode && models.ShortTag() == "!!null" {
			return
		}
		if models.Kind != yaml.MappingNode {
			probs.add(models, path, "must map model names to prices, got %s", kindName(models))
			return
		}
		eachPair(models, path, probs, func(model string, mk, pv *yaml.Node) {
			mpath := join(path, model)
			if strings.TrimSpace(model) == "" {
				probs.add(mk, mpath, "a model name must not be blank")
				return
			}
			pr, ok := parsePrice(pv, mpath, probs)
			key := priceKey(provider, model)
			if line, dup := firstLine[key]; dup {
				// eachPair caught exact duplicates; this is name vs name:latest.
				probs.add(mk, mpath, "model priced twice (first at line %d; a name without a tag is its :latest tag)", line)
				return
			}
			firstLine[key] = mk.Line
			if ok {
				pr.Line = mk.Line
				out.byModel[key] = pr
			}
		})
	})
}

func parsePrice(v *yaml.Node, path string, probs *problems) (Price, bool) {
	if v.Kind != yaml.MappingNode {
		probs.add(v, path, "must be a mapping with input_per_million, output_per_million and optionally per_request, got %s", kindName(v))
		return Price{}, false
	}
	var pr Price
	ok := true
	var haveIn, haveOut bool
	eachPair(v, path, probs, func(key string, k, fv *yaml.Node) {
		field := join(path, key)
		var dst *float64
		switch key {
		case "input_per_million":
			dst, haveIn = &pr.InputPerMillion, true
		case "output_per_million":
			dst, haveOut = &pr.OutputPerMillion, true
		case "per_request":
			dst = &pr.PerRequest
		default:
			probs.add(k, field, "unknown field (allowed: input_per_million, output_per_million, per_request)")
			ok = false
			return
		}
		f, isNum := number(fv)
		switch {
		case !isNum:
			probs.add(fv, field, "must be a number of USD, got %s", describe(fv))
			ok = false
		case f < 0:
			probs.add(fv, field, "must not be negative, got %s", fv.Value)
			ok = false
		case f > maxPrice:
			probs.add(fv, field, "%s USD is not a plausible price (at most %g)", fv.Value, float64(maxPrice))
			ok = false
		default:
			*dst = f
		}
	})
	if !haveIn {
		probs.add(v, join(path, "input_per_million"), "required (write 0 for free input)")
		ok = false
	}
	if !haveOut {
		probs.add(v, join(path, "output_per_million"), "required (write 0 for free output)")
		ok = false
	}
	return pr, ok
}

// describe names a bad value for a message: scalars are quoted, others named by kind.
func describe(v *yaml.Node) string {
	if v.Kind == yaml.ScalarNode && v.ShortTag() != "!!null" {
		return quote(v.Value)
	}
	return kindName(v)
}
