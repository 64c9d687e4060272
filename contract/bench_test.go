package contract

import (
	"os"
	"testing"
)

// BenchmarkDecodeValidateResolve is the worker's per-message contract cost: strict decode,
// full validation and resolution.
func BenchmarkDecodeValidateResolve(b *testing.B) {
	pol := Policy{DefaultModel: "nimble", AllowedModels: []string{"clef"}, KeepAlive: "300"}
	for _, c := range []struct{ name, file string }{{"three", "ticket"}, {"sixty-four", "sixty-four"}} {
		body, err := os.ReadFile("examples/" + c.file + ".json")
		if err != nil {
			b.Fatal(err)
		}
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				req, derr := DecodeRequest(body)
				if derr != nil {
					b.Fatal(derr)
				}
				if _, rerr := pol.Resolve(req); rerr != nil {
					b.Fatal(rerr)
				}
			}
		})
	}
}

func BenchmarkMarshalRequest(b *testing.B) {
	req, err := Policy{DefaultModel: "nimble", KeepAlive: "300"}.Resolve(ticketRequest(b))
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := req.MarshalJSON(); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeResponse(b *testing.B) {
	req := ticketRequest(b)
	body := []byte(ticketAnswer)
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if _, err := DecodeResponse(req, body); err != nil {
			b.Fatal(err)
		}
	}
}
