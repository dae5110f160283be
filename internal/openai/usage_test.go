package openai

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"
)

// Real answers and stream chunks as OpenAI sends them.
const (
	chatAnswer = `{
  "id": "chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG",
  "object": "chat.completion",
  "created": 1741570283,
  "model": "gpt-4o-2024-08-06",
  "choices": [
    {
      "index": 0,
      "message": {
        "role": "assistant",
        "content": "The image shows a wooden boardwalk path running through a lush green field or meadow.",
        "refusal": null,
        "annotations": []
      },
      "logprobs": null,
      "finish_reason": "stop"
    }
  ],
  "usage": {
    "prompt_tokens": 1117,
    "completion_tokens": 46,
    "total_tokens": 1163,
    "prompt_tokens_details": {
      "cached_tokens": 1024,
      "audio_tokens": 0
    },
    "completion_tokens_details": {
      "reasoning_tokens": 0,
      "audio_tokens": 0,
      "accepted_prediction_tokens": 0,
      "rejected_prediction_tokens": 0
    }
  },
  "service_tier": "default",
  "system_fingerprint": "fp_fc9f1d7035"
}`
	embeddingsAnswer  = `{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.0023064255,-0.009327292,-0.0028842222]}],"model":"text-embedding-3-small","usage":{"prompt_tokens":8,"total_tokens":8}}`
	completionsAnswer = `{"id":"cmpl-uqkvlQyYK7bGYrRHQ0eXlWi7","object":"text_completion","created":1589478378,"model":"gpt-3.5-turbo-instruct","system_fingerprint":"fp_44709d6fcb","choices":[{"text":"\n\nThis is indeed a test","index":0,"logprobs":null,"finish_reason":"length"}],"usage":{"prompt_tokens":5,"completion_tokens":7,"total_tokens":12}}`

	chunkHead      = `{"id":"chatcmpl-123","object":"chat.completion.chunk","created":1694268190,"model":"gpt-4o-mini","system_fingerprint":"fp_44709d6fcb",`
	chunkRole      = chunkHead + `"choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null},"logprobs":null,"finish_reason":null}],"usage":null}`
	chunkContent   = chunkHead + `"choices":[{"index":0,"delta":{"content":"Hello"},"logprobs":null,"finish_reason":null}],"usage":null}`
	chunkFinish    = chunkHead + `"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}],"usage":null}`
	chunkUsageOnly = chunkHead + `"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":12,"total_tokens":21,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}}}`
	chunkRefusal   = chunkHead + `"choices":[{"index":0,"delta":{"refusal":"I'm sorry"},"logprobs":null,"finish_reason":null}]}`
	chunkToolStart = chunkHead + `"choices":[{"index":0,"delta":{"role":"assistant","content":null,"tool_calls":[{"index":0,"id":"call_DdmO9pD3xa9XTPNJ32zg2hcA","type":"function","function":{"name":"get_current_weather","arguments":""}}]},"logprobs":null,"finish_reason":null}]}`
	chunkToolArgs  = chunkHead + `"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"location\":"}}]},"logprobs":null,"finish_reason":null}]}`
	chunkFuncArgs  = chunkHead + `"choices":[{"index":0,"delta":{"function_call":{"arguments":"{\n"}},"finish_reason":null}]}`
	chunkText      = `{"id":"cmpl-7iA7iJjj8V2zOkCGvWF2hAkDWBQZe","object":"text_completion","created":1690759702,"choices":[{"text":"This","index":0,"logprobs":null,"finish_reason":null}],"model":"gpt-3.5-turbo-instruct","system_fingerprint":"fp_44709d6fcb"}`
	chunkLogprobs  = chunkHead + `"choices":[{"index":0,"delta":{},"logprobs":{"content":[{"token":"Hi","logprob":-0.1,"bytes":[72,105],"top_logprobs":[]}],"refusal":null},"finish_reason":null}]}`
)

func usage(prompt, completion, total, cached int64) *Usage {
	u := &Usage{PromptTokens: prompt, CompletionTokens: completion, TotalTokens: total}
	if cached >= 0 {
		u.PromptTokensDetails = &struct {
			CachedTokens int64 `json:"cached_tokens"`
		}{cached}
	}
	return u
}

