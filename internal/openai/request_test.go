package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/llmgate/llmgate/internal/jsonscan"
)

// Real request bodies as the OpenAI SDKs send them.
const (
	chatRequest       = `{"messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Hello!"}],"model":"gpt-4o","max_tokens":100,"temperature":0.7}`
	chatStreamRequest = `{
  "model": "gpt-4o-mini",
  "messages": [
    {"role": "developer", "content": "Answer in French."},
    {"role": "user", "content": [{"type": "text", "text": "What is in this image?"}, {"type": "image_url", "image_url": {"url": "https://example.com/cat.png", "detail": "low"}}]}
  ],
  "stream": true,
  "stream_options": {"include_usage": true},
  "max_completion_tokens": 512,
  "max_tokens": 64,
  "n": 2,
  "seed": 42,
  "response_format": {"type": "json_object"}
}`
	chatToolsRequest     = `{"model":"gpt-4.1","messages":[{"role":"user","content":"What's the weather like in Boston today?"},{"role":"assistant","content":null,"tool_calls":[{"id":"call_abc123","type":"function","function":{"name":"get_current_weather","arguments":"{\"location\":\"Boston, MA\"}"}}]},{"role":"tool","tool_call_id":"call_abc123","content":"{\"temperature\":22}"}],"tools":[{"type":"function","function":{"name":"get_current_weather","description":"Get the current weather in a given location","parameters":{"type":"object","properties":{"location":{"type":"string","description":"The city and state, e.g. San Francisco, CA"},"unit":{"type":"string","enum":["celsius","fahrenheit"]}},"required":["location"]}}}],"tool_choice":"auto","parallel_tool_calls":true}`
	chatFunctionsRequest = `{"model":"gpt-3.5-turbo-0613","messages":[{"role":"user","content":"What is the weather like in Boston?"}],"tools":null,"functions":[{"name":"get_current_weather","parameters":{"type":"object","properties":{"location":{"type":"string"}}}}],"function_call":"auto"}`
	completionsRequest   = `{"model":"gpt-3.5-turbo-instruct","prompt":"Say this is a test","max_tokens":7,"temperature":0,"stream":false,"logprobs":null,"stop":"\n"}`
	embeddingsRequest    = `{"input":["The food was delicious and the waiter...","Second"],"model":"text-embedding-3-small","encoding_format":"float","dimensions":256}`
)

func ptr[T any](v T) *T { return &v }

