// Package budgettest is the conformance suite every budget.Backend must pass.
//
// A backend's own tests call Run with a constructor for a store; the suite
// drives it through the public budget.Manager API with real goroutines, so
// it checks admission, settlement, expiry and accounting end to end.
package budgettest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmgate/llmgate/budget"
	"github.com/llmgate/llmgate/clock"
)

// NewStore makes a store for one subtest and returns a function that gives
// a new client of it: each client stands for a separate replica, and all of
// them must see the same state. Period boundaries follow clk (the Manager's
// clock); a backend whose reservations expire by its own clock (a server's)
// may ignore it, and the suite then waits in real time for expiry.
type NewStore func(t *testing.T, clk clock.Clock) (newReplica func() budget.Backend)

// Timing bounds: generous, because the suite runs under -race on busy
// machines.
const (
	// expiryTTL is the reservation TTL of the expiry test.
	expiryTTL = 300 * time.Millisecond
	// waitBound bounds every wait for a condition.
	waitBound = 10 * time.Second
	// pollEvery is how often a condition is checked.
	pollEvery = 5 * time.Millisecond
)

// Model prices for the suite: integers of µUSD per token make costs easy to
// check. Costs: test-model 1 µUSD per uncached prompt token, 0.25 per
// cached token, 2 per completion token.
const (
	testModel  = "test-model"
	otherModel = "other-model"
	freeModel  = "free-model" // costs nothing
)

// Prices is the price table the suite uses.
func Prices() budget.PriceTable {
	return budget.PriceTable{
		testModel:  {InputPerMTok: 1, CachedInputPerMTok: 0.25, OutputPerMTok: 2},
		otherModel: {InputPerMTok: 3, OutputPerMTok: 4},
		freeModel:  {},
	}
}

// Start is the fake clock's start: noon UTC on June 15 of next year, so
// that keys a networked store expires by the window's end are never in its
// past.
func Start() time.Time {
	return time.Date(time.Now().Year()+1, 6, 15, 12, 0, 0, 0, time.UTC)
}

// Run runs the conformance suite as subtests of t.
func Run(t *testing.T, newStore NewStore) {
	s := &suite{newStore: newStore}
	tests := []struct {
		name string
		fn   func(t *testing.T)
	}{
		{"TokenCap", s.testTokenCap},
		{"MoneyCap", s.testMoneyCap},
		{"BothCaps", s.testBothCaps},
		{"NoCapOnlyAccounts", s.testNoCap},
		{"DenialChangesNothing", s.testDenialChangesNothing},
		{"SettleChargesActual", s.testSettleChargesActual},
		{"SettleIdempotent", s.testSettleIdempotent},
		{"SettleSeveralRequests", s.testSettleSeveral},
		{"ReserveRetrySameID", s.testReserveRetry},
		{"ReleaseFrees", s.testRelease},
		{"UnsettledReservationIsCharged", s.testExpiryCharged},
		{"SettleAfterExpiryReplacesCharge", s.testSettleAfterExpiry},
		{"ReleaseAndExpiry", s.testReleaseAndExpiry},
		{"RenewKeepsAndRaisesHold", s.testRenew},
		{"UsageChargesExpiredHolds", s.testUsageSweeps},
		{"ConcurrentUpperBoundEstimatesNeverOvershoot", s.testConcurrentUpperBound},
		{"ConcurrentUnderEstimatesBoundedOvershoot", s.testConcurrentUnderEstimate},
		{"SequentialUnderEstimatesOvershootByLastError", s.testSequentialUnderEstimate},
		{"DayRollover", s.testDayRollover},
		{"MonthRolloverInTimeZone", s.testMonthRolloverTZ},
		{"UsageRowsAggregate", s.testUsageRows},
		{"CostFromPriceTable", s.testCost},
		{"UnknownModel", s.testUnknownModel},
		{"TenantsIndependent", s.testTenantsIndependent},
		{"LargeAmountsExact", s.testLargeAmounts},
		{"InvalidInput", s.testInvalid},
		{"LineFirstComeFirstServed", s.testLineFirstComeFirstServed},
		{"LineRefusesWhatCanNeverFit", s.testLineRefusesWhatCanNeverFit},
		{"LineDeadWaiterEvicted", s.testLineDeadWaiterEvicted},
		{"ReserveWaitAcrossReplicas", s.testReserveWaitAcrossReplicas},
		{"LearnedEstimate", s.testLearnedEstimate},
	}
	for _, tc := range tests {
		t.Run(tc.name, tc.fn)
	}
}

type suite struct {
	newStore NewStore
}

// env is one subtest's store, clock and tenant.
type env struct {
	t       *testing.T
	clk     *clock.Fake
	replica func() budget.Backend
	tenant  string
}

func (s *suite) env(t *testing.T, start time.Time) *env {
	t.Helper()
	clk := clock.NewFake(start)
	replica := s.newStore(t, clk)
	if replica == nil {
		t.Fatal("NewStore returned nil")
	}
	return &env{t: t, clk: clk, replica: replica, tenant: newTenant(t)}
}

// newTenant returns a tenant no other subtest or run uses.
func newTenant(t *testing.T) string {
	name := t.Name()
	if i := strings.LastIndexByte(name, '/'); i >= 0 {
		name = name[i+1:]
	}
	return "bt-" + name + "-" + budget.NewID()[:8]
}