func TestParseUsage(t *testing.T) {
	for _, tc := range []struct {
		name string
		body string
		want *Usage
	}{
		{"chat", chatAnswer, usage(1117, 46, 1163, 1024)},
		{"embeddings", embeddingsAnswer, usage(8, 0, 8, -1)},
		{"completions", completionsAnswer, usage(5, 7, 12, -1)},
		{"stream usage chunk", chunkUsageOnly, usage(9, 12, 21, 0)},
		{"cached equals prompt", `{"usage":{"prompt_tokens":5,"prompt_tokens_details":{"cached_tokens":5}}}`, usage(5, 0, 0, 5)},
		{"null details", `{"usage":{"prompt_tokens":5,"prompt_tokens_details":null}}`, usage(5, 0, 0, -1)},
		{"no usage", `{"id":"x","choices":[]}`, nil},
		{"null usage", chunkContent, nil},
		{"usage not an object", `{"usage":5}`, nil},
		{"negative", `{"usage":{"prompt_tokens":-1,"completion_tokens":3}}`, nil},
		{"negative completion", `{"usage":{"prompt_tokens":1,"completion_tokens":-3}}`, nil},
		{"too large", `{"usage":{"prompt_tokens":1099511627776,"completion_tokens":3}}`, nil},
		{"too large completion", `{"usage":{"prompt_tokens":1,"completion_tokens":1099511627776}}`, nil},
		{"cached over prompt", `{"usage":{"prompt_tokens":5,"prompt_tokens_details":{"cached_tokens":6}}}`, nil},
		{"negative cached", `{"usage":{"prompt_tokens":5,"prompt_tokens_details":{"cached_tokens":-1}}}`, nil},
		{"fraction", `{"usage":{"prompt_tokens":1.5}}`, nil},
		{"string count", `{"usage":{"prompt_tokens":"5"}}`, nil},
		{"invalid JSON", `{"usage":{"prompt_tokens":5}`, nil},
		{"empty", ``, nil},
		{"SSE, not JSON", "data: " + chunkUsageOnly + "\n\n", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := ParseUsage([]byte(tc.body))
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("ParseUsage = %s, want %s", fmtUsage(got), fmtUsage(tc.want))
			}
		})
	}
}

func fmtUsage(u *Usage) string {
	if u == nil {
		return "nil"
	}
	b, _ := json.Marshal(u)
	return string(b)
}

func TestUsageCached(t *testing.T) {
	if got := usage(10, 1, 11, -1).Cached(); got != 0 {
		t.Errorf("Cached without details = %d", got)
	}
	if got := usage(10, 1, 11, 7).Cached(); got != 7 {
		t.Errorf("Cached = %d, want 7", got)
	}
}

func TestParseChunk(t *testing.T) {
	for _, tc := range []struct {
		name string
		data string
		want Chunk
	}{
		{"done", `[DONE]`, Chunk{Done: true}},
		{"done with spaces", " [DONE]\r\n", Chunk{Done: true}},
		{"role only, empty content", chunkRole, Chunk{}},
		{"content", chunkContent, Chunk{Content: true}},
		{"finish", chunkFinish, Chunk{}},
		{"usage only", chunkUsageOnly, Chunk{Usage: usage(9, 12, 21, 0), UsageOnly: true}},
		{"usage only without choices", `{"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}`, Chunk{Usage: usage(1, 2, 3, -1), UsageOnly: true}},
		{"usage with choices", `{"choices":[{"index":0,"delta":{"content":"x"}}],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}`,
			Chunk{Content: true, Usage: usage(1, 2, 3, -1)}},
		{"invalid usage ignored", chunkHead + `"choices":[],"usage":{"prompt_tokens":-1,"completion_tokens":2}}`, Chunk{}},
		{"broken usage JSON", `{"choices":[],"usage":{"prompt_tokens":1`, Chunk{}},
		{"refusal", chunkRefusal, Chunk{Content: true}},
		{"tool call start, empty arguments", chunkToolStart, Chunk{}},
		{"tool call arguments", chunkToolArgs, Chunk{Content: true}},
		{"legacy function_call arguments", chunkFuncArgs, Chunk{Content: true}},
		{"completions text", chunkText, Chunk{Content: true}},
		{"completions empty text", `{"choices":[{"text":"","index":0,"finish_reason":"stop"}]}`, Chunk{}},
		{"logprobs content array", chunkLogprobs, Chunk{}},
		{"null content", `{"choices":[{"delta":{"content":null}}]}`, Chunk{}},
		{"escaped first character", `{"choices":[{"delta":{"content":"\n"}}]}`, Chunk{Content: true}},
		{"escaped quote", `{"choices":[{"delta":{"content":"\"quoted\""}}]}`, Chunk{Content: true}},
		// Providers that pretty-print (Python's json.dumps) put spaces
		// around the colon.
		{"space after colon", `{"choices": [{"delta": {"content": "Hello"}}], "usage": null}`, Chunk{Content: true}},
		{"spaces around colon", "{\"choices\":[{\"delta\":{\"content\" :\n\t\"Hi\"}}]}", Chunk{Content: true}},
		{"spaced usage", `{"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}}`,
			Chunk{Usage: usage(3, 4, 7, -1), UsageOnly: true}},
		{"spaced empty content", `{"choices": [{"delta": {"role": "assistant", "content": ""}}]}`, Chunk{}},
		// n > 1: one choice's delta may be empty while another's is not.
		{"second choice has content", `{"choices":[{"index":0,"delta":{"content":""}},{"index":1,"delta":{"content":"x"}}]}`, Chunk{Content: true}},
		{"second key has content", `{"choices":[{"index":0,"delta":{"content":"","refusal":""}},{"index":1,"delta":{"refusal":"no"}}]}`, Chunk{Content: true}},
		// A string that quotes JSON is not a key.
		{"key inside a string", `{"choices":[{"delta":{"content":""}}],"note":"\"content\":\"y\", \"usage\":{\"prompt_tokens\":1}"}`, Chunk{}},
		{"key as a value", `{"type":"content","kind":"text"}`, Chunk{}},
		{"content at the end", `{"content":"`, Chunk{}},
		{"empty", ``, Chunk{}},
		{"not JSON", `: keep-alive`, Chunk{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := ParseChunk([]byte(tc.data))
			if got.Done != tc.want.Done || got.UsageOnly != tc.want.UsageOnly || got.Content != tc.want.Content ||
				!reflect.DeepEqual(got.Usage, tc.want.Usage) {
				t.Fatalf("ParseChunk = {Done:%v UsageOnly:%v Content:%v Usage:%s}, want {Done:%v UsageOnly:%v Content:%v Usage:%s}",
					got.Done, got.UsageOnly, got.Content, fmtUsage(got.Usage),
					tc.want.Done, tc.want.UsageOnly, tc.want.Content, fmtUsage(tc.want.Usage))
			}
		})
	}
}