func TestParseRequest(t *testing.T) {
	for _, tc := range []struct {
		name string
		ep   Endpoint
		body string
		want Request
	}{
		{
			name: "chat", ep: ChatCompletions, body: chatRequest,
			want: Request{Endpoint: ChatCompletions, Model: "gpt-4o", MaxTokens: 100, N: 1, Temperature: ptr(0.7),
				Messages: json.RawMessage(`[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Hello!"}]`)},
		},
		{
			// max_completion_tokens wins over max_tokens; stream options read.
			name: "chat stream", ep: ChatCompletions, body: chatStreamRequest,
			want: Request{Endpoint: ChatCompletions, Model: "gpt-4o-mini", Stream: true, IncludeUsage: true, MaxTokens: 512, N: 2,
				Messages: json.RawMessage(`[
    {"role": "developer", "content": "Answer in French."},
    {"role": "user", "content": [{"type": "text", "text": "What is in this image?"}, {"type": "image_url", "image_url": {"url": "https://example.com/cat.png", "detail": "low"}}]}
  ]`)},
		},
		{
			name: "chat tools", ep: ChatCompletions, body: chatToolsRequest,
			want: Request{Endpoint: ChatCompletions, Model: "gpt-4.1", N: 1,
				Messages: rawMember(chatToolsRequest, "messages"), Tools: rawMember(chatToolsRequest, "tools")},
		},
		{
			name: "legacy functions when tools is null", ep: ChatCompletions, body: chatFunctionsRequest,
			want: Request{Endpoint: ChatCompletions, Model: "gpt-3.5-turbo-0613", N: 1,
				Messages: rawMember(chatFunctionsRequest, "messages"), Tools: rawMember(chatFunctionsRequest, "functions")},
		},
		{
			name: "tools wins over functions", ep: ChatCompletions,
			body: `{"model":"m","messages":[],"tools":[1],"functions":[2]}`,
			want: Request{Endpoint: ChatCompletions, Model: "m", N: 1, Messages: json.RawMessage(`[]`), Tools: json.RawMessage(`[1]`)},
		},
		{
			name: "empty tools kept", ep: ChatCompletions,
			body: `{"model":"m","messages":[],"tools":[]}`,
			want: Request{Endpoint: ChatCompletions, Model: "m", N: 1, Messages: json.RawMessage(`[]`), Tools: json.RawMessage(`[]`)},
		},
		{
			name: "null functions gives no tools", ep: ChatCompletions,
			body: `{"model":"m","messages":[],"tools":null,"functions":null}`,
			want: Request{Endpoint: ChatCompletions, Model: "m", N: 1, Messages: json.RawMessage(`[]`)},
		},
		{
			name: "completions", ep: Completions, body: completionsRequest,
			want: Request{Endpoint: Completions, Model: "gpt-3.5-turbo-instruct", MaxTokens: 7, N: 1, Temperature: ptr(0.0),
				Input: json.RawMessage(`"Say this is a test"`)},
		},
		{
			name: "completions token prompt", ep: Completions,
			body: `{"model":"davinci-002","prompt":[[1,2,3]],"n":128,"stream":true}`,
			want: Request{Endpoint: Completions, Model: "davinci-002", N: 128, Stream: true, Input: json.RawMessage(`[[1,2,3]]`)},
		},
		{
			name: "embeddings", ep: Embeddings, body: embeddingsRequest,
			want: Request{Endpoint: Embeddings, Model: "text-embedding-3-small", N: 1,
				Input: json.RawMessage(`["The food was delicious and the waiter...","Second"]`)},
		},
		{
			name: "embeddings stream false", ep: Embeddings,
			body: `{"model":"e","input":"x","stream":false}`,
			want: Request{Endpoint: Embeddings, Model: "e", N: 1, Input: json.RawMessage(`"x"`)},
		},
		{
			name: "nulls are absent", ep: ChatCompletions,
			body: `{"model":"m","messages":[],"stream":null,"stream_options":null,"max_tokens":null,"max_completion_tokens":null,"n":null,"temperature":null}`,
			want: Request{Endpoint: ChatCompletions, Model: "m", N: 1, Messages: json.RawMessage(`[]`)},
		},
		{
			name: "bounds", ep: ChatCompletions,
			body: `{"model":"m","messages":[],"max_tokens":1099511627776,"n":1,"stream_options":{"include_usage":null}}`,
			want: Request{Endpoint: ChatCompletions, Model: "m", N: 1, MaxTokens: 1 << 40, Messages: json.RawMessage(`[]`)},
		},
		{
			name: "whitespace around the body", ep: ChatCompletions,
			body: " \r\n\t{\"model\" : \"m\" ,\n \"messages\" :\t[ ] }\n ",
			want: Request{Endpoint: ChatCompletions, Model: "m", N: 1, Messages: json.RawMessage(`[ ]`)},
		},
		{
			// Names match exactly, as at the provider: these are unknown
			// members to both, not a second model, stream or max_tokens.
			name: "names are case-sensitive", ep: ChatCompletions,
			body: `{"model":"m","Model":"x","messages":[],"MESSAGES":{},"stream":true,"Stream":false,"max_tokens":100000,"Max_Tokens":1,"N":500,"stream_options":{"include_usage":true,"Include_Usage":false},"ſtream":false}`,
			want: Request{Endpoint: ChatCompletions, Model: "m", Stream: true, IncludeUsage: true, MaxTokens: 100000, N: 1, Messages: json.RawMessage(`[]`)},
		},
		{
			// Of duplicated names the last wins, as in the provider's parser.
			name: "duplicates: last wins", ep: ChatCompletions,
			body: `{"model":"a","messages":[1],"model":"b","stream":false,"stream":true,"messages":[2]}`,
			want: Request{Endpoint: ChatCompletions, Model: "b", Stream: true, N: 1, Messages: json.RawMessage(`[2]`)},
		},
		{
			name: "escaped names are the same names", ep: ChatCompletions,
			body: `{"mod\u0065l":"m","messages":[],"\u0073tream":true}`,
			want: Request{Endpoint: ChatCompletions, Model: "m", Stream: true, N: 1, Messages: json.RawMessage(`[]`)},
		},
		{
			name: "unicode model", ep: ChatCompletions,
			body: `{"model":"mod\u00e8le-\ud83d\ude80","messages":[]}`,
			want: Request{Endpoint: ChatCompletions, Model: "modèle-🚀", N: 1, Messages: json.RawMessage(`[]`)},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, aerr := ParseRequest(tc.ep, []byte(tc.body))
			if aerr != nil {
				t.Fatalf("ParseRequest: %v", aerr)
			}
			checkRequest(t, got, &tc.want)
		})
	}
}

