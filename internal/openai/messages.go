package openai

import (
	"encoding/json"

	"github.com/llmgate/llmgate/internal/jsonscan"
)

// Anthropic's Messages API reports usage its own way: input_tokens leaves
// out the prompt read from or written to its cache, which it counts in
// cache_read_input_tokens and cache_creation_input_tokens. The gateway's
// Usage counts the whole prompt, as OpenAI does, with the cache reads as
// its cached part.

// messagesUsage is a Messages usage object; nil counts are absent.
type messagesUsage struct {
	InputTokens              *int64 `json:"input_tokens"`
	OutputTokens             *int64 `json:"output_tokens"`
	CacheCreationInputTokens *int64 `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     *int64 `json:"cache_read_input_tokens"`
}

// decodeMessagesUsage reads a usage object (valid JSON): the prompt (input
// and cache tokens), the completion, and whether each was present.
func decodeMessagesUsage(obj []byte) (u Usage, hasIn, hasOut, ok bool) {
	var w messagesUsage
	if json.Unmarshal(obj, &w) != nil {
		return u, false, false, false
	}
	for _, p := range []*int64{w.InputTokens, w.CacheCreationInputTokens, w.CacheReadInputTokens} {
		if p != nil {
			u.PromptTokens += *p
			hasIn = true
		}
	}
	if w.CacheReadInputTokens != nil {
		u.PromptTokensDetails = &struct {
			CachedTokens int64 `json:"cached_tokens"`
		}{*w.CacheReadInputTokens}
	}
	if w.OutputTokens != nil {
		u.CompletionTokens, hasOut = *w.OutputTokens, true
	}
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	for _, p := range []*int64{w.InputTokens, w.CacheCreationInputTokens, w.CacheReadInputTokens, w.OutputTokens} {
		if p != nil && (*p < 0 || *p >= 1<<40) {
			return u, false, false, false
		}
	}
	return u, hasIn, hasOut, u.valid()
}

// ParseMessagesUsage returns the usage of a Messages JSON answer, or nil
// when it has none or it cannot be read.
func ParseMessagesUsage(body []byte) *Usage {
	body = jsonscan.TrimSpace(body)
	if len(body) == 0 || body[0] != '{' || !jsonscan.Valid(body) {
		return nil
	}
	raw := Member(body, "usage")
	if !isObject(raw) {
		return nil
	}
	u, hasIn, hasOut, ok := decodeMessagesUsage(raw)
	if !ok || !hasIn && !hasOut {
		return nil
	}
	return &u
}

// MessagesEvent is what the gateway learns from one data payload of a
// Messages stream (message_start, content_block_start,
// content_block_delta, content_block_stop, message_delta, message_stop,
// ping, error).
type MessagesEvent struct {
	// Type is the event's "type".
	Type string
	// Usage is the usage the event reports: message_start's (the prompt,
	// and the output so far), message_delta's (the output so far,
	// cumulative; sometimes the prompt too). HasInput and HasOutput say
	// which of its counts were reported.
	Usage               *Usage
	HasInput, HasOutput bool
	// Content reports a delta of generated output (text, tool input,
	// thinking).
	Content bool
	// Final is set by message_stop and error: the stream is over.
	Final bool
}

// ParseMessagesEvent inspects one data payload of a Messages stream. It
// never fails: what it cannot read is left zero.
func ParseMessagesEvent(data []byte) MessagesEvent {
	var ev MessagesEvent
	data = jsonscan.TrimSpace(data)
	if len(data) == 0 || data[0] != '{' || !jsonscan.Valid(data) {
		return ev
	}
	var usage, message, delta []byte
	jsonscan.Members(data, func(name, v []byte) {
		switch string(name) {
		case "type":
			ev.Type, _ = jsonscan.String(v)
		case "usage":
			usage = v
		case "message":
			message = v
		case "delta":
			delta = v
		}
	})
	switch ev.Type {
	case "message_stop", "error":
		ev.Final = true
	case "message_start":
		if isObject(message) {
			usage = Member(message, "usage")
		}
	case "content_block_delta":
		if isObject(delta) {
			jsonscan.Members(delta, func(name, v []byte) {
				switch string(name) {
				case "text", "partial_json", "thinking":
					ev.Content = ev.Content || isNonEmptyString(v)
				}
			})
		}
	}
	if isObject(usage) {
		if u, in, out, ok := decodeMessagesUsage(usage); ok && (in || out) {
			ev.Usage, ev.HasInput, ev.HasOutput = &u, in, out
		}
	}
	return ev
}