// manager returns a Manager over a new replica.
func (e *env) manager(mod ...func(*budget.Config)) *budget.Manager {
	e.t.Helper()
	cfg := budget.Config{Prices: Prices(), Clock: e.clk}
	for _, f := range mod {
		f(&cfg)
	}
	m, err := budget.New(e.replica(), cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	return m
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func usage(prompt, completion int64) budget.Usage {
	return budget.Usage{PromptTokens: prompt, CompletionTokens: completion}
}

// mustReserve reserves or fails the test.
func mustReserve(t *testing.T, m *budget.Manager, b budget.Budget, model string, est budget.Usage) budget.Reservation {
	t.Helper()
	r, err := m.Reserve(ctxFor(t), b, "", model, est)
	if err != nil {
		t.Fatalf("Reserve(%+v): %v", est, err)
	}
	return r
}

// mustDeny expects an ExhaustedError and returns it.
func mustDeny(t *testing.T, m *budget.Manager, b budget.Budget, model string, est budget.Usage) *budget.ExhaustedError {
	t.Helper()
	r, err := m.Reserve(ctxFor(t), b, "", model, est)
	if err == nil {
		t.Fatalf("Reserve(%+v) admitted %+v, want ErrExhausted", est, r)
	}
	if !errors.Is(err, budget.ErrExhausted) {
		t.Fatalf("Reserve(%+v) = %v, want ErrExhausted", est, err)
	}
	var ee *budget.ExhaustedError
	if !errors.As(err, &ee) {
		t.Fatalf("Reserve error %T is not an *ExhaustedError", err)
	}
	return ee
}

func mustSettle(t *testing.T, m *budget.Manager, r budget.Reservation, rec budget.Record) budget.Settled {
	t.Helper()
	s, err := m.Settle(ctxFor(t), r, rec)
	if err != nil {
		t.Fatalf("Settle(%s): %v", r.ID, err)
	}
	return s
}

func status(t *testing.T, m *budget.Manager, b budget.Budget, at time.Time) budget.Status {
	t.Helper()
	st, err := m.Spend(ctxFor(t), b, at)
	if err != nil {
		t.Fatalf("Spend: %v", err)
	}
	return st
}

func wantStatus(t *testing.T, m *budget.Manager, b budget.Budget, at time.Time, spent, reserved budget.Amount, holds int) budget.Status {
	t.Helper()
	st := status(t, m, b, at)
	if st.Spent != spent || st.Reserved != reserved || st.Holds != holds {
		t.Fatalf("status = spent %+v reserved %+v holds %d; want spent %+v reserved %+v holds %d",
			st.Spent, st.Reserved, st.Holds, spent, reserved, holds)
	}
	return st
}

// eventually waits, bounded by waitBound, until cond holds.
func eventually(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(waitBound)
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not true after %v; last state: %s", what, waitBound, state)
		}
		time.Sleep(pollEvery) // polling the store: it has no change notification
	}
}

func (s *suite) testTokenCap(t *testing.T) {
	e := s.env(t, Start())
	m := e.manager()
	b := budget.Budget{Tenant: e.tenant, Period: budget.Day, Tokens: 1000}

	r1 := mustReserve(t, m, b, testModel, usage(400, 200))
	if r1.Hold.Tokens != 600 || r1.Left.Tokens != 400 || r1.Left.MicroUSD != budget.Unlimited {
		t.Fatalf("first reservation: hold %+v left %+v; want 600 tokens held, 400 left, money unlimited", r1.Hold, r1.Left)
	}
	ee := mustDeny(t, m, b, testModel, usage(300, 200))
	if !ee.Tokens || ee.Money || ee.Need.Tokens != 500 || ee.Left.Tokens != 400 || ee.Reserved.Tokens != 600 {
		t.Fatalf("denial = %+v; want the token cap, need 500, 400 left, 600 reserved", ee)
	}
	w, _ := b.Window(e.clk.Now())
	if !ee.ResetAt().Equal(w.End) || w.End.Sub(w.Start) != 24*time.Hour {
		t.Fatalf("ResetAt = %v, want the end of the day %v", ee.ResetAt(), w.End)
	}
	if ee.Tenant != e.tenant || ee.Window.ID != w.ID {
		t.Fatalf("denial names tenant %q window %q; want %q %q", ee.Tenant, ee.Window.ID, e.tenant, w.ID)
	}
	if msg := ee.Error(); !strings.Contains(msg, "budget: exhausted") || !strings.Contains(msg, w.ID) {
		t.Fatalf("error message %q lacks the sentinel or the window", msg)
	}
	r2 := mustReserve(t, m, b, testModel, usage(400, 0)) // an exact fit
	if r2.Left.Tokens != 0 {
		t.Fatalf("exact fit left %d tokens, want 0", r2.Left.Tokens)
	}
	// Nothing left: even a zero-token request is denied.
	mustDeny(t, m, b, testModel, usage(0, 0))
	wantStatus(t, m, b, e.clk.Now(), budget.Amount{}, budget.Amount{Tokens: 1000, MicroUSD: r1.Hold.MicroUSD + r2.Hold.MicroUSD}, 2)
	if st := m.Stats(); st.Admitted != 2 || st.Denied != 2 {
		t.Fatalf("stats %+v; want 2 admitted, 2 denied", st)
	}
}

func (s *suite) testMoneyCap(t *testing.T) {
	e := s.env(t, Start())
	m := e.manager()
	b := budget.Budget{Tenant: e.tenant, Period: budget.Month, MicroUSD: 5000}

	// 1000 prompt at 1 + 1000 completion at 2 = 3000 µUSD.
	r := mustReserve(t, m, b, testModel, usage(1000, 1000))
	if r.Hold != (budget.Amount{Tokens: 2000, MicroUSD: 3000}) || r.Left != (budget.Amount{Tokens: budget.Unlimited, MicroUSD: 2000}) {
		t.Fatalf("reservation hold %+v left %+v; want 2000 tokens / 3000 µUSD held, 2000 µUSD left", r.Hold, r.Left)
	}
	ee := mustDeny(t, m, b, testModel, usage(1000, 1000))
	if ee.Tokens || !ee.Money || ee.Need.MicroUSD != 3000 || ee.Left.MicroUSD != 2000 {
		t.Fatalf("denial = %+v; want the money cap, need 3000, 2000 left", ee)
	}
	if !strings.Contains(ee.Error(), "$0.002000 left") {
		t.Fatalf("error %q does not show money in dollars", ee.Error())
	}
	mustReserve(t, m, b, testModel, usage(0, 1000)) // 2000 µUSD: an exact fit
	wantStatus(t, m, b, e.clk.Now(), budget.Amount{}, budget.Amount{Tokens: 3000, MicroUSD: 5000}, 2)
}