func checkRequest(t *testing.T, got, want *Request) {
	t.Helper()
	if got.Endpoint != want.Endpoint || got.Model != want.Model || got.Stream != want.Stream ||
		got.IncludeUsage != want.IncludeUsage || got.MaxTokens != want.MaxTokens || got.N != want.N {
		t.Errorf("got %+v\nwant %+v", *got, *want)
	}
	for _, f := range []struct {
		name      string
		got, want json.RawMessage
	}{{"Messages", got.Messages, want.Messages}, {"Tools", got.Tools, want.Tools}, {"Input", got.Input, want.Input}} {
		if !bytes.Equal(f.got, f.want) || (f.got == nil) != (f.want == nil) {
			t.Errorf("%s = %q, want %q", f.name, f.got, f.want)
		}
	}
	if (got.Temperature == nil) != (want.Temperature == nil) ||
		(got.Temperature != nil && *got.Temperature != *want.Temperature) {
		t.Errorf("Temperature = %v, want %v", fmtPtr(got.Temperature), fmtPtr(want.Temperature))
	}
}

func fmtPtr(p *float64) string {
	if p == nil {
		return "nil"
	}
	return fmt.Sprint(*p)
}

// rawMember returns the raw value of body's top-level member name.
func rawMember(body, name string) json.RawMessage {
	var m map[string]json.RawMessage
	if err := json.Unmarshal([]byte(body), &m); err != nil {
		panic(err)
	}
	return m[name]
}

