package gateway

import (
	"encoding/json"
	"io"
	"testing"
)

func TestCompletionEstimates(t *testing.T) {
	var e completionEstimates
	if got := e.get("a", "m", 256); got != 256 {
		t.Fatalf("no samples: %d, want the default", got)
	}
	for i := range estimateMinSamples - 1 {
		e.observe("a", "m", int64(10+i))
	}
	if got := e.get("a", "m", 256); got != 256 {
		t.Fatalf("%d samples: %d, want the default", estimateMinSamples-1, got)
	}
	e.observe("a", "m", 40)
	if got := e.get("a", "m", 256); got != 40 {
		t.Fatalf("estimate %d, want the largest sample 40", got)
	}
	if got := e.get("b", "m", 256); got != 256 {
		t.Fatalf("another tenant: %d, want the default", got)
	}
	// The largest sample leaves the window after estimateWindow others.
	for range estimateWindow {
		e.observe("a", "m", 5)
	}
	if got := e.get("a", "m", 256); got != 5 {
		t.Fatalf("estimate %d after the window moved on, want 5", got)
	}
}

// TestCompletionEstimateLearned: requests without max_tokens through the
// gateway teach it what their completions use; requests with max_tokens
// do not.
func TestCompletionEstimateLearned(t *testing.T) {
	h := newHarness(t, harnessConfig{})
	body := `{"model":"gpt-4.1","messages":[{"role":"user","content":"Tell me about token buckets."}]}`
	var largest int64
	for range estimateMinSamples {
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
}
