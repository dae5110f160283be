package sim

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// TestOfficialSDK drives the simulator with the official Go SDK, unchanged
// apart from its base URL: what an application pointed at it would see.
func TestOfficialSDK(t *testing.T) {
	_, ts := start(t, Config{RPM: 4, APIKeys: []string{"sk-sdk"}, EmbeddingDimensions: 16})
	client := openai.NewClient(
		option.WithBaseURL(ts.URL+"/v1/"),
		option.WithAPIKey("sk-sdk"),
		option.WithHTTPClient(ts.Client()),
		option.WithMaxRetries(0),
	)
	ctx := t.Context()
	params := openai.ChatCompletionNewParams{
		Model:    "gpt-4.1",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("Be brief."), openai.UserMessage("What is a token bucket?")},
	}

	t.Run("chat", func(t *testing.T) {
		c, err := client.Chat.Completions.New(ctx, params)
		if err != nil {
			t.Fatal(err)
		}
		if len(c.Choices) != 1 || c.Choices[0].Message.Content == "" || c.Choices[0].FinishReason != "stop" {
			t.Fatalf("%+v", c)
		}
		u := c.Usage
		if u.CompletionTokens != int64(len(strings.Fields(c.Choices[0].Message.Content))) || u.TotalTokens != u.PromptTokens+u.CompletionTokens || u.PromptTokens == 0 {
			t.Fatalf("usage %+v", u)
		}

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
		if chunks < 4 || len(acc.Choices) != 1 || acc.Choices[0].Message.Content != c.Choices[0].Message.Content {
			t.Fatalf("%d chunks, streamed %+v, want %q", chunks, acc.Choices, c.Choices[0].Message.Content)
		}
		if acc.Usage.PromptTokens != u.PromptTokens || acc.Usage.CompletionTokens != u.CompletionTokens || acc.Usage.TotalTokens != u.TotalTokens {
			t.Fatalf("stream usage %+v, JSON usage %+v", acc.Usage, u)
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
		if len(e.Data) != 2 || len(e.Data[0].Embedding) != 4 || e.Usage.PromptTokens != 2 || e.Usage.TotalTokens != 2 {
			t.Fatalf("%+v", e)
		}
	})

	t.Run("completions", func(t *testing.T) {
		cp := openai.CompletionNewParams{
			Model:     "gpt-4.1-mini",
			Prompt:    openai.CompletionNewParamsPromptUnion{OfArrayOfStrings: []string{"Once upon a time", "The gateway"}},
			MaxTokens: openai.Int(6),
		}
		c, err := client.Completions.New(ctx, cp)
		if err != nil {
			t.Fatal(err)
		}
		if c.Object != "text_completion" || len(c.Choices) != 2 || c.Choices[1].Index != 1 || c.Choices[0].Text == "" || c.Choices[0].FinishReason != openai.CompletionChoiceFinishReasonLength {
			t.Fatalf("%+v", c)
		}
		// "Once upon a time" (4) + "The gateway" (2); 6 words each.
		if u := c.Usage; u.PromptTokens != 6 || u.CompletionTokens != 12 || u.TotalTokens != 18 {
			t.Fatalf("usage %+v", u)
		}

		sp := cp
		sp.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
		stream := client.Completions.NewStreaming(ctx, sp)
		texts := map[int64]string{}
		var usage openai.CompletionUsage
		for stream.Next() {
			ch := stream.Current()
			for _, choice := range ch.Choices {
				texts[choice.Index] += choice.Text
			}
			if ch.Usage.TotalTokens > 0 {
				usage = ch.Usage
			}
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		if texts[0] != c.Choices[0].Text || texts[1] != c.Choices[1].Text ||
			usage.PromptTokens != c.Usage.PromptTokens || usage.CompletionTokens != c.Usage.CompletionTokens || usage.TotalTokens != c.Usage.TotalTokens {
			t.Fatalf("streamed %v, usage %+v; JSON %+v", texts, usage, c)
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
		if strings.Join(ids, ",") != "gpt-4.1,gpt-4.1-mini,gpt-4o-mini,text-embedding-3-small" {
			t.Fatalf("models %v", ids)
		}
	})

	t.Run("errors", func(t *testing.T) {
		var apiErr *openai.Error
		_, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "gpt-9", Messages: params.Messages})
		if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound || apiErr.Code != "model_not_found" {
			t.Fatalf("unknown model: %v", err)
		}
		_, err = client.Chat.Completions.New(ctx, params, option.WithAPIKey("sk-wrong"))
		if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusUnauthorized || apiErr.Code != "invalid_api_key" {
			t.Fatalf("wrong key: %v", err)
		}
		// RPM 4: the two chat calls used two of gpt-4.1's (each model has
		// its own bucket; models.list is not limited).
		for i := range 3 {
			_, err = client.Chat.Completions.New(ctx, params)
			if i < 2 && err != nil {
				t.Fatalf("call %d: %v", i, err)
			}
		}
		if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusTooManyRequests || apiErr.Type != "requests" || apiErr.Code != "rate_limit_exceeded" {
			t.Fatalf("over the RPM limit: %v", err)
		}
		if ra := apiErr.Response.Header.Get("retry-after"); ra == "" || ra == "0" {
			t.Fatalf("retry-after %q", ra)
		}
	})
}