func (s *suite) testBothCaps(t *testing.T) {
	e := s.env(t, Start())
	m := e.manager()
	b := budget.Budget{Tenant: e.tenant, Period: budget.Day, Tokens: 10_000, MicroUSD: 10_000}

	mustReserve(t, m, b, testModel, usage(4000, 0)) // 4000 tokens, 4000 µUSD
	// Fits the tokens, not the money: 4000 completion tokens = 8000 µUSD.
	ee := mustDeny(t, m, b, testModel, usage(0, 4000))
	if ee.Tokens || !ee.Money {
		t.Fatalf("denial caps tokens=%v money=%v; want money only", ee.Tokens, ee.Money)
	}
	// Fits the money, not the tokens: 6001 prompt tokens on a cheap model...
	// use cached tokens (0.25 µUSD each) to keep the cost low.
	ee = mustDeny(t, m, b, testModel, budget.Usage{PromptTokens: 6001, CachedTokens: 6001})
	if !ee.Tokens || ee.Money {
		t.Fatalf("denial caps tokens=%v money=%v; want tokens only", ee.Tokens, ee.Money)
	}
	// Fits neither.
	ee = mustDeny(t, m, b, testModel, usage(7000, 7000))
	if !ee.Tokens || !ee.Money {
		t.Fatalf("denial caps tokens=%v money=%v; want both", ee.Tokens, ee.Money)
	}
	// Fits both exactly: 6000 tokens, 6000 µUSD.
	mustReserve(t, m, b, testModel, usage(6000, 0))
	st := wantStatus(t, m, b, e.clk.Now(), budget.Amount{}, budget.Amount{Tokens: 10_000, MicroUSD: 10_000}, 2)
	if st.Left != (budget.Amount{}) {
		t.Fatalf("left %+v, want zero", st.Left)
	}
}

func (s *suite) testNoCap(t *testing.T) {
	e := s.env(t, Start())
	m := e.manager()
	b := budget.Budget{Tenant: e.tenant, Period: budget.Month}
	for range 3 {
		r := mustReserve(t, m, b, "unpriced-model", usage(1_000_000, 1_000_000))
		mustSettle(t, m, r, budget.Record{Usage: usage(1_000_000, 1_000_000)})
	}
	st := wantStatus(t, m, b, e.clk.Now(), budget.Amount{Tokens: 6_000_000}, budget.Amount{}, 0)
	if st.Left != (budget.Amount{Tokens: budget.Unlimited, MicroUSD: budget.Unlimited}) {
		t.Fatalf("left %+v, want unlimited", st.Left)
	}
	if got := m.Stats().Unpriced; got != 3 {
		t.Fatalf("Stats().Unpriced = %d, want 3", got)
	}
}

func (s *suite) testDenialChangesNothing(t *testing.T) {
	e := s.env(t, Start())
	m := e.manager()
	b := budget.Budget{Tenant: e.tenant, Period: budget.Day, Tokens: 5000, MicroUSD: 5000}
	r := mustReserve(t, m, b, testModel, usage(1000, 500)) // 1500 tokens, 2000 µUSD
	mustSettle(t, m, r, budget.Record{Usage: usage(1000, 500)})
	mustReserve(t, m, b, testModel, usage(1000, 0)) // held: 1000 tokens, 1000 µUSD
	before := status(t, m, b, e.clk.Now())

	// The token dimension fits (1500 + 1000 + 2000 ≤ 5000) but the money
	// does not (2000 + 1000 + 4000 > 5000): nothing may be reserved.
	for range 5 {
		mustDeny(t, m, b, testModel, usage(0, 2000))
	}
	after := status(t, m, b, e.clk.Now())
	if after.Spent != before.Spent || after.Reserved != before.Reserved || after.Holds != before.Holds {
		t.Fatalf("denials changed the state: before %+v, after %+v", before, after)
	}
}

func (s *suite) testSettleChargesActual(t *testing.T) {
	e := s.env(t, Start())
	m := e.manager()
	other := e.manager() // another replica settles
	b := budget.Budget{Tenant: e.tenant, Period: budget.Day, Tokens: 10_000, MicroUSD: 100_000}

	r := mustReserve(t, m, b, testModel, usage(1000, 1000))
	wantStatus(t, m, b, e.clk.Now(), budget.Amount{}, budget.Amount{Tokens: 2000, MicroUSD: 3000}, 1)
	// Less than estimated: 300 + 2*200 = 700 µUSD.
	got := mustSettle(t, other, r, budget.Record{Usage: usage(300, 200), Deployment: "dep-a"})
	if got.Duplicate || got.Record.MicroUSD != 700 || got.Spent != (budget.Amount{Tokens: 500, MicroUSD: 700}) {
		t.Fatalf("settle = %+v; want 700 µUSD charged, spent 500 tokens / 700 µUSD", got)
	}
	if got.Record.Tenant != e.tenant || got.Record.Model != testModel || !got.Record.Time.Equal(e.clk.Now()) {
		t.Fatalf("settled record %+v: tenant, model or time not filled in", got.Record)
	}
	wantStatus(t, m, b, e.clk.Now(), budget.Amount{Tokens: 500, MicroUSD: 700}, budget.Amount{}, 0)

	// More than estimated: the actual is charged, the hold freed.
	r = mustReserve(t, m, b, testModel, usage(100, 100))
	mustSettle(t, m, r, budget.Record{Usage: usage(2000, 1000)})
	wantStatus(t, m, b, e.clk.Now(), budget.Amount{Tokens: 3500, MicroUSD: 700 + 4000}, budget.Amount{}, 0)
	if st := m.Stats(); st.Settled != 1 {
		t.Fatalf("Stats().Settled = %d on this replica, want 1", st.Settled)
	}
}

