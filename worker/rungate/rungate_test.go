package rungate

import (
	"strings"
	"testing"
)

func TestKeyIsInjectiveValidAndGroupsBatches(t *testing.T) {
	ids := []string{"a", "a:b", "a:", ":b", ":", "a:b:c", "ab", "a.b", "SYS1_REQUESTS~7~abc", "batch1:item-1", "batch1:item-2", "batch10:item-1"}
	seen := map[string]string{}
	for _, id := range ids {
		k := Key(id)
		if other, dup := seen[k]; dup {
			t.Fatalf("%q and %q share key %q", id, other, k)
		}
		seen[k] = id
		if strings.HasPrefix(k, ".") || strings.HasSuffix(k, ".") || strings.Contains(k, "..") {
			t.Fatalf("%q: invalid KV key %q", id, k)
		}
		for _, c := range k {
			if !(c == '.' || c == '-' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z') {
				t.Fatalf("%q: key %q has %q", id, k, c)
			}
		}
	}
	filter := strings.TrimSuffix(GroupFilter("batch1"), "*")
	for _, id := range ids {
		in := strings.HasPrefix(Key(id), filter) && !strings.Contains(strings.TrimPrefix(Key(id), filter), ".")
		if want := strings.HasPrefix(id, "batch1:"); in != want {
			t.Errorf("%q in group batch1 = %v, want %v", id, in, want)
		}
	}
}
