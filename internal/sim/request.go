package sim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/llmgate/llmgate/internal/tokens"
)

// reqError is a request the simulator refuses, in OpenAI's terms.
type reqError struct {
	status           int
	typ, code, param string
	msg              string
}

func badRequest(param, format string, args ...any) *reqError {
	return &reqError{status: http.StatusBadRequest, typ: "invalid_request_error", param: param, msg: fmt.Sprintf(format, args...)}
}

func (e *reqError) write(w http.ResponseWriter) {
	writeError(w, e.status, e.typ, e.code, e.param, e.msg)
}

// chatRequest is the part of a chat completion request the simulator
// reads; every other field is accepted and ignored.
type chatRequest struct {
	Model         string    `json:"model"`
	Messages      []message `json:"messages"`
	Stream        bool      `json:"stream"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	MaxTokens           *int64 `json:"max_tokens"`
	MaxCompletionTokens *int64 `json:"max_completion_tokens"`
	N                   *int64 `json:"n"`

	// The raw values that cost prompt tokens, for tokens.Chat.
	rawMessages, rawTools json.RawMessage
}

// promptCost holds the raw request values that tokens.Chat reads; tools
// and legacy functions both cost prompt tokens, so the simulator bills them
// although it never calls a function.
type promptCost struct {
	Messages  json.RawMessage `json:"messages"`
	Tools     json.RawMessage `json:"tools"`
	Functions json.RawMessage `json:"functions"`
}

type message struct {
	Role      string          `json:"role"`
	Content   json.RawMessage `json:"content"`
	Name      string          `json:"name"`
	ToolCalls json.RawMessage `json:"tool_calls"`
	// text is Content flattened (text parts joined) plus the tool calls' JSON.
	text string
}

var roles = map[string]bool{"system": true, "developer": true, "user": true, "assistant": true, "tool": true, "function": true}

// maxTokens is the completion cap the request asked for (0 = none):
// max_completion_tokens, else max_tokens.
func (r *chatRequest) maxTokens() int64 {
	if r.MaxCompletionTokens != nil {
		return *r.MaxCompletionTokens
	}
	if r.MaxTokens != nil {
		return *r.MaxTokens
	}
	return 0
}

func (r *chatRequest) includeUsage() bool {
	return r.StreamOptions != nil && r.StreamOptions.IncludeUsage
}

// decodeJSON decodes body into v, turning failures into OpenAI's 400s.
func decodeJSON(body []byte, v any) *reqError {
	if len(bytes.TrimSpace(body)) == 0 {
		return badRequest("", "We could not parse the JSON body of your request: the body is empty. The API expects a JSON object.")
	}
	err := json.Unmarshal(body, v)
	var te *json.UnmarshalTypeError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &te) && te.Field != "":
		return badRequest(te.Field, "Invalid type for '%s': expected %s, but got %s.", te.Field, jsonKind(te.Type.Kind().String()), te.Value)
	case errors.As(err, &te):
		return badRequest("", "We could not parse the JSON body of your request: expected a JSON object, got %s.", te.Value)
	default:
		return badRequest("", "We could not parse the JSON body of your request. The API expects a JSON payload, but what was sent was not valid JSON.")
	}
}

func jsonKind(goKind string) string {
	switch goKind {
	case "string":
		return "a string"
	case "bool":
		return "a boolean"
	case "slice":
		return "an array"
	case "struct", "map", "ptr":
		return "an object"
	default:
		return "a number"
	}
}

// parseChatRequest decodes and checks a chat completion body. It never
// panics; every failure is an OpenAI-shaped reqError.
func parseChatRequest(body []byte) (*chatRequest, *reqError) {
	var r chatRequest
	if e := decodeJSON(body, &r); e != nil {
		return nil, e
	}
	if r.Model == "" {
		return nil, badRequest("model", "you must provide a model parameter")
	}
	if len(r.Messages) == 0 {
		return nil, badRequest("messages", "[] is too short - 'messages'")
	}
	for i := range r.Messages {
		m := &r.Messages[i]
		if !roles[m.Role] {
			return nil, badRequest(fmt.Sprintf("messages.[%d].role", i), "Invalid value for 'messages[%d].role': %q; supported values are 'system', 'developer', 'user', 'assistant', 'tool' and 'function'.", i, m.Role)
		}
		text, ok := contentText(m.Content)
		if !ok {
			return nil, badRequest(fmt.Sprintf("messages.[%d].content", i), "Invalid type for 'messages[%d].content': expected a string, an array of content parts or null.", i)
		}
		if t := bytes.TrimSpace(m.ToolCalls); len(t) > 0 && !bytes.Equal(t, []byte("null")) {
			text += string(t)
		}
		m.text = text
	}
	for _, p := range []struct {
		name string
		v    *int64
	}{{"max_tokens", r.MaxTokens}, {"max_completion_tokens", r.MaxCompletionTokens}} {
		if p.v != nil && *p.v < 1 {
			return nil, badRequest(p.name, "Invalid '%s': integer below minimum value. Expected a value >= 1, but got %d instead.", p.name, *p.v)
		}
	}
	if r.N != nil && *r.N != 1 {
		return nil, badRequest("n", "The simulator only produces one choice: 'n' must be 1, got %d.", *r.N)
	}
	if r.StreamOptions != nil && !r.Stream {
		return nil, badRequest("stream_options", "The 'stream_options' parameter is only allowed when 'stream' is enabled.")
	}
	var pc promptCost
	_ = json.Unmarshal(body, &pc) // cannot fail: decodeJSON read the same body into r
	r.rawMessages, r.rawTools = pc.Messages, pc.Tools
	if len(r.rawTools) == 0 {
		r.rawTools = pc.Functions
	}
	return &r, nil
}

// contentText flattens a message content: null, a string, or an array of
// parts whose "text" fields are joined (other parts count nothing).
func contentText(raw json.RawMessage) (string, bool) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return "", true
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, true
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", false
	}
	var b strings.Builder
	for _, p := range parts {
		b.WriteString(p.Text)
	}
	return b.String(), true
}

// embeddingRequest is the part of an embeddings request the simulator reads.
type embeddingRequest struct {
	Model          string          `json:"model"`
	Input          json.RawMessage `json:"input"`
	Dimensions     *int            `json:"dimensions"`
	EncodingFormat string          `json:"encoding_format"`

	inputs []string // each input, as text (token arrays as their JSON)
	tokens int64    // prompt tokens of all inputs
}

// maxEmbeddingInputs is OpenAI's limit on inputs per request.
const maxEmbeddingInputs = 2048

func parseEmbeddingRequest(body []byte) (*embeddingRequest, *reqError) {
	var r embeddingRequest
	if e := decodeJSON(body, &r); e != nil {
		return nil, e
	}
	if r.Model == "" {
		return nil, badRequest("model", "you must provide a model parameter")
	}
	in := bytes.TrimSpace(r.Input)
	inputs, e := textInputs(in, "input", "an input", maxEmbeddingInputs, "inputs",
		"a string, an array of strings, or an array of token arrays", true)
	if e != nil {
		return nil, e
	}
	r.inputs = inputs
	if r.Dimensions != nil && (*r.Dimensions < 1 || *r.Dimensions > MaxEmbeddingDimensions) {
		return nil, badRequest("dimensions", "Invalid 'dimensions': expected a value between 1 and %d, but got %d instead.", MaxEmbeddingDimensions, *r.Dimensions)
	}
	switch r.EncodingFormat {
	case "", "float", "base64":
	default:
		return nil, badRequest("encoding_format", "Invalid value for 'encoding_format': %q; supported values are 'float' and 'base64'.", r.EncodingFormat)
	}
	r.tokens = int64(tokens.Input(r.Model, in))
	return &r, nil
}

// completionRequest is the part of a legacy completions request the
// simulator reads; every other field (echo, suffix, logprobs, stop, ...) is
// accepted and ignored.
type completionRequest struct {
	Model         string          `json:"model"`
	Prompt        json.RawMessage `json:"prompt"`
	Stream        bool            `json:"stream"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	MaxTokens *int64 `json:"max_tokens"`
	N         *int64 `json:"n"`

	prompts []string // each prompt, as text (token arrays as their JSON)
	tokens  int64    // prompt tokens of all prompts
}

