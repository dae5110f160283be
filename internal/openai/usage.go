package openai

import (
	"bytes"
	"encoding/json"

	"github.com/llmgate/llmgate/internal/jsonscan"
)

// Usage is the token usage a provider reports in an answer.
type Usage struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
	TotalTokens      int64 `json:"total_tokens"`
	// PromptTokensDetails.CachedTokens is the part of the prompt served
	// from the provider's prompt cache.
	PromptTokensDetails *struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"prompt_tokens_details,omitempty"`
}

// Cached returns the cached prompt tokens (0 when not reported).
func (u *Usage) Cached() int64 {
	if u.PromptTokensDetails == nil {
		return 0
	}
	return u.PromptTokensDetails.CachedTokens
}

// valid reports whether the counts are usable for accounting.
func (u *Usage) valid() bool {
	return u.PromptTokens >= 0 && u.CompletionTokens >= 0 && u.Cached() >= 0 &&
		u.PromptTokens < 1<<40 && u.CompletionTokens < 1<<40 && u.Cached() <= u.PromptTokens
}

// ParseUsage returns the "usage" of a JSON answer (chat, completions,
// embeddings or Responses, whose input_tokens and output_tokens are read as
// prompt and completion tokens), or nil when it has none or it cannot be
// read.
func ParseUsage(body []byte) *Usage {
	if !jsonscan.Valid(body) {
		return nil
	}
	if u := lastUsage(body); u != nil {
		return u
	}
	var w struct {
		Usage *wireUsage `json:"usage"`
	}
	if err := json.Unmarshal(body, &w); err != nil || w.Usage == nil {
		return nil
	}
	u := w.Usage.usage()
	if !u.valid() {
		return nil
	}
	return u
}

// wireUsage is a usage object as encoding/json reads it: the chat names
// and the Responses ones (input_tokens, output_tokens).
type wireUsage struct {
	Usage
	InputTokens        *int64 `json:"input_tokens"`
	OutputTokens       *int64 `json:"output_tokens"`
	InputTokensDetails *struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"input_tokens_details"`
}

// usage folds the Responses names into the chat ones.
func (w *wireUsage) usage() *Usage {
	u := w.Usage
	if w.InputTokens != nil {
		u.PromptTokens = *w.InputTokens
	}
	if w.OutputTokens != nil {
		u.CompletionTokens = *w.OutputTokens
	}
	if w.InputTokensDetails != nil && u.PromptTokensDetails == nil {
		u.PromptTokensDetails = &struct {
			CachedTokens int64 `json:"cached_tokens"`
		}{w.InputTokensDetails.CachedTokens}
	}
	return &u
}

// Chunk is what the gateway learns from one SSE data payload of a stream.
type Chunk struct {
	// Done is the "[DONE]" sentinel.
	Done bool
	// Usage is the chunk's usage when it carries one (the final chunk of a
	// stream asked for with include_usage).
	Usage *Usage
	// UsageOnly is set when the chunk exists only to carry usage (its
	// "choices" array is empty): a client that did not ask for usage must
	// not see it.
	UsageOnly bool
	// Content reports whether the chunk carries generated output (a
	// content, text, refusal or tool-call delta); such chunks are counted
	// when a stream ends before the provider reported its usage.
	Content bool
}

var (
	doneData = []byte("[DONE]")
	usageKey = []byte(`"usage"`)
	// contentKeys name the deltas that carry generated output.
	contentKeys = [][]byte{[]byte(`"content"`), []byte(`"text"`), []byte(`"refusal"`), []byte(`"arguments"`)}
)

// ParseChunk inspects one SSE data payload. Only chunks whose usage is an
// object are decoded; the others are scanned, so the pass-through stays
// cheap even though every chunk of an include_usage stream has "usage":null.
func ParseChunk(data []byte) Chunk {
	data = bytes.TrimSpace(data)
	if bytes.Equal(data, doneData) {
		return Chunk{Done: true}
	}
	var c Chunk
	for _, k := range contentKeys {
		if hasMember(data, k, isNonEmptyString) {
			c.Content = true
			break
		}
	}
	if !hasMember(data, usageKey, isObject) {
		return c
	}
	var w struct {
		Choices []json.RawMessage `json:"choices"`
		Usage   *Usage            `json:"usage"`
	}
	if err := json.Unmarshal(data, &w); err != nil || w.Usage == nil || !w.Usage.valid() {
		return c
	}
	c.Usage = w.Usage
	c.UsageOnly = len(w.Choices) == 0
	return c
}

