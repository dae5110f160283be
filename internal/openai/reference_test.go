package openai

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"testing"

	"github.com/llmgate/llmgate/internal/jsonscan"
)

// The map-based decoder ParseRequest used before its member scanner: the
// reference the scanner must agree with.

func (w *wireRequest) decodeReference(m map[string]json.RawMessage) *Error {
	for _, f := range [...]struct {
		name string
		dst  any
	}{
		{"model", &w.Model}, {"stream", &w.Stream}, {"max_tokens", &w.MaxTokens},
		{"max_completion_tokens", &w.MaxCompletionTokens}, {"n", &w.N}, {"temperature", &w.Temperature},
	} {
		if err := decodeMemberReference(m, f.name, f.name, f.dst); err != nil {
			return err
		}
	}
	if raw := m["stream_options"]; !isNull(raw) {
		var so map[string]json.RawMessage
		if err := json.Unmarshal(raw, &so); err != nil {
			return typeError("stream_options", err)
		}
		if err := decodeMemberReference(so, "include_usage", "stream_options.include_usage", &w.IncludeUsage); err != nil {
			return err
		}
	}
	w.Messages, w.Tools, w.Functions = m["messages"], m["tools"], m["functions"]
	w.Input, w.Prompt = m["input"], m["prompt"]
	return nil
}

// decodeMemberReference decodes m[name], when present, into dst; param
// names it in the error.
func decodeMemberReference(m map[string]json.RawMessage, name, param string, dst any) *Error {
	raw, ok := m[name]
	if !ok {
		return nil
	}
	if err := json.Unmarshal(raw, dst); err != nil {
		return typeError(param, err)
	}
	return nil
}

func parseRequestReference(ep Endpoint, body []byte) (*Request, *Error) {
	trimmed := jsonscan.TrimSpace(body)
	if len(trimmed) == 0 {
		return nil, BadRequest("", "The request body is empty. The API expects a JSON object.")
	}
	if trimmed[0] != '{' {
		return nil, BadRequest("", "The request body must be a JSON object.")
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(trimmed, &m); err != nil {
		return nil, decodeError(err)
	}
	var w wireRequest
	if err := w.decodeReference(m); err != nil {
		return nil, err
	}
	w.StreamOptions = m["stream_options"]
	return w.request(ep)
}

func rewriteReference(body []byte, set map[string]json.RawMessage) ([]byte, error) {
	for key, v := range set {
		if !json.Valid(v) {
			return nil, fmt.Errorf("%w: the value for %q is not JSON", ErrRewrite, key)
		}
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, fmt.Errorf("%w: body is not a JSON object", ErrRewrite)
	}
	out := make([]byte, 0, len(body)+64)
	out = append(out, '{')
	done := make(map[string]bool, len(set))
	first := true
	for dec.More() {
		start := dec.InputOffset()
		t, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrRewrite, err)
		}
		key, _ := t.(string)
		// The key as written (the separator and spaces before it trimmed):
		// re-encoding the decoded key would change escapes and bad UTF-8.
		rawKey := bytes.TrimLeft(body[start:dec.InputOffset()], ", \t\r\n")
		var val json.RawMessage
		if err := dec.Decode(&val); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrRewrite, err)
		}
		if done[key] {
			continue // a duplicate of a key we set: drop it so ours wins everywhere
		}
		if v, ok := set[key]; ok {
			val, done[key] = v, true
		}
		out = appendMember(out, rawKey, val, first)
		first = false
	}
	// More stops at the end of the input and on a syntax error as well as at
	// the closing brace: insist on the brace and on nothing after it, so a
	// truncated body is an error and not silently completed.
	if t, err := dec.Token(); err != nil || t != json.Delim('}') {
		return nil, fmt.Errorf("%w: body is not a complete JSON object", ErrRewrite)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("%w: data after the JSON object", ErrRewrite)
	}
	for _, key := range slices.Sorted(maps.Keys(set)) { // sorted: the same input always gives the same bytes
		if !done[key] {
			out = appendMember(out, appendString(nil, key), set[key], first)
			first = false
		}
	}
	return append(out, '}'), nil
}

