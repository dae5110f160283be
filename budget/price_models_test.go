package budget

import "testing"

// TestDefaultPricesOtherProviders: the models other providers list have
// prices, dated ids included, and a configured entry overrides them.
func TestDefaultPricesOtherProviders(t *testing.T) {
	tab := DefaultPrices()
	for _, m := range []string{"claude-sonnet-4.5", "claude-sonnet-4-5", "claude-sonnet-4-5-20250929", "gemini-2.5-flash", "deepseek-v3.2", "deepseek-chat"} {
		if p, ok := tab.Lookup(m); !ok || p.InputPerMTok <= 0 || p.OutputPerMTok <= 0 {
			t.Errorf("%s: %+v %v", m, p, ok)
		}
	}
	// 1M prompt tokens (half cached) and 1M completion tokens on Sonnet 4.5:
	// 0.5*3 + 0.5*0.30 + 15 = 16.65 USD.
	if c, _ := tab.Cost("claude-sonnet-4-5", Usage{PromptTokens: 1e6, CachedTokens: 5e5, CompletionTokens: 1e6}); c != 16_650_000 {
		t.Fatalf("cost %d micro-USD, want 16650000", c)
	}
	over := tab.Merge(PriceTable{"gemini-2.5-flash": {InputPerMTok: 1, OutputPerMTok: 1}})
	if p, _ := over.Lookup("gemini-2.5-flash"); p.InputPerMTok != 1 {
		t.Fatalf("override not applied: %+v", p)
	}
	if err := tab.Validate(); err != nil {
		t.Fatal(err)
	}
}
