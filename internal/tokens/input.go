package tokens

import (
	"bytes"
	"encoding/json"

	"github.com/llmgate/llmgate/internal/jsonscan"
)

// Input estimates the tokens of an embeddings "input" or a completions "prompt" value:
// a string, an array of strings, an array of token ids, or an array of token-id arrays.
//
// Strings cost their tokens and token ids one each; nothing is added per
// item, as OpenAI bills these endpoints. A value of any other shape is
// counted as the tokens of its raw bytes.
func Input(model string, input json.RawMessage) int {
	enc := encodingFor(model)
	input = bytes.TrimSpace(input)
	if len(input) == 0 || bytes.Equal(input, []byte("null")) {
		return 0
	}
	switch input[0] {
	case '"':
		var s string
		if json.Unmarshal(input, &s) == nil {
			return enc.count(s)
		}
	case '[':
		if n, ok := countNumbers(input); ok {
			return n
		}
		var items []json.RawMessage
		if json.Unmarshal(input, &items) == nil {
			n := 0
			for _, it := range items {
				n += inputItem(enc, it)
			}
			return n
		}
	}
	return enc.count(string(input))
}

// inputItem counts one element of an input array: a string, a token id, or
// an array of token ids.
func inputItem(enc *encoding, raw json.RawMessage) int {
	if len(raw) == 0 {
		return 0
	}
	switch c := raw[0]; {
	case c == '"':
		var s string
		if json.Unmarshal(raw, &s) == nil {
			return enc.count(s)
		}
	case c == '-' || c >= '0' && c <= '9':
		return 1
	case c == '[':
		if n, ok := countNumbers(raw); ok {
			return n
		}
	}
	return enc.count(string(raw))
}

// countNumbers counts the elements of a flat JSON array of numbers without
// decoding them: a prompt may hold a hundred thousand token ids.
func countNumbers(raw json.RawMessage) (int, bool) {
	inner := bytes.TrimSpace(raw[1:])
	if len(inner) == 0 || inner[len(inner)-1] != ']' {
		return 0, false
	}
	inner = inner[:len(inner)-1]
	n, empty := 0, true
	for _, c := range inner {
		switch {
		case c == ',':
			n++
		case c >= '0' && c <= '9', c == '-', c == '+', c == '.', c == 'e', c == 'E':
			empty = false
		case c == ' ', c == '\t', c == '\n', c == '\r':
		default:
			return 0, false
		}
	}
	if empty {
		return 0, n == 0
	}
	return n + 1, jsonscan.Valid(raw)
}
