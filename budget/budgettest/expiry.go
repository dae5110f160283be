package budgettest

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/llmgate/llmgate/budget"
)

// Tests of what happens to a reservation that is never settled: it is
// charged when it expires (see the budget package doc).

// renewTTL is the reservation TTL of the renewal test: long enough that a
// renewal every renewStep on a busy machine never misses it.
const (
	renewTTL  = time.Second
	renewStep = 400 * time.Millisecond
)

// pass lets d go by, on the fake clock and in real time (a backend on its
// own clock, a server's, only sees the latter): the subject of the renewal
// test is time passing.
func (e *env) pass(d time.Duration) {
	e.clk.Advance(d)
	time.Sleep(d)
}

// expire moves the fake clock past ttl (a backend on its own clock just
// needs real time to pass) and waits until m's store has no live holds.
func (e *env) expire(m *budget.Manager, b budget.Budget, ttl time.Duration) budget.Status {
	e.t.Helper()
	e.clk.Advance(ttl + time.Millisecond)
	var st budget.Status
	eventually(e.t, "the expired holds are swept", func() (bool, string) {
		st = status(e.t, m, b, e.clk.Now())
		return st.Holds == 0, fmt.Sprintf("%+v", st)
	})
	return st
}

// wantRows checks tenant's usage rows in the window at the fake clock's now.
func (e *env) wantRows(m *budget.Manager, b budget.Budget, want ...budget.UsageRow) {
	e.t.Helper()
	w, _ := b.Window(e.clk.Now())
	rows, err := m.Usage(ctxFor(e.t), e.tenant, w.ID)
	if err != nil {
		e.t.Fatal(err)
	}
	if len(rows) != len(want) {
		e.t.Fatalf("usage rows %+v, want %+v", rows, want)
	}
	for i := range want {
		if rows[i] != want[i] {
			e.t.Fatalf("usage row %d = %+v, want %+v", i, rows[i], want[i])
		}
	}
}

func withTTL(ttl time.Duration) func(*budget.Config) {
	return func(c *budget.Config) { c.TTL = ttl }
}

// testExpiryCharged: a hold whose caller never settles (it crashed) is
// charged when it expires: spend, usage row, and the cap, by any replica.
func (s *suite) testExpiryCharged(t *testing.T) {
	e := s.env(t, Start())
	m := e.manager(withTTL(expiryTTL))
	other := e.manager(withTTL(expiryTTL))
	b := budget.Budget{Tenant: e.tenant, Period: budget.Day, Tokens: 1000}

	r := mustReserve(t, m, b, testModel, usage(600, 200)) // 800 tokens, 600 + 400 µUSD
	st := e.expire(other, b, expiryTTL)
	hold := budget.Amount{Tokens: 800, MicroUSD: 1000}
	if st.Spent != hold || st.Reserved != (budget.Amount{}) {
		t.Fatalf("after expiry: %+v; want the hold %+v spent, nothing reserved", st, hold)
	}
	e.wantRows(other, b, budget.UsageRow{Model: testModel, Requests: 1, Expired: 1, PromptTokens: 600, CompletionTokens: 200, MicroUSD: 1000})
	// The charge counts against the cap like any spend.
	mustDeny(t, other, b, testModel, usage(201, 0))
	mustSettle(t, other, mustReserve(t, other, b, testModel, usage(200, 0)), budget.Record{Usage: usage(200, 0)})
	wantStatus(t, m, b, e.clk.Now(), budget.Amount{Tokens: 1000, MicroUSD: 1200}, budget.Amount{}, 0)
	// Its ID counts as settled.
	if _, err := m.Reserve(ctxFor(t), b, r.ID, testModel, usage(1, 0)); !errors.Is(err, budget.ErrSettledID) {
		t.Fatalf("Reserve of an expired, charged ID: %v; want ErrSettledID", err)
	}
}