// contentOracle reports whether valid JSON data has a member named exactly
// (as written, without escapes) content, text, refusal or arguments whose
// value is a non-empty string. ParseChunk must find every such member.
func contentOracle(data []byte) bool {
	type frame struct{ object, wantKey bool }
	var stack []frame
	dec := json.NewDecoder(bytes.NewReader(data))
	plainKey, found := false, false
	for range len(data) + 1 { // every round consumes a token of at least one byte
		off := dec.InputOffset()
		tok, err := dec.Token()
		if err != nil {
			return found
		}
		if n := len(stack); n > 0 && stack[n-1].wantKey {
			if _, ok := tok.(string); ok {
				switch string(bytes.TrimLeft(data[off:dec.InputOffset()], ", \t\r\n")) {
				case `"content"`, `"text"`, `"refusal"`, `"arguments"`:
					plainKey = true
				}
				stack[n-1].wantKey = false
				continue
			}
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, frame{object: true, wantKey: true})
			plainKey = false
			continue
		case json.Delim('['):
			stack = append(stack, frame{})
			plainKey = false
			continue
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
		default:
			if s, ok := tok.(string); ok && plainKey && s != "" {
				found = true
			}
		}
		plainKey = false
		if n := len(stack); n > 0 && stack[n-1].object {
			stack[n-1].wantKey = true // a value ended: a key or '}' comes next
		}
	}
	return found
}

func TestContentOracle(t *testing.T) {
	for data, want := range map[string]bool{
		chunkContent: true, chunkRole: false, chunkToolArgs: true, chunkToolStart: false, chunkLogprobs: false,
		`{"a":{"b":[{"text":"x"}]}}`: true, `{"text":["x"]}`: false, `{"x":"text","y":"content"}`: false,
		`{"c\u006fntent":"x"}`: false, `{"a":[1,{"refusal":""}],"refusal":"no"}`: true,
	} {
		if got := contentOracle([]byte(data)); got != want {
			t.Errorf("contentOracle(%s) = %v, want %v", data, got, want)
		}
	}
}