func TestParseRequestErrors(t *testing.T) {
	const msgs = `"messages":[{"role":"user","content":"hi"}]`
	for _, tc := range []struct {
		name  string
		ep    Endpoint
		body  string
		param string
		msg   string // a part of the message
	}{
		{"empty", ChatCompletions, ``, "", "empty"},
		{"blank", ChatCompletions, " \n\t ", "", "empty"},
		{"array", ChatCompletions, `[{"model":"m"}]`, "", "JSON object"},
		{"string", ChatCompletions, `"model"`, "", "JSON object"},
		{"null", ChatCompletions, `null`, "", "JSON object"},
		{"byte order mark", ChatCompletions, "\ufeff{\"model\":\"m\"," + msgs + "}", "", "JSON object"},
		{"truncated", ChatCompletions, `{"model":"m",` + msgs, "", "syntax error"},
		{"trailing data", ChatCompletions, `{"model":"m",` + msgs + `} {}`, "", "syntax error"},
		{"trailing comma", ChatCompletions, `{"model":"m",` + msgs + `,}`, "", "syntax error"},
		{"control byte in string", ChatCompletions, "{\"model\":\"m\x01\"," + msgs + "}", "", "syntax error"},
		{"missing model", ChatCompletions, `{` + msgs + `}`, "model", "model parameter"},
		{"empty model", ChatCompletions, `{"model":"",` + msgs + `}`, "model", "model parameter"},
		{"null model", ChatCompletions, `{"model":null,` + msgs + `}`, "model", "model parameter"},
		{"model in other case only", ChatCompletions, `{"Model":"m",` + msgs + `}`, "model", "model parameter"},
		{"model number", ChatCompletions, `{"model":4,` + msgs + `}`, "model", "Invalid type for 'model': got number"},
		{"model object", ChatCompletions, `{"model":{"name":"m"},` + msgs + `}`, "model", "Invalid type for 'model'"},
		{"missing messages", ChatCompletions, `{"model":"m"}`, "messages", "Missing required parameter: 'messages'"},
		{"null messages", ChatCompletions, `{"model":"m","messages":null}`, "messages", "Missing required parameter"},
		{"messages string", ChatCompletions, `{"model":"m","messages":"hi"}`, "messages", "Invalid type for 'messages'"},
		{"messages object", ChatCompletions, `{"model":"m","messages":{"role":"user"}}`, "messages", "Invalid type for 'messages'"},
		{"messages number", ChatCompletions, `{"model":"m","messages":1}`, "messages", "Invalid type for 'messages'"},
		{"messages bool", ChatCompletions, `{"model":"m","messages":true}`, "messages", "Invalid type for 'messages'"},
		{"stream string", ChatCompletions, `{"model":"m",` + msgs + `,"stream":"yes"}`, "stream", "Invalid type for 'stream'"},
		{"stream_options string", ChatCompletions, `{"model":"m",` + msgs + `,"stream_options":"x"}`, "stream_options", "Invalid type for 'stream_options'"},
		{"stream_options array", ChatCompletions, `{"model":"m",` + msgs + `,"stream_options":[]}`, "stream_options", "Invalid type"},
		{"include_usage string", ChatCompletions, `{"model":"m",` + msgs + `,"stream_options":{"include_usage":"true"}}`, "stream_options.include_usage", "Invalid type for 'stream_options.include_usage'"},
		{"max_tokens 0", ChatCompletions, `{"model":"m",` + msgs + `,"max_tokens":0}`, "max_tokens", "got 0"},
		{"max_tokens negative", ChatCompletions, `{"model":"m",` + msgs + `,"max_tokens":-5}`, "max_tokens", "got -5"},
		{"max_tokens too large", ChatCompletions, `{"model":"m",` + msgs + `,"max_tokens":1099511627777}`, "max_tokens", "got 1099511627777"},
		{"max_tokens overflow", ChatCompletions, `{"model":"m",` + msgs + `,"max_tokens":99999999999999999999}`, "max_tokens", "Invalid type"},
		{"max_tokens fraction", ChatCompletions, `{"model":"m",` + msgs + `,"max_tokens":1.5}`, "max_tokens", "got number 1.5"},
		{"max_tokens exponent", ChatCompletions, `{"model":"m",` + msgs + `,"max_tokens":1e3}`, "max_tokens", "Invalid type"},
		{"max_tokens string", ChatCompletions, `{"model":"m",` + msgs + `,"max_tokens":"100"}`, "max_tokens", "got string"},
		{"max_completion_tokens 0", ChatCompletions, `{"model":"m",` + msgs + `,"max_completion_tokens":0,"max_tokens":10}`, "max_completion_tokens", "got 0"},
		{"max_tokens 0 beside a valid max_completion_tokens", ChatCompletions, `{"model":"m",` + msgs + `,"max_completion_tokens":10,"max_tokens":0}`, "max_tokens", "got 0"},
		{"n 0", ChatCompletions, `{"model":"m",` + msgs + `,"n":0}`, "n", "from 1 to 128, got 0"},
		{"n negative", ChatCompletions, `{"model":"m",` + msgs + `,"n":-1}`, "n", "got -1"},
		{"n 129", ChatCompletions, `{"model":"m",` + msgs + `,"n":129}`, "n", "got 129"},
		{"n string", ChatCompletions, `{"model":"m",` + msgs + `,"n":"2"}`, "n", "Invalid type for 'n'"},
		{"temperature string", ChatCompletions, `{"model":"m",` + msgs + `,"temperature":"hot"}`, "temperature", "Invalid type for 'temperature'"},
		{"completions missing prompt", Completions, `{"model":"m"}`, "prompt", "Missing required parameter: 'prompt'"},
		{"completions null prompt", Completions, `{"model":"m","prompt":null}`, "prompt", "'prompt'"},
		{"completions messages are not a prompt", Completions, `{"model":"m",` + msgs + `}`, "prompt", "'prompt'"},
		{"embeddings missing input", Embeddings, `{"model":"m"}`, "input", "Missing required parameter: 'input'"},
		{"embeddings null input", Embeddings, `{"model":"m","input":null}`, "input", "'input'"},
		{"embeddings prompt is not input", Embeddings, `{"model":"m","prompt":"x"}`, "input", "'input'"},
		{"embeddings stream", Embeddings, `{"model":"m","input":"x","stream":true}`, "stream", "cannot be streamed"},
		{"model checked before messages", ChatCompletions, `{"messages":"x"}`, "model", "model parameter"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, aerr := ParseRequest(tc.ep, []byte(tc.body))
			if aerr == nil {
				t.Fatalf("ParseRequest = %+v, want an error", *r)
			}
			if r != nil {
				t.Errorf("ParseRequest returned a request with the error")
			}
			if aerr.Status != http.StatusBadRequest || aerr.Type != TypeInvalidRequest || aerr.Code != "" {
				t.Errorf("error %+v, want a 400 %s without code", *aerr, TypeInvalidRequest)
			}
			if aerr.Param != tc.param {
				t.Errorf("param %q, want %q (%s)", aerr.Param, tc.param, aerr.Message)
			}
			if !strings.Contains(aerr.Message, tc.msg) {
				t.Errorf("message %q does not contain %q", aerr.Message, tc.msg)
			}
			checkNoInternals(t, aerr)
			checkErrorBody(t, aerr, aerr.Body())
		})
	}
}

// checkNoInternals asserts a client-facing message has no Go error text.
func checkNoInternals(t *testing.T, e *Error) {
	t.Helper()
	for _, bad := range []string{"json:", "Go ", "unmarshal", "openai:", "reflect"} {
		if strings.Contains(e.Message, bad) {
			t.Errorf("message %q shows internals (%q)", e.Message, bad)
		}
	}
}

func TestEndpoint(t *testing.T) {
	for _, tc := range []struct {
		ep         Endpoint
		path, name string
	}{
		{ChatCompletions, "/chat/completions", "chat"},
		{Completions, "/completions", "completions"},
		{Embeddings, "/embeddings", "embeddings"},
		{Responses, "/responses", "responses"},
		{Messages, "/messages", "messages"},
		{0, "", "unknown"},
		{Messages + 1, "", "unknown"},
	} {
		if got := tc.ep.Path(); got != tc.path {
			t.Errorf("Endpoint(%d).Path() = %q, want %q", tc.ep, got, tc.path)
		}
		if got := tc.ep.String(); got != tc.name {
			t.Errorf("Endpoint(%d).String() = %q, want %q", tc.ep, got, tc.name)
		}
	}
}

