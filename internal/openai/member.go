package openai

import (
	"encoding/json"

	"github.com/llmgate/llmgate/internal/jsonscan"
)

// Member returns the raw value of the top-level member name of the JSON
// object body, matching the name exactly and taking the last of repeated
// members, as the provider reads them; nil when the member is absent or
// body is not a JSON object. It is for the fields ParseRequest does not
// read, when a request needs one (the user field as a session id).
func Member(body []byte, name string) json.RawMessage {
	obj := jsonscan.TrimSpace(body)
	if len(obj) == 0 || obj[0] != '{' || !jsonscan.Valid(obj) {
		return nil
	}
	var v json.RawMessage
	jsonscan.Members(obj, func(n, raw []byte) {
		if string(n) == name {
			v = raw
		}
	})
	return v
}
