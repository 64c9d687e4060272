package contract

import (
	"encoding/json"
	"fmt"
	"testing"
)

func TestKeySet(t *testing.T) {
	var s keySet
	for i := 0; i < 100; i++ {
		if s.add(fmt.Sprint(i)) {
			t.Fatalf("%d reported as repeated", i)
		}
	}
	for _, i := range []int{0, 15, 16, 17, 99} {
		if !s.add(fmt.Sprint(i)) {
			t.Fatalf("%d not reported as repeated", i)
		}
	}
}

func TestAppendStringEscapes(t *testing.T) {
	got := string(appendString(nil, "a\"b\\c\n\t\x01\xffé<>&"))
	want := `"a\"b\\c\n\t\u0001` + "\ufffd" + `é<>&"`
	if got != want {
		t.Fatalf("got %s want %s", got, want)
	}
}

func TestAppendFloatMatchesEncodingJSON(t *testing.T) {
	for _, f := range []float64{0, 1, 0.5, 1e-7, 1.7, 123456789, 1e21, 1e20, 0.000001, 2.5e-10} {
		want := fmt.Sprint(mustJSON(t, f))
		if got := string(appendFloat(nil, f)); got != want {
			t.Errorf("%v: got %s want %s", f, got, want)
		}
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