// testSettleSeveral: a record may stand for several requests (a batch of
// usage recorded at once); its row counts them all, and spend is its tokens.
func (s *suite) testSettleSeveral(t *testing.T) {
	e := s.env(t, Start())
	m := e.manager()
	b := budget.Budget{Tenant: e.tenant, Period: budget.Day}
	r := mustReserve(t, m, b, testModel, usage(0, 0))
	mustSettle(t, m, r, budget.Record{Usage: usage(700, 300), Requests: 7, Deployment: "d", MicroUSD: 70})
	r2 := mustReserve(t, m, b, testModel, usage(0, 0))
	mustSettle(t, m, r2, budget.Record{Usage: usage(1, 1), Deployment: "d", MicroUSD: 1}) // Requests 0: one
	wantStatus(t, m, b, e.clk.Now(), budget.Amount{Tokens: 1002, MicroUSD: 71}, budget.Amount{}, 0)
	rows, err := m.Usage(ctxFor(t), e.tenant, r.Window.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].Requests != 8 || rows[0].PromptTokens != 701 || rows[0].MicroUSD != 71 {
		t.Fatalf("usage rows %+v; want one row of 8 requests, 701 prompt tokens, 71 µUSD", rows)
	}
	if _, err := m.Settle(ctxFor(t), r2, budget.Record{Usage: usage(1, 1), Requests: -1}); !errors.Is(err, budget.ErrInvalid) {
		t.Fatalf("Settle with -1 requests = %v, want ErrInvalid", err)
	}
}

func (s *suite) testSettleIdempotent(t *testing.T) {
	e := s.env(t, Start())
	m1, m2 := e.manager(), e.manager()
	b := budget.Budget{Tenant: e.tenant, Period: budget.Day, Tokens: 10_000}

	r := mustReserve(t, m1, b, testModel, usage(500, 500))
	rec := budget.Record{Usage: usage(400, 100), Deployment: "d"}
	first := mustSettle(t, m1, r, rec)
	for i, m := range []*budget.Manager{m1, m2, m1} {
		again := mustSettle(t, m, r, rec)
		if !again.Duplicate || again.Spent != first.Spent {
			t.Fatalf("settle #%d = %+v; want a duplicate with spend %+v unchanged", i+2, again, first.Spent)
		}
	}
	// A different usage under the same ID is still the same request.
	mustSettle(t, m2, r, budget.Record{Usage: usage(9000, 0)})
	wantStatus(t, m1, b, e.clk.Now(), first.Spent, budget.Amount{}, 0)
	rows, err := m1.Usage(ctxFor(t), e.tenant, r.Window.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].Requests != 1 || rows[0].PromptTokens != 400 {
		t.Fatalf("usage rows %+v; want one row with one request", rows)
	}
}

func (s *suite) testReserveRetry(t *testing.T) {
	e := s.env(t, Start())
	m := e.manager()
	b := budget.Budget{Tenant: e.tenant, Period: budget.Day, Tokens: 1000}
	ctx := ctxFor(t)

	r1, err := m.Reserve(ctx, b, "req-1", testModel, usage(600, 0))
	if err != nil {
		t.Fatal(err)
	}
	// A retry (outcome of the first unknown) holds nothing more, even
	// though a second hold would not fit.
	r2, err := m.Reserve(ctx, b, "req-1", testModel, usage(600, 0))
	if err != nil {
		t.Fatalf("retried Reserve: %v", err)
	}
	if r1.ID != r2.ID {
		t.Fatalf("retry has ID %q, want %q", r2.ID, r1.ID)
	}
	wantStatus(t, m, b, e.clk.Now(), budget.Amount{}, budget.Amount{Tokens: 600, MicroUSD: 600}, 1)
	mustSettle(t, m, r1, budget.Record{Usage: usage(100, 0)})
	if _, err := m.Reserve(ctx, b, "req-1", testModel, usage(100, 0)); !errors.Is(err, budget.ErrSettledID) {
		t.Fatalf("Reserve with a settled ID = %v, want ErrSettledID", err)
	}
	if r1.ID == "" || len(mustReserve(t, m, b, testModel, usage(1, 0)).ID) != 32 {
		t.Fatal("generated reservation IDs should be 32 hex digits")
	}
}

func (s *suite) testRelease(t *testing.T) {
	e := s.env(t, Start())
	m := e.manager()
	other := e.manager()
	b := budget.Budget{Tenant: e.tenant, Period: budget.Day, Tokens: 1000}
	ctx := ctxFor(t)

	r := mustReserve(t, m, b, testModel, usage(1000, 0))
	mustDeny(t, m, b, testModel, usage(1, 0))
	if err := other.Release(ctx, r); err != nil {
		t.Fatal(err)
	}
	wantStatus(t, m, b, e.clk.Now(), budget.Amount{}, budget.Amount{}, 0)
	if err := m.Release(ctx, r); err != nil {
		t.Fatalf("second Release: %v", err)
	}
	r2 := mustReserve(t, m, b, testModel, usage(1000, 0))

	// Release after settle: nothing changes.
	mustSettle(t, m, r2, budget.Record{Usage: usage(10, 0)})
	if err := m.Release(ctx, r2); err != nil {
		t.Fatal(err)
	}
	wantStatus(t, m, b, e.clk.Now(), budget.Amount{Tokens: 10, MicroUSD: 10}, budget.Amount{}, 0)

	// Settle after release still charges: the provider's bill is the truth.
	got := mustSettle(t, m, r, budget.Record{Usage: usage(5, 0)})
	if got.Duplicate {
		t.Fatal("settle after release reported a duplicate")
	}
	wantStatus(t, m, b, e.clk.Now(), budget.Amount{Tokens: 15, MicroUSD: 15}, budget.Amount{}, 0)
}

// outcome is one simulated request of the concurrency tests.
type outcome struct {
	admitted bool
	est      budget.Usage
	res      budget.Reservation
	settled  budget.Settled
	released bool
	err      error
}