// defaultCompletionMaxTokens is OpenAI's max_tokens for legacy completions.
const defaultCompletionMaxTokens = 16

// maxPrompts bounds the prompts of one completions request (one answer each).
const maxPrompts = 2048

func (r *completionRequest) maxTokens() int64 {
	if r.MaxTokens != nil {
		return *r.MaxTokens
	}
	return defaultCompletionMaxTokens
}

func (r *completionRequest) includeUsage() bool {
	return r.StreamOptions != nil && r.StreamOptions.IncludeUsage
}

// parseCompletionRequest decodes and checks a legacy completions body: a
// prompt is a string, an array of strings, an array of token ids or an
// array of token-id arrays, and each prompt gets its own choice.
func parseCompletionRequest(body []byte) (*completionRequest, *reqError) {
	var r completionRequest
	if e := decodeJSON(body, &r); e != nil {
		return nil, e
	}
	if r.Model == "" {
		return nil, badRequest("model", "you must provide a model parameter")
	}
	in := bytes.TrimSpace(r.Prompt)
	prompts, e := textInputs(in, "prompt", "a prompt", maxPrompts, "prompts",
		"a string, an array of strings, an array of tokens, or an array of token arrays", false)
	if e != nil {
		return nil, e
	}
	r.prompts = prompts
	if r.MaxTokens != nil && *r.MaxTokens < 1 {
		return nil, badRequest("max_tokens", "Invalid 'max_tokens': integer below minimum value. Expected a value >= 1, but got %d instead.", *r.MaxTokens)
	}
	if r.N != nil && *r.N != 1 {
		return nil, badRequest("n", "The simulator only produces one choice per prompt: 'n' must be 1, got %d.", *r.N)
	}
	if r.StreamOptions != nil && !r.Stream {
		return nil, badRequest("stream_options", "The 'stream_options' parameter is only allowed when 'stream' is enabled.")
	}
	r.tokens = int64(tokens.Input(r.Model, in))
	return &r, nil
}

