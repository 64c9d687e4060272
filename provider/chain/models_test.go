package chain_test

import (
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/sys1hq/sys1/provider/chain"
)

func TestParseModelMap(t *testing.T) {
	m, err := chain.ParseModelMap(" nimble = jev-1.13.0 ,fast=jev-lite,alias=jev-lite, library/x:7b=y")
	if err != nil {
		t.Fatal(err)
	}
	if m.String() != "nimble=jev-1.13.0,fast=jev-lite,alias=jev-lite,library/x:7b=y" || m.PassThrough() {
		t.Fatalf("map %s", m)
	}
	if sent, ok := m.Route("fast"); !ok || sent != "jev-lite" {
		t.Fatalf("fast → %q %v", sent, ok)
	}
	if _, ok := m.Route("Fast"); ok {
		t.Fatal("names are matched exactly")
	}
	if _, ok := m.Route("other"); ok {
		t.Fatal("an unmapped model is served")
	}
	for _, empty := range []string{"", "  "} {
		m, err := chain.ParseModelMap(empty)
		if err != nil || !m.PassThrough() {
			t.Fatalf("%q: %v", empty, err)
		}
		if sent, ok := m.Route("anything"); !ok || sent != "anything" {
			t.Fatal("pass-through does not pass through")
		}
	}
}

func TestParseModelMapNamesEveryBadEntry(t *testing.T) {
	_, err := chain.ParseModelMap("nimble,=x,a=,b=c=d,,ok=fine,ok=again,sp ace=x,tab=a\tb")
	if err == nil {
		t.Fatal("accepted")
	}
	for _, want := range []string{
		`entry 1 "nimble" is not requested=model`,
		`"="x": the requested model is empty`,
		`"a"="": the model is empty`,
		`entry 4 "b=c=d" has more than one =`,
		"entry 5 is empty",
		`"ok" is mapped twice`,
		`"sp ace"="x": the requested model contains a space`,
		`"tab"="a\tb": the model contains a space or control character`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q lacks %q", err, want)
		}
	}
	_, err = chain.ParseModelMap("x=" + strings.Repeat("é", 200))
	if err == nil || !strings.Contains(err.Error(), "longer than 200 bytes") || len(err.Error()) > 300 {
		t.Fatalf("long name: %v", err)
	}
}

func FuzzParseModelMap(f *testing.F) {
	for _, s := range []string{"nimble=jev-1.13.0,fast=jev-lite", "", "a", "a=b=c", ",,", "x=\xff", " a = b "} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		m, err := chain.ParseModelMap(s)
		if err != nil {
			if !utf8.ValidString(err.Error()) && utf8.ValidString(s) {
				t.Fatalf("invalid UTF-8 in the error for valid input: %q", err)
			}
			return
		}
		// what parses, prints back to an equal map
		again, err := chain.ParseModelMap(m.String())
		if err != nil || fmt.Sprint(again.Routes()) != fmt.Sprint(m.Routes()) {
			t.Fatalf("%q → %q → %v (%v)", s, m.String(), again.Routes(), err)
		}
		for _, r := range m.Routes() {
			if sent, ok := m.Route(r.Requested); !ok || sent != r.Sent || r.Sent == "" {
				t.Fatalf("route %+v", r)
			}
		}
	})
}
