package gateway

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"github.com/llmgate/llmgate/internal/provider"
	"github.com/llmgate/llmgate/internal/sim"
)

// TestResponsesSDK drives the Responses API through the gateway with the
// official SDK: create, stream, retrieve, continue and delete.
func TestResponsesSDK(t *testing.T) {
	h := newHarness(t, harnessConfig{})
	client := h.client(tenantKey)
	ctx := t.Context()
	params := responses.ResponseNewParams{
		Model:        "gpt-4.1",
		Instructions: openai.String("Be brief."),
		Input:        responses.ResponseNewParamsInputUnion{OfString: openai.String("What is a token bucket?")},
	}

	created, err := client.Responses.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(created.ID, responseIDPrefix) || created.OutputText() == "" || created.Usage.InputTokens == 0 || created.Usage.OutputTokens == 0 {
		t.Fatalf("id %q, text %q, usage %+v", created.ID, created.OutputText(), created.Usage)
	}

	t.Run("retrieve", func(t *testing.T) {
		got, err := client.Responses.Get(ctx, created.ID, responses.ResponseGetParams{})
		if err != nil {
			t.Fatal(err)
		}
		if got.ID != created.ID || got.OutputText() != created.OutputText() {
			t.Fatalf("retrieved %q %q, created %q %q", got.ID, got.OutputText(), created.ID, created.OutputText())
		}
	})

	t.Run("stream", func(t *testing.T) {
		stream := client.Responses.NewStreaming(ctx, params)
		var text strings.Builder
		var done responses.Response
		types := map[string]int{}
		for stream.Next() {
			ev := stream.Current()
			types[ev.Type]++
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
		if types["response.created"] != 1 || types["response.completed"] != 1 || types["response.output_text.delta"] < 2 {
			t.Fatalf("events %v", types)
		}
		if text.String() != created.OutputText() || done.Usage.InputTokens != created.Usage.InputTokens || done.Usage.OutputTokens != created.Usage.OutputTokens {
			t.Fatalf("streamed %q usage %+v; JSON %q usage %+v", text.String(), done.Usage, created.OutputText(), created.Usage)
		}
		if !strings.HasPrefix(done.ID, responseIDPrefix) || done.ID == created.ID {
			t.Fatalf("stream id %q", done.ID)
		}
		got, err := client.Responses.Get(ctx, done.ID, responses.ResponseGetParams{})
		if err != nil || got.OutputText() != text.String() {
			t.Fatalf("retrieve the streamed response: %v %+v", err, got)
		}
	})

	t.Run("continue and delete", func(t *testing.T) {
		p := params
		p.PreviousResponseID = openai.String(created.ID)
		p.Input = responses.ResponseNewParamsInputUnion{OfString: openai.String("And a leaky bucket?")}
		next, err := client.Responses.New(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		// The provider bills the conversation so far again.
		if next.PreviousResponseID != created.ID || next.Usage.InputTokens <= created.Usage.InputTokens+created.Usage.OutputTokens {
			t.Fatalf("previous %q usage %+v", next.PreviousResponseID, next.Usage)
		}
		if err := client.Responses.Delete(ctx, next.ID); err != nil {
			t.Fatal(err)
		}
		_, err = client.Responses.Get(ctx, next.ID, responses.ResponseGetParams{})
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound {
			t.Fatalf("get after delete: %v", err)
		}
	})

	t.Run("another tenant cannot read it", func(t *testing.T) {
		other := h.client(batchKey)
		_, err := other.Responses.Get(ctx, created.ID, responses.ResponseGetParams{})
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound {
			t.Fatalf("get by another tenant: %v", err)
		}
		p := params
		p.PreviousResponseID = openai.String(created.ID)
		_, err = other.Responses.New(ctx, p)
		if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound || apiErr.Code != "previous_response_not_found" {
			t.Fatalf("continued by another tenant: %v", err)
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
		var prompt int64
		for _, r := range rows {
			prompt += r.PromptTokens
		}
		if prompt < 3*created.Usage.InputTokens {
			t.Fatalf("prompt tokens recorded %d, want at least %d", prompt, 3*created.Usage.InputTokens)
		}
	})
}

// TestResponsesChainStaysOnItsKey: with two provider keys serving the
// model, every turn of a previous_response_id chain goes to the key that
// stored the previous one (the provider keeps responses per key: another
// key answers 404).
func TestResponsesChainStaysOnItsKey(t *testing.T) {
	const otherKey = "sk-provider-other-9876543210"
	h := newHarness(t, harnessConfig{edit: func(o *Options, h *harness) {
		o.Deployments = append(o.Deployments, Deployment{
			Name: "sim#2/gpt-4.1", Provider: "sim", Model: "gpt-4.1",
			Target: provider.Target{Name: "sim#2/gpt-4.1", BaseURL: h.simURL, APIKey: otherKey},
		})
	}, sim: sim.Config{APIKeys: []string{providerKey, otherKey}}})
	client := h.client(tenantKey)
	ctx := t.Context()
	prev := ""
	seen := map[string]bool{}
	for i := range 12 {
		p := responses.ResponseNewParams{Model: "gpt-4.1", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("turn")}}
		if i%3 != 0 {
			p.PreviousResponseID = openai.String(prev)
		}
		var raw *http.Response
		r, err := client.Responses.New(ctx, p, option.WithResponseInto(&raw))
		if err != nil {
			t.Fatalf("turn %d: %v", i, err)
		}
		seen[raw.Header.Get("X-Llmgate-Deployment")] = true
		prev = r.ID
	}
	if len(seen) != 2 {
		t.Fatalf("deployments used %v: the test needs both keys", seen)
	}
}

func TestResponsesUnknownID(t *testing.T) {
	h := newHarness(t, harnessConfig{})
	for _, id := range []string{"resp_abc", "resp_lg00000000_resp_abc", "resp_lgxx"} {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, h.url+"/v1/responses/"+id, nil)
		req.Header.Set("Authorization", "Bearer "+tenantKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound || !strings.Contains(string(b), `"invalid_request_error"`) {
			t.Fatalf("%s: %d %s", id, resp.StatusCode, b)
		}
	}
}

// FuzzDecodeResponseID: any id a client sends decodes without panic, and
// the ids the gateway makes decode back to their deployment and upstream
// id, for their tenant only.
func FuzzDecodeResponseID(f *testing.F) {
	f.Add("resp_lg0123abcd_resp_x", "resp_abc")
	f.Add("resp_lg", "")
	f.Add("resp_lgzzzzzzzz_", "x_y")
	g := &Gateway{}
	for _, name := range []string{"sim/gpt-4.1", "sim#2/gpt-4.1"} {
		g.deps = append(g.deps, newDeployment(&Deployment{Name: name, Provider: "sim", Model: "gpt-4.1"}, 0))
	}
	a, b := &Tenant{Name: "a"}, &Tenant{Name: "b"}
	f.Fuzz(func(t *testing.T, id, up string) {
		_, _, _ = g.decodeResponseID(a, id)
		if up == "" {
			return
		}
		for _, d := range g.deps {
			cid := clientResponseID(a, d, up)
			got, gotUp, ok := g.decodeResponseID(a, cid)
			if !ok || got != d || gotUp != up {
				t.Fatalf("%q: decoded %v %q %v", cid, got, gotUp, ok)
			}
			if other, _, ok := g.decodeResponseID(b, cid); ok && other == d && responseTag("a", d.Name) != responseTag("b", d.Name) {
				t.Fatalf("%q decoded for another tenant", cid)
			}
		}
	})
}
