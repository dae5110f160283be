package redis

import "testing"

// FuzzRowField checks that usage-row fields read back from Redis decode to
// what was written, and that arbitrary fields never panic the decoder.
func FuzzRowField(f *testing.F) {
	f.Add("gpt-4o", "azure-east")
	f.Add("a:b", "c")
	f.Add("a", ":bc")
	f.Add("", "")
	f.Add("99:x", "")
	f.Fuzz(func(t *testing.T, model, deployment string) {
		m, d, err := parseRowField(rowField(model, deployment))
		if err != nil || m != model || d != deployment {
			t.Fatalf("round trip of (%q, %q) = (%q, %q), %v", model, deployment, m, d, err)
		}
		// Any string at all: no panic; a success splits it without loss.
		raw := model + deployment
		if m, d, err := parseRowField(raw); err == nil && len(m)+len(d) >= len(raw) {
			t.Fatalf("%q decoded to (%q, %q), longer than the field", raw, m, d)
		}
	})
}
