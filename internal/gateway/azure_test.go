package gateway

import (
	"net/http"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/llmgate/llmgate/internal/provider"
	"github.com/llmgate/llmgate/internal/sim"
)

// TestAzureDeployment: a deployment of type azure is called on its
// deployment URL with api-version and api-key; the OpenAI SDK's chat,
// stream and Responses calls reach it unchanged, and its x-ratelimit-*
// headers are learned.
func TestAzureDeployment(t *testing.T) {
	h := newHarness(t, harnessConfig{sim: sim.Config{RPM: 1000, AzureDeployments: map[string]string{"prod-gpt41": "gpt-4.1"}}, edit: func(o *Options, h *harness) {
		o.Deployments = []Deployment{{
			Name: "azure/gpt-4.1", Provider: "azure", Model: "gpt-4.1",
			Target: provider.Target{Name: "azure/gpt-4.1", BaseURL: h.simURL[:len(h.simURL)-len("/v1")], APIKey: providerKey,
				Kind: provider.KindAzure, APIVersion: "2024-10-21", AzureDeployment: "prod-gpt41"},
		}}
		o.Route = func(m string) ([]string, bool) { return []string{"azure/gpt-4.1"}, m == "gpt-4.1" }
	}})
	client := h.client(tenantKey)
	ctx := t.Context()
	params := openai.ChatCompletionNewParams{Model: "gpt-4.1", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}}
	var raw *http.Response
	c, err := client.Chat.Completions.New(ctx, params, option.WithResponseInto(&raw))
	if err != nil {
		t.Fatal(err)
	}
	if c.Model != "gpt-4.1" || c.Usage.PromptTokens == 0 || raw.Header.Get("X-Llmgate-Deployment") != "azure/gpt-4.1" {
		t.Fatalf("%+v %v", c, raw.Header)
	}
	stream := client.Chat.Completions.NewStreaming(ctx, params)
	var acc openai.ChatCompletionAccumulator
	for stream.Next() {
		acc.AddChunk(stream.Current())
	}
	if err := stream.Err(); err != nil || acc.Choices[0].Message.Content != c.Choices[0].Message.Content {
		t.Fatalf("%v %q", err, acc.Choices[0].Message.Content)
	}
	// The provider's x-ratelimit-limit-requests was learned.
	if got := h.gw.byName["azure/gpt-4.1"].learned[learnedRequests].limit.Load(); got != 1000 {
		t.Fatalf("learned RPM %d, want 1000", got)
	}
	if st := h.sim.Stats().Total; st.Calls != 2 {
		t.Fatalf("the simulator served %d calls, want 2", st.Calls)
	}
}
