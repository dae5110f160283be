package openai

import (
	"testing"
)

func TestParseRequestResponses(t *testing.T) {
	r, err := ParseRequest(Responses, []byte(`{"model":"gpt-4.1","input":"hi","instructions":"Be brief.","max_output_tokens":50,"max_tokens":9,"stream":true,"previous_response_id":"resp_1","tools":null}`))
	if err != nil {
		t.Fatal(err)
	}
	if r.Model != "gpt-4.1" || string(r.Input) != `"hi"` || string(r.Instructions) != `"Be brief."` || r.MaxTokens != 50 ||
		!r.Stream || !r.IncludeUsage || r.PreviousResponseID != "resp_1" || r.Tools != nil || r.N != 1 {
		t.Fatalf("%+v", r)
	}
	for _, body := range []string{`{"input":"x"}`, `{"model":"m","previous_response_id":3}`, `{"model":"m","max_output_tokens":0}`} {
		if _, err := ParseRequest(Responses, []byte(body)); err == nil {
			t.Errorf("%s: accepted", body)
		}
	}
	// input is optional: the request may continue a stored response.
	if _, err := ParseRequest(Responses, []byte(`{"model":"m","previous_response_id":"resp_1"}`)); err != nil {
		t.Fatal(err)
	}
}

func TestParseUsageResponses(t *testing.T) {
	for _, body := range []string{
		`{"id":"resp_1","usage":{"input_tokens":12,"input_tokens_details":{"cached_tokens":4},"output_tokens":7,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":19}}`,
		`{"id":"resp_1","usage":{"Input_Tokens":12,"input_tokens_details":{"cached_tokens":4},"output_tokens":7,"total_tokens":19}}`, // the decoder's path
	} {
		u := ParseUsage([]byte(body))
		if u == nil || u.PromptTokens != 12 || u.CompletionTokens != 7 || u.Cached() != 4 {
			t.Fatalf("%s: %+v", body, u)
		}
	}
}

func TestParseResponseEvent(t *testing.T) {
	for _, tc := range []struct {
		data           string
		typ, id        string
		content, final bool
		prompt, output int64
	}{
		{data: `{"type":"response.created","sequence_number":0,"response":{"id":"resp_9","status":"in_progress","usage":null}}`, typ: "response.created", id: "resp_9"},
		{data: `{"type":"response.output_text.delta","item_id":"msg_1","delta":"Hel"}`, typ: "response.output_text.delta", content: true},
		{data: `{"type":"response.output_text.delta","delta":""}`, typ: "response.output_text.delta"},
		{data: `{"type":"response.output_text.done","text":"Hello"}`, typ: "response.output_text.done"},
		{data: `{"type":"response.completed","response":{"id":"resp_9","usage":{"input_tokens":3,"output_tokens":5,"total_tokens":8}}}`, typ: "response.completed", id: "resp_9", final: true, prompt: 3, output: 5},
		{data: `{"type":"error","code":"server_error","message":"x"}`, typ: "error", final: true},
		{data: `not json`},
		{data: `{"type":"response.completed","response":{"usage":{"input_tokens":-1}}}`, typ: "response.completed", final: true},
	} {
		ev := ParseResponseEvent([]byte(tc.data))
		if ev.Type != tc.typ || ev.ResponseID != tc.id || ev.Content != tc.content || ev.Final != tc.final {
			t.Errorf("%s: %+v", tc.data, ev)
		}
		if tc.prompt > 0 && (ev.Usage == nil || ev.Usage.PromptTokens != tc.prompt || ev.Usage.CompletionTokens != tc.output) {
			t.Errorf("%s: usage %+v", tc.data, ev.Usage)
		}
		if tc.prompt == 0 && ev.Usage != nil {
			t.Errorf("%s: usage %+v, want none", tc.data, ev.Usage)
		}
	}
}

func TestReplaceResponseID(t *testing.T) {
	got := string(ReplaceResponseID([]byte(`{"id":"resp_1","x":"resp_1x","y":["resp_1"]}`), "resp_1", "resp_lg_1"))
	if want := `{"id":"resp_lg_1","x":"resp_1x","y":["resp_lg_1"]}`; got != want {
		t.Fatalf("%s, want %s", got, want)
	}
}

