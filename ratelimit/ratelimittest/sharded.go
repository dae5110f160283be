package ratelimittest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgate/llmgate/ratelimit"
)

// RunSharded runs, as subtests of t, the cases of requests that span
// groups of a ratelimit.Sharded: admitted whole or not at all, never over
// any limit under concurrent load, waiting through every group, and
// settled, refunded and extended in every group (and settled at the usage
// recorded in every group when the reservation expires).
//
// newGroup returns a backend of the named group on the store the suite
// shares (a networked backend: a new client each time). Every replica the
// suite builds is a Sharded over it in which each scope is a group of its
// own, except that "X#y" is in X's group.
func RunSharded(t *testing.T, newGroup func(t *testing.T, group string) ratelimit.Backend) {
	s := &shardSuite{newGroup: newGroup}
	// Every replica is a Sharded of its own over the groups.
	s.newBackend = func(t *testing.T) ratelimit.Backend {
		return ratelimit.NewSharded(groupOf, func(g string) ratelimit.Backend { return newGroup(t, g) })
	}
	s.late = s.lateBound(t)
	for _, tc := range []struct {
		name string
		fn   func(t *testing.T)
	}{
		{"CrossGroupAllOrNothing", s.testAllOrNothing},
		{"CrossGroupSettleRefundExtend", s.testSettleRefundExtend},
		{"CrossGroupExpirySettlesAtUsage", s.testExpiryEveryGroup},
		{"CrossGroupWaitTakesEveryGroup", s.testWaitEveryGroup},
		{"CrossGroupWaitGivesUpCleanly", s.testWaitGivesUp},
		{"CrossGroupNeverOverUnderLoad", s.testNeverOver},
		{"CrossGroupFeedbackInItsGroup", s.testFeedback},
		{"CrossGroupOneGroupDown", s.testOneGroupDown},
	} {
		t.Run(tc.name, tc.fn)
	}
}

type shardSuite struct {
	suite
	newGroup func(t *testing.T, group string) ratelimit.Backend
}

// groupOf is the suite's grouping: each scope alone, "X#y" with X.
func groupOf(scope string) string {
	g, _, _ := strings.Cut(scope, "#")
	return g
}

// wantGroupWaiters checks the length of lane in group, if the group's
// backend can tell.
func (s *shardSuite) wantGroupWaiters(t *testing.T, ctx context.Context, group, lane string, n int) {
	t.Helper()
	in, ok := s.newGroup(t, group).(Inspector)
	if !ok {
		return
	}
	got, err := in.Waiters(ctx, lane)
	if err != nil {
		t.Fatalf("Waiters(%q) in group %q: %v", lane, group, err)
	}
	if got != n {
		t.Fatalf("Waiters(%q) in group %q = %d, want %d", lane, group, got, n)
	}
}

// testAllOrNothing: a request spanning two groups is admitted only when
// both have room; refused by either, it leaves the other as it was (the
// part it took there is given back) and says which limit refused.
func (s *shardSuite) testAllOrNothing(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	c, other := s.client(t), s.client(t)
	D, T := newScope(t, "dep"), newScope(t, "tenant")
	req := func() ratelimit.Request {
		return ratelimit.Request{Charges: []ratelimit.Charge{
			{Scope: D, Limit: rph(100)}, {Scope: D, Limit: tph(1000), Cost: 100}, {Scope: T, Limit: rph(2)},
		}}
	}
	for i := range 2 {
		d := mustAllow(t, ctx, c, req(), fmt.Sprintf("request %d", i))
		if st := d.Limits; st[0].Remaining != int64(99-i) || st[1].Remaining != int64(900-100*i) || st[2].Remaining != int64(1-i) {
			t.Fatalf("request %d: statuses %+v, want %d, %d and %d left", i, st, 99-i, 900-100*i, 1-i)
		}
	}
	d := mustDeny(t, ctx, c, req(), "third request: the tenant is out")
	if d.DeniedBy != T || d.DeniedKind != ratelimit.Requests || d.RetryAfter < 29*time.Minute || d.RetryAfter > 30*time.Minute+tol {
		t.Fatalf("refusal %+v, want denied by the tenant's requests, retry after ~30m", d)
	}
	if st := d.Limits; st[0].Remaining != 98 || st[1].Remaining != 800 || st[2].Remaining != 0 {
		t.Fatalf("refusal statuses %+v, want 98, 800 and 0 left (the deployment's part given back)", st)
	}
	wantRemaining(t, ctx, other, D, rph(100), 98, 98, "deployment requests after the refusal")
	wantRemaining(t, ctx, other, D, tph(1000), 800, 800, "deployment tokens after the refusal")

	// Refused by the deployment (its concurrency): the tenant's part goes back.
	D2, T2 := newScope(t, "dep2"), newScope(t, "tenant2")
	h := mustAllow(t, ctx, c, one(D2, conc(1), 1), "deployment permit")
	two := ratelimit.Request{Charges: []ratelimit.Charge{{Scope: D2, Limit: conc(1)}, {Scope: T2, Limit: tph(1000), Cost: 300}}}
	d = mustDeny(t, ctx, other, two, "refused by the deployment's permit")
	if d.DeniedBy != D2 || d.DeniedKind != ratelimit.Concurrency || d.RetryAfter <= 0 {
		t.Fatalf("refusal %+v, want denied by the deployment's concurrency with a retry-after", d)
	}
	wantRemaining(t, ctx, c, T2, tph(1000), 1000, 1000, "tenant tokens after the refusal")
	mustRefund(t, ctx, c, h.ID)
	d = mustAllow(t, ctx, other, two, "after the permit's release")
	if err := c.Refund(ctx, d.ID); err != nil { // another replica knows where its parts are
		t.Fatalf("Refund from another replica: %v", err)
	}
	wantRemaining(t, ctx, c, D2, conc(1), 1, 1, "deployment permit after the refund")
	wantRemaining(t, ctx, c, T2, tph(1000), 1000, 1000, "tenant tokens after the refund")
}

