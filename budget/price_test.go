package budget_test

import (
	"math"
	"testing"

	"github.com/llmgate/llmgate/budget"
)

func TestCost(t *testing.T) {
	table := budget.PriceTable{
		"m":         {InputPerMTok: 2.5, CachedInputPerMTok: 1.25, OutputPerMTok: 10},
		"no-cache":  {InputPerMTok: 0.15, OutputPerMTok: 0.6},
		"embedding": {InputPerMTok: 0.02},
	}
	cases := []struct {
		model string
		u     budget.Usage
		want  int64
	}{
		{"m", budget.Usage{PromptTokens: 1_000_000}, 2_500_000},
		{"m", budget.Usage{CompletionTokens: 1_000_000}, 10_000_000},
		{"m", budget.Usage{PromptTokens: 1_000_000, CachedTokens: 1_000_000}, 1_250_000},
		// 600 × 2.5 + 400 × 1.25 + 100 × 10 = 1500 + 500 + 1000
		{"m", budget.Usage{PromptTokens: 1000, CachedTokens: 400, CompletionTokens: 100}, 3000},
		// Without a cached price, cached tokens cost the input price.
		{"no-cache", budget.Usage{PromptTokens: 1000, CachedTokens: 1000}, 150},
		// 7 × 0.15 = 1.05 → 2 (rounded up, once per request).
		{"no-cache", budget.Usage{PromptTokens: 7}, 2},
		{"embedding", budget.Usage{PromptTokens: 1}, 1},
		{"embedding", budget.Usage{PromptTokens: 50}, 1},
		{"embedding", budget.Usage{PromptTokens: 51}, 2},
		{"m", budget.Usage{}, 0},
		// Dated snapshot names.
		{"m-2024-08-06", budget.Usage{PromptTokens: 1000}, 2500},
		{"m-20250514", budget.Usage{PromptTokens: 1000}, 2500},
		// No float drift: 0.1 + 0.2 style prices sum exactly.
		{"no-cache", budget.Usage{PromptTokens: 1_000_000_000, CompletionTokens: 1_000_000_000}, 750_000_000},
	}
	for _, tc := range cases {
		got, ok := table.Cost(tc.model, tc.u)
		if !ok || got != tc.want {
			t.Errorf("Cost(%q, %+v) = %d, %v; want %d", tc.model, tc.u, got, ok, tc.want)
		}
	}
	if _, ok := table.Cost("unknown", budget.Usage{PromptTokens: 1}); ok {
		t.Error("an unknown model has a price")
	}
	if _, ok := table.Cost("-2024-08-06", budget.Usage{PromptTokens: 1}); ok {
		t.Error("a bare date has a price")
	}
	// Absurd usage saturates instead of wrapping around.
	huge := budget.PriceTable{"x": {InputPerMTok: 1e6, OutputPerMTok: 1e6}}
	if got, _ := huge.Cost("x", budget.Usage{PromptTokens: math.MaxInt64, CompletionTokens: math.MaxInt64}); got != math.MaxInt64 {
		t.Errorf("saturated cost = %d", got)
	}
}

func TestDefaultPrices(t *testing.T) {
	p := budget.DefaultPrices()
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{"gpt-4.1", "gpt-4.1-mini", "gpt-4.1-nano", "gpt-4o", "gpt-4o-mini", "o3", "o4-mini",
		"text-embedding-3-small", "text-embedding-3-large", "gpt-5", "claude-sonnet-4-20250514"} {
		if _, ok := p.Lookup(m); !ok {
			t.Errorf("no default price for %s", m)
		}
	}
	// gpt-4o-mini: 1M prompt ($0.15) + 1M completion ($0.60) = $0.75.
	if got, _ := p.Cost("gpt-4o-mini-2024-07-18", budget.Usage{PromptTokens: 1e6, CompletionTokens: 1e6}); got != 750_000 {
		t.Errorf("gpt-4o-mini cost %d µUSD, want 750000", got)
	}
}

func TestPriceTableMerge(t *testing.T) {
	base := budget.DefaultPrices()
	over := budget.PriceTable{"gpt-4o": {InputPerMTok: 1}, "my-model": {InputPerMTok: 9}}
	m := base.Merge(over)
	if m["gpt-4o"].InputPerMTok != 1 || m["my-model"].InputPerMTok != 9 || m["gpt-4.1"] != base["gpt-4.1"] {
		t.Fatalf("merge result wrong: %+v %+v", m["gpt-4o"], m["my-model"])
	}
	if base["gpt-4o"].InputPerMTok == 1 {
		t.Fatal("Merge changed its receiver")
	}
	bad := []budget.PriceTable{
		{"x": {InputPerMTok: -1}},
		{"x": {OutputPerMTok: math.NaN()}},
		{"x": {CachedInputPerMTok: math.Inf(1)}},
		{"": {}},
	}
	for _, tbl := range bad {
		if err := tbl.Validate(); err == nil {
			t.Errorf("Validate(%v) = nil", tbl)
		}
	}
}

// FuzzCost checks that cost never panics, is never negative, never
// decreases when a request uses more, and that caching never costs more.
func FuzzCost(f *testing.F) {
	f.Add(1000.0, 500.0, 4000.0, int64(10), int64(5), int64(20), int64(1))
	f.Add(0.02, 0.0, 0.0, int64(1), int64(0), int64(0), int64(1000))
	f.Fuzz(func(t *testing.T, in, cin, out float64, prompt, cached, completion, more int64) {
		p := budget.Price{InputPerMTok: in, CachedInputPerMTok: cin, OutputPerMTok: out}
		if p.Validate() != nil || cin > in {
			return
		}
		tbl := budget.PriceTable{"m": p}
		u := budget.Usage{PromptTokens: prompt, CachedTokens: cached, CompletionTokens: completion}
		if u.Validate() != nil || more < 0 || more > budget.MaxAmount/4 || u.PromptTokens > budget.MaxAmount/4 || u.CompletionTokens > budget.MaxAmount/4 {
			return
		}
		c, _ := tbl.Cost("m", u)
		if c < 0 {
			t.Fatalf("negative cost %d", c)
		}
		bigger := u
		bigger.CompletionTokens += more
		bigger.PromptTokens += more
		if c2, _ := tbl.Cost("m", bigger); c2 < c {
			t.Fatalf("more tokens cost less: %d < %d", c2, c)
		}
		uncached := u
		uncached.CachedTokens = 0
		if c3, _ := tbl.Cost("m", uncached); c3 < c {
			t.Fatalf("cached tokens cost more than uncached: %d > %d", c, c3)
		}
	})
}
