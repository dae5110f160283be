package gateway

import (
	"cmp"
	"encoding/json"
	"io"
	"math/rand/v2"
	"testing"

	"github.com/llmgate/llmgate/budget"
)

// TestCompletionEstimates: after every answer, the estimate kept one
// sample at a time is budget.LearnedEstimate of the answers so far (the
// same percentile as the budget store's), the default until enough are
// known, and one very long answer does not move it.
func TestCompletionEstimates(t *testing.T) {
	var e completionEstimates
	if got := e.get("a", "m", 256); got != 256 {
		t.Fatalf("no samples: %d, want the default", got)
	}
	rnd := rand.New(rand.NewPCG(1, 2))
	var all []int64
	for i := range 3 * budget.LearnWindow {
		v := 1 + rnd.Int64N(50)
		if i == budget.LearnWindow {
			v = 5000
		}
		e.observe("a", "m", v)
		all = append(all, v)
		learned := budget.LearnedEstimate(all)
		if got, want := e.get("a", "m", 256), cmp.Or(learned, 256); got != want {
			t.Fatalf("after %d answers: estimate %d, want %d", len(all), got, want)
		}
		if learned > 50 {
			t.Fatalf("after %d answers: estimate %d follows the one long answer", len(all), learned)
		}
	}
	if got := e.get("b", "m", 256); got != 256 {
		t.Fatalf("another tenant: %d, want the default", got)
	}
}

// TestCompletionEstimateLearned: requests without max_tokens through the
// gateway teach it what their completions use, and, for a tenant with a
// budget, teach the budget store, where a replica that served none of
// them finds it; requests with max_tokens do not.
func TestCompletionEstimateLearned(t *testing.T) {
	h := newHarness(t, harnessConfig{edit: func(_ *Options, h *harness) {
		h.teamA.Budget = &budget.Budget{Tenant: "team-a", Period: budget.Month, Tokens: 1_000_000}
	}})
	body := `{"model":"gpt-4.1","messages":[{"role":"user","content":"Tell me about token buckets."}]}`
	var largest int64
	for range budget.LearnMinSamples {
		resp := h.post("/v1/chat/completions", tenantKey, body)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var ans struct {
			Usage struct {
				CompletionTokens int64 `json:"completion_tokens"`
			} `json:"usage"`
		}
		if resp.StatusCode != 200 || json.Unmarshal(b, &ans) != nil || ans.Usage.CompletionTokens == 0 {
			t.Fatalf("%d %s", resp.StatusCode, b)
		}
		largest = max(largest, ans.Usage.CompletionTokens)
	}
	if err := h.gw.Close(t.Context()); err != nil { // the settles have run
		t.Fatal(err)
	}
	if got := h.gw.estimates.get("team-a", "gpt-4.1", DefaultCompletionEstimate); got != largest {
		t.Fatalf("learned estimate %d, want the largest completion %d", got, largest)
	}
	if got := h.gw.estimates.get("team-a", "gpt-4.1-mini", DefaultCompletionEstimate); got != DefaultCompletionEstimate {
		t.Fatalf("a model never used: %d", got)
	}
	cold, err := budget.New(h.budgets.Backend(), budget.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cold.Reserve(t.Context(), *h.teamA.Budget, "", "gpt-4.1", budget.Usage{PromptTokens: 1}); err != nil {
		t.Fatal(err)
	}
	if got, ok := cold.Learned("team-a", "gpt-4.1"); !ok || got != largest {
		t.Fatalf("another replica finds %d, %v in the budget store; want the largest completion %d", got, ok, largest)
	}
}