// race runs n requests on goroutines spread over the managers, all starting
// together; each reserves est(i) and then settles actual(i, est) (or
// releases, when actual returns ok false).
func race(t *testing.T, ms []*budget.Manager, b budget.Budget, n int,
	est func(i int) budget.Usage, actual func(i int, est budget.Usage) (budget.Usage, bool)) []outcome {
	t.Helper()
	ctx := ctxFor(t)
	out := make([]outcome, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			m := ms[i%len(ms)]
			o := &out[i]
			o.est = est(i)
			<-start
			r, err := m.Reserve(ctx, b, "", testModel, o.est)
			if errors.Is(err, budget.ErrExhausted) {
				return
			}
			if err != nil {
				o.err = err
				return
			}
			o.admitted, o.res = true, r
			u, ok := actual(i, o.est)
			if !ok {
				o.released = true
				o.err = m.Release(ctx, r)
				return
			}
			o.settled, o.err = m.Settle(ctx, r, budget.Record{Usage: u, Deployment: fmt.Sprintf("dep-%d", i%3)})
		})
	}
	close(start)
	wg.Wait()
	for i, o := range out {
		if o.err != nil {
			t.Fatalf("request %d: %v", i, o.err)
		}
	}
	return out
}

// replicas returns n Managers, each over its own client of the store.
func (e *env) replicas(n int) []*budget.Manager {
	ms := make([]*budget.Manager, n)
	for i := range ms {
		ms[i] = e.manager()
	}
	return ms
}

// checkAccounting verifies that the store's spend is exactly the sum of
// what the settled requests reported, and that nothing is left reserved.
func checkAccounting(t *testing.T, m *budget.Manager, b budget.Budget, at time.Time, out []outcome) (spent budget.Amount, admitted int) {
	t.Helper()
	var sum budget.Amount
	var requests int64
	for _, o := range out {
		if o.admitted {
			admitted++
		}
		if o.admitted && !o.released {
			sum = sum.Add(budget.Amount{Tokens: o.settled.Record.Usage.Tokens(), MicroUSD: o.settled.Record.MicroUSD})
			requests++
		}
	}
	wantStatus(t, m, b, at, sum, budget.Amount{}, 0)
	w, _ := b.Window(at)
	rows, err := m.Usage(ctxFor(t), b.Tenant, w.ID)
	if err != nil {
		t.Fatal(err)
	}
	var rowRequests int64
	var rowSum budget.Amount
	for _, r := range rows {
		rowRequests += r.Requests
		rowSum = rowSum.Add(budget.Amount{Tokens: r.PromptTokens + r.CompletionTokens, MicroUSD: r.MicroUSD})
	}
	if rowRequests != requests || rowSum != sum {
		t.Fatalf("usage rows count %d requests, %+v; settled requests were %d, %+v", rowRequests, rowSum, requests, sum)
	}
	return sum, admitted
}

func (s *suite) testConcurrentUpperBound(t *testing.T) {
	e := s.env(t, Start())
	ms := e.replicas(4)
	b := budget.Budget{Tenant: e.tenant, Period: budget.Day, Tokens: 3000, MicroUSD: 4000}
	const n = 200
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rnd := rand.New(rand.NewPCG(seed, 1))
	ests := make([]budget.Usage, n)
	actuals := make([]budget.Usage, n)
	release := make([]bool, n)
	for i := range n {
		ests[i] = usage(20+rnd.Int64N(40), 10+rnd.Int64N(40))
		// The estimate is an upper bound: the actual is at most it.
		actuals[i] = usage(rnd.Int64N(ests[i].PromptTokens+1), rnd.Int64N(ests[i].CompletionTokens+1))
		release[i] = rnd.IntN(10) == 0
	}
	out := race(t, ms, b, n, func(i int) budget.Usage { return ests[i] },
		func(i int, _ budget.Usage) (budget.Usage, bool) { return actuals[i], !release[i] })

	spent, admitted := checkAccounting(t, ms[0], b, e.clk.Now(), out)
	t.Logf("admitted %d of %d; spent %+v of caps %+v", admitted, n, spent, b.Cap())
	if spent.Tokens > b.Tokens || spent.MicroUSD > b.MicroUSD {
		t.Fatalf("overshoot with upper-bound estimates: spent %+v, caps %+v", spent, b.Cap())
	}
	if admitted == 0 || admitted == n {
		t.Fatalf("admitted %d of %d: the budget should admit some and deny some", admitted, n)
	}
	// Every admission was checked against the caps at that moment.
	for i, o := range out {
		if !o.admitted {
			continue
		}
		r := o.res
		if r.Spent.Tokens+r.Reserved.Tokens > b.Tokens || r.Spent.MicroUSD+r.Reserved.MicroUSD > b.MicroUSD {
			t.Fatalf("request %d admitted with spent %+v + reserved %+v over the caps %+v", i, r.Spent, r.Reserved, b.Cap())
		}
	}
}

func (s *suite) testConcurrentUnderEstimate(t *testing.T) {
	e := s.env(t, Start())
	ms := e.replicas(4)
	b := budget.Budget{Tenant: e.tenant, Period: budget.Day, Tokens: 3000}
	const (
		n      = 200
		minEst = 40
		maxErr = 25 // each request uses up to this many tokens more than estimated
	)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rnd := rand.New(rand.NewPCG(seed, 2))
	ests := make([]budget.Usage, n)
	errs := make([]int64, n)
	for i := range n {
		ests[i] = usage(minEst/2+rnd.Int64N(30), minEst/2+rnd.Int64N(30))
		errs[i] = rnd.Int64N(maxErr + 1)
	}
	out := race(t, ms, b, n, func(i int) budget.Usage { return ests[i] },
		func(i int, est budget.Usage) (budget.Usage, bool) {
			return usage(est.PromptTokens, est.CompletionTokens+errs[i]), true
		})
	spent, admitted := checkAccounting(t, ms[0], b, e.clk.Now(), out)

	// The guarantee: spend exceeds the cap by at most the estimate errors
	// of the requests that were in flight when the last one was admitted.
	// Those held at most maxReserved tokens, so there were at most
	// maxReserved/minEst of them.
	var maxReserved int64
	for _, o := range out {
		if o.admitted {
			maxReserved = max(maxReserved, o.res.Reserved.Tokens)
		}
	}
	bound := b.Tokens + (maxReserved/minEst)*maxErr
	t.Logf("admitted %d of %d; spent %d tokens of cap %d; bound %d (in flight at most %d tokens)", admitted, n, spent.Tokens, b.Tokens, bound, maxReserved)
	if spent.Tokens > bound {
		t.Fatalf("spent %d tokens, above the bound %d (cap %d + in-flight estimate errors)", spent.Tokens, bound, b.Tokens)
	}
	if admitted == 0 || admitted == n {
		t.Fatalf("admitted %d of %d: the budget should admit some and deny some", admitted, n)
	}
}

