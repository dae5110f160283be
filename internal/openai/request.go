package openai

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"unicode/utf8"

	"github.com/llmgate/llmgate/internal/jsonscan"
)

// Endpoint is an API route the gateway proxies.
type Endpoint uint8

// The proxied endpoints.
const (
	ChatCompletions Endpoint = iota + 1
	Completions
	Embeddings
	// Responses is OpenAI's Responses API (POST /v1/responses).
	Responses
	// Messages is Anthropic's Messages API (POST /v1/messages).
	Messages
)

// Path returns the endpoint's path below the API base ("/chat/completions").
func (e Endpoint) Path() string {
	switch e {
	case ChatCompletions:
		return "/chat/completions"
	case Completions:
		return "/completions"
	case Embeddings:
		return "/embeddings"
	case Responses:
		return "/responses"
	case Messages:
		return "/messages"
	}
	return ""
}

func (e Endpoint) String() string {
	switch e {
	case ChatCompletions:
		return "chat"
	case Completions:
		return "completions"
	case Embeddings:
		return "embeddings"
	case Responses:
		return "responses"
	case Messages:
		return "messages"
	}
	return "unknown"
}

// Request is what the gateway reads from a request body; the body itself is
// forwarded unchanged apart from the fields Rewrite sets.
type Request struct {
	Endpoint Endpoint
	Model    string
	Stream   bool
	// IncludeUsage is stream_options.include_usage as the client sent it;
	// always true for Responses, whose streams always end with their usage.
	IncludeUsage bool
	// MaxTokens is max_completion_tokens, else max_tokens (max_output_tokens
	// for Responses); 0 when neither.
	MaxTokens int64
	// N is the number of choices asked for (default 1).
	N int64
	// Messages and Tools are the raw chat fields (nil when absent);
	// Tools falls back to the legacy "functions".
	Messages, Tools json.RawMessage
	// Input is the embeddings or Responses "input", or the completions
	// "prompt".
	Input json.RawMessage
	// Instructions is the Responses "instructions", or the Messages
	// "system" (raw, nil when absent).
	Instructions json.RawMessage
	// PreviousResponseID is the Responses "previous_response_id" ("" when
	// absent): the response this one continues.
	PreviousResponseID string
	// Temperature is the sampling temperature, nil when absent.
	Temperature *float64
	// StreamOptions is the raw "stream_options" (nil when absent), for
	// UsageStreamOptions.
	StreamOptions json.RawMessage
}

// wireRequest holds every endpoint's fields at once; unknown fields are
// ignored (they are forwarded untouched).
type wireRequest struct {
	Model, PreviousResponseID                 *string
	Stream, IncludeUsage                      *bool
	MaxTokens, MaxCompletionTokens, N         *int64
	MaxOutputTokens                           *int64
	Instructions                              json.RawMessage
	Temperature                               *float64
	Messages, Tools, Functions, Input, Prompt json.RawMessage
	System                                    json.RawMessage
	StreamOptions                             json.RawMessage
}

