package respcache

import (
	"bytes"
	"encoding/json"
)

// finishLength is the finish_reason of an answer cut by max_tokens (or the
// context window): replaying it would hand a truncated answer to a client
// that may have asked for more room.
const finishLength = "length"

// Cacheable reports whether a completed answer may be stored:
//   - a 2xx status only: errors are never cached;
//   - a JSON answer (Body): an embeddings list ("object": "list" with a
//     "data" array), or a chat completion or text completion with at least
//     one choice, each with a finish_reason that is not "length" (unless
//     allowLength). A body carrying "error", a choice without a
//     finish_reason, or any other shape is not cached: what cannot be judged
//     complete is not replayed;
//   - a stream (Events): it must end with a "data: [DONE]" event (comments
//     after it are ignored), carry no error event or chunk, and every choice
//     it mentions must have received exactly one finish_reason, not "length"
//     (unless allowLength), in its last chunk. A stream cut short has no
//     [DONE] and is refused.
//
// An entry that is both (Body and Events) or neither is not cacheable.
func Cacheable(e *Entry, allowLength bool) bool {
	if e == nil || e.Status < 200 || e.Status > 299 {
		return false
	}
	switch {
	case e.Body != nil && e.Events == nil:
		return cacheableBody(e.Body, allowLength)
	case e.Body == nil && len(e.Events) > 0:
		return cacheableStream(e.Events, allowLength)
	default:
		return false
	}
}

// answer is the part of a JSON answer, or of a stream chunk, that Cacheable
// reads.
type answer struct {
	Object  string          `json:"object"`
	Error   json.RawMessage `json:"error"`
	Data    json.RawMessage `json:"data"`
	Choices []struct {
		Index        int     `json:"index"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
}

func (a *answer) hasError() bool {
	return len(a.Error) > 0 && !bytes.Equal(a.Error, []byte("null"))
}

func cacheableBody(body []byte, allowLength bool) bool {
	var a answer
	if err := json.Unmarshal(body, &a); err != nil || a.hasError() {
		return false
	}
	if a.Object == "list" {
		return len(a.Data) > 0 && a.Data[0] == '['
	}
	if len(a.Choices) == 0 {
		return false
	}
	for _, ch := range a.Choices {
		if ch.FinishReason == nil || *ch.FinishReason == "" || (*ch.FinishReason == finishLength && !allowLength) {
			return false
		}
	}
	return true
}

func cacheableStream(events [][]byte, allowLength bool) bool {
	// Choice indexes are small (n is at most 128 at OpenAI); anything else
	// is refused rather than tracked.
	const maxChoices = 1024
	const (
		unseen = iota
		open
		finished
	)
	var state [maxChoices]uint8
	var opened, closed int // choices seen, and those finished
	done := false
	for _, ev := range events {
		name, data, hasData := parseEvent(ev)
		if !hasData {
			if name == "error" {
				return false
			}
			continue // a comment or keep-alive
		}
		if done || name == "error" {
			return false // data after [DONE], or an error event
		}
		if bytes.Equal(data, []byte("[DONE]")) {
			done = true
			continue
		}
		var a answer
		if err := json.Unmarshal(data, &a); err != nil || a.hasError() {
			return false
		}
		for _, ch := range a.Choices {
			if ch.Index < 0 || ch.Index >= maxChoices || state[ch.Index] == finished {
				return false // out of range, or more after the choice finished: malformed
			}
			if state[ch.Index] == unseen {
				opened++
			}
			if ch.FinishReason == nil || *ch.FinishReason == "" {
				state[ch.Index] = open
				continue
			}
			if *ch.FinishReason == finishLength && !allowLength {
				return false
			}
			state[ch.Index] = finished
			closed++
		}
	}
	return done && opened > 0 && closed == opened
}

// parseEvent reads one server-sent event: its "event" field, and its "data"
// lines joined with "\n". Lines end in "\n", "\r\n" or "\r".
func parseEvent(ev []byte) (name string, data []byte, hasData bool) {
	for len(ev) > 0 {
		end := bytes.IndexAny(ev, "\r\n")
		line := ev
		if end < 0 {
			ev = nil
		} else {
			line = ev[:end]
			if ev[end] == '\r' && end+1 < len(ev) && ev[end+1] == '\n' {
				end++
			}
			ev = ev[end+1:]
		}
		if len(line) == 0 || line[0] == ':' {
			continue
		}
		field, value, _ := bytes.Cut(line, []byte(":"))
		if len(value) > 0 && value[0] == ' ' {
			value = value[1:]
		}
		switch string(field) {
		case "event":
			name = string(value)
		case "data":
			if hasData {
				data = append(data, '\n')
			}
			data = append(data, value...)
			hasData = true
		}
	}
	return name, data, hasData
}
