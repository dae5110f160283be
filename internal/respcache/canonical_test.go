package respcache_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/llmgate/llmgate/internal/respcache"
)

func TestCanonical(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"key order", `{"b":1,"a":2,"c":3}`, `{"a":2,"b":1,"c":3}`},
		{"prefix sorts first", `{"ab":1,"a":2,"":3}`, `{"":3,"a":2,"ab":1}`},
		{"whitespace", " \t\r\n{ \"a\" :\n[ 1 ,\t2 ] , \"b\" : { } , \"c\" : [ ] }\n", `{"a":[1,2],"b":{},"c":[]}`},
		{"nested", `{"z":{"y":1,"x":[{"b":1,"a":0},[{"d":[],"c":{}}]]},"a":null}`, `{"a":null,"z":{"x":[{"a":0,"b":1},[{"c":{},"d":[]}]],"y":1}}`},
		{"array order kept", `[3,1,2,{"b":0,"a":0}]`, `[3,1,2,{"a":0,"b":0}]`},
		{"unicode escape", `"\u00e9"`, `"é"`},
		{"unicode escape upper-case", `"\u00E9t\u00C9"`, `"étÉ"`},
		{"literal utf-8 kept", `"é😀中"`, `"é😀中"`},
		{"surrogate pair", `"\ud83d\ude00"`, `"😀"`},
		{"surrogate pair upper-case", `"\uD83D\uDE00x"`, `"😀x"`},
		{"solidus", `"a\/b"`, `"a/b"`},
		{"short escapes", `"\b\f\n\r\t\"\\"`, `"\b\f\n\r\t\"\\"`},
		{"short escapes from \\u", `"\u0008\u000C\u000a\u000D\u0009\u0022\u005C"`, `"\b\f\n\r\t\"\\"`},
		{"other controls", `"\u0000\u001F\u0001"`, `"\u0000\u001f\u0001"`},
		{"ascii from \\u", `"\u0041\u007f"`, "\"A\x7f\""},
		{"html kept literal", `"<a&b>\u2028"`, "\"<a&b>\u2028\""},
		{"U+FFFD literal", `"\ufffd"`, "\"\uFFFD\""},
		{"escaped key", `{"\u0062":1,"a":2}`, `{"a":2,"b":1}`},
		{"duplicate keeps last", `{"a":1,"a":2}`, `{"a":2}`},
		{"duplicate keeps last value", `{"a":1,"b":0,"a":{"c":1}}`, `{"a":{"c":1},"b":0}`},
		{"duplicate by escape", `{"a":1,"\u0061":2,"b":3}`, `{"a":2,"b":3}`},
		{"duplicate thrice", `{"a":1,"b":2,"a":3,"b":4,"a":5}`, `{"a":5,"b":4}`},
		{"duplicates in nested", `[{"x":1,"x":2},{"x":3}]`, `[{"x":2},{"x":3}]`},
		{"numbers as written", `[1,1.0,1e2,1E+2,-0,0.5e-3,123456789012345678901234567890]`, `[1,1.0,1e2,1E+2,-0,0.5e-3,123456789012345678901234567890]`},
		{"literals", `[true,false,null]`, `[true,false,null]`},
		{"top-level string", ` "x" `, `"x"`},
		{"top-level number", "12\n", `12`},
		{"empty object", `{}`, `{}`},
		{"empty key and string", `{"":""}`, `{"":""}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := respcache.Canonical([]byte(tc.in))
			if err != nil {
				t.Fatalf("Canonical(%q): %v", tc.in, err)
			}
			if string(got) != tc.want {
				t.Fatalf("Canonical(%q)\n got %s\nwant %s", tc.in, got, tc.want)
			}
			checkCanonicalProperties(t, []byte(tc.in), got)
		})
	}
}

func TestCanonicalInvalid(t *testing.T) {
	for _, in := range []string{
		``, ` `, `{`, `}`, `[`, `{"a"}`, `{"a":}`, `{"a" 1}`, `{"a":1,}`, `{,}`, `[1,]`, `[,1]`, `[1 2]`,
		`{"a":1 "b":2}`, `{1:2}`, `{a:1}`, `{'a':1}`, `'a'`,
		`01`, `-01`, `1.`, `.5`, `1e`, `1e+`, `+1`, `-`, `--1`, `0x10`, `1_000`, `NaN`, `Infinity`, `-Infinity`,
		`tru`, `nul`, `True`, `nulll`, `falsey`,
		`"abc`, `"\x"`, `"\u12"`, `"\u12g4"`, `"\`, `"\u`,
		`"\ud800"`, `"\udc00"`, `"\ud800\u0041"`, `"\ud800\ud800"`, `"\ud800x"`, `"\udbff\\udc00"`,
		"\"a\x00b\"", "\"a\nb\"", "\"a\tb\"", "\"\x1f\"",
		"\"\xff\"", "\"\xc3\"", "\"\xed\xa0\x80\"", "\"\xc0\xaf\"", "{\"\xff\":1}",
		`{} {}`, `{"a":1}x`, `1 2`, `[] ]`, "\x00", "\ufeff{}",
	} {
		t.Run(fmt.Sprintf("%q", in), func(t *testing.T) {
			got, err := respcache.Canonical([]byte(in))
			if !errors.Is(err, respcache.ErrInvalidJSON) || got != nil {
				t.Fatalf("Canonical(%q) = %q, %v; want nil, ErrInvalidJSON", in, got, err)
			}
			if _, err := respcache.Key("s", "m", []byte(in), false); !errors.Is(err, respcache.ErrInvalidJSON) {
				t.Fatalf("Key(%q): %v; want ErrInvalidJSON", in, err)
			}
		})
	}
}

