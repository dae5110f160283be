package respcache_test

import (
	"encoding/hex"
	"strings"
	"testing"

	"github.com/llmgate/llmgate/internal/respcache"
)

func mustKey(t *testing.T, scope, model, body string, stream bool) string {
	t.Helper()
	k, err := respcache.Key(scope, model, []byte(body), stream)
	if err != nil {
		t.Fatalf("Key(%q, %q, %q, %v): %v", scope, model, body, stream, err)
	}
	if b, err := hex.DecodeString(k); err != nil || len(b) != 32 {
		t.Fatalf("Key = %q, want 64 hex digits", k)
	}
	return k
}

const chatBody = `{"model":"gpt-4o","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Caf\u00e9?"}],"temperature":0.2,"n":1}`

func TestKeySameContent(t *testing.T) {
	want := mustKey(t, "acme", "gpt-4o", chatBody, false)
	for _, body := range []string{
		// member order, whitespace, escapes
		`{ "n" : 1 , "temperature" : 0.2 , "messages" : [ { "content" : "Be brief." , "role" : "system" } , { "content" : "Café?" , "role" : "user" } ] , "model" : "gpt-4o" }`,
		"{\n  \"model\": \"gpt-4o\",\n  \"messages\": [\n    {\"role\": \"system\", \"content\": \"Be brief.\"},\n    {\"role\": \"user\", \"content\": \"Caf\\u00E9?\"}\n  ],\n  \"temperature\": 0.2,\n  \"n\": 1\n}\n",
		// fields that do not change the answer
		`{"model":"gpt-4o","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Café?"}],"temperature":0.2,"n":1,"stream":false}`,
		`{"model":"gpt-4o","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Café?"}],"temperature":0.2,"n":1,"stream":true}`,
		`{"user":"alice","model":"gpt-4o","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Café?"}],"temperature":0.2,"n":1}`,
		`{"model":"gpt-4o","safety_identifier":"h1","prompt_cache_key":"k","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Café?"}],"temperature":0.2,"n":1,"user":"bob"}`,
		// a duplicate key: the last value is the one a provider reads
		`{"temperature":1,"model":"gpt-4o","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Café?"}],"temperature":0.2,"n":1}`,
	} {
		if got := mustKey(t, "acme", "gpt-4o", body, false); got != want {
			t.Errorf("Key(%s) = %s, want %s (same request)", body, got, want)
		}
	}
}

func TestKeyDiffers(t *testing.T) {
	base := mustKey(t, "acme", "gpt-4o", chatBody, false)
	seen := map[string]string{base: "base"}
	for name, k := range map[string]string{
		"scope":            mustKey(t, "other", "gpt-4o", chatBody, false),
		"empty scope":      mustKey(t, "", "gpt-4o", chatBody, false),
		"model":            mustKey(t, "acme", "gpt-4o-mini", chatBody, false),
		"stream":           mustKey(t, "acme", "gpt-4o", chatBody, true),
		"n":                mustKey(t, "acme", "gpt-4o", `{"model":"gpt-4o","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Café?"}],"temperature":0.2,"n":2}`, false),
		"no n":             mustKey(t, "acme", "gpt-4o", `{"model":"gpt-4o","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Café?"}],"temperature":0.2}`, false),
		"number form":      mustKey(t, "acme", "gpt-4o", `{"model":"gpt-4o","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Café?"}],"temperature":0.20,"n":1}`, false),
		"content":          mustKey(t, "acme", "gpt-4o", `{"model":"gpt-4o","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Cafe?"}],"temperature":0.2,"n":1}`, false),
		"message order":    mustKey(t, "acme", "gpt-4o", `{"model":"gpt-4o","messages":[{"role":"user","content":"Café?"},{"role":"system","content":"Be brief."}],"temperature":0.2,"n":1}`, false),
		"stream_options":   mustKey(t, "acme", "gpt-4o", `{"model":"gpt-4o","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Café?"}],"temperature":0.2,"n":1,"stream_options":{"include_usage":true}}`, false),
		"metadata":         mustKey(t, "acme", "gpt-4o", `{"model":"gpt-4o","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Café?"}],"temperature":0.2,"n":1,"metadata":{"a":"b"}}`, false),
		"nested user kept": mustKey(t, "acme", "gpt-4o", `{"model":"gpt-4o","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Café?","user":"x"}],"temperature":0.2,"n":1}`, false),
		// Scope and model are length-prefixed: moving a byte between them
		// makes a different key.
		"scope/model split": mustKey(t, "acmeg", "pt-4o", chatBody, false),
	} {
		if prev, ok := seen[k]; ok {
			t.Errorf("%s: same key as %s", name, prev)
		}
		seen[k] = name
	}
}

// TestKeyStable pins the key of one request: a change in how keys are
// derived must bump keyVersion (and change this test), or a rolling deploy
// would serve old entries under a new meaning. The value was computed
// outside Go from the documented layout:
//
//	sha256("llmgate-respcache-v1\x00" + "\x04acme" + "\x06gpt-4o" + "\x00" +
//	       `{"messages":[{"content":"hi","role":"user"}],"model":"gpt-4o"}`)
func TestKeyStable(t *testing.T) {
	const want = "a16ceced32e12e8d7154f28af5f1c48b1482d719928821035346350c859aa610"
	if got := mustKey(t, "acme", "gpt-4o", `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`, false); got != want {
		t.Fatalf("Key = %s, want %s", got, want)
	}
}

func TestTenantTag(t *testing.T) {
	for in, want := range map[string]string{
		"team-a":                "team-a",
		"a.b_c@d-e":             "a.b_c@d-e",
		"x{y}":                  "#",
		"":                      "#",
		"has space":             "#",
		"é":                     "#",
		"#0123":                 "#",
		strings.Repeat("a", 64): strings.Repeat("a", 64),
		strings.Repeat("a", 65): "#",
	} {
		got := respcache.TenantTag(in)
		if want == "#" {
			if len(got) != 65 || got[0] != '#' {
				t.Errorf("TenantTag(%q) = %q, want # and 64 hex digits", in, got)
			}
			continue
		}
		if got != want {
			t.Errorf("TenantTag(%q) = %q, want %q", in, got, want)
		}
	}
}

// FuzzTenantTag: a tag is never empty, never holds a brace (which would
// end the Cluster hash tag early) and two tenants never share one.
func FuzzTenantTag(f *testing.F) {
	for _, s := range [][2]string{{"team-a", "team-b"}, {"", "#"}, {"{", "}"}, {"a", "#" + strings.Repeat("0", 64)}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		ta, tb := respcache.TenantTag(a), respcache.TenantTag(b)
		for _, tag := range []string{ta, tb} {
			if tag == "" || strings.ContainsAny(tag, "{}") || len(tag) > 65 {
				t.Fatalf("TenantTag gives %q", tag)
			}
		}
		if a != b && ta == tb {
			t.Fatalf("TenantTag(%q) = TenantTag(%q) = %q", a, b, ta)
		}
	})
}
