package synthetic

import (
	"math"
	"reflect"
	"testing"

	"github.com/sys1hq/sys1/contract"
)

func TestCalibrationSyntheticGenerate(t *testing.T) {
	for _, typ := range []contract.QuestionType{contract.TypeChoice, contract.TypeNoul, contract.TypeScore} {
		a, b := Generate(typ, 500, 2.5, 9), Generate(typ, 500, 2.5, 9)
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("%s: the same seed gave different answers", typ)
		}
		other := Generate(typ, 500, 0.6, 9)
		want := map[contract.QuestionType]int{contract.TypeChoice: 4, contract.TypeNoul: 2, contract.TypeScore: 5}[typ]
		for i, x := range a {
			if len(x.Reported) != want || len(x.Truth) != want || x.Label < 0 || x.Label >= want {
				t.Fatalf("%s answer %d: %+v", typ, i, x)
			}
			if other[i].Label != x.Label {
				t.Fatalf("%s answer %d: the label depends on the distortion", typ, i)
			}
			// Reported is the truth to the power 2.5, normalised.
			z := 0.0
			for _, q := range x.Truth {
				z += math.Pow(q, 2.5)
			}
			for j, q := range x.Truth {
				if math.Abs(x.Reported[j]-math.Pow(q, 2.5)/z) > 1e-9 {
					t.Fatalf("%s answer %d: reported %v is not truth %v sharpened by 2.5", typ, i, x.Reported, x.Truth)
				}
			}
		}
	}
}