func TestCanonicalDepth(t *testing.T) {
	nest := func(n int, open, close string) []byte {
		return []byte(strings.Repeat(open, n) + "0" + strings.Repeat(close, n))
	}
	for _, p := range [][2]string{{"[", "]"}, {`{"a":`, "}"}} {
		if _, err := respcache.Canonical(nest(respcache.MaxDepth, p[0], p[1])); err != nil {
			t.Fatalf("%s nested MaxDepth deep: %v", p[0], err)
		}
		if _, err := respcache.Canonical(nest(respcache.MaxDepth+1, p[0], p[1])); !errors.Is(err, respcache.ErrInvalidJSON) {
			t.Fatalf("%s nested MaxDepth+1 deep: %v, want ErrInvalidJSON", p[0], err)
		}
	}
}

// TestCanonicalDoesNotAlias checks that the result is the caller's: a
// second call (reusing pooled buffers) does not change the first result.
func TestCanonicalDoesNotAlias(t *testing.T) {
	in := []byte(`{"b":[1,2],"a":"x"}`)
	first, err := respcache.Canonical(in)
	if err != nil {
		t.Fatal(err)
	}
	want := string(first)
	for range 10 {
		if _, err := respcache.Canonical([]byte(`{"z":"zzzzzzzzzzzzzzzzzzzzz","y":1}`)); err != nil {
			t.Fatal(err)
		}
		if _, err := respcache.Key("s", "m", []byte(`{"q":1,"p":2}`), true); err != nil {
			t.Fatal(err)
		}
	}
	if string(first) != want {
		t.Fatalf("first result changed to %s, want %s", first, want)
	}
	if string(in) != `{"b":[1,2],"a":"x"}` {
		t.Fatalf("input changed to %s", in)
	}
}

// checkCanonicalProperties asserts what must hold for any accepted input:
// the output is valid JSON, a fixed point, identical to the reference
// implementation's, and read by encoding/json as the same value as the input.
func checkCanonicalProperties(t *testing.T, in, got []byte) {
	t.Helper()
	if !json.Valid(got) {
		t.Fatalf("Canonical(%q) = %q: not valid JSON", in, got)
	}
	if len(got) > len(in) {
		t.Fatalf("Canonical(%q) = %q: longer than the input", in, got)
	}
	again, err := respcache.Canonical(got)
	if err != nil || !bytes.Equal(again, got) {
		t.Fatalf("Canonical(Canonical(%q)) = %q, %v; want %q", in, again, err, got)
	}
	ref, err := referenceCanonical(in)
	if err != nil {
		t.Fatalf("reference refused %q (%v), Canonical accepted it", in, err)
	}
	if !bytes.Equal(ref, got) {
		t.Fatalf("Canonical(%q)\n got %q\n ref %q", in, got, ref)
	}
	a, err := decodeNumbers(in)
	if err != nil {
		t.Fatalf("decode %q: %v", in, err)
	}
	b, err := decodeNumbers(got)
	if err != nil {
		t.Fatalf("decode %q: %v", got, err)
	}
	if !reflect.DeepEqual(a, b) {
		t.Fatalf("Canonical changed the value:\n in %q -> %#v\nout %q -> %#v", in, a, got, b)
	}
}

