package gateway

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"github.com/llmgate/llmgate/budget"
	budgetmemory "github.com/llmgate/llmgate/budget/memory"
)

// countingBudgets counts the settles that reach the budget store.
type countingBudgets struct {
	budget.Backend
	settles atomic.Int64
	settled chan struct{} // one value per settle done
}

func (c *countingBudgets) Settle(ctx context.Context, req budget.SettleRequest) (budget.SettleResult, error) {
	r, err := c.Backend.Settle(ctx, req)
	c.settles.Add(1)
	c.settled <- struct{}{}
	return r, err
}

// countingHarness is a harness whose budget store counts settles and whose
// usage batch flushes only at Close; edit, if not nil, changes the harness
// before the gateway is made.
func countingHarness(t *testing.T, edit func(*harness)) (*harness, *countingBudgets) {
	store := &countingBudgets{settled: make(chan struct{}, 100)}
	h := newHarness(t, harnessConfig{edit: func(o *Options, h *harness) {
		bb, err := budgetmemory.Open(budgetmemory.Config{})
		if err != nil {
			t.Fatal(err)
		}
		store.Backend = bb
		bm, err := budget.New(store, budget.Config{})
		if err != nil {
			t.Fatal(err)
		}
		o.Budgets, h.budgets = bm, bm
		o.Admission.UsageFlushInterval = time.Hour
		if edit != nil {
			edit(h)
		}
	}})
	return h, store
}

// TestUsageOfUncappedTenantsIsBatched: the usage of a tenant without a
// budget cap is recorded in one store call per row and interval (here,
// only at Close), with every request and token counted; a tenant with a
// cap is still settled request by request.
func TestUsageOfUncappedTenantsIsBatched(t *testing.T) {
	h, store := countingHarness(t, func(h *harness) {
		h.batch.Budget = &budget.Budget{Tenant: h.batch.Name, Period: budget.Month, Tokens: 1_000_000}
	})
	ctx := t.Context()
	team, batch := h.client(tenantKey), h.client(batchKey)
	const n = 10
	var prompt, completion int64
	for i := range n {
		c, err := team.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
			Model:    "gpt-4.1",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(fmt.Sprintf("question %d", i))},
		})
		if err != nil {
			t.Fatal(err)
		}
		prompt += c.Usage.PromptTokens
		completion += c.Usage.CompletionTokens
	}
	const capped = 3
	for i := range capped {
		if _, err := batch.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
			Model:    "gpt-4.1",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(fmt.Sprintf("batch %d", i))},
		}); err != nil {
			t.Fatal(err)
		}
	}
	// The capped tenant's settles run in the background.
	for range capped {
		select {
		case <-store.settled:
		case <-time.After(10 * time.Second):
			t.Fatalf("%d settles after 10s, want %d (the capped tenant's, one per request)", store.settles.Load(), capped)
		}
	}
	if got := store.settles.Load(); got != capped {
		t.Fatalf("%d settles before Close, want %d (the capped tenant's, one per request)", got, capped)
	}
	if err := h.gw.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if got := store.settles.Load(); got != capped+1 {
		t.Fatalf("%d settles after Close, want %d (one for the uncapped tenant's %d requests)", got, capped+1, n)
	}
	rows, err := h.budgets.Usage(ctx, "team-a", time.Now().UTC().Format("2006-01"))
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].Requests != n || rows[0].PromptTokens != prompt || rows[0].CompletionTokens != completion || rows[0].MicroUSD <= 0 {
		t.Fatalf("usage rows %+v; want one row of %d requests, %d prompt and %d completion tokens, priced", rows, n, prompt, completion)
	}
}

// TestCloseRecordsLateUsage: usage added while Close waits for the requests
// in flight (a request that ends after Close was called) is recorded by
// Close, which does not wait for the usage batch's flush timer: it once did,
// for the whole interval.
func TestCloseRecordsLateUsage(t *testing.T) {
	h, store := countingHarness(t, nil)
	g := h.gw
	g.pending.Add(1) // a request in flight
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	closed := make(chan error, 1)
	go func() { closed <- g.Close(ctx) }()
	// Wait until Close waits for that request.
	for deadline := time.Now().Add(10 * time.Second); ; runtime.Gosched() {
		g.pending.mu.Lock()
		waiting := g.pending.waiting
		g.pending.mu.Unlock()
		if waiting > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("Close does not wait for the request in flight")
		}
	}
	win, err := h.teamA.accountingBudget().Window(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	res := budget.Reservation{Tenant: h.teamA.Name, Window: win}
	g.usage.add(res, budget.Record{Model: "gpt-4.1", Deployment: "sim/gpt-4.1", Usage: budget.Usage{PromptTokens: 7, CompletionTokens: 5}})
	g.pending.Done() // the request ends
	if err := <-closed; err != nil {
		t.Fatalf("Close = %v; want it to return once the request ended", err)
	}
	if got := store.settles.Load(); got != 1 {
		t.Fatalf("%d settles after Close; want 1, the late request's usage", got)
	}
}
