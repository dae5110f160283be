package openai

import (
	"encoding/json"
	"unicode/utf8"
)

// eachMember calls f for each member of the JSON object obj, in order, with
// the member's name (unescaped, as a decoder reads it) and its raw value.
// obj must be valid JSON (json.Valid) starting with '{'; on anything else
// eachMember stops early without panicking. It allocates only for names with
// escapes or bytes that are not valid UTF-8.
func eachMember(obj []byte, f func(name string, value []byte)) {
	eachMemberRaw(obj, func(name string, _, value []byte) { f(name, value) })
}

// eachMemberRaw is eachMember that also passes the name as written (quoted,
// escapes and all).
func eachMemberRaw(obj []byte, f func(name string, rawName, value []byte)) {
	i := skipSpace(obj, 1)
	for i < len(obj) && obj[i] == '"' {
		end := skipString(obj, i)
		rawName := obj[i:end]
		name := memberName(rawName)
		i = skipSpace(obj, end)
		if i >= len(obj) || obj[i] != ':' {
			return
		}
		start := skipSpace(obj, i+1)
		end = skipValue(obj, start)
		if end > len(obj) || start >= end {
			return
		}
		f(name, rawName, obj[start:end])
		i = skipSpace(obj, end)
		if i >= len(obj) || obj[i] != ',' {
			return
		}
		i = skipSpace(obj, i+1)
	}
}

// memberName returns the string a JSON decoder reads from the quoted name q.
func memberName(q []byte) string {
	if len(q) < 2 {
		return ""
	}
	plain := true
	for _, c := range q[1 : len(q)-1] {
		if c == '\\' || c >= utf8.RuneSelf {
			plain = false
			break
		}
	}
	if plain {
		return string(q[1 : len(q)-1])
	}
	var s string
	_ = json.Unmarshal(q, &s) // valid JSON: escapes and bad UTF-8 decoded as encoding/json does
	return s
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index after the string that starts at b[i] == '"'.
func skipString(b []byte, i int) int {
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

// skipValue returns the index after the value that starts at b[i].
func skipValue(b []byte, i int) int {
	if i >= len(b) {
		return len(b)
	}
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		if end := closeOf(b, i); end >= 0 {
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

// closeOf returns the index after the object or array that starts at b[i],
// or -1 when it does not end. Strings are skipped whole, so brackets inside
// them do not count; validity is not checked.
func closeOf(b []byte, i int) int {
	depth := 0
	for ; i < len(b); i++ {
		switch b[i] {
		case '"':
			i = skipString(b, i) - 1
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