// member is one top-level member of a JSON object as written.
type member struct{ key, val string }

// members splits a JSON object into its members, keys and values as written
// (decoded key too). It trusts body to be a valid object.
func members(t testing.TB, body []byte) (ms []member, keys []string) {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(body))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		t.Fatalf("not an object: %q", body)
	}
	for dec.More() {
		start := dec.InputOffset()
		tok, err := dec.Token()
		if err != nil {
			t.Fatalf("%q: %v", body, err)
		}
		raw := strings.TrimLeft(string(body[start:dec.InputOffset()]), ", \t\r\n")
		var val json.RawMessage
		if err := dec.Decode(&val); err != nil {
			t.Fatalf("%q: %v", body, err)
		}
		ms = append(ms, member{raw, string(val)})
		keys = append(keys, tok.(string))
	}
	return ms, keys
}

// checkRewrite asserts everything Rewrite promises about out =
// Rewrite(body, set), body being a valid JSON object.
func checkRewrite(t testing.TB, body []byte, set map[string]json.RawMessage, out []byte) {
	t.Helper()
	if !json.Valid(out) {
		t.Fatalf("Rewrite(%q) = %q: not valid JSON", body, out)
	}
	// Member by member: the others are kept as written and in order, the
	// first of each set key gets the new value, later duplicates of it go,
	// the missing set keys follow in sorted order.
	in, inKeys := members(t, body)
	var want []member
	done := map[string]bool{}
	for i, m := range in {
		k := inKeys[i]
		v, ok := set[k]
		switch {
		case done[k]:
		case ok:
			done[k] = true
			want = append(want, member{m.key, string(v)})
		default:
			want = append(want, m)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(set)) {
		if !done[k] {
			q, _ := json.Marshal(k)
			want = append(want, member{string(q), string(set[k])})
		}
	}
	got, _ := members(t, out)
	if !slices.Equal(got, want) {
		t.Fatalf("Rewrite(%q, %q)\n got members %q\nwant members %q", body, set, got, want)
	}
	// And as a decoder sees it: the original object with the set keys
	// replaced.
	var before, after map[string]any
	if err := json.Unmarshal(body, &before); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(out, &after); err != nil {
		t.Fatalf("Rewrite output %q: %v", out, err)
	}
	for k, raw := range set {
		var v any
		if err := json.Unmarshal(raw, &v); err != nil {
			t.Fatal(err)
		}
		before[validUTF8(k)] = v // as the key is written out
	}
	if !jsonEqual(before, after) {
		t.Fatalf("Rewrite(%q, %q) = %q: decodes to\n%v\nwant\n%v", body, set, out, after, before)
	}
	// Deterministic.
	again, err := Rewrite(body, set)
	if err != nil || !bytes.Equal(again, out) {
		t.Fatalf("Rewrite is not deterministic: %q then %q (%v)", out, again, err)
	}
}

// jsonEqual compares decoded JSON; NaN cannot occur in JSON.
func jsonEqual(a, b any) bool {
	x, _ := json.Marshal(a) // maps marshal with sorted keys
	y, _ := json.Marshal(b)
	return bytes.Equal(x, y)
}

func raws(kv ...string) map[string]json.RawMessage {
	m := make(map[string]json.RawMessage, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = json.RawMessage(kv[i+1])
	}
	return m
}

func TestRewrite(t *testing.T) {
	for _, tc := range []struct {
		name string
		body string
		set  map[string]json.RawMessage
		want string
	}{
		{
			name: "replace in place",
			body: `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"stream":true}`,
			set:  raws("model", `"gpt-4o-2024-08-06"`),
			want: `{"model":"gpt-4o-2024-08-06","messages":[{"role":"user","content":"hi"}],"stream":true}`,
		},
		{
			name: "add missing keys in sorted order",
			body: `{"model":"m","messages":[]}`,
			set:  raws("stream_options", `{"include_usage":true}`, "b", `1`, "a", `null`),
			want: `{"model":"m","messages":[],"a":null,"b":1,"stream_options":{"include_usage":true}}`,
		},
		{
			name: "replace and add",
			body: `{"stream":false,"model":"m"}`,
			set:  raws("model", `"x"`, "stream_options", `{"include_usage":true}`),
			want: `{"stream":false,"model":"x","stream_options":{"include_usage":true}}`,
		},
		{
			name: "duplicated set key: first replaced, others dropped",
			body: `{"model":"a","x":1,"model":"b","y":2,"model":"c"}`,
			set:  raws("model", `"z"`),
			want: `{"model":"z","x":1,"y":2}`,
		},
		{
			name: "duplicated other key kept",
			body: `{"x":1,"model":"a","x":2}`,
			set:  raws("model", `"z"`),
			want: `{"x":1,"model":"z","x":2}`,
		},
		{
			name: "nested keys untouched",
			body: `{"metadata":{"model":"keep"},"messages":[{"model":"keep"}]}`,
			set:  raws("model", `"z"`),
			want: `{"metadata":{"model":"keep"},"messages":[{"model":"keep"}],"model":"z"}`,
		},
		{
			name: "values kept byte for byte, spaces between members dropped",
			body: "{ \"a\" : 1.50e+3 ,\n\t\"b\":\"\\u00e9\\n\\/\" , \"c\" : [ 1 , { \"d\" : null } ] }",
			set:  raws("z", `true`),
			want: `{"a":1.50e+3,"b":"\u00e9\n\/","c":[ 1 , { "d" : null } ],"z":true}`,
		},
		{
			name: "keys kept as written",
			body: `{"a\u003cb":1,"<&>":2,"\u2028":3,"mod\u0065l":"old"}`,
			set:  raws("model", `"new"`),
			want: `{"a\u003cb":1,"<&>":2,"\u2028":3,"mod\u0065l":"new"}`,
		},
		{
			name: "invalid UTF-8 key kept",
			body: "{\"\xff\":1}",
			set:  raws("model", `"m"`),
			want: "{\"\xff\":1,\"model\":\"m\"}",
		},
		{
			name: "empty object",
			body: ` { } `,
			set:  raws("model", `"m"`, "n", `2`),
			want: `{"model":"m","n":2}`,
		},
		{
			name: "nothing to set",
			body: `{"a" : 1}`,
			want: `{"a":1}`,
		},
		{
			name: "added keys are escaped",
			body: `{}`,
			set:  raws("<\"k\">", `1`),
			want: `{"\u003c\"k\"\u003e":1}`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := Rewrite([]byte(tc.body), tc.set)
			if err != nil {
				t.Fatalf("Rewrite: %v", err)
			}
			if string(out) != tc.want {
				t.Fatalf("Rewrite =\n%s\nwant\n%s", out, tc.want)
			}
			checkRewrite(t, []byte(tc.body), tc.set, out)
		})
	}
}

