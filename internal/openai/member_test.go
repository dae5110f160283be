package openai

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/llmgate/llmgate/internal/jsonscan"
)

func TestMember(t *testing.T) {
	for _, tc := range []struct {
		body, name string
		want       string // "" = nil
	}{
		{`{"model":"m","user":"alice"}`, "user", `"alice"`},
		{` {"user" : "a" , "user":"b"} `, "user", `"b"`},
		{`{"User":"a"}`, "user", ""},
		{`{"u\u0073er":"a"}`, "user", `"a"`},
		{`{"messages":[{"user":"x"}]}`, "user", ""},
		{`{"user":{"id":1}}`, "user", `{"id":1}`},
		{`{"user":"a"`, "user", ""},
		{`["user"]`, "user", ""},
		{``, "user", ""},
	} {
		got := Member([]byte(tc.body), tc.name)
		if tc.want == "" && got != nil || tc.want != "" && string(got) != tc.want {
			t.Errorf("Member(%s, %q) = %q, want %q", tc.body, tc.name, got, tc.want)
		}
	}
}

// FuzzMember: Member finds what a decoder into a map finds (exact names,
// the last of repeated members).
func FuzzMember(f *testing.F) {
	for _, s := range []string{`{"user":"a"}`, `{"user":"a","user":1}`, `{"USER":"a"}`, ` {"a":[{"user":2}], "user" : null } `, `{`, `[]`, `"x"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		got := Member(body, "user")
		var m map[string]json.RawMessage
		trimmed := jsonscan.TrimSpace(body)
		if len(trimmed) == 0 || trimmed[0] != '{' || json.Unmarshal(trimmed, &m) != nil {
			if got != nil {
				t.Fatalf("Member of a non-object %q = %q", body, got)
			}
			return
		}
		if want, ok := m["user"]; !ok && got != nil || ok && !bytes.Equal(got, want) {
			t.Fatalf("Member(%q) = %q, a map decode reads %q", body, got, want)
		}
	})
}
