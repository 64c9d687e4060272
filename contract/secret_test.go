package contract

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

func TestSecretNeverPrints(t *testing.T) {
	type config struct {
		Key   Secret
		Unset Secret
	}
	c := config{Key: "sk-live-123"}
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, out := range []string{fmt.Sprint(c), fmt.Sprintf("%v %+v %#v %s", c, c, c, c.Key), string(b)} {
		if strings.Contains(out, "sk-live-123") {
			t.Errorf("the secret printed: %s", out)
		}
		if !strings.Contains(out, "[redacted]") {
			t.Errorf("a set secret should show as [redacted]: %s", out)
		}
	}
	if c.Unset.String() != "" {
		t.Errorf("an unset secret should print empty, got %q", c.Unset.String())
	}
	var back Secret
	if err := back.UnmarshalText([]byte("v")); err != nil || back.Reveal() != "v" {
		t.Errorf("UnmarshalText/Reveal: %q %v", back.Reveal(), err)
	}
}