// decode fills w from the members of a request object. It matches names
// exactly and not the way encoding/json matches struct fields, without
// regard to case: {"stream":true,"STREAM":false} would read as false there
// while the provider, which matches names exactly, streams (and the gateway
// would miss the stream's usage). Of duplicated names the last wins, as in
// the provider's parser; only the values kept are decoded.
func (w *wireRequest) decode(obj []byte) *Error {
	var model, stream, maxTokens, maxCompletion, maxOutput, n, temperature, previous []byte
	jsonscan.Members(obj, func(name, v []byte) {
		switch string(name) {
		case "model":
			model = v
		case "stream":
			stream = v
		case "max_tokens":
			maxTokens = v
		case "max_completion_tokens":
			maxCompletion = v
		case "max_output_tokens":
			maxOutput = v
		case "previous_response_id":
			previous = v
		case "instructions":
			w.Instructions = v
		case "system":
			w.System = v
		case "n":
			n = v
		case "temperature":
			temperature = v
		case "stream_options":
			w.StreamOptions = v
		case "messages":
			w.Messages = v
		case "tools":
			w.Tools = v
		case "functions":
			w.Functions = v
		case "input":
			w.Input = v
		case "prompt":
			w.Prompt = v
		}
	})
	if err := decodeString(model, "model", &w.Model); err != nil {
		return err
	}
	if err := decodeString(previous, "previous_response_id", &w.PreviousResponseID); err != nil {
		return err
	}
	if err := decodeBool(stream, "stream", &w.Stream); err != nil {
		return err
	}
	for _, f := range [...]struct {
		raw  []byte
		name string
		dst  **int64
	}{{maxTokens, "max_tokens", &w.MaxTokens}, {maxCompletion, "max_completion_tokens", &w.MaxCompletionTokens},
		{maxOutput, "max_output_tokens", &w.MaxOutputTokens}, {n, "n", &w.N}} {
		if err := decodeInt(f.raw, f.name, f.dst); err != nil {
			return err
		}
	}
	if err := decodeFloat(temperature, "temperature", &w.Temperature); err != nil {
		return err
	}
	if so := w.StreamOptions; !isNull(so) {
		if so[0] != '{' {
			var m map[string]json.RawMessage
			return typeError("stream_options", json.Unmarshal(so, &m))
		}
		var includeUsage []byte
		jsonscan.Members(so, func(name, v []byte) {
			if string(name) == "include_usage" {
				includeUsage = v
			}
		})
		if err := decodeBool(includeUsage, "stream_options.include_usage", &w.IncludeUsage); err != nil {
			return err
		}
	}
	return nil
}

// The decode* functions read a member's raw value (nil: absent) into dst,
// directly for the plain forms requests use, and through encoding/json
// otherwise, so that values and errors are the ones it gives.

func decodeString(raw []byte, param string, dst **string) *Error {
	if raw == nil {
		return nil
	}
	if len(raw) >= 2 && raw[0] == '"' && plainString(raw[1:len(raw)-1]) {
		s := string(raw[1 : len(raw)-1])
		*dst = &s
		return nil
	}
	return decodeJSON(raw, param, dst)
}