func TestRewriteDeterministic(t *testing.T) {
	set := map[string]json.RawMessage{}
	for i := range 50 {
		set[fmt.Sprintf("k%02d", i)] = json.RawMessage(fmt.Sprint(i))
	}
	first, err := Rewrite([]byte(`{"k10":"old","x":1}`), set)
	if err != nil {
		t.Fatal(err)
	}
	for range 20 { // map iteration order differs run to run
		again, err := Rewrite([]byte(`{"k10":"old","x":1}`), set)
		if err != nil || !bytes.Equal(again, first) {
			t.Fatalf("Rewrite changed: %s then %s (%v)", first, again, err)
		}
	}
	if !bytes.HasPrefix(first, []byte(`{"k10":10,"x":1,"k00":0,"k01":1,`)) {
		t.Fatalf("Rewrite = %s", first)
	}
}

func TestRewriteErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		body string
		set  map[string]json.RawMessage
	}{
		{"empty", ``, nil},
		{"array", `[1]`, nil},
		{"number", `1`, nil},
		{"string", `"{}"`, nil},
		{"truncated", `{"a":1`, nil},
		{"truncated after comma", `{"a":1,`, nil},
		{"truncated value", `{"a":[1,2`, nil},
		{"wrong closer", `{"a":1]`, nil},
		{"trailing comma", `{"a":1,}`, nil},
		{"missing colon", `{"a" 1}`, nil},
		{"number key", `{1:2}`, nil},
		{"bad value", `{"a":tru}`, nil},
		{"trailing data", `{"a":1} x`, nil},
		{"two objects", `{}{}`, nil},
		{"nil value", `{}`, raws("model", "")},
		{"broken value", `{}`, raws("model", `{"a":`)},
		{"two values", `{}`, raws("model", `1 2`)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := Rewrite([]byte(tc.body), tc.set)
			if err == nil {
				t.Fatalf("Rewrite = %q, want an error", out)
			}
			if !errors.Is(err, ErrRewrite) || !strings.HasPrefix(err.Error(), "openai: rewrite") {
				t.Fatalf("error %q is not an ErrRewrite", err)
			}
		})
	}
}

