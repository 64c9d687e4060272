package contract

import (
	"errors"
	"os"
	"strings"
	"testing"
)

func mustDecode(t testing.TB, body string) *Request {
	t.Helper()
	req, err := DecodeRequest([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	return req
}

func TestResolveModel(t *testing.T) {
	pol := Policy{DefaultModel: "nimble", AllowedModels: []string{"clef:cloud", "nimble"}}
	tests := []struct {
		name, model, want string
		code              Code
	}{
		{"default applied", "", "nimble", ""},
		{"default allowed by name", "nimble", "nimble", ""},
		{"allow-listed", "clef:cloud", "clef:cloud", ""},
		{"not allowed", "llama3", "", CodeModelNotAllowed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			body := withQuestions(choiceQ)
			if tc.model != "" {
				body = `{"model":"` + tc.model + `",` + body[1:]
			}
			req := mustDecode(t, body)
			got, err := pol.Resolve(req)
			if tc.code != "" {
				if err == nil || err.Code != tc.code || err.Status != 400 {
					t.Fatalf("want %s, got %v", tc.code, err)
				}
				if !strings.Contains(err.Message, "allowed models: nimble, clef:cloud") {
					t.Fatalf("message does not name the allowed models: %q", err.Message)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.Model != tc.want {
				t.Fatalf("model %q, want %q", got.Model, tc.want)
			}
			if req.Model != tc.model {
				t.Fatalf("Resolve modified its argument: model %q", req.Model)
			}
		})
	}
	// With no allow-list only the default is allowed.
	_, err := Policy{DefaultModel: "nimble"}.Resolve(mustDecode(t, `{"model":"other",`+withQuestions(choiceQ)[1:]))
	if err == nil || err.Code != CodeModelNotAllowed || !strings.HasSuffix(err.Message, "allowed models: nimble") {
		t.Fatalf("got %v", err)
	}
}

func TestResolveKeepAlive(t *testing.T) {
	tests := []struct{ policy, want string }{
		{"", ""},
		{"300", `300`},
		{"007", `7`},
		{"0", `0`},
		{"5m", `"5m"`},
		{"-1s", `"-1s"`},
	}
	for _, tc := range tests {
		t.Run(tc.policy, func(t *testing.T) {
			// The caller's keep_alive is dropped by the decoder; the policy's value is sent.
			req := mustDecode(t, `{"keep_alive":"24h",`+withQuestions(choiceQ)[1:])
			got, err := Policy{DefaultModel: "nimble", KeepAlive: tc.policy}.Resolve(req)
			if err != nil {
				t.Fatal(err)
			}
			if string(got.KeepAlive) != tc.want {
				t.Fatalf("keep_alive %s, want %s", got.KeepAlive, tc.want)
			}
			b, _ := got.MarshalJSON()
			if tc.want == "" && strings.Contains(string(b), "keep_alive") {
				t.Fatalf("keep_alive sent: %s", b)
			}
			if tc.want != "" && !strings.HasSuffix(string(b), `,"keep_alive":`+tc.want+`}`) {
				t.Fatalf("encoded: %s", b)
			}
			if req.KeepAlive != nil {
				t.Fatal("Resolve modified its argument")
			}
		})
	}
}

// bigState returns a request whose serialized size is exactly n bytes (n large enough).
func sizedRequest(t *testing.T, n int, images string) *Request {
	t.Helper()
	pre := `{"state":"`
	post := `","questions":{` + choiceQ + `}` + images + `}`
	body := pre + strings.Repeat("x", n-len(pre)-len(post)) + post
	req := mustDecode(t, body)
	out, _ := req.MarshalJSON()
	if len(out) != n {
		t.Fatalf("built %d bytes, want %d", len(out), n)
	}
	return req
}

func TestResolveSize(t *testing.T) {
	pol := Policy{DefaultModel: "nimble"}
	modelLen := len(`"model":"nimble",`)
	tests := []struct {
		name   string
		req    *Request
		policy Policy
		tooBig bool
	}{
		{"text at the limit", sizedRequest(t, MaxTextBytes-modelLen, ""), pol, false},
		{"text one byte over", sizedRequest(t, MaxTextBytes-modelLen+1, ""), pol, true},
		{"keep_alive counts", sizedRequest(t, MaxTextBytes-modelLen, ""), Policy{DefaultModel: "nimble", KeepAlive: "5"}, true},
		{"text with image under 64 KiB", sizedRequest(t, MaxTextBytes-modelLen-100, `,"images":["`+pngB64+`"]`), pol, false},
		// SPEC §5: with images only the 32 MiB bound applies, as upstream's.
		{"text part over 64 KiB with image", sizedRequest(t, MaxTextBytes+1000, `,"images":["`+pngB64+`"]`), pol, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.policy.Resolve(tc.req)
			if tc.tooBig {
				if err == nil || err.Code != CodeRequestTooLarge || err.Status != 413 {
					t.Fatalf("want SYS1_REQUEST_TOO_LARGE, got %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			b, _ := got.MarshalJSON()
			if len(tc.req.Images) == 0 && len(b) != MaxTextBytes && !strings.Contains(tc.name, "image") {
				t.Fatalf("resolved size %d", len(b))
			}
		})
	}
}

// TestResolveImageTotal: with images the whole body may reach 32 MiB, not more; the size is
// computed exactly as MarshalJSON would write it.
func TestResolveImageTotal(t *testing.T) {
	base := mustDecode(t, withImages(`["`+pngB64+`"]`))
	resolved, err := Policy{DefaultModel: "nimble"}.Resolve(base)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := resolved.MarshalJSON()
	// Grow a second (synthetic, unvalidated) image so the total lands on the limit exactly.
	fill := MaxImageRequestBytes - len(b) - len(`,""`)
	at := *resolved
	at.Images = append([]Image{}, resolved.Images...)
	at.Images = append(at.Images, Image{Data: strings.Repeat("A", fill)})
	if _, err := (Policy{DefaultModel: "nimble"}).Resolve(&at); err != nil {
		t.Fatalf("at the limit: %v", err)
	}
	if got, _ := at.MarshalJSON(); len(got) != MaxImageRequestBytes {
		t.Fatalf("built %d bytes", len(got))
	}
	at.Images[1].Data += "AAAA"
	if _, err := (Policy{DefaultModel: "nimble"}).Resolve(&at); err == nil || err.Code != CodeRequestTooLarge {
		t.Fatalf("over the limit: %v", err)
	}
	// Line breaks (which base64 decoders skip, so validation accepts them) are escaped on the
	// wire: the same length of data with some of them is over the limit.
	at.Images[1].Data = strings.Repeat("A", fill-8) + strings.Repeat("AAA\n", 2)
	if got, _ := at.MarshalJSON(); len(got) != MaxImageRequestBytes+2 {
		t.Fatalf("built %d bytes", len(got))
	}
	if _, err := (Policy{DefaultModel: "nimble"}).Resolve(&at); err == nil || err.Code != CodeRequestTooLarge {
		t.Fatalf("escaped line breaks not counted: %v", err)
	}
}

// TestResolveExamples: every example resolves under the default policy.
func TestResolveExamples(t *testing.T) {
	for _, name := range []string{"ticket", "one", "sixty-four", "image"} {
		b, _ := os.ReadFile("examples/" + name + ".json")
		req, derr := DecodeRequest(b)
		if derr != nil {
			t.Fatal(derr)
		}
		if _, err := (Policy{DefaultModel: "nimble"}).Resolve(req); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	var e *Error
	if !errors.As(error(Errorf(CodeRequestTooLarge, "x")), &e) {
		t.Fatal("Errorf does not build an *Error")
	}
}