func FuzzParseResponseEvent(f *testing.F) {
	f.Add([]byte(`{"type":"response.completed","response":{"id":"resp_9","usage":{"input_tokens":3,"output_tokens":5}}}`))
	f.Add([]byte(`{"type":"response.output_text.delta","delta":"x"}`))
	f.Add([]byte(`{"type":"response.created","response":{"id":"r","usage":{"input_tokens":1e3}}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		ev := ParseResponseEvent(data)
		if ev.Usage != nil && !ev.Usage.valid() {
			t.Fatalf("invalid usage %+v", ev.Usage)
		}
		_ = ParseResponseID(data)
	})
}

func TestParseRequestMessages(t *testing.T) {
	r, err := ParseRequest(Messages, []byte(`{"model":"claude-sonnet-4-5","max_tokens":100,"system":"Be brief.","messages":[{"role":"user","content":"hi"}],"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	if r.MaxTokens != 100 || string(r.Instructions) != `"Be brief."` || !r.Stream || !r.IncludeUsage || len(r.Messages) == 0 {
		t.Fatalf("%+v", r)
	}
	for _, body := range []string{`{"model":"m","max_tokens":1}`, `{"model":"m","messages":{}}`, `{"model":"m","messages":[],"max_tokens":0}`} {
		if _, err := ParseRequest(Messages, []byte(body)); err == nil {
			t.Errorf("%s: accepted", body)
		}
	}
}

func TestParseMessagesUsage(t *testing.T) {
	u := ParseMessagesUsage([]byte(`{"id":"msg_1","type":"message","usage":{"input_tokens":10,"cache_creation_input_tokens":5,"cache_read_input_tokens":20,"output_tokens":7}}`))
	if u == nil || u.PromptTokens != 35 || u.Cached() != 20 || u.CompletionTokens != 7 {
		t.Fatalf("%+v", u)
	}
	for _, body := range []string{`{"usage":{"input_tokens":-1,"output_tokens":1}}`, `{"usage":null}`, `{}`, `x`, `{"usage":{}}`} {
		if u := ParseMessagesUsage([]byte(body)); u != nil {
			t.Errorf("%s: %+v", body, u)
		}
	}
}

func TestParseMessagesEvent(t *testing.T) {
	start := ParseMessagesEvent([]byte(`{"type":"message_start","message":{"id":"msg_1","usage":{"input_tokens":25,"cache_read_input_tokens":0,"output_tokens":1}}}`))
	if start.Type != "message_start" || start.Usage == nil || start.Usage.PromptTokens != 25 || !start.HasInput || !start.HasOutput {
		t.Fatalf("%+v", start)
	}
	delta := ParseMessagesEvent([]byte(`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}`))
	if !delta.Content || delta.Usage != nil || delta.Final {
		t.Fatalf("%+v", delta)
	}
	if ev := ParseMessagesEvent([]byte(`{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":""}}`)); ev.Content {
		t.Fatalf("an empty delta counted: %+v", ev)
	}
	md := ParseMessagesEvent([]byte(`{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":15}}`))
	if md.Usage == nil || md.Usage.CompletionTokens != 15 || md.HasInput || !md.HasOutput {
		t.Fatalf("%+v", md)
	}
	if ev := ParseMessagesEvent([]byte(`{"type":"message_stop"}`)); !ev.Final {
		t.Fatalf("%+v", ev)
	}
}

func FuzzParseMessages(f *testing.F) {
	f.Add([]byte(`{"type":"message_start","message":{"usage":{"input_tokens":25,"output_tokens":1}}}`))
	f.Add([]byte(`{"type":"message_delta","usage":{"output_tokens":15}}`))
	f.Add([]byte(`{"id":"m","usage":{"input_tokens":1e2,"cache_read_input_tokens":3}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		ev := ParseMessagesEvent(data)
		if ev.Usage != nil && (!ev.Usage.valid() || !ev.HasInput && !ev.HasOutput) {
			t.Fatalf("usage %+v", ev)
		}
		if u := ParseMessagesUsage(data); u != nil && !u.valid() {
			t.Fatalf("usage %+v", u)
		}
	})
}
