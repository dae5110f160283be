package tokens_test

import (
	"encoding/json"
	"fmt"

	"github.com/llmgate/llmgate/internal/tokens"
)

func ExampleChat() {
	// The request body's "messages" and "tools" values, as received.
	var body struct {
		Model    string          `json:"model"`
		Messages json.RawMessage `json:"messages"`
		Tools    json.RawMessage `json:"tools"`
	}
	_ = json.Unmarshal([]byte(`{
		"model": "gpt-4o",
		"messages": [
			{"role": "system", "content": "You are a helpful assistant that can answer to questions about the weather."},
			{"role": "user", "content": "What's the weather like in San Francisco?"}
		],
		"tools": [{"type": "function", "function": {
			"name": "get_current_weather",
			"description": "Get the current weather in a given location",
			"parameters": {"type": "object", "properties": {
				"location": {"type": "string", "description": "The city and state, e.g. San Francisco, CA"},
				"unit": {"type": "string", "description": "The unit of temperature to return", "enum": ["celsius", "fahrenheit"]}
			}, "required": ["location"]}
		}}]
	}`), &body)
	// OpenAI billed this request 101 prompt tokens (OpenAI cookbook,
	// "How to count tokens with tiktoken").
	fmt.Println(tokens.Chat(body.Model, body.Messages, body.Tools))
	// Output: 101
}

func ExampleInput() {
	fmt.Println(tokens.Input("text-embedding-3-small", json.RawMessage(`["tiktoken is great!", [1, 2, 3]]`)))
	// Output: 9
}

func ExampleText() {
	fmt.Println(tokens.Text("gpt-4", "tiktoken is great!"))
	// Output: 6
}
