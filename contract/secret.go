package contract

// Secret is a configuration value that must never be printed: a password, a token, an API
// key. fmt (%v, %+v, %#v), JSON and text encodings all show "[redacted]" — or "" when it is
// unset, so a configuration dump still tells set from unset — and Reveal returns the value for
// the one place that must use it. Every component's configuration uses this one type.
type Secret string

const redactedSecret = "[redacted]"

// String redacts the value.
func (s Secret) String() string {
	if s == "" {
		return ""
	}
	return redactedSecret
}

// GoString redacts the value for %#v.
func (s Secret) GoString() string { return `"` + s.String() + `"` }

// MarshalText keeps the value out of JSON and other text encodings.
func (s Secret) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText stores the value as given (environment parsing goes through it).
func (s *Secret) UnmarshalText(b []byte) error { *s = Secret(b); return nil }

// Reveal returns the secret value.
func (s Secret) Reveal() string { return string(s) }