// FuzzRewriteMatchesReference: Rewrite gives the bytes, or the failure, the
// decoder-based version it replaced gave.
func FuzzRewriteMatchesReference(f *testing.F) {
	for _, s := range requestSeeds {
		f.Add([]byte(s), "stream_options", `{"include_usage":true}`)
	}
	for _, s := range []string{
		`{"a":1,"a":2,"b" : [1, {"c":"}"}] }`,
		`{"mod\u0065l":"x","model":"y"}`,
		` {"x":null} `,
		`{"x":1} {}`,
		`{"x":1`,
		`[1]`,
	} {
		f.Add([]byte(s), "model", `"m"`)
	}
	f.Fuzz(func(t *testing.T, body []byte, key, value string) {
		set := map[string]json.RawMessage{key: json.RawMessage(value), "model": json.RawMessage(`"upstream"`)}
		got, gerr := Rewrite(body, set)
		want, werr := rewriteReference(body, set)
		if (gerr == nil) != (werr == nil) || !bytes.Equal(got, want) {
			t.Fatalf("Rewrite = %q, %v; reference %q, %v; body %q", got, gerr, want, werr, body)
		}
	})
}

// FuzzParseRequestMatchesReference: ParseRequest reads exactly what the
// map-based decoder it replaced read, and refuses with the same error.
func FuzzParseRequestMatchesReference(f *testing.F) {
	for _, s := range requestSeeds {
		f.Add(uint8(ChatCompletions), []byte(s))
	}
	for _, s := range []string{
		`{"model":"m","messages":[],"stream":true,"STREAM":false,"stream":null}`,
		`{"mod\u0065l":"x","messages":[{"a":"}]"}],"n":2,"n":"2"}`,
		`{"model":"caf\u00e9","messages":[],"temperature":1e400}`,
		`{"model":"m","messages":[],"max_tokens":1.5}`,
		`{"model":"m","messages":[],"max_tokens":-0,"n":00}`,
		`{"model":"m","messages":[],"stream_options":"x"}`,
		`{"model":"m","messages":[],"stream_options":{"include_usage":1,"include_usage":true}}`,
		"{\"model\":\"\xff\",\"messages\":[]}",
		`{"model":"m","messages":[] ,"temperature": -0.0 , "max_tokens" : 99999999999999999999}`,
	} {
		f.Add(uint8(ChatCompletions), []byte(s))
	}
	f.Fuzz(func(t *testing.T, ep uint8, body []byte) {
		e := Endpoint(ep % 4)
		got, gerr := ParseRequest(e, body)
		want, werr := parseRequestReference(e, body)
		switch {
		case (gerr == nil) != (werr == nil):
			t.Fatalf("ParseRequest error %v, reference %v, body %q", gerr, werr, body)
		case gerr != nil:
			if gerr.Status != werr.Status || gerr.Param != werr.Param || gerr.Message != werr.Message {
				t.Fatalf("ParseRequest error %+v, reference %+v, body %q", *gerr, *werr, body)
			}
		default:
			if !sameRequest(got, want) {
				t.Fatalf("ParseRequest %+v, reference %+v, body %q", *got, *want, body)
			}
		}
	})
}

func sameRequest(a, b *Request) bool {
	floatEq := (a.Temperature == nil) == (b.Temperature == nil) &&
		(a.Temperature == nil || *a.Temperature == *b.Temperature || *a.Temperature != *a.Temperature && *b.Temperature != *b.Temperature)
	return a.Endpoint == b.Endpoint && a.Model == b.Model && a.Stream == b.Stream && a.IncludeUsage == b.IncludeUsage &&
		a.MaxTokens == b.MaxTokens && a.N == b.N && floatEq &&
		bytes.Equal(a.Messages, b.Messages) && bytes.Equal(a.Tools, b.Tools) && bytes.Equal(a.Input, b.Input) &&
		bytes.Equal(a.StreamOptions, b.StreamOptions)
}