// testSettleRefundExtend: Settle charges the real costs in every group,
// once; Extend keeps the permits of every group past the original hold.
func (s *shardSuite) testSettleRefundExtend(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	c, other := s.client(t), s.client(t)
	D, T := newScope(t, "dep"), newScope(t, "tenant")
	const hold = 300 * time.Millisecond
	r := ratelimit.Request{Hold: hold, Charges: []ratelimit.Charge{
		{Scope: D, Limit: tph(1000), Cost: 100}, {Scope: D + "#c", Limit: conc(1)},
		{Scope: T, Limit: tph(1000), Cost: 100}, {Scope: T + "#c", Limit: conc(1)},
	}}
	d := mustAllow(t, ctx, c, r, "reservation")
	if err := other.Extend(ctx, d.ID, 5*time.Second); err != nil {
		t.Fatalf("Extend: %v", err)
	}
	s.sleep(hold + 200*time.Millisecond) // past the original hold
	mustDeny(t, ctx, other, one(D+"#c", conc(1), 1), "deployment permit after the original hold, extended")
	mustDeny(t, ctx, other, one(T+"#c", conc(1), 1), "tenant permit after the original hold, extended")

	actual := []int64{40, 1, 30, 1}
	mustSettle(t, ctx, other, d.ID, actual)
	mustSettle(t, ctx, c, d.ID, actual) // a second settle is a no-op
	if err := c.Refund(ctx, d.ID); err != nil {
		t.Fatalf("Refund after Settle: %v", err)
	}
	wantRemaining(t, ctx, c, D, tph(1000), 960, 961, "deployment tokens after the settle")
	wantRemaining(t, ctx, c, T, tph(1000), 970, 971, "tenant tokens after the settle")
	wantRemaining(t, ctx, c, D+"#c", conc(1), 1, 1, "deployment permit after the settle")
	wantRemaining(t, ctx, c, T+"#c", conc(1), 1, 1, "tenant permit after the settle")
	if err := c.Extend(ctx, d.ID, time.Second); !errors.Is(err, ratelimit.ErrUnknownReservation) {
		t.Fatalf("Extend of a settled reservation = %v, want ErrUnknownReservation", err)
	}

	// A refund gives back every group's part.
	r.Hold = 0
	d = mustAllow(t, ctx, c, r, "reservation to refund")
	mustRefund(t, ctx, other, d.ID)
	mustRefund(t, ctx, c, d.ID)
	wantRemaining(t, ctx, c, D, tph(1000), 960, 961, "deployment tokens after the refund")
	wantRemaining(t, ctx, c, T, tph(1000), 970, 971, "tenant tokens after the refund")
	mustAllow(t, ctx, other, r, "both permits free after the refund")
}

