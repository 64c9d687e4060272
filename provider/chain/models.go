package chain

import (
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// ModelRoute maps one requested model to the model a provider runs for it.
type ModelRoute struct {
	Requested string `json:"requested"`
	Sent      string `json:"sent"`
}

// ModelMap is a provider's explicit model mapping, in configuration order. The zero value
// passes every requested model through unchanged; a non-empty map serves only the models it
// names, so a provider is never silently sent a model it was not configured for.
type ModelMap struct {
	routes []ModelRoute
	index  map[string]string
}

// NewModelMap builds a map from routes: each side non-empty and a valid model name, each
// requested model once.
func NewModelMap(routes ...ModelRoute) (ModelMap, error) {
	var problems []string
	m := ModelMap{index: make(map[string]string, len(routes))}
	for _, r := range routes {
		r.Requested, r.Sent = strings.TrimSpace(r.Requested), strings.TrimSpace(r.Sent)
		bad := false
		for _, side := range []struct{ what, v string }{{"requested model", r.Requested}, {"model", r.Sent}} {
			if why := badModelName(side.v); why != "" {
				problems = append(problems, fmt.Sprintf("%q=%q: the %s %s", clip(r.Requested), clip(r.Sent), side.what, why))
				bad = true
			}
		}
		if bad {
			continue
		}
		if _, dup := m.index[r.Requested]; dup {
			problems = append(problems, fmt.Sprintf("%q is mapped twice", clip(r.Requested)))
			continue
		}
		m.index[r.Requested] = r.Sent
		m.routes = append(m.routes, r)
	}
	if len(problems) > 0 {
		return ModelMap{}, errors.New(strings.Join(problems, "; "))
	}
	if len(m.routes) == 0 {
		return ModelMap{}, nil
	}
	return m, nil
}

// ParseModelMap reads "requested=sent,requested=sent" (spaces around names are ignored; an
// empty string is the pass-through map). The error names every bad entry.
func ParseModelMap(s string) (ModelMap, error) {
	if strings.TrimSpace(s) == "" {
		return ModelMap{}, nil
	}
	var routes []ModelRoute
	var problems []string
	for i, entry := range strings.Split(s, ",") {
		requested, sent, ok := strings.Cut(entry, "=")
		switch {
		case strings.TrimSpace(entry) == "":
			problems = append(problems, fmt.Sprintf("entry %d is empty", i+1))
		case !ok:
			problems = append(problems, fmt.Sprintf("entry %d %q is not requested=model", i+1, clip(strings.TrimSpace(entry))))
		case strings.Contains(sent, "="):
			problems = append(problems, fmt.Sprintf("entry %d %q has more than one =", i+1, clip(strings.TrimSpace(entry))))
		default:
			routes = append(routes, ModelRoute{Requested: requested, Sent: sent})
		}
	}
	m, err := NewModelMap(routes...)
	if err != nil {
		problems = append(problems, err.Error())
	}
	if len(problems) > 0 {
		return ModelMap{}, errors.New(strings.Join(problems, "; "))
	}
	return m, nil
}

// badModelName says what is wrong with a model name, or "" when it is fine: not empty, at
// most 200 bytes of UTF-8 without spaces or control characters.
func badModelName(s string) string {
	switch {
	case s == "":
		return "is empty"
	case len(s) > 200:
		return "is longer than 200 bytes"
	case !utf8.ValidString(s):
		return "is not UTF-8"
	}
	for _, r := range s {
		if unicode.IsSpace(r) || unicode.IsControl(r) {
			return "contains a space or control character"
		}
	}
	return ""
}

// clip bounds a name echoed in a message.
func clip(s string) string {
	if len(s) <= 64 {
		return s
	}
	cut := 64
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// PassThrough reports whether the map is empty: every requested model goes as is.
func (m ModelMap) PassThrough() bool { return len(m.routes) == 0 }

// Route is the model to send for requested, and whether this provider serves it.
func (m ModelMap) Route(requested string) (string, bool) {
	if m.PassThrough() {
		return requested, true
	}
	sent, ok := m.index[requested]
	return sent, ok
}

// Routes are the mappings in configuration order (nil for pass-through).
func (m ModelMap) Routes() []ModelRoute { return append([]ModelRoute(nil), m.routes...) }

// String is the map in the syntax ParseModelMap reads.
func (m ModelMap) String() string {
	parts := make([]string, len(m.routes))
	for i, r := range m.routes {
		parts[i] = r.Requested + "=" + r.Sent
	}
	return strings.Join(parts, ",")
}
