package tokens

import (
	"bytes"
	"encoding/json"

	"github.com/llmgate/llmgate/internal/jsonscan"
)

// The chat format's overheads. OpenAI documents the first three for its
// chat models: each message is wrapped as <|start|>{role}<|message|>{content}<|end|>
// (3 tokens besides the role and the content), a name costs 1 token
// besides its text, and the reply is primed with <|start|>assistant<|message|>
// (3 tokens). The others are fitted to the recorded requests in testdata
// (see accuracy_test.go): reasoning models (o1, o3, o4, gpt-5) are billed
// one token less per request, a tool call 6 tokens besides its function's
// name and arguments (a legacy function_call 3), and a tool result is
// rendered under its function's name instead of a role.
const (
	tokensPerMessage     = 3
	tokensPerName        = 1
	tokensReply          = 3
	tokensReplyReasoning = 2
	tokensPerToolCall    = 6
	tokensPerLegacyCall  = 3
)

// maxToolCallIDsRemembered bounds the map from tool call ids to function
// names that names tool results; results of calls beyond it go unnamed.
const maxToolCallIDsRemembered = 1024

// message is the part of a chat message that costs prompt tokens.
type message struct {
	Role         string          `json:"role"`
	Content      json.RawMessage `json:"content"`
	Name         string          `json:"name"`
	ToolCalls    []toolCall      `json:"tool_calls"`
	FunctionCall *functionCall   `json:"function_call"`
	ToolCallID   string          `json:"tool_call_id"`
}

type toolCall struct {
	ID       string       `json:"id"`
	Function functionCall `json:"function"`
}

type functionCall struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// Chat estimates the prompt_tokens an OpenAI chat completion request will be billed for.
// messages is the raw JSON value of the request's "messages" array; tools is the raw "tools"
// value (nil when absent; also accept legacy "functions" through the same parameter).
// It never fails: malformed parts are counted as their raw bytes' tokens.
//
// The estimate follows OpenAI's documented chat format, renders function
// definitions the way OpenAI renders them into the prompt (a TypeScript
// namespace in the system message), counts a tool result under the name of
// the function that was called, and counts an image by OpenAI's published
// rules for detail "low" or, for other details, as a 1024×1024 image (the
// request does not say the image's size). Audio and file parts, and a
// response_format schema, are not counted.
func Chat(model string, messages, tools json.RawMessage) int {
	enc := encodingFor(model)
	base := baseModel(model)
	n := tokensReply
	if isReasoning(base) {
		n = tokensReplyReasoning
	}
	msgs, junk, ok := decodeMessages(messages)
	if !ok {
		return n + enc.count(string(messages))
	}
	for _, r := range junk {
		n += tokensPerMessage + enc.count(string(r))
	}
	withTools := hasTools(tools)
	hasSystem := false
	var callNames map[string]string // tool_call_id -> function name
	for i := range msgs {
		m := &msgs[i]
		if !hasSystem && (m.Role == "system" || m.Role == "developer") {
			hasSystem = true
			if withTools {
				// The function definitions are appended to the
				// first system message, which then ends in a newline.
				n += newlinePadding(enc, m.Content)
			}
		}
		for _, c := range m.ToolCalls {
			if c.ID != "" && len(callNames) < maxToolCallIDsRemembered {
				if callNames == nil {
					callNames = make(map[string]string, len(m.ToolCalls))
				}
				callNames[c.ID] = c.Function.Name
			}
		}
		if m.Role == "tool" {
			// A tool result is rendered under the function's name, which
			// the request only gives through the call's id.
			m.Name = callNames[m.ToolCallID]
		}
		n += messageTokens(enc, base, m)
	}
	if withTools {
		n += toolsTokens(enc, tools, hasSystem)
	}
	return n
}

// decodeMessages decodes a messages array in one pass. If some element is
// not a message object, it decodes element by element and returns the ones
// it could not read as junk, to be counted as raw bytes. ok is false if
// messages is not a JSON array at all.
func decodeMessages(messages json.RawMessage) (msgs []message, junk []json.RawMessage, ok bool) {
	if msgs, ok := scanMessages(messages); ok {
		return msgs, nil, true
	}
	if json.Unmarshal(messages, &msgs) == nil {
		return msgs, nil, true
	}
	var raw []json.RawMessage
	if json.Unmarshal(messages, &raw) != nil {
		return nil, nil, false
	}
	msgs = make([]message, 0, len(raw))
	for _, r := range raw {
		var m message
		if json.Unmarshal(r, &m) != nil {
			junk = append(junk, r)
			continue
		}
		msgs = append(msgs, m)
	}
	return msgs, junk, true
}

