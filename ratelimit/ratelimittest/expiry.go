package ratelimittest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/llmgate/llmgate/ratelimit"
)

// Reservations whose caller died: once their hold is over, their rate
// charges are settled at the usage their last Extend recorded, or stand as
// reserved when none was.

// extendOrFail extends id by hold from c with used, failing the test on error.
func extendOrFail(t *testing.T, ctx context.Context, c *client, id string, hold time.Duration, used ...int64) {
	t.Helper()
	if err := c.Extend(ctx, id, hold, used...); err != nil {
		t.Fatalf("Extend(%s, %v, %v): %v", id, hold, used, err)
	}
}

// testExpirySettlesAtUsage: a reservation that expires unsettled after an
// Extend that recorded its usage so far is settled at that usage: the
// buckets get back what was reserved beyond it, or are charged what was
// used beyond the estimate, and its permit is freed. Without recorded
// usage the estimate stands; an Extend without usage keeps what an earlier
// one recorded; recorded usage gives nothing back before the expiry; a
// Settle after the expiry is a no-op that reports ErrUnknownReservation.
func (s *suite) testExpirySettlesAtUsage(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	c, other := s.client(t), s.client(t)
	A, B, C, D := newScope(t, "A"), newScope(t, "B"), newScope(t, "C"), newScope(t, "D")
	lim := tph(1000) // refills 1 token in 3.6s: the test's times move nothing
	const hold = 300 * time.Millisecond
	held := func(scope string, cost int64) ratelimit.Request {
		r := one(scope, lim, cost)
		r.Hold = hold
		return r
	}
	start := s.now()
	a := mustAllow(t, ctx, c, ratelimit.Request{Hold: hold, Charges: []ratelimit.Charge{
		{Scope: A, Limit: rph(10)}, {Scope: A, Limit: lim, Cost: 300}, {Scope: A, Limit: conc(1)},
	}}, "A")
	b := mustAllow(t, ctx, c, held(B, 300), "B")
	cr := mustAllow(t, ctx, c, held(C, 300), "C")
	d := mustAllow(t, ctx, c, held(D, 100), "D")
	extendOrFail(t, ctx, other, a.ID, hold, 1, 100, 1) // from another replica
	extendOrFail(t, ctx, c, b.ID, hold)                // no usage: the estimate stands
	extendOrFail(t, ctx, c, cr.ID, hold, 100)
	extendOrFail(t, ctx, other, cr.ID, hold) // keeps the usage recorded
	extendOrFail(t, ctx, c, d.ID, hold, 250) // beyond the estimate
	extended := s.now()                      // every reservation expires by extended+hold, none before start+hold

	// Nothing comes back before the expiry (judged only if the probes
	// were done before it could be).
	tokens, permits := remaining(t, ctx, c, A, lim), remaining(t, ctx, c, A, conc(1))
	if s.since(start) < hold && (tokens != 700 || permits != 0) {
		t.Fatalf("before the expiry, A has %d tokens and %d permits left; want 700 and 0", tokens, permits)
	}
	s.sleep(s.until(extended.Add(hold)) + 50*time.Millisecond)

	wantRemaining(t, ctx, c, A, lim, 900, 901, "A's tokens after the expiry (100 used of 300)")
	wantRemaining(t, ctx, c, A, rph(10), 9, 9, "A's requests after the expiry")
	wantRemaining(t, ctx, c, A, conc(1), 1, 1, "A's permit after the expiry")
	wantRemaining(t, ctx, other, B, lim, 700, 701, "B's tokens after the expiry (no usage recorded)")
	wantRemaining(t, ctx, other, C, lim, 900, 901, "C's tokens after the expiry (usage kept by an Extend without)")
	wantRemaining(t, ctx, other, D, lim, 750, 751, "D's tokens after the expiry (250 used of 100)")

	// A late Settle changes nothing: what the expiry charged stands.
	for _, id := range []string{a.ID, cr.ID} {
		if err := c.Settle(ctx, id, []int64{1, 0, 1}); !errors.Is(err, ratelimit.ErrUnknownReservation) {
			t.Fatalf("Settle after the expiry = %v, want ErrUnknownReservation", err)
		}
		if err := other.Extend(ctx, id, hold, 0); !errors.Is(err, ratelimit.ErrUnknownReservation) {
			t.Fatalf("Extend after the expiry = %v, want ErrUnknownReservation", err)
		}
	}
	wantRemaining(t, ctx, c, A, lim, 900, 901, "A's tokens after a late Settle")
	wantRemaining(t, ctx, c, C, lim, 900, 901, "C's tokens after a late Settle")

	// A settle before the expiry wins over the usage recorded.
	e := mustAllow(t, ctx, c, held(B, 200), "E")
	extendOrFail(t, ctx, other, e.ID, hold, 150)
	mustSettle(t, ctx, other, e.ID, []int64{20})
	s.sleep(hold + 50*time.Millisecond)
	wantRemaining(t, ctx, c, B, lim, 680, 681, "B's tokens after E settled at 20 and its hold passed")
}