// testUsageSweeps: Usage sweeps like every call, so the first read after
// a hold expired, with no other call before it, counts the hold's charge
// in the rows (an admin page that reads the rows and then the spend must
// not show the spend without the rows).
func (s *suite) testUsageSweeps(t *testing.T) {
	e := s.env(t, Start())
	m := e.manager(withTTL(expiryTTL))
	b := budget.Budget{Tenant: e.tenant, Period: budget.Day, Tokens: 1000}

	mustReserve(t, m, b, testModel, usage(600, 200))
	w, _ := b.Window(e.clk.Now())
	e.clk.Advance(expiryTTL + time.Millisecond)
	want := budget.UsageRow{Model: testModel, Requests: 1, Expired: 1, PromptTokens: 600, CompletionTokens: 200, MicroUSD: 1000}
	eventually(t, "Usage counts the expired hold", func() (bool, string) {
		rows, err := m.Usage(ctxFor(t), e.tenant, w.ID)
		if err != nil {
			t.Fatal(err)
		}
		return len(rows) == 1 && rows[0] == want, fmt.Sprintf("%+v", rows)
	})
	wantStatus(t, m, b, e.clk.Now(), budget.Amount{Tokens: 800, MicroUSD: 1000}, budget.Amount{}, 0)
}

// testSettleAfterExpiry: a late Settle replaces the expiry's charge with the
// actual usage, once, even when replicas race to settle it.
func (s *suite) testSettleAfterExpiry(t *testing.T) {
	e := s.env(t, Start())
	ms := make([]*budget.Manager, 4)
	for i := range ms {
		ms[i] = e.manager(withTTL(expiryTTL))
	}
	b := budget.Budget{Tenant: e.tenant, Period: budget.Day, Tokens: 10_000}

	r := mustReserve(t, ms[0], b, testModel, usage(600, 200))
	kept := mustReserve(t, ms[0], b, otherModel, usage(10, 10)) // expires too; never settled
	if st := e.expire(ms[1], b, expiryTTL); st.Spent != (budget.Amount{Tokens: 820, MicroUSD: 1000 + 70}) {
		t.Fatalf("after expiry: %+v; want both holds charged", st)
	}
	// Every replica settles the same expired reservation at once.
	var wg sync.WaitGroup
	got := make([]budget.Settled, len(ms))
	errs := make([]error, len(ms))
	for i, m := range ms {
		wg.Go(func() {
			got[i], errs[i] = m.Settle(ctxFor(t), r, budget.Record{Deployment: "dep-1", Usage: usage(300, 50)})
		})
	}
	wg.Wait()
	applied := 0
	for i := range ms {
		if errs[i] != nil {
			t.Fatalf("replica %d: Settle after expiry: %v", i, errs[i])
		}
		if !got[i].Duplicate {
			applied++
		}
	}
	if applied != 1 {
		t.Fatalf("%d of %d concurrent settles after expiry applied; want exactly 1", applied, len(ms))
	}
	// 300 + 50 tokens and 300 + 100 µUSD replace 800 and 1000; the other
	// expired hold's charge stands.
	want := budget.Amount{Tokens: 350 + 20, MicroUSD: 400 + 70}
	wantStatus(t, ms[2], b, e.clk.Now(), want, budget.Amount{}, 0)
	e.wantRows(ms[3], b,
		budget.UsageRow{Model: otherModel, Requests: 1, Expired: 1, PromptTokens: 10, CompletionTokens: 10, MicroUSD: 70},
		budget.UsageRow{Model: testModel, Deployment: "dep-1", Requests: 1, PromptTokens: 300, CompletionTokens: 50, MicroUSD: 400})
	// And again: nothing changes.
	if again := mustSettle(t, ms[0], r, budget.Record{Usage: usage(999, 0)}); !again.Duplicate {
		t.Fatalf("a second settle after expiry applied: %+v", again)
	}
	wantStatus(t, ms[0], b, e.clk.Now(), want, budget.Amount{}, 0)
	// A settle for more than the hold is charged in full.
	big := mustSettle(t, ms[1], kept, budget.Record{Usage: usage(1000, 1000)})
	if big.Duplicate || big.Spent != (budget.Amount{Tokens: 350 + 2000, MicroUSD: 400 + 7000}) {
		t.Fatalf("settle of the other expired hold: %+v; want its charge replaced by 2000 tokens, 7000 µUSD", big)
	}
}

