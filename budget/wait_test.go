package budget_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/llmgate/llmgate/budget"
	"github.com/llmgate/llmgate/budget/memory"
)

// waitBudget is a token-only budget: the test model has no price.
var waitBudget = budget.Budget{Tenant: "acme", Period: budget.Day, Tokens: 1000}

func newWaitManager(t *testing.T) *budget.Manager {
	t.Helper()
	b, err := memory.Open(memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	m, err := budget.New(b, budget.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func tokens(n int64) budget.Usage { return budget.Usage{PromptTokens: n} }

// waitResult is what a ReserveWait in a goroutine returned.
type waitResult struct {
	res budget.Reservation
	err error
}

func reserveWaitAsync(m *budget.Manager, need int64, maxWait time.Duration) <-chan waitResult {
	ch := make(chan waitResult, 1)
	go func() {
		res, err := m.ReserveWait(context.Background(), waitBudget, "", "m", tokens(need), maxWait)
		ch <- waitResult{res, err}
	}()
	return ch
}

// TestReserveWaitAdmitsWhenHoldsSettleLow: a request that does not fit
// while another's hold is in flight waits, and is admitted when that
// request settles below its hold.
func TestReserveWaitAdmitsWhenHoldsSettleLow(t *testing.T) {
	m := newWaitManager(t)
	ctx := t.Context()
	first, err := m.Reserve(ctx, waitBudget, "", "m", tokens(800))
	if err != nil {
		t.Fatal(err)
	}
	waiting := reserveWaitAsync(m, 500, time.Minute)
	// It cannot be admitted before the settle: 800 + 500 > 1000.
	select {
	case r := <-waiting:
		t.Fatalf("admitted or refused before the settle: %+v %v", r.res, r.err)
	case <-time.After(50 * time.Millisecond): // it had the time to be wrongly admitted
	}
	if _, err := m.Settle(ctx, first, budget.Record{Usage: tokens(100)}); err != nil {
		t.Fatal(err)
	}
	r := <-waiting
	if r.err != nil {
		t.Fatalf("after the settle: %v", r.err)
	}
	st, err := m.Spend(ctx, waitBudget, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if st.Spent.Tokens != 100 || st.Reserved.Tokens != 500 {
		t.Fatalf("spend %+v; want 100 spent, 500 held", st)
	}
}

// TestReserveWaitRefusesAtOnceWhenWaitingCannotHelp: nothing in flight, or
// a need beyond what is left even if every hold settled at 0, is refused
// without waiting.
func TestReserveWaitRefusesAtOnceWhenWaitingCannotHelp(t *testing.T) {
	m := newWaitManager(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	res, err := m.Reserve(ctx, waitBudget, "", "m", tokens(700))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Settle(ctx, res, budget.Record{Usage: tokens(700)}); err != nil {
		t.Fatal(err)
	}
	// 700 spent, nothing held: 400 can never fit.
	start := time.Now()
	if _, err := m.ReserveWait(ctx, waitBudget, "", "m", tokens(400), time.Hour); !errors.Is(err, budget.ErrExhausted) {
		t.Fatalf("nothing in flight: %v; want ErrExhausted", err)
	}
	// 700 spent, 200 held: 400 does not fit even if the 200 cost nothing.
	if _, err := m.Reserve(ctx, waitBudget, "", "m", tokens(200)); err != nil {
		t.Fatal(err)
	}
	if _, err := m.ReserveWait(ctx, waitBudget, "", "m", tokens(400), time.Hour); !errors.Is(err, budget.ErrExhausted) {
		t.Fatalf("beyond what is left: %v; want ErrExhausted", err)
	}
	// Both returned without waiting out the hour (the context's minute).
	if ctx.Err() != nil {
		t.Fatalf("refusals took %v", time.Since(start))
	}
}

// TestReserveWaitGivesUpAtMaxWait: a hold that never settles leaves the
// waiter refused when its max wait passes.
func TestReserveWaitGivesUpAtMaxWait(t *testing.T) {
	m := newWaitManager(t)
	if _, err := m.Reserve(t.Context(), waitBudget, "", "m", tokens(900)); err != nil {
		t.Fatal(err)
	}
	const maxWait = 100 * time.Millisecond
	start := time.Now()
	_, err := m.ReserveWait(t.Context(), waitBudget, "", "m", tokens(500), maxWait)
	if !errors.Is(err, budget.ErrExhausted) {
		t.Fatalf("%v; want ErrExhausted", err)
	}
	if took := time.Since(start); took < maxWait {
		t.Fatalf("refused after %v, before the max wait %v", took, maxWait)
	}
}

// TestReserveWaitInArrivalOrder: waiters are admitted oldest first, even
// when a younger one would fit sooner.
func TestReserveWaitInArrivalOrder(t *testing.T) {
	m := newWaitManager(t)
	ctx := t.Context()
	var held [2]budget.Reservation
	for i := range held {
		r, err := m.Reserve(ctx, waitBudget, "", "m", tokens(500))
		if err != nil {
			t.Fatal(err)
		}
		held[i] = r
	}
	big := reserveWaitAsync(m, 600, time.Minute)
	waitQueued(t, m, 1)
	small := reserveWaitAsync(m, 100, time.Minute)
	waitQueued(t, m, 2)
	// One hold settles at 0: the small one would fit now (500 + 100), but
	// the big one (500 + 600) is first and still waits.
	if _, err := m.Settle(ctx, held[0], budget.Record{}); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-small:
		t.Fatalf("the younger waiter went first: %+v %v", r.res, r.err)
	case r := <-big:
		t.Fatalf("the big waiter did not wait: %+v %v", r.res, r.err)
	case <-time.After(50 * time.Millisecond): // the time to go wrong
	}
	if _, err := m.Settle(ctx, held[1], budget.Record{}); err != nil {
		t.Fatal(err)
	}
	for name, ch := range map[string]<-chan waitResult{"big": big, "small": small} {
		if r := <-ch; r.err != nil {
			t.Fatalf("%s: %v", name, r.err)
		}
	}
	if n := m.Stats().Waiting; n != 0 {
		t.Fatalf("%d still waiting", n)
	}
}

func waitQueued(t *testing.T, m *budget.Manager, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for m.Stats().Waiting != uint64(n) {
		if time.Now().After(deadline) {
			t.Fatalf("%d waiters, want %d", m.Stats().Waiting, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestReserveWaitFuncRetriesWithLearnedEstimate: a replica that knows
// nothing yet reserves with its default, and when the store's reply
// carries the estimate learned from other replicas' answers, it tries
// again at once with it, instead of waiting for room it does not need.
func TestReserveWaitFuncRetriesWithLearnedEstimate(t *testing.T) {
	b, err := memory.Open(memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	newManager := func() *budget.Manager {
		// Renewals of a place every 20 minutes: only a retry admits soon.
		m, err := budget.New(b, budget.Config{WaiterLease: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	warm, cold := newManager(), newManager()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for range budget.LearnMinSamples {
		r, err := warm.Reserve(ctx, waitBudget, "", "m", budget.Usage{PromptTokens: 10, CompletionTokens: 500})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := warm.Settle(ctx, r, budget.Record{Usage: budget.Usage{PromptTokens: 10, CompletionTokens: 30}, LearnCompletion: 30}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := warm.Reserve(ctx, waitBudget, "", "m", tokens(600)); err != nil {
		t.Fatal(err)
	}
	// 240 spent, 600 held: the default 10 + 500 does not fit, 10 + 30 does.
	tries := 0
	res, err := cold.ReserveWaitFunc(ctx, waitBudget, "", "m", func() budget.Usage {
		tries++
		completion, ok := cold.Learned("acme", "m")
		if !ok {
			completion = 500
		}
		return budget.Usage{PromptTokens: 10, CompletionTokens: completion}
	}, time.Hour)
	if err != nil {
		t.Fatalf("ReserveWaitFunc: %v (estimate asked %d times)", err, tries)
	}
	if res.Estimate.CompletionTokens != 30 {
		t.Fatalf("reserved %+v; want the learned 30 completion tokens", res.Estimate)
	}
}
