package jsonscan

import (
	"encoding/json"
	"strings"
	"testing"
)

var validCases = []string{
	`{}`, `[]`, ` {"a":1} `, `{"a":[1,2,{"b":null}],"c":"d"}`, `"x"`, `0`, `-0`, `-0.5e+10`, `1E5`, `true`, `false`, `null`,
	`{"a":1,}`, `[1,]`, `[,1]`, `{"a"}`, `{"a":}`, `{a:1}`, `01`, `1.`, `.5`, `1e`, `-`, `+1`, `"\u12"`, `"\x"`, `"a`,
	"\"\x01\"", "\"\xff\xfe\"", `"\u00e9\n\"\\\/"`, `[1 2]`, `{"a":1 "b":2}`, `tru`, `nul`, `[true false]`, `{} {}`, ``, ` `,
	"\v{}", "{}\u00a0", `[[[]]]`, `[[[]]`, `{"a":{"b":{}}}}`, `{"":""}`, `[-1.0e-0]`, `[1e+]`, `{"a":1}x`, `"\uD800"`,
}

func TestValidMatchesEncodingJSON(t *testing.T) {
	for _, s := range validCases {
		if got, want := Valid([]byte(s)), json.Valid([]byte(s)); got != want {
			t.Errorf("Valid(%q) = %v, json.Valid %v", s, got, want)
		}
	}
}

// TestValidDepth: nesting is allowed as deep as encoding/json allows it.
func TestValidDepth(t *testing.T) {
	for _, depth := range []int{maxDepth, maxDepth + 1} {
		for _, open := range []string{"[", `{"a":`} {
			closer := map[string]string{"[": "]", `{"a":`: "}"}[open]
			s := []byte(strings.Repeat(open, depth) + "1" + strings.Repeat(closer, depth))
			if got, want := Valid(s), json.Valid(s); got != want {
				t.Errorf("depth %d of %q: Valid %v, json.Valid %v", depth, open, got, want)
			}
		}
	}
}

func FuzzValid(f *testing.F) {
	for _, s := range validCases {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if got, want := Valid(b), json.Valid(b); got != want {
			t.Fatalf("Valid(%q) = %v, json.Valid %v", b, got, want)
		}
	})
}

func BenchmarkValid(b *testing.B) {
	body := []byte(`{"model":"gpt-4.1-mini","max_tokens":16,"messages":[{"role":"system","content":"You are a helpful assistant that answers briefly."},{"role":"user","content":"What does a gateway in front of an LLM provider do?"},{"role":"assistant","content":"It coordinates the callers."}],"temperature":0.7,"stream":false}`)
	for _, tc := range []struct {
		name  string
		valid func([]byte) bool
	}{{"jsonscan", Valid}, {"encoding_json", json.Valid}} {
		b.Run(tc.name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			for range b.N {
				if !tc.valid(body) {
					b.Fatal("invalid")
				}
			}
		})
	}
}