// testWaitWokenByExpiryRefund: waiters for tokens that a crashed holder
// reserved are admitted when its reservation expires, because it recorded
// that it used less: the store tells the first waiter when that expiry
// comes (its hint), so it sleeps neither until the bucket refills nor
// until it renews its place, and the walk then admits the next waiter too.
func (s *suite) testWaitWokenByExpiryRefund(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	crashed, w1, w2 := s.client(t), s.client(t), s.client(t)
	T, dep := newScope(t, "T"), newScope(t, "dep")
	lim := tph(1000)
	const hold = 400 * time.Millisecond
	r := one(T, lim, 1000)
	r.Hold = hold
	h := mustAllow(t, ctx, crashed, r, "holder that never settles")
	start := time.Now()
	extendOrFail(t, ctx, crashed, h.ID, hold, 200)
	extended := time.Now() // the reservation expires between start+hold and extended+hold
	// Two waiters in another lane (the deployment's), blocked on T.
	waiter := func(name string, cost int64) ratelimit.Request {
		return ratelimit.Request{ID: newID(name), Charges: []ratelimit.Charge{{Scope: dep, Limit: rph(100)}, {Scope: T, Limit: lim, Cost: cost}}}
	}
	ch1 := queue(t, ctx, w1, waiter("w1", 500), "first waiter")
	ch2 := queue(t, ctx, w2, waiter("w2", 300), "second waiter")
	for i, ch := range []<-chan waited{ch1, ch2} {
		got := receive(t, ch, waitBound, "waiter for an expired reservation's unused tokens")
		if early := start.Add(hold).Sub(got.at); early > 2*time.Millisecond {
			t.Fatalf("waiter %d admitted %v before the reservation expired", i+1, early)
		}
		late := got.at.Sub(extended.Add(hold))
		t.Logf("waiter %d admitted %v after the reservation expired", i+1, late.Round(10*time.Microsecond))
		if late > s.late {
			t.Errorf("waiter %d admitted %v after the reservation expired, want within %v: the expiry gives back 800 tokens but nobody is told when (renewals every %v)", i+1, late, s.late, waiterLease/3)
		}
	}
	wantRemaining(t, ctx, w1, T, lim, 0, 1, "T after both waiters")
}

// testExpiryEveryGroup: a reservation over two groups that expires
// unsettled after an Extend with its usage is settled at that usage in
// each group, each part at the usage of its own charges.
func (s *shardSuite) testExpiryEveryGroup(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	c, other := s.client(t), s.client(t)
	D, T := newScope(t, "dep"), newScope(t, "tenant")
	const hold = 300 * time.Millisecond
	r := ratelimit.Request{Hold: hold, Charges: []ratelimit.Charge{
		{Scope: D, Limit: rph(100)}, {Scope: D, Limit: tph(1000), Cost: 300}, {Scope: D + "#c", Limit: conc(1)},
		{Scope: T, Limit: tph(1000), Cost: 300},
	}}
	start := time.Now()
	d := mustAllow(t, ctx, c, r, "reservation")
	extendOrFail(t, ctx, other, d.ID, hold, 1, 100, 1, 40)
	extended := time.Now()
	// Nothing comes back before the expiry (judged only if the probes
	// were done before it could be).
	dt, tt := remaining(t, ctx, c, D, tph(1000)), remaining(t, ctx, c, T, tph(1000))
	if time.Since(start) < hold && (dt != 700 || tt != 700) {
		t.Fatalf("before the expiry, the deployment has %d tokens and the tenant %d; want 700 each", dt, tt)
	}
	time.Sleep(time.Until(extended.Add(hold)) + 50*time.Millisecond) // the expiry is the subject
	wantRemaining(t, ctx, c, D, tph(1000), 900, 901, "deployment tokens after the expiry")
	wantRemaining(t, ctx, c, T, tph(1000), 960, 961, "tenant tokens after the expiry")
	wantRemaining(t, ctx, c, D, rph(100), 99, 99, "deployment requests after the expiry")
	wantRemaining(t, ctx, c, D+"#c", conc(1), 1, 1, "deployment permit after the expiry")
	if err := other.Settle(ctx, d.ID, []int64{1, 0, 1, 0}); !errors.Is(err, ratelimit.ErrUnknownReservation) {
		t.Fatalf("Settle after the expiry = %v, want ErrUnknownReservation", err)
	}
	wantRemaining(t, ctx, c, D, tph(1000), 900, 901, "deployment tokens after a late Settle")
	wantRemaining(t, ctx, c, T, tph(1000), 960, 961, "tenant tokens after a late Settle")
}
