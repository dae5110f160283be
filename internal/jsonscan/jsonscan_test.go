package jsonscan

import (
	"bytes"
	"encoding/json"
	"testing"
)

var seeds = []string{
	`[]`, `[1, "two", {"three": [3]}, null, true, -4.5e6]`, ` [ "a" , "b\"]" ] `,
	`{"a":1,"b":"x","a":[2]}`, `{"\u0061":1, "é":2, "\ud800":3}`, `"plain"`, `"esc\n\u00e9\"q"`,
	`"\xff\xfe"`, `"x`, `[1,`, `{"a":}`, `5`, `[[[]]]`,
}

// FuzzElements checks Elements against encoding/json on valid arrays.
func FuzzElements(f *testing.F) {
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		b = bytes.TrimSpace(b)
		var got [][]byte
		Elements(b, func(v []byte) bool { got = append(got, v); return true })
		var want []json.RawMessage
		if !json.Valid(b) || json.Unmarshal(b, &want) != nil {
			return // not an array: Elements only had to stop without panicking
		}
		if len(got) != len(want) {
			t.Fatalf("%q: %d elements, encoding/json %d", b, len(got), len(want))
		}
		for i := range got {
			if !bytes.Equal(got[i], want[i]) {
				t.Fatalf("%q: element %d is %q, encoding/json %q", b, i, got[i], want[i])
			}
		}
	})
}

// FuzzMembers checks Members against encoding/json on valid objects: the
// last of repeated names wins in both.
func FuzzMembers(f *testing.F) {
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		b = bytes.TrimSpace(b)
		got := map[string]string{}
		Members(b, func(name, v []byte) { got[string(name)] = string(v) })
		var want map[string]json.RawMessage
		if !json.Valid(b) || json.Unmarshal(b, &want) != nil {
			return
		}
		if len(got) != len(want) {
			t.Fatalf("%q: %d members, encoding/json %d", b, len(got), len(want))
		}
		for k, v := range want {
			if got[k] != string(v) {
				t.Fatalf("%q: member %q is %q, encoding/json %q", b, k, got[k], v)
			}
		}
	})
}

// FuzzString checks String against encoding/json.
func FuzzString(f *testing.F) {
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(bytes.TrimSpace(b)) != len(b) {
			return // String reads a value as Skip cuts it, without spaces around
		}
		got, ok := String(b)
		var want string
		err := json.Unmarshal(b, &want)
		if ok != (err == nil && len(b) > 0 && b[0] == '"') {
			t.Fatalf("String(%q) ok = %v, encoding/json: %q %v", b, ok, want, err)
		}
		if ok && got != want {
			t.Fatalf("String(%q) = %q, encoding/json %q", b, got, want)
		}
		// Plain, when it answers, answers what String does.
		if p, pok := Plain(b); pok && (!ok || string(p) != got) {
			t.Fatalf("Plain(%q) = %q; String = %q, %v", b, p, got, ok)
		}
	})
}

func TestPlain(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want string
		ok   bool
	}{
		{`"hello"`, "hello", true},
		{`""`, "", true},
		{`"é ok"`, "é ok", true},
		{`"a\nb"`, "", false},    // an escape to decode
		{"\"a\x01\"", "", false}, // a control byte: invalid JSON
		{"\"\xff\"", "", false},  // not UTF-8
		{`"open`, "", false},
		{`12`, "", false},
	} {
		got, ok := Plain([]byte(tc.in))
		if ok != tc.ok || string(got) != tc.want {
			t.Errorf("Plain(%q) = %q, %v; want %q, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

func TestElementsStops(t *testing.T) {
	n := 0
	Elements([]byte(`[1,2,3]`), func([]byte) bool { n++; return n < 2 })
	if n != 2 {
		t.Fatalf("Elements went on after false: %d calls", n)
	}
}
