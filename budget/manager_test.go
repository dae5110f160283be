package budget_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgate/llmgate/budget"
	"github.com/llmgate/llmgate/budget/memory"
	"github.com/llmgate/llmgate/clock"
)

// flaky wraps a backend and fails every call while down is set.
type flaky struct {
	budget.Backend
	down atomic.Bool
}

var errDown = errors.New("connection refused")

func (f *flaky) Reserve(ctx context.Context, req budget.ReserveRequest) (budget.ReserveResult, error) {
	if f.down.Load() {
		return budget.ReserveResult{}, errDown
	}
	return f.Backend.Reserve(ctx, req)
}

func (f *flaky) Settle(ctx context.Context, req budget.SettleRequest) (budget.SettleResult, error) {
	if f.down.Load() {
		return budget.SettleResult{}, errDown
	}
	return f.Backend.Settle(ctx, req)
}

func (f *flaky) Release(ctx context.Context, key budget.Key, id string) (bool, error) {
	if f.down.Load() {
		return false, errDown
	}
	return f.Backend.Release(ctx, key, id)
}

func (f *flaky) Totals(ctx context.Context, key budget.Key) (budget.Totals, error) {
	if f.down.Load() {
		return budget.Totals{}, errDown
	}
	return f.Backend.Totals(ctx, key)
}