// scanMessages is decodeMessages without reflection for the common shape:
// an array of message objects whose role, name and tool_call_id are strings
// and that have no tool calls. ok is false for anything else, and for
// member names encoding/json would match without regard to case ("Role"):
// encoding/json decodes those. Contents are sub-slices of messages.
func scanMessages(messages []byte) (msgs []message, ok bool) {
	if len(messages) == 0 || messages[0] != '[' || !jsonscan.Valid(messages) {
		return nil, false
	}
	ok = true
	// One allocation for the usual message list: "role" once per message.
	msgs = make([]message, 0, bytes.Count(messages, []byte(`"role"`)))
	jsonscan.Elements(messages, func(el []byte) bool {
		if el[0] != '{' {
			ok = false
			return false
		}
		var m message
		jsonscan.Members(el, func(name, v []byte) {
			switch {
			case !ok:
			case string(name) == "role":
				ok = scanString(&m.Role, v)
			case string(name) == "name":
				ok = scanString(&m.Name, v)
			case string(name) == "tool_call_id":
				ok = scanString(&m.ToolCallID, v)
			case string(name) == "content":
				m.Content = v
			case string(name) == "tool_calls", string(name) == "function_call":
				ok = string(v) == "null" // null leaves them empty, as absent
			default:
				ok = !jsonscan.FoldsTo(name, messageFields[:]...)
			}
		})
		msgs = append(msgs, m)
		return ok
	})
	return msgs, ok
}

// messageFields are the JSON names of message's fields.
var messageFields = [...]string{"role", "content", "name", "tool_calls", "function_call", "tool_call_id"}

// commonRoles are the roles OpenAI defines.
var commonRoles = [...]string{"system", "user", "assistant", "tool", "developer", "function"}

// scanString sets *dst to the JSON string v as encoding/json would: null
// leaves it as it is; ok is false for any other type (a decoding error).
func scanString(dst *string, v []byte) bool {
	if string(v) == "null" {
		return true
	}
	for _, r := range commonRoles {
		if len(v) == len(r)+2 && v[0] == '"' && string(v[1:len(v)-1]) == r {
			*dst = r // the constant, not a copy per message
			return true
		}
	}
	s, ok := jsonscan.String(v)
	if ok {
		*dst = s
	}
	return ok
}

// isReasoning reports whether m is one of OpenAI's reasoning models.
func isReasoning(m string) bool {
	return len(m) >= 2 && m[0] == 'o' && m[1] >= '1' && m[1] <= '9' ||
		len(m) >= 5 && m[:5] == "gpt-5"
}

func messageTokens(enc *encoding, model string, m *message) int {
	n := tokensPerMessage + contentTokens(enc, model, m.Content)
	switch m.Role {
	case "tool", "function":
		// Rendered with the function's name in place of the role.
		n += enc.count(m.Name)
	default:
		n += enc.count(m.Role)
		if m.Name != "" {
			n += tokensPerName + enc.count(m.Name)
		}
	}
	for i := range m.ToolCalls {
		f := &m.ToolCalls[i].Function
		n += tokensPerToolCall + enc.count(f.Name) + enc.count(callArguments(enc, f.Arguments))
	}
	if f := m.FunctionCall; f != nil {
		n += tokensPerLegacyCall + enc.count(f.Name) + enc.count(f.Arguments)
	}
	return n
}

// callArguments returns a tool call's arguments as the model sees them.
// For o200k_base models OpenAI re-serialises them compactly: recorded
// requests whose arguments had spaces after the colons were billed for the
// compact form. (The recorded cl100k_base requests were billed as sent.)
func callArguments(enc *encoding, args string) string {
	if enc != o200k || !containsSpace(args) {
		return args
	}
	var b bytes.Buffer
	b.Grow(len(args))
	if json.Compact(&b, []byte(args)) != nil {
		return args
	}
	return b.String()
}

// containsSpace reports whether s contains JSON white space: without any,
// compacting changes nothing and its allocation is saved.
func containsSpace(s string) bool {
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case ' ', '\t', '\n', '\r':
			return true
		}
	}
	return false
}

// newlinePadding is what appending "\n" to a string content costs.
func newlinePadding(enc *encoding, content json.RawMessage) int {
	content = bytes.TrimSpace(content)
	if len(content) == 0 || content[0] != '"' {
		return 0
	}
	s, ok := jsonscan.String(content)
	if !ok {
		return 0
	}
	return enc.count(s+"\n") - enc.count(s)
}

// contentTokens counts a message content: null, a string, or an array of
// parts. Anything else is counted as its raw bytes.
func contentTokens(enc *encoding, model string, raw json.RawMessage) int {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return 0
	}
	switch raw[0] {
	case '"':
		if b, ok := jsonscan.Plain(raw); ok {
			return enc.countBytes(b)
		}
		if s, ok := jsonscan.String(raw); ok {
			return enc.count(s)
		}
	case '[':
		var parts []json.RawMessage
		if err := json.Unmarshal(raw, &parts); err == nil {
			n := 0
			for _, p := range parts {
				n += partTokens(enc, model, p)
			}
			return n
		}
	}
	return enc.count(string(raw))
}

type contentPart struct {
	Type     string `json:"type"`
	Text     string `json:"text"`
	Refusal  string `json:"refusal"`
	ImageURL struct {
		Detail string `json:"detail"`
	} `json:"image_url"`
}

func partTokens(enc *encoding, model string, raw json.RawMessage) int {
	var p contentPart
	if err := json.Unmarshal(raw, &p); err != nil {
		return enc.count(string(raw))
	}
	switch p.Type {
	case "text":
		return enc.count(p.Text)
	case "refusal":
		return enc.count(p.Refusal)
	case "image_url":
		return imageTokens(model, p.ImageURL.Detail)
	case "input_audio", "file":
		return 0 // billed by their decoded media, which an estimate cannot see
	}
	return enc.count(string(raw))
}
