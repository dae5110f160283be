package budget_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/llmgate/llmgate/budget"
	"github.com/llmgate/llmgate/budget/memory"
	"github.com/llmgate/llmgate/clock"
)

// A request reserves an upper bound of what it may use, calls the
// provider, and settles what the provider reported.
func ExampleManager_Reserve() {
	ctx := context.Background()
	clk := clock.NewFake(time.Date(2026, 11, 29, 19, 0, 0, 0, time.UTC))
	store, _ := memory.Open(memory.Config{Clock: clk}) // Config.Path persists it
	defer store.Close()
	m, _ := budget.New(store, budget.Config{Clock: clk})

	acme := budget.Budget{Tenant: "acme", Period: budget.Month, MicroUSD: 50_000} // $0.05 a month

	// Prompt of 1,000 tokens, max_tokens 2,000: at most 1,000×$2 + 2,000×$8 per million.
	res, err := m.Reserve(ctx, acme, "", "gpt-4.1", budget.Usage{PromptTokens: 1000, CompletionTokens: 2000})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("held", budget.FormatUSD(res.Hold.MicroUSD), "left", budget.FormatUSD(res.Left.MicroUSD))

	// The provider answered with 150 tokens; 800 prompt tokens came from its cache.
	s, _ := m.Settle(ctx, res, budget.Record{Deployment: "openai-main",
		Usage: budget.Usage{PromptTokens: 1000, CachedTokens: 800, CompletionTokens: 150}})
	fmt.Println("charged", budget.FormatUSD(s.Record.MicroUSD), "spent", budget.FormatUSD(s.Spent.MicroUSD))

	// A request that cannot fit is denied with what is left and when it resets.
	_, err = m.Reserve(ctx, acme, "", "gpt-4.1", budget.Usage{PromptTokens: 10_000, CompletionTokens: 4000})
	var ee *budget.ExhaustedError
	if errors.As(err, &ee) {
		fmt.Println("denied; left", budget.FormatUSD(ee.Left.MicroUSD), "until", ee.ResetAt().Format(time.DateOnly))
	}

	rows, _ := m.Usage(ctx, "acme", "2026-11")
	for _, r := range rows {
		fmt.Println(r.Model, r.Deployment, r.Requests, r.PromptTokens, r.CachedTokens, r.CompletionTokens, budget.FormatUSD(r.MicroUSD))
	}

	// Output:
	// held $0.018000 left $0.032000
	// charged $0.002000 spent $0.002000
	// denied; left $0.048000 until 2026-12-01
	// gpt-4.1 openai-main 1 1000 800 150 $0.002000
}
