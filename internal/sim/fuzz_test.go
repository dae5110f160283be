package sim

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
)

// FuzzRequestBody sends arbitrary bodies to the chat, embeddings, legacy
// completions and Responses endpoints: the server must never panic, and every answer is either a
// well-formed success or an error in OpenAI's shape.
func FuzzRequestBody(f *testing.F) {
	for _, seed := range []string{
		chatBody("hello", ""),
		chatBody("hello", `,"stream":true,"stream_options":{"include_usage":true},"max_tokens":3`),
		chatBody("hello", `,"max_tokens":9223372036854775807`),
		chatBody("hello", `,"max_completion_tokens":-1,"n":1`),
		`{"model":"gpt-4.1","messages":[{"role":"user","content":[{"type":"text","text":"hi"},{"type":"image_url"}]},{"role":"assistant","content":null,"tool_calls":[{"id":"x"}]}]}`,
		`{"model":"gpt-4.1","messages":[{"role":"user","content":{"a":1}}]}`,
		`{"model":"text-embedding-3-small","input":["a","b"],"dimensions":3,"encoding_format":"base64"}`,
		`{"model":"text-embedding-3-small","input":[[1,2],[3]]}`,
		`{"model":"text-embedding-3-small","input":[1,-2,3e30]}`,
		`{"model":"text-embedding-3-small","input":""}`,
		`{"model":"gpt-4.1","prompt":["a",[1]],"stream":true,"stream_options":{"include_usage":true}}`,
		`{"model":"gpt-4.1","prompt":[[1,2],[3]],"max_tokens":9223372036854775807}`,
		`{"model":"gpt-4.1","prompt":"","max_tokens":1}`,
		`{"model":"gpt-4.1","input":"hi","instructions":"x","max_output_tokens":2,"stream":true}`,
		`{"model":"gpt-4.1","input":[{"role":"user","content":[{"type":"input_text","text":"hi"}]}],"store":false}`,
		`{"model":"gpt-4.1","previous_response_id":"resp_x"}`,
		`{"model":"gpt-4.1","input":7}`,
		`{"model":`, `null`, `[]`, `"x"`, ``, "\xff\xfe", `{"model":"gpt-4.1","messages":null}`,
	} {
		f.Add(uint8(0), []byte(seed))
		f.Add(uint8(1), []byte(seed))
		f.Add(uint8(2), []byte(seed))
		f.Add(uint8(3), []byte(seed))
	}
	f.Fuzz(func(t *testing.T, which uint8, body []byte) {
		s, err := New(Config{TPM: 2000, EmbeddingDimensions: 4})
		if err != nil {
			t.Fatal(err)
		}
		path := [...]string{"/v1/chat/completions", "/v1/embeddings", "/v1/completions", "/v1/responses"}[which%4]
		rec := httptest.NewRecorder()
		s.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body)))
		out := rec.Body.Bytes()
		switch rec.Code {
		case http.StatusOK:
			if rec.Header().Get("Content-Type") == "text/event-stream; charset=utf-8" {
				if path == "/v1/responses" {
					if !bytes.Contains(out, []byte("event: response.completed\n")) && !bytes.Contains(out, []byte("event: response.incomplete\n")) {
						t.Fatalf("Responses stream without its final event: %q", out)
					}
					return
				}
				if !bytes.HasSuffix(out, []byte("data: [DONE]\n\n")) {
					t.Fatalf("stream without [DONE]: %q", out)
				}
				return
			}
			if !json.Valid(out) {
				t.Fatalf("200 with invalid JSON: %q", out)
			}
		case http.StatusBadRequest, http.StatusNotFound, http.StatusTooManyRequests:
			openAIError(t, out)
		default:
			t.Fatalf("status %d for %q: %s", rec.Code, body, out)
		}
	})
}

// FuzzMessagesBody sends arbitrary bodies to Anthropic's /v1/messages and
// count_tokens: no panic, and every answer is a success or an error in
// Anthropic's shape.
func FuzzMessagesBody(f *testing.F) {
	for _, seed := range []string{
		`{"model":"gpt-4.1","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"gpt-4.1","max_tokens":5,"system":[{"type":"text","text":"x"}],"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],"stream":true}`,
		`{"model":"gpt-4.1","max_tokens":0,"messages":[]}`, `{"model":"gpt-4.1","messages":[{"role":"system","content":1}]}`, `null`, ``,
	} {
		f.Add(false, []byte(seed))
		f.Add(true, []byte(seed))
	}
	f.Fuzz(func(t *testing.T, count bool, body []byte) {
		s, err := New(Config{ITPM: 2000, OTPM: 100})
		if err != nil {
			t.Fatal(err)
		}
		path := "/v1/messages"
		if count {
			path += "/count_tokens"
		}
		req := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body))
		req.Header.Set("anthropic-version", "2023-06-01")
		rec := httptest.NewRecorder()
		s.Handler().ServeHTTP(rec, req)
		out := rec.Body.Bytes()
		if rec.Code == http.StatusOK {
			if !json.Valid(out) && !bytes.Contains(out, []byte("event: message_stop\n")) {
				t.Fatalf("200 that is neither JSON nor a complete stream: %q", out)
			}
			return
		}
		var e struct {
			Type  string `json:"type"`
			Error struct{ Type, Message string }
		}
		if json.Unmarshal(out, &e) != nil || e.Type != "error" || e.Error.Type == "" || e.Error.Message == "" {
			t.Fatalf("status %d, not Anthropic's error shape: %s", rec.Code, out)
		}
	})
}