// testWaitEveryGroup: a waiter refused by its tenant's permit is woken
// when that permit is released; it then holds the tenant's part while it
// waits for the deployment's permit, and is woken when that one goes.
func (s *shardSuite) testWaitEveryGroup(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	holder, w, probe := s.client(t), s.client(t), s.client(t)
	D, T := newScope(t, "dep"), newScope(t, "tenant")
	th := mustAllow(t, ctx, holder, one(T, conc(1), 1), "tenant permit")
	dh := mustAllow(t, ctx, holder, one(D, conc(1), 1), "deployment permit")
	req := ratelimit.Request{ID: newID("w"), Charges: []ratelimit.Charge{{Scope: D, Limit: conc(1)}, {Scope: T, Limit: conc(1)}}}
	ch := queue(t, ctx, w, req, "waiter")
	s.wantGroupWaiters(t, ctx, D, D, 0) // it waits for its tenant first
	s.wantGroupWaiters(t, ctx, T, D, 1)

	// The release admits the waiter's tenant part in the same store call:
	// the waiter holds the tenant's permit while it waits for the
	// deployment's.
	mustSettle(t, ctx, holder, th.ID, []int64{1})
	mustDeny(t, ctx, probe, one(T, conc(1), 1), "tenant permit after its release, with a waiter")
	notReturned(t, ch, "waiter while the deployment's permit is held")
	start := time.Now()
	mustSettle(t, ctx, holder, dh.ID, []int64{1})
	got := receive(t, ch, waitBound, "waiter after both permits were released")
	if d := got.at.Sub(start); d > s.late {
		t.Fatalf("waiter admitted %v after the deployment's permit was released, want within %v", d, s.late)
	}
	mustDeny(t, ctx, probe, one(D, conc(1), 1), "deployment permit while the waiter holds it")
	mustSettle(t, ctx, w, got.d.ID, []int64{1, 1})
	wantRemaining(t, ctx, probe, D, conc(1), 1, 1, "deployment permit after the waiter settled")
	wantRemaining(t, ctx, probe, T, conc(1), 1, 1, "tenant permit after the waiter settled")
	s.wantGroupWaiters(t, ctx, D, D, 0)
	s.wantGroupWaiters(t, ctx, T, D, 0)
}

// testWaitGivesUp: a waiter that gives up while holding its tenant's part
// gives it back, and leaves nothing queued in either group.
func (s *shardSuite) testWaitGivesUp(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	holder, w := s.client(t), s.client(t)
	D, T := newScope(t, "dep"), newScope(t, "tenant")
	mustAllow(t, ctx, holder, one(D, tph(100), 80), "drain the deployment to 20")
	req := ratelimit.Request{ID: newID("w"), MaxWait: 200 * time.Millisecond, Charges: []ratelimit.Charge{
		{Scope: D, Limit: tph(100), Cost: 50}, {Scope: T, Limit: tph(100), Cost: 50}, {Scope: T + "#c", Limit: conc(1)},
	}}
	d, err := w.Wait(ctx, req)
	if !errors.Is(err, ratelimit.ErrLimited) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait = %+v, %v; want ErrLimited after MaxWait", d, err)
	}
	if d.DeniedBy != D || d.DeniedKind != ratelimit.Tokens || len(d.Limits) != 3 {
		t.Fatalf("decision %+v, want denied by the deployment's tokens with 3 statuses", d)
	}
	s.wantGroupWaiters(t, ctx, D, D, 0)
	s.wantGroupWaiters(t, ctx, T, D, 0)
	wantRemaining(t, ctx, holder, D, tph(100), 20, 20, "deployment after the waiter gave up")
	wantRemaining(t, ctx, holder, T, tph(100), 100, 100, "tenant tokens after the waiter gave up")
	wantRemaining(t, ctx, holder, T+"#c", conc(1), 1, 1, "tenant permit after the waiter gave up")
}

