package loadtest

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sys1hq/sys1/contract"
)

// Every built-in template is one of the contract's example requests and a valid request.
func TestTemplatesAreTheContractExamples(t *testing.T) {
	names := TemplateNames()
	if want := []string{"image", "one", "sixty-four", "ticket"}; strings.Join(names, ",") != strings.Join(want, ",") {
		t.Fatalf("TemplateNames = %v, want %v", names, want)
	}
	for _, name := range names {
		got, err := Template(name)
		if err != nil {
			t.Fatal(err)
		}
		want, err := os.ReadFile(filepath.Join("..", "..", "..", "contract", "examples", name+".json"))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("template %s is not contract/examples/%s.json", name, name)
		}
		if _, cerr := contract.DecodeRequest(got); cerr != nil {
			t.Errorf("template %s is not a valid request: %v", name, cerr)
		}
	}
}

func TestTemplateFromFileAndErrors(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "mine.json")
	if err := os.WriteFile(path, []byte(`{"state":"x","questions":{}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if b, err := Template(path); err != nil || !bytes.Contains(b, []byte(`"state":"x"`)) {
		t.Fatalf("Template(file) = %q, %v", b, err)
	}
	empty := filepath.Join(dir, "empty.json")
	if err := os.WriteFile(empty, []byte(" \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ in, want string }{
		{"", "empty template"},
		{"seventy", `unknown template "seventy": use one of image, one, sixty-four, ticket`},
		{filepath.Join(dir, "missing.json"), "read template"},
		{empty, "is empty"},
	} {
		if _, err := Template(tc.in); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Template(%q) error = %v, want it to contain %q", tc.in, err, tc.want)
		}
	}
}
