// Package jsonscan checks JSON (Valid) and then walks it without decoding it, so the gateway reads a body's few fields with few allocations.
package jsonscan

import (
	"encoding/json"
	"strings"
	"unicode/utf8"
)

// Members calls f for each member of the JSON object obj, in order, with
// the member's name (unescaped, as a decoder reads it) and its raw value;
// both may alias obj, and are valid only during the call.
// obj must be valid JSON (json.Valid) starting with '{'; on anything else
// Members stops early without panicking. It allocates only for names with
// escapes or bytes that are not valid UTF-8.
func Members(obj []byte, f func(name, value []byte)) {
	MembersRaw(obj, func(name, _, value []byte) { f(name, value) })
}

// MembersRaw is Members that also passes the name as written (quoted,
// escapes and all).
func MembersRaw(obj []byte, f func(name, rawName, value []byte)) {
	i := SkipSpace(obj, 1)
	for i < len(obj) && obj[i] == '"' {
		end := SkipString(obj, i)
		rawName := obj[i:end]
		name := memberName(rawName)
		i = SkipSpace(obj, end)
		if i >= len(obj) || obj[i] != ':' {
			return
		}
		start := SkipSpace(obj, i+1)
		end = Skip(obj, start)
		if end > len(obj) || start >= end {
			return
		}
		f(name, rawName, obj[start:end])
		i = SkipSpace(obj, end)
		if i >= len(obj) || obj[i] != ',' {
			return
		}
		i = SkipSpace(obj, i+1)
	}
}

// memberName returns the string a JSON decoder reads from the quoted name
// q: q's own bytes when it has no escapes and is ASCII.
func memberName(q []byte) []byte {
	if len(q) < 2 {
		return nil
	}
	plain := true
	for _, c := range q[1 : len(q)-1] {
		if c == '\\' || c >= utf8.RuneSelf {
			plain = false
			break
		}
	}
	if plain {
		return q[1 : len(q)-1]
	}
	var s string
	_ = json.Unmarshal(q, &s) // valid JSON: escapes and bad UTF-8 decoded as encoding/json does
	return []byte(s)
}

// SkipSpace returns the index of the first byte at or after b[i] that is
// not JSON white space.
func SkipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// SkipString returns the index after the string that starts at b[i] == '"'.
func SkipString(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return len(b)
}

// Skip returns the index after the value that starts at b[i].
func Skip(b []byte, i int) int {
	if i >= len(b) {
		return len(b)
	}
	switch b[i] {
	case '"':
		return SkipString(b, i)
	case '{', '[':
		if end := Close(b, i); end >= 0 {
			return end
		}
		return len(b)
	}
	for ; i < len(b); i++ { // a number or a literal
		switch b[i] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return i
		}
	}
	return len(b)
}

// Close returns the index after the object or array that starts at b[i],
// or -1 when it does not end. Strings are skipped whole, so brackets inside
// them do not count; validity is not checked.
func Close(b []byte, i int) int {
	depth := 0
	for ; i < len(b); i++ {
		switch b[i] {
		case '"':
			i = SkipString(b, i) - 1
		case '{', '[':
			depth++
		case '}', ']':
			depth--
			if depth == 0 {
				return i + 1
			}
		}
	}
	return -1
}

// Elements calls f for each element of the JSON array arr, in order, with
// the element's raw value, until f returns false. arr must be valid JSON
// starting with '['; on anything else Elements stops early without
// panicking.
func Elements(arr []byte, f func(value []byte) bool) {
	if len(arr) == 0 || arr[0] != '[' {
		return
	}
	i := SkipSpace(arr, 1)
	for i < len(arr) && arr[i] != ']' {
		end := Skip(arr, i)
		if end > len(arr) || i >= end || !f(arr[i:end]) {
			return
		}
		i = SkipSpace(arr, end)
		if i >= len(arr) || arr[i] != ',' {
			return
		}
		i = SkipSpace(arr, i+1)
	}
}

// String returns the string the JSON string value v (quotes included)
// decodes to, as encoding/json decodes it; ok is false when v is not a
// string. Strings without escapes, control bytes or invalid UTF-8 are
// converted without a decoder.
func String(v []byte) (s string, ok bool) {
	if len(v) < 2 || v[0] != '"' || v[len(v)-1] != '"' {
		return "", false
	}
	if inner := v[1 : len(v)-1]; !needsDecoder(inner) && utf8.Valid(inner) {
		return string(inner), true
	}
	if json.Unmarshal(v, &s) != nil {
		return "", false
	}
	return s, true
}

// Plain returns the bytes of the JSON string v when they are its value as
// they stand (no escape to decode, valid UTF-8): a view of v, not a copy.
func Plain(v []byte) ([]byte, bool) {
	if len(v) < 2 || v[0] != '"' || v[len(v)-1] != '"' {
		return nil, false
	}
	inner := v[1 : len(v)-1]
	if needsDecoder(inner) || !utf8.Valid(inner) {
		return nil, false
	}
	return inner, true
}

// needsDecoder reports whether s has an escape, a quote or a control byte.
func needsDecoder(s []byte) bool {
	for _, c := range s {
		if c == '\\' || c == '"' || c < 0x20 {
			return true
		}
	}
	return false
}

// TrimSpace returns b without the JSON white space (space, tab, line feed,
// carriage return) around it; unlike bytes.TrimSpace it keeps other
// Unicode spaces, which make the text invalid JSON.
func TrimSpace(b []byte) []byte {
	b = b[SkipSpace(b, 0):]
	end := len(b)
	for end > 0 && (b[end-1] == ' ' || b[end-1] == '\t' || b[end-1] == '\n' || b[end-1] == '\r') {
		end--
	}
	return b[:end]
}

// FoldsTo reports whether encoding/json might decode the member name into
// one of the struct fields named fields although name is none of them
// exactly: it matches names without regard to case, with Unicode folds
// for non-ASCII names (so any non-ASCII name counts as a match). A decoder
// that matches names exactly hands such objects to encoding/json.
func FoldsTo(name []byte, fields ...string) bool {
	for _, c := range name {
		if c >= utf8.RuneSelf {
			return true
		}
	}
	for _, f := range fields {
		if len(name) == len(f) && strings.EqualFold(string(name), f) {
			return true
		}
	}
	return false
}
