package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go/v3"

	lgopenai "github.com/llmgate/llmgate/internal/openai"
	"github.com/llmgate/llmgate/internal/provider"
	"github.com/llmgate/llmgate/internal/sim"
)

const claude = "claude-sonnet-4-5"

// anthropicHarness is the harness with an Anthropic deployment of claude
// on the simulator, and edit applied after.
func anthropicHarness(t *testing.T, sc sim.Config, limits Limits, edit func(*Options, *harness)) *harness {
	sc.Models = append(sc.Models, "gpt-4.1", "gpt-4.1-mini", claude)
	return newHarness(t, harnessConfig{sim: sc, edit: func(o *Options, h *harness) {
		o.Deployments = append(o.Deployments, Deployment{
			Name: "anthropic/" + claude, Provider: "anthropic", Model: claude, Limits: limits,
			Target: provider.Target{Name: "anthropic/" + claude, BaseURL: h.simURL, APIKey: providerKey, Kind: provider.KindAnthropic},
		})
		route := o.Route
		o.Route = func(m string) ([]string, bool) {
			switch m {
			case claude:
				return []string{"anthropic/" + claude}, true
			case "claude-or-gpt":
				return []string{"anthropic/" + claude, "sim/gpt-4.1"}, true
			}
			return route(m)
		}
		if edit != nil {
			edit(o, h)
		}
	}})
}

// anthropicClient is an official Anthropic SDK client for the gateway,
// unchanged but for its base URL and key (sent as x-api-key).
func (h *harness) anthropicClient(key string) anthropic.Client {
	return anthropic.NewClient(aoption.WithBaseURL(h.url), aoption.WithAPIKey(key), aoption.WithMaxRetries(0))
}

// TestAnthropicSDK drives /v1/messages with the official Anthropic SDK:
// create, stream, count_tokens, errors in Anthropic's shape; and the same
// deployment answers chat completions from the OpenAI SDK.
func TestAnthropicSDK(t *testing.T) {
	h := anthropicHarness(t, sim.Config{}, Limits{}, nil)
	client := h.anthropicClient(tenantKey)
	ctx := t.Context()
	params := anthropic.MessageNewParams{
		Model: claude, MaxTokens: 200,
		System:   []anthropic.TextBlockParam{{Text: "Be brief."}},
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("What is a token bucket?"))},
	}
	msg, err := client.Messages.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if len(msg.Content) != 1 || msg.Content[0].Text == "" || msg.Usage.InputTokens == 0 || msg.Usage.OutputTokens == 0 {
		t.Fatalf("%s", msg.RawJSON())
	}

	t.Run("stream", func(t *testing.T) {
		stream := client.Messages.NewStreaming(ctx, params)
		var acc anthropic.Message
		events := 0
		for stream.Next() {
			if err := acc.Accumulate(stream.Current()); err != nil {
				t.Fatal(err)
			}
			events++
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		if events < 6 || len(acc.Content) != 1 || acc.Content[0].Text != msg.Content[0].Text || acc.Usage.OutputTokens != msg.Usage.OutputTokens || acc.Usage.InputTokens != msg.Usage.InputTokens {
			t.Fatalf("%d events, streamed %v usage %+v; JSON %q usage %+v", events, acc.Content, acc.Usage, msg.Content[0].Text, msg.Usage)
		}
	})

	t.Run("count tokens", func(t *testing.T) {
		n, err := client.Messages.CountTokens(ctx, anthropic.MessageCountTokensParams{Model: claude, System: anthropic.MessageCountTokensParamsSystemUnion{OfTextBlockArray: params.System}, Messages: params.Messages})
		if err != nil {
			t.Fatal(err)
		}
		if n.InputTokens != msg.Usage.InputTokens {
			t.Fatalf("count_tokens %d, the message's input %d", n.InputTokens, msg.Usage.InputTokens)
		}
	})

	t.Run("errors in anthropic's shape", func(t *testing.T) {
		for _, tc := range []struct {
			key, model string
			status     int
			typ        string
		}{
			{"sk-wrong", claude, 401, "authentication_error"},
			{tenantKey, "no-such-model", 404, "not_found_error"},
			{tenantKey, "gpt-4.1", 400, "invalid_request_error"}, // not an Anthropic deployment
		} {
			p := params
			p.Model = anthropic.Model(tc.model)
			c := h.anthropicClient(tc.key)
			_, err := c.Messages.New(ctx, p)
			var ae *anthropic.Error
			if !errors.As(err, &ae) || ae.StatusCode != tc.status {
				t.Fatalf("%s/%s: %v", tc.key, tc.model, err)
			}
			var body struct {
				Type  string `json:"type"`
				Error struct{ Type, Message string }
			}
			if json.Unmarshal([]byte(ae.RawJSON()), &body) != nil || body.Type != "error" || body.Error.Type != tc.typ || body.Error.Message == "" {
				t.Fatalf("%s/%s: body %s, want an Anthropic %s", tc.key, tc.model, ae.RawJSON(), tc.typ)
			}
		}
	})

	t.Run("chat completions on the anthropic deployment", func(t *testing.T) {
		oc := h.client(tenantKey)
		c, err := oc.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
			Model: claude, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
		})
		if err != nil || c.Model != claude || c.Usage.PromptTokens == 0 {
			t.Fatalf("%v %+v", err, c)
		}
	})

	t.Run("usage settled", func(t *testing.T) {
		if err := h.gw.Close(ctx); err != nil {
			t.Fatal(err)
		}
		rows, err := h.budgets.Usage(ctx, "team-a", time.Now().UTC().Format("2006-01"))
		if err != nil {
			t.Fatal(err)
		}
		var prompt, completion int64
		for _, r := range rows {
			if r.Model == claude {
				prompt, completion = prompt+r.PromptTokens, completion+r.CompletionTokens
			}
		}
		if prompt < 2*msg.Usage.InputTokens || completion < 2*msg.Usage.OutputTokens {
			t.Fatalf("recorded %d prompt and %d completion tokens, want at least %d and %d", prompt, completion, 2*msg.Usage.InputTokens, 2*msg.Usage.OutputTokens)
		}
	})
}

