package openai

import (
	"bytes"
	"strings"

	"github.com/llmgate/llmgate/internal/jsonscan"
)

// ResponseEvent is what the gateway learns from one SSE data payload of a
// Responses stream (typed events: response.created, ...,
// response.output_text.delta, ..., response.completed).
type ResponseEvent struct {
	// Type is the event's "type" ("" when unreadable).
	Type string
	// ResponseID is the id of the response the event carries (the
	// response.created, response.in_progress and final events do).
	ResponseID string
	// Usage is the final event's usage (response.completed, and
	// response.incomplete or response.failed when they report one).
	Usage *Usage
	// Content reports whether the event carries generated output (a
	// non-empty delta of text, refusal or function-call arguments).
	Content bool
	// Final is set by the events that end a stream: response.completed,
	// response.incomplete, response.failed and error.
	Final bool
}

// ParseResponseEvent inspects one data payload of a Responses stream. It
// never fails: what it cannot read is left zero.
func ParseResponseEvent(data []byte) ResponseEvent {
	var ev ResponseEvent
	data = jsonscan.TrimSpace(data)
	if len(data) == 0 || data[0] != '{' || !jsonscan.Valid(data) {
		return ev
	}
	var delta, response []byte
	jsonscan.Members(data, func(name, v []byte) {
		switch string(name) {
		case "type":
			ev.Type, _ = jsonscan.String(v)
		case "delta":
			delta = v
		case "response":
			response = v
		}
	})
	switch ev.Type {
	case "response.completed", "response.incomplete", "response.failed", "error":
		ev.Final = true
	}
	if strings.HasSuffix(ev.Type, ".delta") && isNonEmptyString(delta) {
		ev.Content = true
	}
	if len(response) > 0 && response[0] == '{' {
		ev.ResponseID, ev.Usage = responseIDUsage(response)
	}
	return ev
}

// ParseResponseID returns the top-level "id" of a Responses answer (a
// response object), or "" when it has none.
func ParseResponseID(body []byte) string {
	body = jsonscan.TrimSpace(body)
	if len(body) == 0 || body[0] != '{' || !jsonscan.Valid(body) {
		return ""
	}
	id, _ := responseIDUsage(body)
	return id
}

// responseIDUsage reads the id and usage of a response object (valid JSON).
func responseIDUsage(obj []byte) (id string, u *Usage) {
	var usage []byte
	jsonscan.Members(obj, func(name, v []byte) {
		switch string(name) {
		case "id":
			id, _ = jsonscan.String(v)
		case "usage":
			usage = v
		}
	})
	if isObject(usage) {
		var ok bool
		if u, ok = scanUsage(usage); !ok {
			var w wireUsage
			u = nil
			if decodeJSON(usage, "usage", &w) == nil {
				u = w.usage()
			}
		}
		if u != nil && !u.valid() {
			u = nil
		}
	}
	return id, u
}

// ReplaceResponseID returns b with every JSON string equal to from (a
// response id) replaced by to; b itself when from does not occur. Ids are
// random and long, so they occur nowhere else.
func ReplaceResponseID(b []byte, from, to string) []byte {
	if from == "" {
		return b
	}
	q := appendString(nil, from)
	if !bytes.Contains(b, q) {
		return b
	}
	return bytes.ReplaceAll(b, q, appendString(nil, to))
}