func (s *suite) testSequentialUnderEstimate(t *testing.T) {
	e := s.env(t, Start())
	m := e.manager()
	b := budget.Budget{Tenant: e.tenant, Period: budget.Day, Tokens: 1000}
	const (
		est    = 100
		maxErr = 30
	)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rnd := rand.New(rand.NewPCG(seed, 3))
	for i := 0; ; i++ {
		if i > 1000 {
			t.Fatal("never denied")
		}
		r, err := m.Reserve(ctxFor(t), b, "", testModel, usage(est, 0))
		if errors.Is(err, budget.ErrExhausted) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		// Random under-estimates, and the worst one for the request that
		// fills the budget.
		extra := rnd.Int64N(maxErr + 1)
		if r.Left.Tokens < est {
			extra = maxErr
		}
		mustSettle(t, m, r, budget.Record{Usage: usage(est+extra, 0)})
	}
	st := status(t, m, b, e.clk.Now())
	t.Logf("spent %d tokens of cap %d", st.Spent.Tokens, b.Tokens)
	if st.Spent.Tokens > b.Tokens+maxErr {
		t.Fatalf("spent %d tokens: more than the cap %d plus the last request's estimate error %d", st.Spent.Tokens, b.Tokens, maxErr)
	}
	if st.Spent.Tokens+est <= b.Tokens {
		t.Fatalf("denied with %d tokens spent: a %d-token request still fit under %d", st.Spent.Tokens, est, b.Tokens)
	}
}

func (s *suite) testDayRollover(t *testing.T) {
	e := s.env(t, Start())
	m := e.manager()
	b := budget.Budget{Tenant: e.tenant, Period: budget.Day, Tokens: 100}
	day1 := e.clk.Now()
	r := mustReserve(t, m, b, testModel, usage(100, 0))
	mustSettle(t, m, r, budget.Record{Usage: usage(100, 0)})
	ee := mustDeny(t, m, b, testModel, usage(1, 0))

	// One nanosecond before midnight: still today.
	e.clk.Advance(ee.ResetAt().Sub(e.clk.Now()) - time.Nanosecond)
	mustDeny(t, m, b, testModel, usage(1, 0))
	e.clk.Advance(time.Nanosecond)
	r2 := mustReserve(t, m, b, testModel, usage(100, 0))
	if r2.Window.ID == r.Window.ID || !r2.Window.Start.Equal(ee.ResetAt()) {
		t.Fatalf("after midnight the window is %+v; want the next day, starting %v", r2.Window, ee.ResetAt())
	}
	wantStatus(t, m, b, day1, budget.Amount{Tokens: 100, MicroUSD: 100}, budget.Amount{}, 0)
	wantStatus(t, m, b, e.clk.Now(), budget.Amount{}, budget.Amount{Tokens: 100, MicroUSD: 100}, 1)
}

func (s *suite) testMonthRolloverTZ(t *testing.T) {
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatalf("time zone database: %v", err)
	}
	y := Start().Year()
	// 23:00 on March 31 in New York is 03:00 on April 1 in UTC.
	start := time.Date(y, time.March, 31, 23, 0, 0, 0, ny)
	e := s.env(t, start)
	m := e.manager()
	b := budget.Budget{Tenant: e.tenant, Period: budget.Month, Location: ny, MicroUSD: 1000}
	bUTC := budget.Budget{Tenant: e.tenant + "-utc", Period: budget.Month, MicroUSD: 1000}

	r := mustReserve(t, m, b, testModel, usage(1000, 0))
	if want := fmt.Sprintf("%d-03", y); r.Window.ID != want {
		t.Fatalf("New York window at %v is %q, want %q", start.UTC(), r.Window.ID, want)
	}
	if rUTC := mustReserve(t, m, bUTC, testModel, usage(1, 0)); rUTC.Window.ID != fmt.Sprintf("%d-04", y) {
		t.Fatalf("UTC window at %v is %q, want April", start.UTC(), rUTC.Window.ID)
	}
	mustSettle(t, m, r, budget.Record{Usage: usage(1000, 0)})
	ee := mustDeny(t, m, b, testModel, usage(1, 0))
	if want := time.Date(y, time.April, 1, 0, 0, 0, 0, ny); !ee.ResetAt().Equal(want) {
		t.Fatalf("ResetAt = %v, want %v (midnight in New York)", ee.ResetAt(), want)
	}
	e.clk.Advance(59 * time.Minute)
	mustDeny(t, m, b, testModel, usage(1, 0))
	e.clk.Advance(time.Minute)
	r2 := mustReserve(t, m, b, testModel, usage(1000, 0))
	if want := fmt.Sprintf("%d-04", y); r2.Window.ID != want {
		t.Fatalf("window after New York midnight is %q, want %q", r2.Window.ID, want)
	}
}