// testNeverOver: replicas admit and wait for requests over two
// deployments that share a tenant, at once; no limit of either group ever
// has more permits out, or has admitted more, than it allows, and once
// all is settled nothing is left held or queued.
func (s *shardSuite) testNeverOver(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	T := newScope(t, "tenant")
	deps := []string{newScope(t, "dep-a"), newScope(t, "dep-b")}
	const (
		replicas, workers, attempts = 3, 3, 12
		tenantRate, depRate         = 40, 30
		tenantConc, depConc         = 3, 2
	)
	var (
		inFlight  sync.Map // scope -> *atomic.Int64
		admitted  sync.Map
		violation atomic.Value
	)
	counter := func(m *sync.Map, scope string) *atomic.Int64 {
		v, _ := m.LoadOrStore(scope, new(atomic.Int64))
		return v.(*atomic.Int64)
	}
	var wg sync.WaitGroup
	for i := range replicas {
		c := s.client(t)
		for j := range workers {
			wg.Go(func() {
				for k := range attempts {
					dep := deps[(i+j+k)%2]
					r := ratelimit.Request{MaxWait: 50 * time.Millisecond, Charges: []ratelimit.Charge{
						{Scope: dep, Limit: rph(depRate)}, {Scope: dep + "#c", Limit: conc(depConc)},
						{Scope: T, Limit: rph(tenantRate)}, {Scope: T + "#c", Limit: conc(tenantConc)},
					}}
					var d ratelimit.Decision
					var err error
					if k%2 == 0 {
						d, err = c.Allow(ctx, r)
					} else {
						d, err = c.Wait(ctx, r)
					}
					if err != nil && !errors.Is(err, ratelimit.ErrLimited) {
						violation.CompareAndSwap(nil, fmt.Sprintf("replica %d: %v", i, err))
						return
					}
					if !d.Allowed {
						continue
					}
					for scope, lim := range map[string]int64{dep + "#c": depConc, T + "#c": tenantConc} {
						if n := counter(&inFlight, scope).Add(1); n > lim {
							violation.CompareAndSwap(nil, fmt.Sprintf("%d requests in flight on %s, limit %d", n, scope, lim))
						}
					}
					counter(&admitted, dep).Add(1)
					counter(&admitted, T).Add(1)
					time.Sleep(time.Millisecond) // the request "runs"
					counter(&inFlight, dep+"#c").Add(-1)
					counter(&inFlight, T+"#c").Add(-1)
					if err := c.Settle(ctx, d.ID, []int64{1, 1, 1, 1}); err != nil {
						violation.CompareAndSwap(nil, fmt.Sprintf("settle: %v", err))
					}
				}
			})
		}
	}
	wg.Wait()
	if v := violation.Load(); v != nil {
		t.Fatal(v)
	}
	total := 0
	for _, dep := range deps {
		n := counter(&admitted, dep).Load()
		if n > depRate {
			t.Fatalf("%d admitted on a deployment of %d per hour", n, depRate)
		}
		total += int(n)
	}
	if n := counter(&admitted, T).Load(); n > tenantRate || int(n) != total {
		t.Fatalf("%d admitted on the tenant (limit %d), %d on its deployments", n, tenantRate, total)
	}
	if total == 0 {
		t.Fatal("nothing was admitted")
	}
	t.Logf("%d of %d requests admitted", total, replicas*workers*attempts)
	probe := s.client(t)
	wantRemaining(t, ctx, probe, T+"#c", conc(tenantConc), tenantConc, tenantConc, "tenant permits after all settled")
	for _, dep := range deps {
		wantRemaining(t, ctx, probe, dep+"#c", conc(depConc), depConc, depConc, "deployment permits after all settled")
		wantRemaining(t, ctx, probe, dep, rph(depRate), depRate-counter(&admitted, dep).Load(), depRate-counter(&admitted, dep).Load(), "deployment requests after all settled")
		s.wantGroupWaiters(t, ctx, dep, dep, 0)
		s.wantGroupWaiters(t, ctx, T, dep, 0)
	}
	wantRemaining(t, ctx, probe, T, rph(tenantRate), tenantRate-int64(total), tenantRate-int64(total), "tenant requests after all settled")
}

// shardID reports whether id is a ratelimit.Sharded decision ID for the
// request ID rid: it names the groups first and ends with rid.
func shardID(id, rid string) bool {
	return strings.HasPrefix(id, "s:") && strings.HasSuffix(id, ":"+rid)
}

