package gateway

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
)

// TestOfficialSDK drives the gateway with the official Go SDK, unchanged
// apart from its base URL, through to the simulated provider.
func TestOfficialSDK(t *testing.T) {
	h := newHarness(t, harnessConfig{})
	client := h.client(tenantKey)
	ctx := t.Context()
	params := openai.ChatCompletionNewParams{
		Model:    "gpt-4.1",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("Be brief."), openai.UserMessage("What is a token bucket?")},
	}

	var direct *openai.ChatCompletion
	t.Run("chat", func(t *testing.T) {
		c, err := client.Chat.Completions.New(ctx, params)
		if err != nil {
			t.Fatal(err)
		}
		if len(c.Choices) != 1 || c.Choices[0].Message.Content == "" || c.Usage.PromptTokens == 0 {
			t.Fatalf("%+v", c)
		}
		direct = c
	})

	t.Run("chat stream with usage", func(t *testing.T) {
		sp := params
		sp.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
		stream := client.Chat.Completions.NewStreaming(ctx, sp)
		var acc openai.ChatCompletionAccumulator
		chunks := 0
		for stream.Next() {
			acc.AddChunk(stream.Current())
			chunks++
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		if chunks < 4 || acc.Choices[0].Message.Content != direct.Choices[0].Message.Content {
			t.Fatalf("%d chunks, content %q, want %q", chunks, acc.Choices[0].Message.Content, direct.Choices[0].Message.Content)
		}
		if acc.Usage.PromptTokens != direct.Usage.PromptTokens || acc.Usage.CompletionTokens != direct.Usage.CompletionTokens {
			t.Fatalf("stream usage %+v, JSON usage %+v", acc.Usage, direct.Usage)
		}
	})

	t.Run("stream without usage is what the provider sends without it", func(t *testing.T) {
		body := `{"model":"gpt-4.1","stream":true,"messages":[{"role":"user","content":"What is a token bucket?"}]}`
		resp := h.post("/v1/chat/completions", tenantKey, body)
		via, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		req, _ := http.NewRequest("POST", h.simURL+"/chat/completions", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+providerKey)
		dresp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		direct, _ := io.ReadAll(dresp.Body)
		dresp.Body.Close()
		// Chunk ids and timestamps differ per call; compare the rest.
		norm := func(b []byte) string {
			return regexp.MustCompile(`"id":"[^"]*","object":"chat.completion.chunk","created":\d+`).ReplaceAllString(string(b), "")
		}
		if norm(via) != norm(direct) {
			t.Fatalf("through the gateway:\n%s\ndirect:\n%s", via, direct)
		}
	})

	t.Run("chat stream without usage hides the usage chunk", func(t *testing.T) {
		stream := client.Chat.Completions.NewStreaming(ctx, params)
		var acc openai.ChatCompletionAccumulator
		for stream.Next() {
			ch := stream.Current()
			if len(ch.Choices) == 0 || ch.Usage.TotalTokens != 0 {
				t.Fatalf("the client did not ask for usage but got chunk %s", ch.RawJSON())
			}
			acc.AddChunk(ch)
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		if acc.Choices[0].Message.Content != direct.Choices[0].Message.Content {
			t.Fatalf("content %q", acc.Choices[0].Message.Content)
		}
	})

	t.Run("alias", func(t *testing.T) {
		p := params
		p.Model = "fast"
		c, err := client.Chat.Completions.New(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		if c.Model != "gpt-4.1-mini" {
			t.Fatalf("alias fast answered by %q, want gpt-4.1-mini", c.Model)
		}
	})

	t.Run("completions", func(t *testing.T) {
		c, err := client.Completions.New(ctx, openai.CompletionNewParams{
			Model:  "gpt-4.1",
			Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("Say hi")},
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(c.Choices) != 1 || c.Usage.PromptTokens == 0 {
			t.Fatalf("%+v", c)
		}
	})

	t.Run("embeddings", func(t *testing.T) {
		e, err := client.Embeddings.New(ctx, openai.EmbeddingNewParams{
			Model:      openai.EmbeddingModelTextEmbedding3Small,
			Input:      openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: []string{"one", "two"}},
			Dimensions: openai.Int(4),
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(e.Data) != 2 || len(e.Data[0].Embedding) != 4 || e.Usage.PromptTokens == 0 {
			t.Fatalf("%+v", e)
		}
	})

	t.Run("models", func(t *testing.T) {
		page, err := client.Models.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, m := range page.Data {
			ids = append(ids, m.ID)
		}
		if strings.Join(ids, ",") != "gpt-4.1,gpt-4.1-mini,text-embedding-3-small,fast" {
			t.Fatalf("models %v", ids)
		}
		m, err := client.Models.Get(ctx, "fast")
		if err != nil || m.ID != "fast" {
			t.Fatalf("%+v %v", m, err)
		}
	})

	t.Run("errors", func(t *testing.T) {
		cases := []struct {
			name   string
			client openai.Client
			model  string
			status int
			code   string
		}{
			{"unknown key", h.client("sk-wrong"), "gpt-4.1", 401, "invalid_api_key"},
			{"unknown model", client, "gpt-9", 404, "model_not_found"},
		}
		for _, tc := range cases {
			p := params
			p.Model = tc.model
			_, err := tc.client.Chat.Completions.New(ctx, p)
			var apiErr *openai.Error
			if !errors.As(err, &apiErr) {
				t.Fatalf("%s: %v", tc.name, err)
			}
			if apiErr.StatusCode != tc.status || apiErr.Code != tc.code || apiErr.Message == "" {
				t.Fatalf("%s: status %d code %q message %q", tc.name, apiErr.StatusCode, apiErr.Code, apiErr.Message)
			}
			if apiErr.Response.Header.Get("X-Request-Id") == "" {
				t.Fatalf("%s: no x-request-id", tc.name)
			}
		}
	})
}

// TestErrorStatuses checks each error status and its OpenAI-shaped body.
func TestErrorStatuses(t *testing.T) {
	h := newHarness(t, harnessConfig{edit: func(o *Options, h *harness) {
		o.HTTP.MaxBodyBytes = 1024
		h.teamA.Models = map[string]bool{"gpt-4.1": true}
	}})
	chat := `{"model":"gpt-4.1","messages":[{"role":"user","content":"hi"}]}`
	cases := []struct {
		name, path, key, body string
		hdr                   []string
		status                int
		code, param           string
	}{
		{"no key", "/v1/chat/completions", "", chat, nil, 401, "missing_api_key", ""},
		{"bad key", "/v1/chat/completions", "sk-nope", chat, nil, 401, "invalid_api_key", ""},
		{"malformed json", "/v1/chat/completions", tenantKey, `{"model":`, nil, 400, "", ""},
		{"not an object", "/v1/chat/completions", tenantKey, `[1,2]`, nil, 400, "", ""},
		{"empty body", "/v1/chat/completions", tenantKey, ``, nil, 400, "", ""},
		{"missing model", "/v1/chat/completions", tenantKey, `{"messages":[]}`, nil, 400, "", "model"},
		{"missing messages", "/v1/chat/completions", tenantKey, `{"model":"gpt-4.1"}`, nil, 400, "", "messages"},
		{"wrong type", "/v1/chat/completions", tenantKey, `{"model":"gpt-4.1","messages":[],"max_tokens":"x"}`, nil, 400, "", "max_tokens"},
		{"model not allowed", "/v1/chat/completions", tenantKey, `{"model":"gpt-4.1-mini","messages":[]}`, nil, 403, "model_not_allowed", "model"},
		{"unknown model", "/v1/chat/completions", batchKey, `{"model":"nope","messages":[]}`, nil, 404, "model_not_found", "model"},
		{"unknown route", "/v1/nothing", tenantKey, chat, nil, 404, "unknown_url", ""},
		{"too large", "/v1/chat/completions", tenantKey, `{"model":"gpt-4.1","messages":[{"role":"user","content":"` + strings.Repeat("x", 2000) + `"}]}`, nil, 413, "request_too_large", ""},
		{"bad priority", "/v1/chat/completions", tenantKey, chat, []string{"X-Llmgate-Priority", "urgent"}, 400, "invalid_header", "x-llmgate-priority"},
		{"bad max wait", "/v1/chat/completions", tenantKey, chat, []string{"X-Llmgate-Max-Wait", "soon"}, 400, "invalid_header", "x-llmgate-max-wait"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp := h.post(tc.path, tc.key, tc.body, tc.hdr...)
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.status, body)
			}
			if resp.Header.Get("X-Request-Id") == "" || resp.Header.Get("Content-Type") != "application/json" {
				t.Fatalf("headers %v", resp.Header)
			}
			var e struct {
				Error map[string]*string `json:"error"`
			}
			if err := json.Unmarshal(body, &e); err != nil {
				t.Fatalf("body %s: %v", body, err)
			}
			for _, k := range []string{"message", "type", "param", "code"} {
				if _, ok := e.Error[k]; !ok {
					t.Fatalf("error has no %q: %s", k, body)
				}
			}
			if e.Error["message"] == nil || *e.Error["message"] == "" || e.Error["type"] == nil {
				t.Fatalf("empty message or type: %s", body)
			}
			if tc.code != "" && (e.Error["code"] == nil || *e.Error["code"] != tc.code) {
				t.Fatalf("code in %s, want %q", body, tc.code)
			}
			if tc.param != "" && (e.Error["param"] == nil || *e.Error["param"] != tc.param) {
				t.Fatalf("param in %s, want %q", body, tc.param)
			}
		})
	}
	if h.sim.Stats().Total.Calls != 0 {
		t.Fatalf("rejected requests reached the provider: %+v", h.sim.Stats().Total)
	}
}

func TestRequestIDEchoed(t *testing.T) {
	h := newHarness(t, harnessConfig{})
	resp := h.post("/v1/chat/completions", tenantKey, `{"model":"gpt-4.1","messages":[{"role":"user","content":"hi"}]}`, "X-Request-Id", "client-123")
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Request-Id") != "client-123" {
		t.Fatalf("status %d request id %q", resp.StatusCode, resp.Header.Get("X-Request-Id"))
	}
	resp2 := h.post("/v1/chat/completions", tenantKey, `{}`, "X-Request-Id", "bad id\twith spaces")
	defer resp2.Body.Close()
	if id := resp2.Header.Get("X-Request-Id"); id == "" || strings.Contains(id, " ") {
		t.Fatalf("unsafe request id echoed: %q", id)
	}
}
