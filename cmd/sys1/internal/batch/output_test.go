package batch

import (
	"os"
	"path/filepath"
	"testing"
)

// TestOutputDoesNotFollowAPlantedSymlink: a symbolic link planted at OUT.partial (or at OUT,
// or at the errors file's names) pointing at a file the batch's user can write is replaced,
// never written through: the target keeps its bytes, the outputs are regular files.
func TestOutputDoesNotFollowAPlantedSymlink(t *testing.T) {
	dir := t.TempDir()
	victim := filepath.Join(dir, "authorized_keys")
	if err := os.WriteFile(victim, []byte("precious\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "results.jsonl")
	for _, link := range []string{out + PartialSuffix, out, ErrorsPath(out) + PartialSuffix} {
		if err := os.Symlink(victim, link); err != nil {
			t.Fatal(err)
		}
	}
	o, err := CreateOutput(out)
	if err != nil {
		t.Fatal(err)
	}
	if err := o.write([]byte(`{"custom_id":"a"}`), StatusFailed); err != nil {
		t.Fatal(err)
	}
	if err := o.Commit(); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(victim); string(b) != "precious\n" {
		t.Fatalf("the symlink's target was written: %q", b)
	}
	for _, name := range []string{out, ErrorsPath(out)} {
		st, err := os.Lstat(name)
		if err != nil || !st.Mode().IsRegular() {
			t.Fatalf("%s: %v %v, want a regular file", name, st.Mode(), err)
		}
		if b, _ := os.ReadFile(name); string(b) != "{\"custom_id\":\"a\"}\n" {
			t.Errorf("%s holds %q", name, b)
		}
	}
	// A directory where the partial file goes is an error, not something to remove.
	if err := os.Mkdir(filepath.Join(dir, "d.jsonl"+PartialSuffix), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := CreateOutput(filepath.Join(dir, "d.jsonl")); err == nil {
		t.Error("a directory at OUT.partial was accepted")
	}
}
