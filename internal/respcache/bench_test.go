package respcache_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/llmgate/llmgate/internal/respcache"
)

// benchBody is a typical 2 KB chat request: a system prompt, a few turns,
// sampling parameters and a tool, members in the order SDKs send them.
var benchBody = func() []byte {
	var b strings.Builder
	b.WriteString(`{"model":"gpt-4o-mini","messages":[{"role":"system","content":"You are a helpful assistant for an online bookshop. Answer briefly, cite the catalogue when you can, and never invent ISBNs."}`)
	for i := 0; b.Len() < 1700; i++ {
		fmt.Fprintf(&b, `,{"role":"user","content":"Turn %d: do you have \"The Left Hand of Darkness\" in paperback, and what does shipping to Zürich cost?"},{"role":"assistant","content":"Yes \u2014 turn %d: paperback in stock, shipping CHF 9.50."}`, i, i)
	}
	b.WriteString(`],"temperature":0.7,"top_p":1,"max_tokens":512,"n":1,"stream":true,"stream_options":{"include_usage":true},"user":"user-1234",`)
	b.WriteString(`"tools":[{"type":"function","function":{"name":"lookup","parameters":{"type":"object","properties":{"isbn":{"type":"string"}},"required":["isbn"]}}}]}`)
	return []byte(b.String())
}()

func BenchmarkCanonical(b *testing.B) {
	b.SetBytes(int64(len(benchBody)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := respcache.Canonical(benchBody); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkKey(b *testing.B) {
	b.SetBytes(int64(len(benchBody)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := respcache.Key("tenant:acme", "gpt-4o-mini", benchBody, true); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCanonicalReference is the obvious implementation (decode into
// an any, encode again), for comparison.
func BenchmarkCanonicalReference(b *testing.B) {
	b.SetBytes(int64(len(benchBody)))
	b.ReportAllocs()
	for b.Loop() {
		var v any
		if err := json.Unmarshal(benchBody, &v); err != nil {
			b.Fatal(err)
		}
		if _, err := json.Marshal(v); err != nil {
			b.Fatal(err)
		}
	}
}

func TestBenchBodyIsTwoKB(t *testing.T) {
	if n := len(benchBody); n < 1800 || n > 2300 {
		t.Fatalf("benchmark body is %d bytes, want about 2 KB", n)
	}
	if _, err := respcache.Canonical(benchBody); err != nil {
		t.Fatal(err)
	}
}