func (s *suite) testUsageRows(t *testing.T) {
	e := s.env(t, Start())
	m := e.manager()
	b := budget.Budget{Tenant: e.tenant, Period: budget.Month}
	settle := func(reserveModel string, rec budget.Record) {
		t.Helper()
		r := mustReserve(t, m, b, reserveModel, usage(10, 10))
		mustSettle(t, m, r, rec)
	}
	settle(testModel, budget.Record{Deployment: "azure-east", Usage: budget.Usage{PromptTokens: 100, CompletionTokens: 10, CachedTokens: 40}})
	settle(testModel, budget.Record{Deployment: "azure-east", Usage: budget.Usage{PromptTokens: 200, CompletionTokens: 20}})
	settle(testModel, budget.Record{Deployment: "openai", Usage: usage(1, 2)})
	// A fallback: reserved for testModel, served by otherModel.
	settle(testModel, budget.Record{Model: otherModel, Deployment: "openai", Usage: usage(10, 10)})
	settle(otherModel, budget.Record{Usage: usage(5, 5)}) // no deployment
	// Names that would collide under a naive encoding.
	settle(testModel, budget.Record{Model: "a:b", Deployment: "c", Usage: usage(1, 0)})
	settle(testModel, budget.Record{Model: "a", Deployment: ":bc", Usage: usage(2, 0)})

	w, _ := b.Window(e.clk.Now())
	rows, err := m.Usage(ctxFor(t), e.tenant, w.ID)
	if err != nil {
		t.Fatal(err)
	}
	want := []budget.UsageRow{
		{Model: "a", Deployment: ":bc", Requests: 1, PromptTokens: 2, MicroUSD: 2},
		{Model: "a:b", Deployment: "c", Requests: 1, PromptTokens: 1, MicroUSD: 1},
		{Model: otherModel, Deployment: "", Requests: 1, PromptTokens: 5, CompletionTokens: 5, MicroUSD: 35},
		{Model: otherModel, Deployment: "openai", Requests: 1, PromptTokens: 10, CompletionTokens: 10, MicroUSD: 70},
		// (60 + 40*0.25 + 20) + (200 + 40) = 90 + 240
		{Model: testModel, Deployment: "azure-east", Requests: 2, PromptTokens: 300, CompletionTokens: 30, CachedTokens: 40, MicroUSD: 330},
		{Model: testModel, Deployment: "openai", Requests: 1, PromptTokens: 1, CompletionTokens: 2, MicroUSD: 5},
	}
	if len(rows) != len(want) {
		t.Fatalf("got %d rows %+v, want %d %+v", len(rows), rows, len(want), want)
	}
	for i := range want {
		if rows[i] != want[i] {
			t.Errorf("row %d = %+v, want %+v", i, rows[i], want[i])
		}
	}
	// Another window, and another tenant, have no rows.
	next, _ := b.Window(w.End)
	if rows, err := m.Usage(ctxFor(t), e.tenant, next.ID); err != nil || len(rows) != 0 {
		t.Fatalf("next window rows = %+v, %v; want none", rows, err)
	}
	if rows, err := m.Usage(ctxFor(t), e.tenant+"-other", w.ID); err != nil || len(rows) != 0 {
		t.Fatalf("other tenant rows = %+v, %v; want none", rows, err)
	}
}

func (s *suite) testCost(t *testing.T) {
	e := s.env(t, Start())
	m := e.manager()
	b := budget.Budget{Tenant: e.tenant, Period: budget.Day, MicroUSD: 1_000_000}

	// 1000 prompt of which 400 cached, 500 completion:
	// 600*1 + 400*0.25 + 500*2 = 1700 µUSD.
	u := budget.Usage{PromptTokens: 1000, CachedTokens: 400, CompletionTokens: 500}
	r, err := m.Reserve(ctxFor(t), b, "", testModel, u)
	if err != nil {
		t.Fatal(err)
	}
	if r.Hold.MicroUSD != 1700 {
		t.Fatalf("estimate with cached tokens holds %d µUSD, want 1700", r.Hold.MicroUSD)
	}
	got := mustSettle(t, m, r, budget.Record{Usage: u})
	if got.Record.MicroUSD != 1700 || got.Spent.MicroUSD != 1700 {
		t.Fatalf("settled %+v, want 1700 µUSD", got)
	}
	// A dated snapshot name is priced as its model; fractions round up
	// once per request: 3 cached tokens at 0.25 = 0.75 → 1 µUSD.
	r = mustReserve(t, m, b, testModel+"-2025-04-14", budget.Usage{PromptTokens: 3, CachedTokens: 3})
	if got := mustSettle(t, m, r, budget.Record{Usage: budget.Usage{PromptTokens: 3, CachedTokens: 3}}); got.Record.MicroUSD != 1 {
		t.Fatalf("3 cached tokens cost %d µUSD, want 1 (rounded up)", got.Record.MicroUSD)
	}
	// A cost the caller knows (the provider reported it) is used as is.
	r = mustReserve(t, m, b, testModel, usage(10, 10))
	if got := mustSettle(t, m, r, budget.Record{Usage: usage(10, 10), MicroUSD: 12345}); got.Record.MicroUSD != 12345 {
		t.Fatalf("explicit cost became %d", got.Record.MicroUSD)
	}
	// A fallback model without a price is charged at the reserved model's.
	r = mustReserve(t, m, b, otherModel, usage(10, 10))
	if got := mustSettle(t, m, r, budget.Record{Model: "mystery", Usage: usage(10, 10)}); got.Record.MicroUSD != 70 || got.Record.Model != "mystery" {
		t.Fatalf("unpriced fallback: %+v; want 70 µUSD at other-model's price, model mystery", got.Record)
	}
	wantStatus(t, m, b, e.clk.Now(), budget.Amount{Tokens: 1500 + 3 + 20 + 20, MicroUSD: 1700 + 1 + 12345 + 70}, budget.Amount{}, 0)
}

func (s *suite) testUnknownModel(t *testing.T) {
	e := s.env(t, Start())
	m := e.manager()
	money := budget.Budget{Tenant: e.tenant, Period: budget.Day, MicroUSD: 1000}
	_, err := m.Reserve(ctxFor(t), money, "", "no-such-model", usage(1, 1))
	if !errors.Is(err, budget.ErrUnknownPrice) || errors.Is(err, budget.ErrStoreUnavailable) {
		t.Fatalf("money budget, unpriced model: %v; want ErrUnknownPrice", err)
	}
	wantStatus(t, m, money, e.clk.Now(), budget.Amount{}, budget.Amount{}, 0)
	tokens := budget.Budget{Tenant: e.tenant, Period: budget.Day, Tokens: 1000}
	r := mustReserve(t, m, tokens, "no-such-model", usage(1, 1))
	if got := mustSettle(t, m, r, budget.Record{Usage: usage(1, 1)}); got.Record.MicroUSD != 0 {
		t.Fatalf("unpriced model cost %d, want 0", got.Record.MicroUSD)
	}
	if m.Stats().Unpriced != 1 {
		t.Fatalf("Stats().Unpriced = %d, want 1", m.Stats().Unpriced)
	}
}