func TestStreamOptionsWithUsage(t *testing.T) {
	for _, tc := range []struct {
		body, want string
	}{
		{`{"model":"m","stream":true}`, `{"include_usage":true}`},
		{`{"model":"m","stream_options":null}`, `{"include_usage":true}`},
		{`{"stream_options":{}}`, `{"include_usage":true}`},
		{`{"stream_options":{"include_usage":false}}`, `{"include_usage":true}`},
		{`{"stream_options":{"include_usage":true}}`, `{"include_usage":true}`},
		{`{"stream_options":{"include_obfuscation":false}}`, `{"include_obfuscation":false,"include_usage":true}`},
		{`{"stream_options":{"include_usage":false,"include_obfuscation":false}}`, `{"include_usage":true,"include_obfuscation":false}`},
		{`{"stream_options":{"include_usage":false},"stream_options":{"x":1}}`, `{"x":1,"include_usage":true}`},
		// The provider reads only "stream_options"; other spellings are
		// not the client's options.
		{`{"STREAM_OPTIONS":{"x":1}}`, `{"include_usage":true}`},
		{`{"stream_options":{"x":1},"Stream_Options":null}`, `{"x":1,"include_usage":true}`},
	} {
		got, err := StreamOptionsWithUsage([]byte(tc.body))
		if err != nil {
			t.Errorf("StreamOptionsWithUsage(%s): %v", tc.body, err)
			continue
		}
		if string(got) != tc.want {
			t.Errorf("StreamOptionsWithUsage(%s) = %s, want %s", tc.body, got, tc.want)
		}
	}
	for _, body := range []string{``, `[]`, `{"stream_options":`, `{"stream_options":5}`, `{"stream_options":[]}`, `{"stream_options":"x"}`} {
		if got, err := StreamOptionsWithUsage([]byte(body)); err == nil {
			t.Errorf("StreamOptionsWithUsage(%s) = %s, want an error", body, got)
		} else if !strings.HasPrefix(err.Error(), "openai: ") {
			t.Errorf("StreamOptionsWithUsage(%s): error %q lacks the package prefix", body, err)
		}
	}
}

// requestSeeds are bodies for the request fuzzers.
var requestSeeds = []string{
	chatRequest, chatStreamRequest, chatToolsRequest, chatFunctionsRequest, completionsRequest, embeddingsRequest,
	`{"model":"m","messages":[],"stream":true,"STREAM":false,"max_tokens":100000,"Max_Tokens":1}`,
	`{"model":"a","model":"b","messages":[1],"messages":[2]}`,
	`{"mod\u0065l":"m","messages":[],"n":128,"max_tokens":1099511627776}`,
	`{"model":"m","messages":"x"}`, `{"model":"m","messages":[],"n":0}`, `{"model":"m","max_tokens":1.5}`,
	`{"model":"m","input":"x","stream":true}`, `{"model":"m","prompt":null}`,
	`{"model":"m","stream_options":{"include_usage":"x"}}`, `{"model":{}}`,
	"{\"\xff\":\"\xfe\",\"model\":\"\xff\",\"messages\":[]}", `{"a":1`, `{"a":1]`, `{} x`, ``, `null`, `[]`, " {\n} ",
}