// hasMember reports whether some `key: value` in data has a value for which
// ok, given the bytes from the value on, is true. It looks at every
// occurrence (one choice may have an empty delta and the next a full one) and
// allows whitespace around the colon, as providers that pretty-print send.
// A quoted key can only match outside JSON strings: inside them quotes are
// escaped.
func hasMember(data, key []byte, ok func(value []byte) bool) bool {
	for { // bounded: every round drops at least len(key) bytes
		i := bytes.Index(data, key)
		if i < 0 {
			return false
		}
		data = data[i+len(key):]
		v := bytes.TrimLeft(data, jsonSpace)
		if len(v) > 0 && v[0] == ':' && ok(bytes.TrimLeft(v[1:], jsonSpace)) {
			return true
		}
	}
}

const jsonSpace = " \t\r\n"

func isNonEmptyString(v []byte) bool { return len(v) > 1 && v[0] == '"' && v[1] != '"' }

func isObject(v []byte) bool { return len(v) > 0 && v[0] == '{' }

// lastUsage decodes the last "usage" object of an answer without decoding
// the rest: providers put usage last, and a key can only appear unescaped
// as a key (inside strings its quotes are escaped). nil means: not found
// this way, decode the whole answer.
func lastUsage(body []byte) *Usage {
	i := bytes.LastIndex(body, usageKey)
	if i <= 0 || body[i-1] == '\\' {
		return nil
	}
	v := bytes.TrimLeft(body[i+len(usageKey):], jsonSpace)
	if len(v) == 0 || v[0] != ':' {
		return nil
	}
	v = bytes.TrimLeft(v[1:], jsonSpace)
	if !isObject(v) {
		return nil
	}
	end := objectEnd(v)
	if end < 0 {
		return nil
	}
	u, ok := scanUsage(v[:end])
	if !ok {
		var w wireUsage
		if json.Unmarshal(v[:end], &w) != nil {
			return nil
		}
		u = w.usage()
	}
	if !u.valid() {
		return nil
	}
	return u
}

// scanUsage decodes a usage object (valid JSON) without reflection when its
// counts are plain integers under their exact names; ok is false for
// anything else, which encoding/json then decodes (it also matches names
// without regard to case, and has its own errors).
func scanUsage(obj []byte) (u *Usage, ok bool) {
	u, ok = new(Usage), true
	jsonscan.Members(obj, func(name, v []byte) {
		switch {
		case !ok:
		case string(name) == "prompt_tokens", string(name) == "input_tokens":
			ok = scanCount(&u.PromptTokens, v)
		case string(name) == "completion_tokens", string(name) == "output_tokens":
			ok = scanCount(&u.CompletionTokens, v)
		case string(name) == "total_tokens":
			ok = scanCount(&u.TotalTokens, v)
		case string(name) == "prompt_tokens_details", string(name) == "input_tokens_details":
			if string(v) == "null" {
				u.PromptTokensDetails = nil
				return
			}
			if v[0] != '{' {
				ok = false
				return
			}
			if u.PromptTokensDetails == nil {
				u.PromptTokensDetails = &struct {
					CachedTokens int64 `json:"cached_tokens"`
				}{}
			}
			jsonscan.Members(v, func(name, v []byte) {
				switch {
				case !ok:
				case string(name) == "cached_tokens":
					ok = scanCount(&u.PromptTokensDetails.CachedTokens, v)
				default:
					ok = !jsonscan.FoldsTo(name, "cached_tokens")
				}
			})
		default:
			ok = !jsonscan.FoldsTo(name, "prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details",
				"input_tokens", "output_tokens", "input_tokens_details")
		}
	})
	return u, ok
}

// scanCount reads a plain non-negative integer (null leaves dst as it is).
func scanCount(dst *int64, v []byte) bool {
	if string(v) == "null" {
		return true
	}
	if len(v) == 0 || len(v) > 18 {
		return false
	}
	var n int64
	for _, c := range v {
		if c < '0' || c > '9' {
			return false
		}
		n = n*10 + int64(c-'0')
	}
	*dst = n
	return true
}

// objectEnd returns the length of the JSON object v starts with, or -1 when
// it does not end; validity is left to the decoder.
func objectEnd(v []byte) int { return jsonscan.Close(v, 0) }