// decodeNumbers is json.Unmarshal into an any, with numbers as written.
func decodeNumbers(in []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(in))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if dec.More() {
		return nil, errors.New("data after the value")
	}
	return v, nil
}

// referenceCanonical is the obvious, slow canonicaliser: decode with
// encoding/json (numbers as written, duplicate keys last-wins) and encode
// again with sorted keys and the canonical string escaping.
func referenceCanonical(in []byte) ([]byte, error) {
	if !json.Valid(in) {
		return nil, errors.New("invalid JSON")
	}
	if !utf8.Valid(in) {
		return nil, errors.New("invalid UTF-8")
	}
	v, err := decodeNumbers(in)
	if err != nil {
		return nil, err
	}
	var b strings.Builder
	refEncode(&b, v)
	return []byte(b.String()), nil
}

func refEncode(b *strings.Builder, v any) {
	switch v := v.(type) {
	case nil:
		b.WriteString("null")
	case bool:
		fmt.Fprint(b, v)
	case json.Number:
		b.WriteString(string(v))
	case string:
		b.WriteString(refQuote(v))
	case []any:
		b.WriteByte('[')
		for i, x := range v {
			if i > 0 {
				b.WriteByte(',')
			}
			refEncode(b, x)
		}
		b.WriteByte(']')
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		// Sorted by the escaped key, as documented.
		slices.SortFunc(keys, func(x, y string) int { return strings.Compare(refEscape(x), refEscape(y)) })
		b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(refQuote(k))
			b.WriteByte(':')
			refEncode(b, v[k])
		}
		b.WriteByte('}')
	default:
		panic(fmt.Sprintf("unexpected %T", v))
	}
}

var refShort = map[rune]string{'"': `\"`, '\\': `\\`, '\b': `\b`, '\f': `\f`, '\n': `\n`, '\r': `\r`, '\t': `\t`}

// refQuote quotes s in the canonical escaping.
func refQuote(s string) string { return `"` + refEscape(s) + `"` }

func refEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch {
		case refShort[r] != "":
			b.WriteString(refShort[r])
		case r < 0x20:
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// surrogateEscape finds a \u escape of a UTF-16 surrogate: bodies with one
// unpaired are refused by Canonical though encoding/json accepts them.
var surrogateEscape = regexp.MustCompile(`(?i)\\ud[89a-f]`)

func FuzzCanonical(f *testing.F) {
	for _, s := range []string{
		`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"temperature":0.2}`,
		`{"b":1,"a":{"d":[1,2,{"f":null,"e":true}],"c":"x"}}`,
		`{"a":1,"a":2}`, `"\u00e9\ud83d\ude00\/\n"`, `[1.0,1e2,-0]`, `"\ud800"`, "\"\xff\"",
		` { } `, `[[[[]]]]`, `{"":0,"\u0000":1}`, `{"a\"":1,"a#":2,"a\\":3}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		got, err := respcache.Canonical(in)
		if err != nil {
			if !errors.Is(err, respcache.ErrInvalidJSON) || got != nil {
				t.Fatalf("Canonical(%q) = %q, %v; want nil, ErrInvalidJSON", in, got, err)
			}
			if json.Valid(in) && utf8.Valid(in) && !surrogateEscape.Match(in) &&
				bytes.Count(in, []byte("["))+bytes.Count(in, []byte("{")) <= respcache.MaxDepth {
				t.Fatalf("Canonical refused %q (%v), which is strict JSON", in, err)
			}
			return
		}
		checkCanonicalProperties(t, in, got)
	})
}