// testFeedback: a cooldown, an observed count and a learned limit act on
// their scope's group: a request over that group and another is held back
// by them, one over the other group alone is not.
func (s *shardSuite) testFeedback(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	c, other := s.client(t), s.client(t)
	D, T := newScope(t, "dep"), newScope(t, "tenant")
	both := ratelimit.Request{Charges: []ratelimit.Charge{{Scope: D, Limit: rph(100)}, {Scope: T, Limit: tph(1000), Cost: 10}}}
	if _, err := c.Cooldown(ctx, D, time.Hour); err != nil {
		t.Fatal(err)
	}
	if d := mustDeny(t, ctx, other, both, "during the deployment's cooldown"); d.DeniedBy != D || d.RetryAfter < 59*time.Minute {
		t.Fatalf("refusal %+v, want denied by the deployment for ~1h", d)
	}
	mustRefund(t, ctx, other, mustAllow(t, ctx, other, one(T, tph(1000), 10), "the tenant alone").ID)

	D2 := newScope(t, "dep2")
	both.Charges[0].Scope = D2
	if err := c.Observe(ctx, T, tph(1000), 5); err != nil {
		t.Fatal(err)
	}
	if d := mustDeny(t, ctx, other, both, "after the tenant's observed count"); d.DeniedBy != T {
		t.Fatalf("refusal %+v, want denied by the tenant", d)
	}
	wantRemaining(t, ctx, other, D2, rph(100), 100, 100, "the deployment after the refusal")
	T2 := newScope(t, "tenant2")
	both.Charges[1].Scope = T2
	if err := c.Learn(ctx, D2, rph(100), ratelimit.Learned{Limit: 1, Remaining: 0}); err != nil {
		t.Fatal(err)
	}
	if d := mustDeny(t, ctx, other, both, "after the deployment's learned limit"); d.DeniedBy != D2 {
		t.Fatalf("refusal %+v, want denied by the deployment", d)
	}
	wantRemaining(t, ctx, other, T2, tph(1000), 1000, 1000, "the tenant after the refusal")
}

// downGroup fails every call while down is set.
type downGroup struct {
	ratelimit.Backend
	down *atomic.Bool
}

func (g downGroup) Admit(ctx context.Context, r *ratelimit.Request) (ratelimit.Decision, error) {
	if g.down.Load() {
		return ratelimit.Decision{}, errDown
	}
	return g.Backend.Admit(ctx, r)
}

func (g downGroup) Enqueue(ctx context.Context, r *ratelimit.Request, lease time.Duration) (ratelimit.Decision, bool, time.Duration, error) {
	if g.down.Load() {
		return ratelimit.Decision{}, false, 0, errDown
	}
	return g.Backend.Enqueue(ctx, r, lease)
}

// testOneGroupDown: when one group's store cannot be reached, a request
// over it and a working group gets the outage policy (admitted unchecked,
// or refused when a limit fails closed), and what the working group
// admitted is given back; requests of the working group alone go on.
func (s *shardSuite) testOneGroupDown(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	D, T := newScope(t, "dep"), newScope(t, "tenant")
	var down atomic.Bool
	sh := ratelimit.NewSharded(groupOf, func(g string) ratelimit.Backend {
		if g == T {
			return downGroup{Backend: s.newGroup(t, g), down: &down}
		}
		return s.newGroup(t, g)
	})
	sp := &spy{Backend: sh, queued: make(map[string]chan struct{})}
	c := &client{Limiter: ratelimit.New(sp), spy: sp}
	probe := s.client(t)
	closedLim := tph(1000)
	closedLim.FailClosed = true
	open := ratelimit.Request{Charges: []ratelimit.Charge{{Scope: D, Limit: tph(1000), Cost: 100}, {Scope: D + "#c", Limit: conc(1)}, {Scope: T, Limit: rph(10)}}}
	closed := ratelimit.Request{Charges: []ratelimit.Charge{{Scope: D, Limit: closedLim, Cost: 100}, {Scope: D + "#c", Limit: conc(1)}, {Scope: T, Limit: rph(10)}}}
	down.Store(true)
	for _, wait := range []bool{false, true} {
		call := c.Allow
		if wait {
			call = c.Wait
		}
		d, err := call(ctx, open)
		if err != nil || !d.Allowed || !d.Degraded {
			t.Fatalf("fail-open request with the tenant's group down (wait %v) = %+v, %v; want admitted, Degraded", wait, d, err)
		}
		if d, err = call(ctx, closed); !errors.Is(err, ratelimit.ErrStoreUnavailable) || d.Allowed {
			t.Fatalf("fail-closed request with the tenant's group down (wait %v) = %+v, %v; want ErrStoreUnavailable", wait, d, err)
		}
		wantRemaining(t, ctx, probe, D, tph(1000), 1000, 1000, "deployment tokens: its part given back")
		wantRemaining(t, ctx, probe, D+"#c", conc(1), 1, 1, "deployment permit: its part given back")
	}
	mustRefund(t, ctx, c, mustAllow(t, ctx, c, one(D, tph(1000), 100), "the deployment alone").ID)
	down.Store(false)
	mustSettle(t, ctx, c, mustAllow(t, ctx, c, closed, "after the outage").ID, []int64{100, 1, 1})
	wantRemaining(t, ctx, probe, T, rph(10), 9, 9, "tenant after the outage: unchecked admissions were not recorded")
}