func (s *suite) testTenantsIndependent(t *testing.T) {
	e := s.env(t, Start())
	m := e.manager()
	// Tenants whose names contain hash-tag and separator characters.
	names := []string{e.tenant + "-a", e.tenant + "-{b}", e.tenant + "-c}:2026", e.tenant + "-ä ü"}
	for _, n := range names {
		b := budget.Budget{Tenant: n, Period: budget.Day, Tokens: 100}
		r := mustReserve(t, m, b, testModel, usage(100, 0))
		mustSettle(t, m, r, budget.Record{Usage: usage(100, 0)})
		mustDeny(t, m, b, testModel, usage(1, 0))
	}
	for _, n := range names {
		b := budget.Budget{Tenant: n, Period: budget.Day, Tokens: 100}
		wantStatus(t, m, b, e.clk.Now(), budget.Amount{Tokens: 100, MicroUSD: 100}, budget.Amount{}, 0)
		// The same tenant's month is separate from its day.
		bm := budget.Budget{Tenant: n, Period: budget.Month, Tokens: 100}
		wantStatus(t, m, bm, e.clk.Now(), budget.Amount{}, budget.Amount{}, 0)
	}
}

func (s *suite) testInvalid(t *testing.T) {
	e := s.env(t, Start())
	m := e.manager()
	ctx := ctxFor(t)
	good := budget.Budget{Tenant: e.tenant, Period: budget.Day, Tokens: 100}
	bad := []struct {
		name  string
		b     budget.Budget
		id    string
		model string
		est   budget.Usage
	}{
		{"empty tenant", budget.Budget{Period: budget.Day}, "", testModel, usage(1, 1)},
		{"control char tenant", budget.Budget{Tenant: "a\nb", Period: budget.Day}, "", testModel, usage(1, 1)},
		{"long tenant", budget.Budget{Tenant: strings.Repeat("t", budget.MaxNameLen+1), Period: budget.Day}, "", testModel, usage(1, 1)},
		{"bad period", budget.Budget{Tenant: "x", Period: "week"}, "", testModel, usage(1, 1)},
		{"negative cap", budget.Budget{Tenant: "x", Period: budget.Day, Tokens: -1}, "", testModel, usage(1, 1)},
		{"huge cap", budget.Budget{Tenant: "x", Period: budget.Day, MicroUSD: budget.MaxAmount + 1}, "", testModel, usage(1, 1)},
		{"empty model", good, "", "", usage(1, 1)},
		{"negative estimate", good, "", testModel, usage(-1, 1)},
		{"cached above prompt", good, "", testModel, budget.Usage{PromptTokens: 1, CachedTokens: 2}},
		{"bad id", good, "a\x00b", testModel, usage(1, 1)},
	}
	for _, tc := range bad {
		_, err := m.Reserve(ctx, tc.b, tc.id, tc.model, tc.est)
		if !errors.Is(err, budget.ErrInvalid) {
			t.Errorf("%s: Reserve = %v, want ErrInvalid", tc.name, err)
		}
	}
	r := mustReserve(t, m, good, testModel, usage(10, 0))
	if _, err := m.Settle(ctx, r, budget.Record{Usage: usage(-5, 0)}); !errors.Is(err, budget.ErrInvalid) {
		t.Errorf("Settle with negative usage = %v, want ErrInvalid", err)
	}
	if _, err := m.Settle(ctx, r, budget.Record{Tenant: "someone-else", Usage: usage(5, 0)}); !errors.Is(err, budget.ErrInvalid) {
		t.Errorf("Settle with another tenant = %v, want ErrInvalid", err)
	}
	if _, err := m.Settle(ctx, budget.Reservation{}, budget.Record{}); !errors.Is(err, budget.ErrInvalid) {
		t.Errorf("Settle of a zero Reservation = %v, want ErrInvalid", err)
	}
	if _, err := m.Usage(ctx, e.tenant, "2026-13"); !errors.Is(err, budget.ErrInvalid) {
		t.Errorf("Usage with a bad window = %v, want ErrInvalid", err)
	}
	// None of that touched the store.
	wantStatus(t, m, good, e.clk.Now(), budget.Amount{}, budget.Amount{Tokens: 10, MicroUSD: 10}, 1)
	if st := m.Stats(); st.StoreErrors != 0 {
		t.Fatalf("invalid input counted as store errors: %+v", st)
	}
}

// testLargeAmounts checks exact arithmetic up to budget.MaxAmount (2^53-1):
// scripting languages that compute in doubles must not round.
func (s *suite) testLargeAmounts(t *testing.T) {
	e := s.env(t, Start())
	m := e.manager()
	b := budget.Budget{Tenant: e.tenant, Period: budget.Month, Tokens: budget.MaxAmount, MicroUSD: budget.MaxAmount}
	half := int64(budget.MaxAmount / 2) // 2^52 - 1
	r := mustReserve(t, m, b, freeModel, usage(half, half))
	wantStatus(t, m, b, e.clk.Now(), budget.Amount{}, budget.Amount{Tokens: 2 * half}, 1)
	mustSettle(t, m, r, budget.Record{Usage: usage(half, half), MicroUSD: budget.MaxAmount - 1})
	wantStatus(t, m, b, e.clk.Now(), budget.Amount{Tokens: 2 * half, MicroUSD: budget.MaxAmount - 1}, budget.Amount{}, 0)
	// 2^53 - 2 spent: exactly one token and one micro-dollar are left.
	mustDeny(t, m, b, freeModel, usage(2, 0))
	r = mustReserve(t, m, b, testModel, usage(1, 0))
	if r.Left != (budget.Amount{}) {
		t.Fatalf("left after the last token: %+v, want zero", r.Left)
	}
	mustDeny(t, m, b, freeModel, usage(0, 0))
	if err := m.Release(ctxFor(t), r); err != nil {
		t.Fatal(err)
	}
	wantStatus(t, m, b, e.clk.Now(), budget.Amount{Tokens: 2 * half, MicroUSD: budget.MaxAmount - 1}, budget.Amount{}, 0)
}
