package tokens

import (
	"encoding/json"
	"testing"
)

func raw(s string) json.RawMessage { return json.RawMessage(s) }

func TestChatFormat(t *testing.T) {
	// Token counts of the pieces, in o200k_base: "hello" 1, "user" 1,
	// "Hello" 1, "system" 1, "bob" 1, "assistant" 1.
	for _, tc := range []struct {
		name     string
		model    string
		messages string
		want     int
	}{
		{"one message", "gpt-4o", `[{"role":"user","content":"hello"}]`, 3 + 1 + 1 + 3},
		{"name", "gpt-4o", `[{"role":"user","name":"bob","content":"hello"}]`, 3 + 1 + 1 + 1 + 1 + 3},
		{"null content", "gpt-4o", `[{"role":"assistant","content":null}]`, 3 + 1 + 3},
		{"text parts", "gpt-4o", `[{"role":"user","content":[{"type":"text","text":"hello"},{"type":"text","text":"hello"}]}]`, 3 + 1 + 2 + 3},
		{"refusal part", "gpt-4o", `[{"role":"assistant","content":[{"type":"refusal","refusal":"hello"}]}]`, 3 + 1 + 1 + 3},
		{"empty", "gpt-4o", `[]`, 3},
		{"reasoning model", "o3-mini", `[{"role":"user","content":"hello"}]`, 3 + 1 + 1 + 2},
		{"gpt-5", "gpt-5-mini", `[{"role":"user","content":"hello"}]`, 3 + 1 + 1 + 2},
		{"provider prefix", "openai/o4-mini", `[{"role":"user","content":"hello"}]`, 3 + 1 + 1 + 2},
		{"image low", "gpt-4o", `[{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://example.com/a.png","detail":"low"}}]}]`, 3 + 1 + 85 + 3},
		{"image auto", "gpt-4o", `[{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://example.com/a.png"}}]}]`, 3 + 1 + 765 + 3},
		{"image low gpt-4o-mini", "gpt-4o-mini", `[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA","detail":"low"}}]}]`, 3 + 1 + 2833 + 3},
		{"image gpt-4.1-mini patches", "gpt-4.1-mini", `[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]`, 3 + 1 + 1659 + 3},
		{"audio part not counted", "gpt-4o", `[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"AAAA","format":"wav"}}]}]`, 3 + 1 + 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Chat(tc.model, raw(tc.messages), nil); got != tc.want {
				t.Errorf("Chat = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestChatToolCalls(t *testing.T) {
	call := `{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_capital","arguments":"{\"country\": \"France\"}"}}]}`
	result := `{"role":"tool","tool_call_id":"call_1","content":"Paris"}`
	user := `{"role":"user","content":"hello"}`
	base := Chat("gpt-4o", raw(`[`+user+`]`), nil)
	withCall := Chat("gpt-4o", raw(`[`+user+`,`+call+`]`), nil)
	withResult := Chat("gpt-4o", raw(`[`+user+`,`+call+`,`+result+`]`), nil)

	name, args := Text("gpt-4o", "get_capital"), Text("gpt-4o", `{"country":"France"}`)
	if got, want := withCall-base, 3+1+tokensPerToolCall+name+args; got != want {
		t.Errorf("a tool call costs %d, want %d (arguments compacted)", got, want)
	}
	if got, want := withResult-withCall, 3+name+Text("gpt-4o", "Paris"); got != want {
		t.Errorf("a tool result costs %d, want %d (named after its call)", got, want)
	}

	// cl100k_base models are billed for the arguments as sent.
	withCall4 := Chat("gpt-4", raw(`[`+user+`,`+call+`]`), nil) - Chat("gpt-4", raw(`[`+user+`]`), nil)
	if want := 3 + 1 + tokensPerToolCall + Text("gpt-4", "get_capital") + Text("gpt-4", `{"country": "France"}`); withCall4 != want {
		t.Errorf("gpt-4 tool call costs %d, want %d", withCall4, want)
	}

	// An unknown call id leaves the result nameless, not broken.
	orphan := Chat("gpt-4o", raw(`[`+user+`,{"role":"tool","tool_call_id":"nope","content":"Paris"}]`), nil)
	if want := base + 3 + 1; orphan != want {
		t.Errorf("orphan tool result: %d, want %d", orphan, want)
	}
}

func TestChatLegacyFunctions(t *testing.T) {
	// hmarr/openai-chat-tokens: gpt-3.5-turbo billed 26 for this message.
	msgs := raw(`[{"role":"assistant","content":"","function_call":{"name":"do_stuff","arguments":"{\"foo\": \"bar\", \"baz\": 1.5}"}}]`)
	if got := Chat("gpt-3.5-turbo", msgs, nil); got != 26 {
		t.Errorf("function_call message: %d, want 26", got)
	}
	// A function result is rendered under the function's name: billed 15.
	msgs = raw(`[{"role":"user","content":"hello world"},{"role":"function","name":"do_stuff","content":"{}"}]`)
	if got := Chat("gpt-3.5-turbo", msgs, nil); got != 15 {
		t.Errorf("function result: %d, want 15", got)
	}
}

func TestChatTools(t *testing.T) {
	user := raw(`[{"role":"user","content":"hello"}]`)
	withSystem := raw(`[{"role":"system","content":"Hello"},{"role":"user","content":"hello"}]`)
	tools := raw(`[{"type":"function","function":{"name":"foo","description":"Do a foo","parameters":{"type":"object","properties":{}}}}]`)
	functions := raw(`[{"name":"foo","description":"Do a foo","parameters":{"type":"object","properties":{}}}]`)

	// hmarr/openai-chat-tokens: gpt-3.5-turbo billed 36 with this function.
	if got := Chat("gpt-3.5-turbo", user, functions); got != 36 {
		t.Errorf("legacy functions: %d, want 36", got)
	}
	if a, b := Chat("gpt-4o", user, tools), Chat("gpt-4o", user, functions); a != b {
		t.Errorf("tools %d and the same legacy functions %d differ", a, b)
	}
	rendered := Text("gpt-4o", "namespace functions {\n\n// Do a foo\ntype foo = () => any;\n\n} // namespace functions")
	if got, want := Chat("gpt-4o", user, tools)-Chat("gpt-4o", user, nil), rendered+tokensPerFunctionsBlock; got != want {
		t.Errorf("tools cost %d, want %d", got, want)
	}
	// Joining a system message: 4 fewer, plus the system's trailing newline.
	pad := Text("gpt-4o", "Hello\n") - Text("gpt-4o", "Hello")
	if got, want := Chat("gpt-4o", withSystem, tools)-Chat("gpt-4o", withSystem, nil), rendered+tokensPerFunctionsBlock-tokensSavedBySystemJoin+pad; got != want {
		t.Errorf("tools with a system message cost %d, want %d", got, want)
	}
	for _, empty := range []string{``, `null`, `[]`, ` [ ] `} {
		if got, want := Chat("gpt-4o", user, raw(empty)), Chat("gpt-4o", user, nil); got != want {
			t.Errorf("tools %q: %d, want %d (no tools)", empty, got, want)
		}
	}
}

func TestRenderFunctions(t *testing.T) {
	ts := parseTools(raw(`[{"type":"function","function":{"name":"plan","description":"  Make a plan.\n  ","parameters":{
		"type":"object","required":["steps","mode"],
		"properties":{
			"steps":{"type":"array","items":{"type":"object","required":["title"],"properties":{"title":{"type":"string","description":"Step title"},"minutes":{"type":"integer"}}}},
			"mode":{"type":"string","enum":["fast","careful"]},
			"note":{"type":["string","null"]},
			"tags":{"anyOf":[{"type":"array","items":{"type":"string"}},{"type":"null"}]},
			"level":{"const":3},
			"extra":{"type":"object"},
			"any":{}
		}}}},
		{"type":"function","function":{"name":"ping","parameters":{"type":"object","properties":{}}}},
		{"type":"web_search"}]`))
	want := `namespace functions {

// Make a plan.
type plan = (_: {
steps: {
  // Step title
  title: string,
  minutes?: number,
}[],
mode: "fast" | "careful",
note?: string | null,
tags?: string[] | null,
level?: 3,
extra?: object,
any?: any,
}) => any;

type ping = () => any;

} // namespace functions`
	if got := renderFunctions(ts.fns); got != want {
		t.Errorf("rendered:\n%s\nwant:\n%s", got, want)
	}
	if len(ts.raw) != 1 || ts.raw[0] != `{"type":"web_search"}` {
		t.Errorf("non-function tools kept raw: %q", ts.raw)
	}
}

func TestChatMalformed(t *testing.T) {
	for _, tc := range []struct {
		name, messages, tools string
	}{
		{"not JSON", `this is not json`, ``},
		{"object, not array", `{"role":"user","content":"hi"}`, ``},
		{"message not an object", `["just a string", 42]`, ``},
		{"content a number", `[{"role":"user","content":12345}]`, ``},
		{"content an object", `[{"role":"user","content":{"text":"hi"}}]`, ``},
		{"part not an object", `[{"role":"user","content":["hi", 1]}]`, ``},
		{"role a number", `[{"role":7,"content":"hi"}]`, ``},
		{"tools not JSON", `[{"role":"user","content":"hi"}]`, `{{{`},
		{"tools an object", `[{"role":"user","content":"hi"}]`, `{"name":"x"}`},
		{"tool schema odd", `[{"role":"user","content":"hi"}]`, `[{"name":"x","parameters":{"type":"object","properties":{"a":{"type":7,"items":"no","enum":"no"}},"required":"a"}}]`},
		{"deep nesting", `[{"role":"user","content":"hi"}]`, `[{"name":"x","parameters":` + deepSchema(100) + `}]`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Chat("gpt-4o", raw(tc.messages), raw(tc.tools))
			if got <= tokensReply {
				t.Errorf("Chat = %d: malformed input must still be counted", got)
			}
		})
	}
	// Raw bytes are counted: more junk, more tokens.
	if a, b := Chat("gpt-4o", raw(`["x"]`), nil), Chat("gpt-4o", raw(`["a much longer piece of junk text"]`), nil); a >= b {
		t.Errorf("junk counted %d and %d", a, b)
	}
}

func deepSchema(depth int) string {
	s := `{"type":"string"}`
	for range depth {
		s = `{"type":"object","properties":{"a":` + s + `}}`
	}
	return s
}

func TestInput(t *testing.T) {
	hello := Text("text-embedding-3-small", "hello world")
	for _, tc := range []struct {
		name, input string
		want        int
	}{
		{"string", `"hello world"`, hello},
		{"strings", `["hello world", "hello world"]`, 2 * hello},
		{"token ids", `[1, 2, 3, 4]`, 4},
		{"token id arrays", `[[1, 2], [3], []]`, 3},
		{"empty array", `[]`, 0},
		{"null", `null`, 0},
		{"absent", ``, 0},
		{"mixed", `["hello world", [1, 2]]`, hello + 2},
		{"nested strings counted raw", `[["hello world"]]`, Text("text-embedding-3-small", `["hello world"]`)},
		{"number", `42`, Text("text-embedding-3-small", "42")},
		{"not JSON", `[1, 2,`, Text("text-embedding-3-small", `[1, 2,`)},
		{"bad number", `[1, 2e, 3]`, Text("text-embedding-3-small", `[1, 2e, 3]`)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Input("text-embedding-3-small", raw(tc.input)); got != tc.want {
				t.Errorf("Input(%s) = %d, want %d", tc.input, got, tc.want)
			}
		})
	}
}

// TestScanMessagesTakesCommonShapes makes sure the reflection-free decoder
// serves the requests it is for (FuzzScanMessages checks what it returns).
func TestScanMessagesTakesCommonShapes(t *testing.T) {
	for _, s := range []string{
		string(shortChat("")),
		`[{"role":"user","content":"a\nb \u00e9","name":"n"},{"role":"tool","tool_call_id":"c","content":[{"type":"text","text":"x"}]}]`,
		`[{"role":"assistant","content":null,"tool_calls":null,"refusal":null}]`,
	} {
		if _, ok := scanMessages([]byte(s)); !ok {
			t.Errorf("scanMessages(%s) fell back to encoding/json", s)
		}
	}
	for _, s := range []string{
		`[{"role":"assistant","tool_calls":[{"id":"c","function":{"name":"f","arguments":"{}"}}]}]`,
		`[{"Role":"user","content":"x"}]`,
		`[{"role":1}]`,
		`["text"]`,
	} {
		if _, ok := scanMessages([]byte(s)); ok {
			t.Errorf("scanMessages(%s) took a shape it must leave to encoding/json", s)
		}
	}
}
