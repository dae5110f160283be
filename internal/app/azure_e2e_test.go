//go:build unix

package app

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"github.com/llmgate/llmgate/internal/e2eutil"
	"github.com/llmgate/llmgate/internal/sim"
)

// TestE2EAzureProvider: a provider of type azure, configured as for Azure
// OpenAI (resource URL, api_version, a deployment name per model), serves
// the OpenAI SDK's chat completions through llmgate serve.
func TestE2EAzureProvider(t *testing.T) {
	t.Parallel()
	e2eutil.LogRuntime(t)
	s := newE2ESim(t, sim.Config{APIKeys: []string{e2eutil.ProviderKey}, AzureDeployments: map[string]string{"prod-41": "gpt-4.1"}})
	y := gatewayConfig{Store: "memory", SimURL: s.url, LogLevel: "info"}.YAML()
	y = strings.Replace(y, "  - name: sim\n    base_url: "+s.url+"\n",
		"  - name: sim\n    type: azure\n    base_url: "+strings.TrimSuffix(s.url, "/v1")+"\n    api_version: 2024-10-21\n    deployments: {gpt-4.1: prod-41}\n", 1)
	if !strings.Contains(y, "type: azure") {
		t.Fatalf("configuration not rewritten:\n%s", y)
	}
	r := e2eutil.StartReplicasYAML(t, 1, y)[0]
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	c := r.SDK(e2eutil.TenantKey)
	got, err := c.Chat.Completions.New(ctx, chatParams("hello", 8))
	if err != nil || got.Model != "gpt-4.1" || got.Usage.PromptTokens == 0 {
		t.Fatalf("%v %+v", err, got)
	}
	stream := c.Chat.Completions.NewStreaming(ctx, chatParams("hello", 8))
	var acc openai.ChatCompletionAccumulator
	for stream.Next() {
		acc.AddChunk(stream.Current())
	}
	if err := stream.Err(); err != nil || acc.Choices[0].Message.Content != got.Choices[0].Message.Content {
		t.Fatalf("%v %q", err, acc.Choices[0].Message.Content)
	}
}