// textInputs reads an embeddings "input" or a completions "prompt" (in,
// trimmed): a string, an array of strings, an array of token ids or an
// array of token-id arrays. Each input comes back as text, token arrays as
// their JSON. param names the field in errors; nonEmpty refuses empty
// strings (OpenAI does for embeddings, not for prompts).
func textInputs(in []byte, param, one string, most int, plural, shapes string, nonEmpty bool) ([]string, *reqError) {
	var (
		str   string
		many  []string
		toks  []int64
		toksN [][]int64
		out   []string
	)
	switch {
	case len(in) == 0 || bytes.Equal(in, []byte("null")):
		return nil, badRequest(param, "'%s' is a required property", param)
	case json.Unmarshal(in, &str) == nil:
		if nonEmpty && str == "" {
			return nil, badRequest(param, "'$.%s' is invalid: %s must not be empty.", param, one)
		}
		out = []string{str}
	case json.Unmarshal(in, &many) == nil:
		for i, s := range many {
			if nonEmpty && s == "" {
				return nil, badRequest(param, "'$.%s[%d]' is invalid: %s must not be empty.", param, i, one)
			}
		}
		out = many
	case json.Unmarshal(in, &toks) == nil:
		out = []string{string(in)}
	case json.Unmarshal(in, &toksN) == nil:
		for _, t := range toksN {
			b, _ := json.Marshal(t)
			out = append(out, string(b))
		}
	default:
		return nil, badRequest(param, "'$.%s' is invalid: expected %s.", param, shapes)
	}
	if len(out) == 0 {
		return nil, badRequest(param, "'$.%s' is invalid: the array is empty.", param)
	}
	if len(out) > most {
		return nil, badRequest(param, "'$.%s' is invalid: at most %d %s per request, got %d.", param, most, plural, len(out))
	}
	return out, nil
}