func newFlaky(t *testing.T) *flaky {
	t.Helper()
	b, err := memory.Open(memory.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return &flaky{Backend: b}
}

var acme = budget.Budget{Tenant: "acme", Period: budget.Day, Tokens: 1000, MicroUSD: 1_000_000}

func TestFailClosedByDefault(t *testing.T) {
	f := newFlaky(t)
	var logs bytes.Buffer
	m, err := budget.New(f, budget.Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	f.down.Store(true)
	_, err = m.Reserve(t.Context(), acme, "", "gpt-4o", budget.Usage{PromptTokens: 10})
	if !errors.Is(err, budget.ErrStoreUnavailable) || !errors.Is(err, errDown) {
		t.Fatalf("Reserve with the store down = %v; want ErrStoreUnavailable wrapping the cause", err)
	}
	if st := m.Stats(); st.StoreErrors != 1 || st.FailedOpen != 0 || st.Admitted != 0 {
		t.Fatalf("stats %+v", st)
	}
	if !strings.Contains(logs.String(), "fail-closed") || !strings.Contains(logs.String(), "tenant=acme") {
		t.Fatalf("log %q should say fail-closed and name the tenant", logs.String())
	}
	if _, err := m.Spend(t.Context(), acme, time.Now()); !errors.Is(err, budget.ErrStoreUnavailable) {
		t.Fatalf("Spend with the store down = %v", err)
	}
}

func TestFailOpen(t *testing.T) {
	f := newFlaky(t)
	var logs bytes.Buffer
	m, err := budget.New(f, budget.Config{FailOpen: true, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	f.down.Store(true)
	r, err := m.Reserve(t.Context(), acme, "", "gpt-4o", budget.Usage{PromptTokens: 10})
	if err != nil || !r.Unchecked || r.ID == "" {
		t.Fatalf("fail-open Reserve = %+v, %v; want an unchecked reservation", r, err)
	}
	if st := m.Stats(); st.StoreErrors != 1 || st.FailedOpen != 1 {
		t.Fatalf("stats %+v", st)
	}
	if !strings.Contains(logs.String(), "fail-open") {
		t.Fatalf("log %q should say fail-open", logs.String())
	}
	// Settle fails while the store is down (the caller retries) ...
	if _, err := m.Settle(t.Context(), r, budget.Record{Usage: budget.Usage{PromptTokens: 10}}); !errors.Is(err, budget.ErrStoreUnavailable) {
		t.Fatalf("Settle with the store down = %v", err)
	}
	if err := m.Release(t.Context(), r); !errors.Is(err, budget.ErrStoreUnavailable) {
		t.Fatalf("Release with the store down = %v", err)
	}
	// ... and charges the unchecked request once the store is back.
	f.down.Store(false)
	s, err := m.Settle(t.Context(), r, budget.Record{Usage: budget.Usage{PromptTokens: 10}})
	if err != nil || s.Spent.Tokens != 10 {
		t.Fatalf("Settle after recovery = %+v, %v", s, err)
	}
	// Invalid input and denials are never "failing open".
	if _, err := m.Reserve(t.Context(), acme, "", "gpt-4o", budget.Usage{PromptTokens: 5000}); !errors.Is(err, budget.ErrExhausted) {
		t.Fatalf("over-budget Reserve with fail-open = %v, want ErrExhausted", err)
	}
}

func TestCancelledContextIsNotAnOutage(t *testing.T) {
	f := newFlaky(t)
	m, err := budget.New(f, budget.Config{FailOpen: true})
	if err != nil {
		t.Fatal(err)
	}
	f.down.Store(true)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err = m.Reserve(ctx, acme, "", "gpt-4o", budget.Usage{PromptTokens: 1})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Reserve with a cancelled context = %v, want context.Canceled", err)
	}
	if st := m.Stats(); st.StoreErrors != 0 || st.FailedOpen != 0 {
		t.Fatalf("a cancelled caller counted as an outage: %+v", st)
	}
}

func TestConfigValidate(t *testing.T) {
	b := newFlaky(t)
	bad := []budget.Config{
		{TTL: time.Millisecond},
		{RememberSettled: time.Nanosecond},
		{Retention: -time.Hour},
		{Prices: budget.PriceTable{"m": {InputPerMTok: -1}}},
	}
	for _, c := range bad {
		if _, err := budget.New(b, c); !errors.Is(err, budget.ErrInvalid) {
			t.Errorf("New(%+v) = %v, want ErrInvalid", c, err)
		}
	}
	if _, err := budget.New(nil, budget.Config{}); !errors.Is(err, budget.ErrInvalid) {
		t.Errorf("New(nil) = %v", err)
	}
	m, err := budget.New(b, budget.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := m.Prices()["gpt-4.1"]; !ok {
		t.Error("default config lacks the default prices")
	}
}

func TestBudgetValidateMessages(t *testing.T) {
	cases := map[string]budget.Budget{
		"Tenant is empty":     {Period: budget.Day},
		"want day or month":   {Tenant: "t", Period: "year"},
		"period is empty":     {Tenant: "t"},
		"use 0 for no cap":    {Tenant: "t", Period: budget.Day, MicroUSD: -5},
		"above the maximum":   {Tenant: "t", Period: budget.Day, Tokens: budget.MaxAmount + 1},
		"control characters":  {Tenant: "t\x1b[31m", Period: budget.Day},
		"not valid UTF-8":     {Tenant: "t\xff", Period: budget.Day},
		"bytes long; at most": {Tenant: strings.Repeat("x", 300), Period: budget.Day},
	}
	for want, b := range cases {
		err := b.Validate()
		if !errors.Is(err, budget.ErrInvalid) || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate(%+v) = %v; want ErrInvalid saying %q", b, err, want)
		}
	}
	if err := (budget.Budget{Tenant: "t", Period: budget.Month}).Validate(); err != nil {
		t.Errorf("an accounting-only budget is valid: %v", err)
	}
}

func TestExhaustedError(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 11, 29, 19, 0, 0, 0, time.UTC))
	b, err := memory.Open(memory.Config{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	m, err := budget.New(b, budget.Config{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	tight := budget.Budget{Tenant: "acme", Period: budget.Month, MicroUSD: 1_500_000}
	_, err = m.Reserve(t.Context(), tight, "", "gpt-4.1", budget.Usage{PromptTokens: 1_000_000}) // $2.00
	var ee *budget.ExhaustedError
	if !errors.As(err, &ee) || !errors.Is(err, budget.ErrExhausted) {
		t.Fatalf("Reserve = %v", err)
	}
	want := `budget: exhausted: tenant "acme" month 2026-11: money: need $2.000000, $1.500000 left; resets at 2026-12-01T00:00:00Z`
	if err.Error() != want {
		t.Fatalf("message\n%s\nwant\n%s", err, want)
	}
	if !ee.ResetAt().Equal(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)) {
		t.Fatalf("ResetAt %v", ee.ResetAt())
	}
}

func TestFormatUSD(t *testing.T) {
	for in, want := range map[int64]string{0: "$0.000000", 1: "$0.000001", 1_234_567: "$1.234567", -2_500_000: "-$2.500000", -9223372036854775808: "-$9223372036854.775808"} {
		if got := budget.FormatUSD(in); got != want {
			t.Errorf("FormatUSD(%d) = %q, want %q", in, got, want)
		}
	}
}