// plainString reports whether s needs no unescaping or UTF-8 repair.
func plainString(s []byte) bool {
	for _, c := range s {
		if c == '\\' || c == '"' || c < 0x20 || c >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

func decodeBool(raw []byte, param string, dst **bool) *Error {
	switch string(raw) {
	case "":
		return nil
	case "true", "false":
		v := raw[0] == 't'
		*dst = &v
		return nil
	case "null":
		*dst = nil
		return nil
	}
	return decodeJSON(raw, param, dst)
}

func decodeInt(raw []byte, param string, dst **int64) *Error {
	if raw == nil {
		return nil
	}
	if len(raw) <= 18 && plainDigits(raw) {
		v, err := strconv.ParseInt(string(raw), 10, 64)
		if err == nil {
			*dst = &v
			return nil
		}
	}
	return decodeJSON(raw, param, dst)
}

func plainDigits(b []byte) bool {
	if len(b) > 0 && b[0] == '-' {
		b = b[1:]
	}
	if len(b) == 0 {
		return false
	}
	for _, c := range b {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

func decodeFloat(raw []byte, param string, dst **float64) *Error {
	if raw == nil {
		return nil
	}
	if len(raw) > 0 && (raw[0] == '-' || raw[0] >= '0' && raw[0] <= '9') {
		if v, err := strconv.ParseFloat(string(raw), 64); err == nil {
			*dst = &v
			return nil
		}
	}
	return decodeJSON(raw, param, dst)
}

func decodeJSON(raw []byte, param string, dst any) *Error {
	if err := json.Unmarshal(raw, dst); err != nil {
		return typeError(param, err)
	}
	return nil
}

// typeError is the 400 for a member of the wrong type (its JSON is valid:
// it came out of a decoded object).
func typeError(param string, err error) *Error {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return BadRequest(param, "Invalid type for '%s': got %s.", param, te.Value)
	}
	return BadRequest(param, "Invalid value for '%s'.", param)
}

// ErrRewrite is returned by Rewrite for a body or value that is not JSON.
var ErrRewrite = errors.New("openai: rewrite")

// MaxChoices bounds n: it multiplies the completion estimate.
const MaxChoices = 128

// ParseRequest reads the fields the gateway needs from a body sent to ep.
// It checks only what the gateway relies on; the provider validates the rest.
func ParseRequest(ep Endpoint, body []byte) (*Request, *Error) {
	trimmed := jsonscan.TrimSpace(body)
	if len(trimmed) == 0 {
		return nil, BadRequest("", "The request body is empty. The API expects a JSON object.")
	}
	if trimmed[0] != '{' {
		return nil, BadRequest("", "The request body must be a JSON object.")
	}
	if !jsonscan.Valid(trimmed) {
		var m map[string]json.RawMessage // for the error it gives
		return nil, decodeError(json.Unmarshal(trimmed, &m))
	}
	var w wireRequest
	if err := w.decode(trimmed); err != nil {
		return nil, err
	}
	return w.request(ep)
}

// request checks what w read for a request to ep and returns it.
func (w *wireRequest) request(ep Endpoint) (*Request, *Error) {
	r := &Request{Endpoint: ep, N: 1, Temperature: w.Temperature, StreamOptions: w.StreamOptions}
	if w.Model == nil || *w.Model == "" {
		return nil, BadRequest("model", "You must provide a model parameter.")
	}
	r.Model = *w.Model
	if w.Stream != nil {
		r.Stream = *w.Stream
	}
	if w.IncludeUsage != nil {
		r.IncludeUsage = *w.IncludeUsage
	}
	for _, p := range []struct {
		name string
		v    *int64
	}{{"max_tokens", w.MaxTokens}, {"max_completion_tokens", w.MaxCompletionTokens}, {"max_output_tokens", w.MaxOutputTokens}} {
		if p.v != nil && (*p.v < 1 || *p.v > 1<<40) {
			return nil, BadRequest(p.name, "Invalid '%s': expected an integer >= 1, got %d.", p.name, *p.v)
		}
	}
	switch {
	case w.MaxCompletionTokens != nil:
		r.MaxTokens = *w.MaxCompletionTokens
	case w.MaxTokens != nil:
		r.MaxTokens = *w.MaxTokens
	}
	if w.N != nil {
		if *w.N < 1 || *w.N > MaxChoices {
			return nil, BadRequest("n", "Invalid 'n': expected an integer from 1 to %d, got %d.", MaxChoices, *w.N)
		}
		r.N = *w.N
	}
	switch ep {
	case ChatCompletions:
		if isNull(w.Messages) {
			return nil, BadRequest("messages", "Missing required parameter: 'messages'.")
		}
		if w.Messages[0] != '[' {
			return nil, BadRequest("messages", "Invalid type for 'messages': expected an array of message objects.")
		}
		r.Messages = w.Messages
		r.Tools = w.Tools
		if isNull(r.Tools) {
			r.Tools = w.Functions
		}
		if isNull(r.Tools) {
			r.Tools = nil
		}
	case Completions:
		if isNull(w.Prompt) {
			return nil, BadRequest("prompt", "Missing required parameter: 'prompt'.")
		}
		r.Input = w.Prompt
	case Embeddings:
		if isNull(w.Input) {
			return nil, BadRequest("input", "Missing required parameter: 'input'.")
		}
		if r.Stream {
			return nil, BadRequest("stream", "Embeddings cannot be streamed.")
		}
		r.Input = w.Input
	case Messages:
		if isNull(w.Messages) {
			return nil, BadRequest("messages", "messages: Field required")
		}
		if w.Messages[0] != '[' {
			return nil, BadRequest("messages", "messages: Input should be a valid list")
		}
		r.Messages, r.Tools, r.Instructions = w.Messages, nullToNil(w.Tools), nullToNil(w.System)
		r.IncludeUsage, r.N = true, 1
		r.MaxTokens = 0
		if w.MaxTokens != nil {
			r.MaxTokens = *w.MaxTokens
		}
	case Responses:
		// input may be absent: a request can continue a stored response
		// or use a stored prompt; the provider says what is missing.
		r.Input, r.Tools, r.Instructions = nullToNil(w.Input), nullToNil(w.Tools), nullToNil(w.Instructions)
		r.IncludeUsage = true
		r.N, r.MaxTokens = 1, 0
		if w.MaxOutputTokens != nil {
			r.MaxTokens = *w.MaxOutputTokens
		}
		if w.PreviousResponseID != nil {
			r.PreviousResponseID = *w.PreviousResponseID
		}
	}
	return r, nil
}

func nullToNil(raw json.RawMessage) json.RawMessage {
	if isNull(raw) {
		return nil
	}
	return raw
}

func isNull(raw json.RawMessage) bool {
	return len(raw) == 0 || string(raw) == "null"
}

// decodeError turns a JSON decoding failure into a 400 naming the field.
func decodeError(err error) *Error {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) && te.Field != "" {
		return BadRequest(te.Field, "Invalid type for '%s': got %s.", te.Field, te.Value)
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return BadRequest("", "We could not parse the JSON body of your request (syntax error at byte %d). The API expects a JSON object.", se.Offset)
	}
	return BadRequest("", "We could not parse the JSON body of your request. The API expects a JSON object.")
}

// Rewrite returns body with the top-level fields in set replaced or added
// (values are raw JSON). Other fields, their order and their bytes are kept
// (not the spaces between them). A field of set that body has more than once
// keeps the first place and only the new value. The error is ErrRewrite when
// body is not one complete JSON object or a value in set is not JSON.
func Rewrite(body []byte, set map[string]json.RawMessage) ([]byte, error) {
	for key, v := range set {
		if !jsonscan.Valid(v) {
			return nil, fmt.Errorf("%w: the value for %q is not JSON", ErrRewrite, key)
		}
	}
	obj := jsonscan.TrimSpace(body)
	if len(obj) == 0 || obj[0] != '{' {
		return nil, fmt.Errorf("%w: body is not a JSON object", ErrRewrite)
	}
	if !jsonscan.Valid(obj) {
		return nil, fmt.Errorf("%w: body is not one complete JSON object", ErrRewrite)
	}
	out := make([]byte, 0, len(obj)+64)
	out = append(out, '{')
	var done map[string]bool
	first := true
	jsonscan.MembersRaw(obj, func(name, rawKey, val []byte) {
		key := string(name)
		if done[key] {
			return // a duplicate of a key we set: drop it so ours wins everywhere
		}
		if v, ok := set[key]; ok {
			if done == nil {
				done = make(map[string]bool, len(set))
			}
			val, done[key] = v, true
		}
		// The key as written: re-encoding the decoded key would change
		// escapes and bad UTF-8.
		out = appendMember(out, rawKey, val, first)
		first = false
	})
	for _, key := range slices.Sorted(maps.Keys(set)) { // sorted: the same input always gives the same bytes
		if !done[key] {
			out = appendMember(out, appendString(nil, key), set[key], first)
			first = false
		}
	}
	return append(out, '}'), nil
}

func appendMember(out, key []byte, val json.RawMessage, first bool) []byte {
	if !first {
		out = append(out, ',')
	}
	out = append(out, key...)
	out = append(out, ':')
	return append(out, val...)
}

// StreamOptionsWithUsage returns the stream_options value to send upstream
// so that the provider reports usage at the end of a stream: the client's
// own options (raw, may be nil) with include_usage set to true.
func StreamOptionsWithUsage(body []byte) (json.RawMessage, error) {
	body = jsonscan.TrimSpace(body)
	if len(body) == 0 || body[0] != '{' || !jsonscan.Valid(body) {
		return nil, errors.New("openai: stream options: the body is not a JSON object")
	}
	var so []byte // names match exactly, the last of duplicates wins: as upstream
	jsonscan.Members(body, func(name, v []byte) {
		if string(name) == "stream_options" {
			so = v
		}
	})
	return UsageStreamOptions(so)
}

// UsageStreamOptions is StreamOptionsWithUsage for a request already
// parsed: so is its Request.StreamOptions.
func UsageStreamOptions(so json.RawMessage) (json.RawMessage, error) {
	if isNull(so) {
		return json.RawMessage(`{"include_usage":true}`), nil
	}
	return Rewrite(so, map[string]json.RawMessage{"include_usage": json.RawMessage("true")})
}