// FuzzParseChunk: never panics, and what it reports agrees with a full
// decode of the payload.
func FuzzParseChunk(f *testing.F) {
	for _, s := range []string{
		`[DONE]`, ` [DONE] `, chunkRole, chunkContent, chunkFinish, chunkUsageOnly, chunkRefusal, chunkToolStart,
		chunkToolArgs, chunkFuncArgs, chunkText, chunkLogprobs, chatAnswer, embeddingsAnswer,
		`{"choices": [{"delta": {"content": "Hello"}}], "usage": null}`,
		`{"choices":[{"index":0,"delta":{"content":""}},{"index":1,"delta":{"content":"x"}}]}`,
		`{"choices":[],"usage":{"prompt_tokens":-1}}`, `{"choices":[],"usage":{"prompt_tokens":1`,
		`{"say \"content":"x"}`, `{"content":"`, `"content":"x"`, ``, "\xff",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c := ParseChunk(data)
		if c.Done != bytes.Equal(bytes.TrimSpace(data), []byte("[DONE]")) {
			t.Fatalf("Done = %v for %q", c.Done, data)
		}
		if c.Done && (c.Usage != nil || c.UsageOnly || c.Content) {
			t.Fatalf("[DONE] with more: %+v", c)
		}
		if c.UsageOnly && c.Usage == nil {
			t.Fatalf("UsageOnly without Usage for %q", data)
		}
		if c.Usage != nil {
			if !c.Usage.valid() {
				t.Fatalf("invalid usage %s from %q", fmtUsage(c.Usage), data)
			}
			// ParseUsage reads the same usage.
			if u := ParseUsage(data); !reflect.DeepEqual(u, c.Usage) {
				t.Fatalf("ParseChunk usage %s, ParseUsage %s for %q", fmtUsage(c.Usage), fmtUsage(u), data)
			}
			var w struct {
				Choices []json.RawMessage `json:"choices"`
			}
			if err := json.Unmarshal(data, &w); err != nil || c.UsageOnly != (len(w.Choices) == 0) {
				t.Fatalf("UsageOnly %v, %d choices (%v) in %q", c.UsageOnly, len(w.Choices), err, data)
			}
		}
		if !json.Valid(data) {
			return
		}
		if contentOracle(data) && !c.Content {
			t.Fatalf("Content not detected in %q", data)
		}
		// A usage object written plainly at the top level is always read.
		trimmed := bytes.TrimSpace(data)
		if trimmed[0] != '{' {
			return
		}
		ms, _ := members(t, trimmed)
		for _, m := range ms {
			if m.key != `"usage"` || m.val[0] != '{' {
				continue
			}
			var w struct {
				Choices []json.RawMessage `json:"choices"`
				Usage   *Usage            `json:"usage"`
			}
			if json.Unmarshal(data, &w) == nil && w.Usage != nil && w.Usage.valid() && c.Usage == nil {
				t.Fatalf("usage %s missed in %q", fmtUsage(w.Usage), data)
			}
		}
	})
}

func TestObjectEnd(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int
	}{
		{`{}`, 2},
		{`{"a":1} tail`, 7},
		{`{"a":{"b":[1,{"c":2}]}},`, 23},
		{`{"a":"}{\"}"}x`, 13},
		{`{"a":1`, -1},
		{`{"a":"\\"}x`, 10},
	} {
		if got := objectEnd([]byte(tc.in)); got != tc.want {
			t.Errorf("objectEnd(%q) = %d, want %d", tc.in, got, tc.want)
		}
	}
}

// FuzzScanUsage checks the reflection-free usage decoder against
// encoding/json: whenever it accepts an object, encoding/json must decode
// the same counts from it.
func FuzzScanUsage(f *testing.F) {
	for _, s := range []string{
		`{"prompt_tokens":57,"completion_tokens":10,"total_tokens":67,"prompt_tokens_details":{"cached_tokens":3,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0}}`,
		`{"prompt_tokens":1,"Prompt_Tokens":2}`, `{"prompt_tokens":null,"prompt_tokens_details":null}`,
		`{"prompt_tokens_details":{"cached_tokens":1},"prompt_tokens_details":{"audio_tokens":2}}`,
		`{"prompt_tokens":-1}`, `{"prompt_tokens":1e3}`, `{"prompt_tokens":"5"}`, `{"ſrompt_tokens":4}`,
		`{"prompt_tokens_details":{"CACHED_TOKENS":2}}`, `{}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, obj []byte) {
		if len(obj) == 0 || obj[0] != '{' || !json.Valid(obj) {
			return
		}
		got, ok := scanUsage(obj)
		if !ok {
			return
		}
		var want Usage
		if err := json.Unmarshal(obj, &want); err != nil {
			t.Fatalf("scanUsage accepted %s, encoding/json: %v", obj, err)
		}
		if got.PromptTokens != want.PromptTokens || got.CompletionTokens != want.CompletionTokens ||
			got.TotalTokens != want.TotalTokens || (got.PromptTokensDetails == nil) != (want.PromptTokensDetails == nil) ||
			got.Cached() != want.Cached() {
			t.Fatalf("%s: %+v, encoding/json %+v", obj, *got, want)
		}
	})
}
