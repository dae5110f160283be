//go:build unix

package app

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"

	"github.com/llmgate/llmgate/internal/e2eutil"
	"github.com/llmgate/llmgate/internal/sim"
	"github.com/llmgate/llmgate/internal/testutil"
)

// TestE2EResponsesAcrossReplicas: the official SDK creates a response
// through one replica, streams one through another, and retrieves and
// continues each through a replica that did not create it.
func TestE2EResponsesAcrossReplicas(t *testing.T) {
	t.Parallel()
	e2eutil.LogRuntime(t)
	rds := testutil.StartRedis(t)
	s := newE2ESim(t, sim.Config{APIKeys: []string{e2eutil.ProviderKey}})
	reps := e2eutil.StartReplicas(t, 2, gatewayConfig{Store: rds.URL(), SimURL: s.url, LogLevel: "info"})
	a, b := reps[0].SDK(e2eutil.TenantKey), reps[1].SDK(e2eutil.TenantKey)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	params := responses.ResponseNewParams{
		Model: "gpt-4.1",
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("What is a fencing token?")},
	}

	created, err := a.Responses.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	got, err := b.Responses.Get(ctx, created.ID, responses.ResponseGetParams{})
	if err != nil || got.ID != created.ID || got.OutputText() != created.OutputText() || created.OutputText() == "" {
		t.Fatalf("created via A %q %q; retrieved via B: %v %+v", created.ID, created.OutputText(), err, got)
	}

	stream := b.Responses.NewStreaming(ctx, params)
	var text strings.Builder
	var done responses.Response
	for stream.Next() {
		ev := stream.Current()
		switch ev.Type {
		case "response.output_text.delta":
			text.WriteString(ev.Delta)
		case "response.completed":
			done = ev.AsResponseCompleted().Response
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if text.String() != created.OutputText() || done.Usage.OutputTokens != created.Usage.OutputTokens {
		t.Fatalf("streamed %q (usage %+v), created %q (usage %+v)", text.String(), done.Usage, created.OutputText(), created.Usage)
	}
	p := params
	p.PreviousResponseID = openai.String(done.ID)
	next, err := a.Responses.New(ctx, p)
	if err != nil || next.PreviousResponseID != done.ID {
		t.Fatalf("continue B's stream via A: %v %+v", err, next)
	}
}