// testReleaseAndExpiry: a hold released before its TTL is never charged;
// one released after it expired has its expiry's charge taken back, and a
// later Settle of it is charged.
func (s *suite) testReleaseAndExpiry(t *testing.T) {
	e := s.env(t, Start())
	m := e.manager(withTTL(expiryTTL))
	b := budget.Budget{Tenant: e.tenant, Period: budget.Day, Tokens: 1000}
	ctx := ctxFor(t)

	released := mustReserve(t, m, b, testModel, usage(500, 0))
	crashed := mustReserve(t, m, b, testModel, usage(300, 0)) // the witness: it expires
	if err := m.Release(ctx, released); err != nil {
		t.Fatal(err)
	}
	// Once the witness's expiry is charged, the released hold's would be too.
	if st := e.expire(m, b, expiryTTL); st.Spent != (budget.Amount{Tokens: 300, MicroUSD: 300}) {
		t.Fatalf("after expiry: %+v; want only the unreleased hold (300) charged", st)
	}
	// The crashed caller comes back and finds nothing was billed.
	if err := m.Release(ctx, crashed); err != nil {
		t.Fatal(err)
	}
	wantStatus(t, m, b, e.clk.Now(), budget.Amount{}, budget.Amount{}, 0)
	e.wantRows(m, b)
	if err := m.Release(ctx, crashed); err != nil { // twice: nothing
		t.Fatal(err)
	}
	wantStatus(t, m, b, e.clk.Now(), budget.Amount{}, budget.Amount{}, 0)
	// It was mistaken after all: a settle still charges.
	if got := mustSettle(t, m, crashed, budget.Record{Usage: usage(40, 0)}); got.Duplicate || got.Spent.Tokens != 40 {
		t.Fatalf("settle after release after expiry: %+v; want 40 tokens charged", got)
	}
	e.wantRows(m, b, budget.UsageRow{Model: testModel, Requests: 1, PromptTokens: 40, MicroUSD: 40})
}

// testRenew: Renew keeps a hold alive past its TTL and raises it to the
// usage reported so far (never lowering it); when renewals stop, the expiry
// charges max(estimate, reported) in the row of the reported deployment.
func (s *suite) testRenew(t *testing.T) {
	e := s.env(t, Start())
	m := e.manager(withTTL(renewTTL))
	other := e.manager(withTTL(renewTTL))
	b := budget.Budget{Tenant: e.tenant, Period: budget.Day, Tokens: 1000}
	ctx := ctxFor(t)

	r := mustReserve(t, m, b, testModel, usage(100, 200)) // 300 tokens, 500 µUSD
	p := budget.Progress{Usage: usage(80, 0)}
	for i := range 4 { // 1.6 TTLs in all
		e.pass(renewStep)
		p.Usage.CompletionTokens += 120 // 120, 240, 360, 480
		if i == 1 {
			p.Deployment = "dep-a"
		}
		ok, err := other.Renew(ctx, r, p)
		if err != nil || !ok {
			t.Fatalf("renewal %d after %v: %v, %v; want the hold live and renewed", i+1, time.Duration(i+1)*renewStep, ok, err)
		}
	}
	// 100 (the estimate's, above the 80 reported) + 480 reported: 580
	// tokens, 100 + 960 µUSD; over the cap, because those tokens are used.
	hold := budget.Amount{Tokens: 580, MicroUSD: 1060}
	wantStatus(t, m, b, e.clk.Now(), budget.Amount{}, hold, 1)
	mustDeny(t, m, b, testModel, usage(421, 0))
	// A stale report lowers nothing.
	if ok, err := m.Renew(ctx, r, budget.Progress{Usage: usage(0, 10)}); err != nil || !ok {
		t.Fatalf("stale renewal: %v, %v", ok, err)
	}
	wantStatus(t, m, b, e.clk.Now(), budget.Amount{}, hold, 1)

	st := e.expire(other, b, renewTTL)
	if st.Spent != hold || st.Reserved != (budget.Amount{}) {
		t.Fatalf("after the renewals stopped and the hold expired: %+v; want %+v spent", st, hold)
	}
	e.wantRows(m, b, budget.UsageRow{Model: testModel, Deployment: "dep-a", Requests: 1, Expired: 1, PromptTokens: 100, CompletionTokens: 480, MicroUSD: 1060})
	// Too late: nothing to renew, nothing changes.
	if ok, err := m.Renew(ctx, r, budget.Progress{Usage: usage(100, 900)}); err != nil || ok {
		t.Fatalf("renewal after expiry: %v, %v; want false, nil", ok, err)
	}
	wantStatus(t, m, b, e.clk.Now(), hold, budget.Amount{}, 0)
	// Nor is a settled hold renewed.
	r2 := mustReserve(t, m, b, freeModel, usage(0, 0))
	mustSettle(t, m, r2, budget.Record{})
	if ok, err := m.Renew(ctx, r2, budget.Progress{Usage: usage(5, 5)}); err != nil || ok {
		t.Fatalf("renewal after settle: %v, %v; want false, nil", ok, err)
	}
}
