package gateway

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
)

// FuzzServe sends arbitrary bodies to every proxied endpoint: the gateway
// never panics, and every answer it writes itself is OpenAI's error shape.
func FuzzServe(f *testing.F) {
	seeds := []string{
		chatBody,
		`{"model":"gpt-4.1","stream":true,"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"gpt-4.1","stream":true,"stream_options":{"include_usage":false},"messages":[]}`,
		`{"model":"gpt-4.1","stream":true,"stream_options":"x","messages":[]}`,
		`{"model":"fast","n":3,"max_tokens":5,"messages":[{"role":"user","content":[{"type":"text","text":"a"}]}]}`,
		`{"model":"text-embedding-3-small","input":["a","b"]}`,
		`{"model":"gpt-4.1","prompt":[[1,2,3]]}`,
		`{"model":1}`, `{"model":"gpt-4.1","messages":{}}`, `null`, `{`, ``, "\x00\xff",
		`{"model":"gpt-4.1","model":"gpt-4.1-mini","messages":[]}`,
	}
	for i, s := range seeds {
		f.Add(uint8(i%3), []byte(s))
	}
	h := newHarness(&testing.T{}, harnessConfig{})
	paths := []string{"/v1/chat/completions", "/v1/completions", "/v1/embeddings"}
	f.Fuzz(func(t *testing.T, ep uint8, body []byte) {
		req := httptest.NewRequest(http.MethodPost, paths[int(ep)%len(paths)], bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+tenantKey)
		req.Header.Set("X-Llmgate-Max-Wait", "0")
		rec := httptest.NewRecorder()
		h.gw.Handler().ServeHTTP(rec, req)
		if rec.Header().Get("X-Request-Id") == "" {
			t.Fatal("no x-request-id")
		}
		if rec.Code == http.StatusOK {
			return
		}
		if rec.Header().Get("X-Llmgate-Deployment") != "" {
			return // the provider's own answer, relayed as is
		}
		var e struct {
			Error *struct {
				Message string  `json:"message"`
				Type    string  `json:"type"`
				Param   *string `json:"param"`
				Code    *string `json:"code"`
			} `json:"error"`
		}
		b, _ := io.ReadAll(rec.Body)
		if err := json.Unmarshal(b, &e); err != nil || e.Error == nil || e.Error.Message == "" || e.Error.Type == "" {
			t.Fatalf("status %d with body %q", rec.Code, b)
		}
	})
}
