package topology

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Bytes is a size in bytes as an operator writes it: a whole number of bytes, or a number
// with a unit, binary (KiB, MiB, GiB, TiB: powers of 1024) or decimal (KB, MB, GB, TB:
// powers of 1000), "8GiB", "512 MiB", "1.5GB". Env parsing reads it through UnmarshalText.
type Bytes int64

// Byte units.
const (
	KiB Bytes = 1 << 10
	MiB Bytes = 1 << 20
	GiB Bytes = 1 << 30
	TiB Bytes = 1 << 40
)

var byteUnits = []struct {
	suffix string
	factor float64
}{
	{"kib", 1 << 10}, {"mib", 1 << 20}, {"gib", 1 << 30}, {"tib", 1 << 40},
	{"kb", 1e3}, {"mb", 1e6}, {"gb", 1e9}, {"tb", 1e12},
	{"k", 1 << 10}, {"m", 1 << 20}, {"g", 1 << 30}, {"t", 1 << 40}, // as nats-server reads them
	{"b", 1},
}

// ParseBytes reads a size (see Bytes).
func ParseBytes(s string) (Bytes, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	if t == "" {
		return 0, fmt.Errorf("empty size")
	}
	factor := 1.0
	for _, u := range byteUnits {
		if strings.HasSuffix(t, u.suffix) {
			t, factor = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.factor
			break
		}
	}
	if factor == 1 {
		n, err := strconv.ParseInt(t, 10, 64)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("%q is not a size: write bytes (1073741824) or a number with a unit (1GiB, 512MiB, 10GB)", s)
		}
		return Bytes(n), nil
	}
	f, err := strconv.ParseFloat(t, 64)
	if err != nil || f < 0 || math.IsInf(f, 0) || math.IsNaN(f) || f*factor >= math.MaxInt64 {
		return 0, fmt.Errorf("%q is not a size: write bytes (1073741824) or a number with a unit (1GiB, 512MiB, 10GB)", s)
	}
	return Bytes(math.Round(f * factor)), nil
}

// UnmarshalText implements encoding.TextUnmarshaler (env parsing).
func (b *Bytes) UnmarshalText(text []byte) error {
	v, err := ParseBytes(string(text))
	if err != nil {
		return err
	}
	*b = v
	return nil
}

// String writes the size in the largest binary unit that divides it, else in bytes.
func (b Bytes) String() string {
	for _, u := range []struct {
		name string
		v    Bytes
	}{{"TiB", TiB}, {"GiB", GiB}, {"MiB", MiB}, {"KiB", KiB}} {
		if b >= u.v && b%u.v == 0 {
			return strconv.FormatInt(int64(b/u.v), 10) + u.name
		}
	}
	return strconv.FormatInt(int64(b), 10) + "B"
}
