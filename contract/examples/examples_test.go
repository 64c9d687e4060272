package examples

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Every *.json request in the directory is listed, and nothing that is not a request is.
func TestRequestsAreTheRequestFiles(t *testing.T) {
	paths, err := filepath.Glob("*.json")
	if err != nil {
		t.Fatal(err)
	}
	var onDisk []string
	for _, p := range paths {
		name := strings.TrimSuffix(p, ".json")
		if name == "record" || strings.HasPrefix(name, "reply") || strings.HasPrefix(name, "label") || name == "review-item" {
			continue
		}
		onDisk = append(onDisk, name)
	}
	if got, want := strings.Join(RequestNames(), ","), strings.Join(onDisk, ","); got != want {
		t.Fatalf("RequestNames = %s, request files = %s", got, want)
	}
	for _, name := range RequestNames() {
		got, err := Request(name)
		if err != nil {
			t.Fatal(err)
		}
		want, err := os.ReadFile(name + ".json")
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Errorf("Request(%q) is not %s.json", name, name)
		}
	}
	if _, err := Request("record"); err == nil || !strings.Contains(err.Error(), "use one of image, one, sixty-four, ticket") {
		t.Errorf("Request(record) error = %v, want the list of requests", err)
	}
}