func FuzzParseRequest(f *testing.F) {
	for _, s := range requestSeeds {
		for ep := range Messages + 1 {
			f.Add(uint8(ep), []byte(s))
		}
	}
	f.Add(uint8(Responses), []byte(`{"model":"m","input":"x","previous_response_id":"resp_1","max_output_tokens":3,"instructions":null}`))
	f.Fuzz(func(t *testing.T, ep uint8, body []byte) {
		r, aerr := ParseRequest(Endpoint(ep%6), body)
		if aerr != nil {
			if r != nil {
				t.Fatal("request and error both returned")
			}
			if aerr.Status != http.StatusBadRequest || aerr.Type != TypeInvalidRequest {
				t.Fatalf("error %+v, want a 400 %s", *aerr, TypeInvalidRequest)
			}
			checkNoInternals(t, aerr)
			checkErrorBody(t, aerr, aerr.Body())
			return
		}
		// Accepted: the body is an object, and what was read agrees with an
		// exact-name decode of it.
		trimmed := jsonscan.TrimSpace(body)
		if !json.Valid(trimmed) || trimmed[0] != '{' {
			t.Fatalf("accepted a body that is not a JSON object: %q", body)
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal(trimmed, &m); err != nil {
			t.Fatal(err)
		}
		var model string
		if err := json.Unmarshal(m["model"], &model); err != nil || model == "" || model != r.Model {
			t.Fatalf("Model %q, body's model %s (%v)", r.Model, m["model"], err)
		}
		if r.Endpoint != Endpoint(ep%6) || r.N < 1 || r.N > MaxChoices || r.MaxTokens < 0 || r.MaxTokens > 1<<40 {
			t.Fatalf("out of range: %+v", *r)
		}
		if stream := string(m["stream"]) == "true"; r.Stream != stream {
			t.Fatalf("Stream %v, body's stream %s", r.Stream, m["stream"])
		}
		switch r.Endpoint {
		case ChatCompletions:
			if len(r.Messages) == 0 || r.Messages[0] != '[' || !bytes.Equal(r.Messages, m["messages"]) {
				t.Fatalf("Messages %q, body's %q", r.Messages, m["messages"])
			}
		case Completions:
			if !bytes.Equal(r.Input, m["prompt"]) || isNull(r.Input) {
				t.Fatalf("Input %q, body's prompt %q", r.Input, m["prompt"])
			}
		case Embeddings:
			if !bytes.Equal(r.Input, m["input"]) || isNull(r.Input) || r.Stream {
				t.Fatalf("Input %q, body's input %q, stream %v", r.Input, m["input"], r.Stream)
			}
		case Messages:
			if r.Messages[0] != '[' || !bytes.Equal(r.Messages, m["messages"]) || !r.IncludeUsage {
				t.Fatalf("Messages %q, body's %q", r.Messages, m["messages"])
			}
		case Responses:
			if !isNull(r.Input) && !bytes.Equal(r.Input, m["input"]) || !r.IncludeUsage || r.N != 1 {
				t.Fatalf("Input %q, body's input %q, %+v", r.Input, m["input"], *r)
			}
			var prev *string
			if json.Unmarshal(m["previous_response_id"], &prev) == nil && prev != nil && *prev != r.PreviousResponseID {
				t.Fatalf("PreviousResponseID %q, body's %s", r.PreviousResponseID, m["previous_response_id"])
			}
		}
		// Whatever was accepted can be rewritten for upstream.
		set := raws("model", `"upstream-model"`)
		if r.Stream {
			so, err := StreamOptionsWithUsage(body)
			if err != nil {
				t.Fatalf("StreamOptionsWithUsage: %v", err)
			}
			var v struct {
				IncludeUsage bool `json:"include_usage"`
			}
			if err := json.Unmarshal(so, &v); err != nil || !v.IncludeUsage {
				t.Fatalf("StreamOptionsWithUsage = %s (%v)", so, err)
			}
			set["stream_options"] = so
		}
		out, err := Rewrite(body, set)
		if err != nil {
			t.Fatalf("Rewrite of an accepted body: %v", err)
		}
		checkRewrite(t, body, set, out)
	})
}

// FuzzRewrite: Rewrite succeeds exactly for valid JSON objects, and then
// keeps every other member as written and in order.
func FuzzRewrite(f *testing.F) {
	for _, s := range requestSeeds {
		f.Add([]byte(s), "model", []byte(`"gpt-4o"`))
	}
	f.Add([]byte(`{"model":"a","x":1,"model":"b"}`), "model", []byte(`"z"`))
	f.Add([]byte(`{"stream_options":{"include_usage":false}}`), "stream_options", []byte(`{"include_usage":true}`))
	f.Add([]byte(`{"a\u003cb":1}`), "a<b", []byte(`2`))
	f.Add([]byte(`{"a":1}`), "b", []byte(``))
	f.Add([]byte(`{"a":1}`), "b", []byte(`{`))
	f.Fuzz(func(t *testing.T, body []byte, key string, val []byte) {
		set := raws(key, string(val), "stream", "true")
		out, err := Rewrite(body, set)
		object := json.Valid(body) && jsonscan.TrimSpace(body)[0] == '{'
		if !json.Valid(val) {
			if err == nil {
				t.Fatalf("Rewrite accepted the value %q: %q", val, out)
			}
			return
		}
		if object != (err == nil) {
			t.Fatalf("Rewrite(%q): error %v, body is an object: %v", body, err, object)
		}
		if err != nil {
			if !errors.Is(err, ErrRewrite) {
				t.Fatalf("error %v is not ErrRewrite", err)
			}
			return
		}
		checkRewrite(t, body, set, out)
	})
}

// TestOnlyJSONWhiteSpaceAroundBody: a body the provider would refuse as
// invalid JSON (a vertical tab or a no-break space before the object) is
// refused here, before it costs quota.
func TestOnlyJSONWhiteSpaceAroundBody(t *testing.T) {
	for _, body := range []string{"\v{\"model\":\"m\",\"messages\":[]}", "\u00a0{\"model\":\"m\",\"messages\":[]}"} {
		if _, err := ParseRequest(ChatCompletions, []byte(body)); err == nil {
			t.Errorf("ParseRequest(%q) accepted a body that is not JSON", body)
		}
	}
	if _, err := ParseRequest(ChatCompletions, []byte(" \t\r\n{\"model\":\"m\",\"messages\":[]}\n")); err != nil {
		t.Errorf("ParseRequest refused JSON white space around the body: %v", err)
	}
}