// TestMessagesInputOutputLimits: the deployment's ITPM and OTPM are
// charged the prompt and max_tokens, and settled with what was used.
func TestMessagesInputOutputLimits(t *testing.T) {
	h := anthropicHarness(t, sim.Config{}, Limits{ITPM: 10000, OTPM: 1000}, func(o *Options, _ *harness) { o.Admission.MaxWait = -1 })
	body := `{"model":"` + claude + `","max_tokens":600,"messages":[{"role":"user","content":"hello"}]}`
	post := func() *http.Response {
		resp := h.post("/v1/messages", "", body, "x-api-key", tenantKey, "anthropic-version", "2023-06-01")
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	// 600 of 1,000 output tokens are held while the first runs, and all
	// but the few it generated come back at its settle: a second fits.
	for i := range 2 {
		if resp := post(); resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: %d", i, resp.StatusCode)
		}
	}
	// One over the whole OTPM is refused, in Anthropic's shape.
	resp := h.post("/v1/messages", "", strings.Replace(body, "600", "5000", 1), "x-api-key", tenantKey, "anthropic-version", "2023-06-01")
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(string(b), `"type":"rate_limit_error"`) {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
}

func TestAnthropicWriter(t *testing.T) {
	rec := httptest.NewRecorder()
	w := &anthropicWriter{ResponseWriter: rec}
	e := errf(http.StatusTooManyRequests, "tokens", "rate_limit_exceeded", "", "Rate limit reached.")
	e.Write(w)
	if rec.Code != 429 || strings.TrimSpace(rec.Body.String()) != `{"error":{"message":"Rate limit reached.","type":"rate_limit_error"},"type":"error"}` {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
	// In a stream: the gateway's in-band error becomes an error event.
	rec = httptest.NewRecorder()
	w = &anthropicWriter{ResponseWriter: rec}
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write([]byte("event: message_start\ndata: {\"type\":\"message_start\"}\n\n"))
	b := errf(http.StatusBadGateway, lgopenai.TypeUpstream, "stream_interrupted", "", "The provider's stream ended unexpectedly.").Body()
	_, _ = w.Write(append(append([]byte("data: "), b...), '\n'))
	want := "event: message_start\ndata: {\"type\":\"message_start\"}\n\nevent: error\ndata: {\"error\":{\"message\":\"The provider's stream ended unexpectedly.\",\"type\":\"api_error\"},\"type\":\"error\"}\n\n"
	if rec.Body.String() != want {
		t.Fatalf("got\n%q\nwant\n%q", rec.Body.String(), want)
	}
	// The provider's own errors pass unchanged.
	rec = httptest.NewRecorder()
	w = &anthropicWriter{ResponseWriter: rec}
	w.WriteHeader(529)
	const up = `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`
	_, _ = w.Write([]byte(up))
	if rec.Body.String() != up {
		t.Fatalf("%s", rec.Body)
	}
}

// TestMessagesStreamCut: a provider stream cut halfway ends the client's
// stream with an Anthropic error event and is charged what it streamed.
func TestMessagesStreamCut(t *testing.T) {
	h := anthropicHarness(t, sim.Config{DropRate: 1}, Limits{}, nil)
	resp := h.post("/v1/messages", "", `{"model":"`+claude+`","max_tokens":100,"stream":true,"messages":[{"role":"user","content":"hello"}]}`,
		"x-api-key", tenantKey, "anthropic-version", "2023-06-01")
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), "event: error\ndata: {\"error\":{") || strings.Contains(string(b), "message_stop") {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
}

// FuzzAnthropicWriter: whatever is written, the writer does not panic, and
// a gateway error comes out in Anthropic's shape.
func FuzzAnthropicWriter(f *testing.F) {
	f.Add(429, []byte(`{"error":{"message":"x","type":"tokens"}}`))
	f.Add(200, []byte(`data: {"error":{"message":"cut"}}`+"\n\n"))
	f.Add(500, []byte(`{"error":{`))
	f.Fuzz(func(t *testing.T, status int, b []byte) {
		if status < 200 || status > 999 || status == http.StatusNoContent || status == http.StatusNotModified {
			return // statuses without a body: the gateway never answers with them
		}
		rec := httptest.NewRecorder()
		w := &anthropicWriter{ResponseWriter: rec}
		w.WriteHeader(status)
		if n, err := w.Write(b); n != len(b) || err != nil {
			t.Fatalf("Write = %d, %v", n, err)
		}
		if status >= 400 && bytes.HasPrefix(b, openaiErrorStart) && json.Valid(b) && rec.Body.String() != string(b) {
			var e struct{ Type string }
			if json.Unmarshal(rec.Body.Bytes(), &e) != nil || e.Type != "error" {
				t.Fatalf("converted to %s", rec.Body)
			}
		}
	})
}

// TestMessagesLearnsInputOutputLimits: a deployment without itpm/otpm
// configured learns them from the anthropic-ratelimit-* headers.
func TestMessagesLearnsInputOutputLimits(t *testing.T) {
	h := anthropicHarness(t, sim.Config{ITPM: 20000, OTPM: 4000}, Limits{}, nil)
	for i := range 3 {
		resp := h.post("/v1/messages", "", `{"model":"`+claude+`","max_tokens":100,"messages":[{"role":"user","content":"hello `+strings.Repeat("x", i)+`"}]}`,
			"x-api-key", tenantKey, "anthropic-version", "2023-06-01")
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: %d", i, resp.StatusCode)
		}
		if resp.Header.Get("Anthropic-Ratelimit-Output-Tokens-Limit") != "" {
			t.Fatal("the provider's account limits were relayed to the client")
		}
	}
	d := h.gw.byName["anthropic/"+claude]
	now := time.Now()
	if in, out := d.learned[learnedInput].get(now), d.learned[learnedOutput].get(now); in != 20000 || out != 4000 {
		t.Fatalf("learned ITPM %d, OTPM %d; want 20000 and 4000", in, out)
	}
	if ch := d.ioCharges(nil, 10, 100); len(ch) != 2 || ch[0].Limit.Limit != 20000 || ch[1].Limit.Limit != 4000 || ch[1].Cost != 100 {
		t.Fatalf("charges %+v", ch)
	}
}
