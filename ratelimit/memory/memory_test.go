package memory_test

import (
	"context"
	"errors"
	"fmt"
	"math/big"
	"sync"
	"testing"
	"time"

	"github.com/llmgate/llmgate/clock"
	"github.com/llmgate/llmgate/ratelimit"
	"github.com/llmgate/llmgate/ratelimit/memory"
	"github.com/llmgate/llmgate/ratelimit/ratelimittest"
)

func TestConformance(t *testing.T) {
	// One store for the whole suite: every "replica" the suite asks for is
	// the same in-memory backend.
	b := memory.New(nil)
	ratelimittest.Run(t, func(*testing.T) ratelimit.Backend { return b })
}

// TestConformanceSharded runs the cross-group cases over a memory backend
// per group.
func TestConformanceSharded(t *testing.T) {
	var mu sync.Mutex
	groups := map[string]*memory.Backend{}
	ratelimittest.RunSharded(t, func(_ *testing.T, g string) ratelimit.Backend {
		mu.Lock()
		defer mu.Unlock()
		if groups[g] == nil {
			groups[g] = memory.New(nil)
		}
		return groups[g]
	})
}

// TestConformanceFakeClock runs the suite's tests of refills, holds and
// cooldowns on a fake clock, so that their bounds are exact on any machine.
func TestConformanceFakeClock(t *testing.T) {
	clk := clock.NewFake(start)
	b := memory.New(clk)
	ratelimittest.RunFakeClock(t, clk, func(*testing.T) ratelimit.Backend { return b })
}

var start = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

func rpm(n int64) ratelimit.Limit {
	return ratelimit.Limit{Kind: ratelimit.Requests, Limit: n, Window: time.Minute}
}

func one(scope string, l ratelimit.Limit, cost int64) ratelimit.Request {
	return ratelimit.Request{Charges: []ratelimit.Charge{{Scope: scope, Limit: l, Cost: cost}}}
}

func allow(t *testing.T, l *ratelimit.Limiter, r ratelimit.Request, want bool, what string) ratelimit.Decision {
	t.Helper()
	d, err := l.Allow(t.Context(), r)
	if err != nil {
		t.Fatalf("%s: Allow: %v", what, err)
	}
	if d.Allowed != want {
		t.Fatalf("%s: Allowed = %v (retry after %v, statuses %+v), want %v", what, d.Allowed, d.RetryAfter, d.Limits, want)
	}
	return d
}

// ceilDiv returns ⌈a·b/c⌉ exactly.
func ceilDiv(a, b, c int64) time.Duration {
	n := new(big.Int).Mul(big.NewInt(a), big.NewInt(b))
	q, m := new(big.Int).QuoRem(n, big.NewInt(c), new(big.Int))
	if m.Sign() > 0 {
		q.Add(q, big.NewInt(1))
	}
	return time.Duration(q.Int64())
}

// TestFakeClockRetryAfterIsExact: for a drained bucket, RetryAfter is the
// exact time until the cost fits: a nanosecond earlier it is still refused
// (by a nanosecond or so), at RetryAfter it is admitted.
func TestFakeClockRetryAfterIsExact(t *testing.T) {
	for _, tc := range []struct {
		name string
		lim  ratelimit.Limit
		cost int64
	}{
		{"60 rpm", rpm(60), 1},
		{"3500 rpm", rpm(3500), 1},
		{"3 per 7s", ratelimit.Limit{Kind: ratelimit.Requests, Limit: 3, Window: 7 * time.Second}, 1},
		{"90k tpm, 1000 tokens", ratelimit.Limit{Kind: ratelimit.Tokens, Limit: 90_000, Window: time.Minute}, 1000},
		{"90k tpm, 7 tokens", ratelimit.Limit{Kind: ratelimit.Tokens, Limit: 90_000, Window: time.Minute}, 7},
		{"1000 per hour, burst 10", ratelimit.Limit{Kind: ratelimit.Tokens, Limit: 1000, Window: time.Hour, Burst: 10}, 3},
		{"1M per day, 12345 tokens", ratelimit.Limit{Kind: ratelimit.Tokens, Limit: 1_000_000, Window: 24 * time.Hour}, 12345},
		{"30M tpm, 100k tokens", ratelimit.Limit{Kind: ratelimit.Tokens, Limit: 30_000_000, Window: time.Minute}, 100_000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := clock.NewFake(start)
			l := ratelimit.New(memory.New(clk))
			burst := tc.lim.Burst
			if burst == 0 {
				burst = tc.lim.Limit
			}
			if tc.lim.Kind == ratelimit.Tokens {
				allow(t, l, one("s", tc.lim, burst), true, "drain")
			} else {
				for i := range burst {
					allow(t, l, one("s", tc.lim, 1), true, fmt.Sprintf("drain %d", i))
				}
			}
			d := allow(t, l, one("s", tc.lim, tc.cost), false, "drained")
			want := ceilDiv(tc.cost, int64(tc.lim.Window), tc.lim.Limit)
			if diff := d.RetryAfter - want; diff < -time.Nanosecond || diff > time.Nanosecond {
				t.Fatalf("RetryAfter = %v, want %v (cost × window / limit)", d.RetryAfter, want)
			}
			if st := d.Limits[0]; st.Remaining != 0 || st.Reset != ceilDiv(burst, int64(tc.lim.Window), tc.lim.Limit) {
				t.Fatalf("status %+v, want 0 remaining and reset %v", st, ceilDiv(burst, int64(tc.lim.Window), tc.lim.Limit))
			}
			clk.Advance(d.RetryAfter - time.Nanosecond)
			early := allow(t, l, one("s", tc.lim, tc.cost), false, "a nanosecond before RetryAfter")
			if early.RetryAfter <= 0 || early.RetryAfter > 2*time.Nanosecond {
				t.Fatalf("RetryAfter a nanosecond early = %v, want 1ns", early.RetryAfter)
			}
			clk.Advance(time.Nanosecond)
			allow(t, l, one("s", tc.lim, tc.cost), true, "at RetryAfter")
		})
	}
}

// TestFakeClockRefillIsContinuous: a 60 rpm bucket regains exactly one
// request per second, not a minute's worth per minute; a quiet period
// restores the whole burst and no more.
func TestFakeClockRefillIsContinuous(t *testing.T) {
	clk := clock.NewFake(start)
	l := ratelimit.New(memory.New(clk))
	lim := rpm(60)
	for i := range 60 {
		d := allow(t, l, one("s", lim, 1), true, fmt.Sprintf("burst %d", i))
		if st := d.Limits[0]; st.Remaining != int64(59-i) || st.Reset != time.Duration(i+1)*time.Second {
			t.Fatalf("burst %d: status %+v, want %d remaining, reset %ds", i, st, 59-i, i+1)
		}
	}
	for k := range 5 {
		clk.Advance(time.Second)
		d := allow(t, l, one("s", lim, 1), true, fmt.Sprintf("second %d", k+1))
		if st := d.Limits[0]; st.Remaining != 0 || st.Reset != time.Minute {
			t.Fatalf("second %d: status %+v, want 0 remaining, reset 1m", k+1, st)
		}
		d = allow(t, l, one("s", lim, 1), false, fmt.Sprintf("second %d, again", k+1))
		if d.RetryAfter != time.Second {
			t.Fatalf("second %d: RetryAfter = %v, want 1s", k+1, d.RetryAfter)
		}
	}
	clk.Advance(10 * time.Minute)
	d := allow(t, l, one("s", lim, 1), true, "after a quiet period")
	if st := d.Limits[0]; st.Remaining != 59 || st.Reset != time.Second {
		t.Fatalf("after a quiet period: status %+v, want 59 remaining (capped at the burst), reset 1s", st)
	}
}

// TestFakeClockPermitExpiry: an unsettled permit frees exactly at the end
// of its Hold; Extend moves that end.
func TestFakeClockPermitExpiry(t *testing.T) {
	clk := clock.NewFake(start)
	l := ratelimit.New(memory.New(clk))
	c := ratelimit.Limit{Kind: ratelimit.Concurrency, Limit: 1}
	r := one("c", c, 1)
	r.Hold = 5 * time.Second
	allow(t, l, r, true, "holder")
	clk.Advance(5*time.Second - time.Nanosecond)
	allow(t, l, one("c", c, 1), false, "a nanosecond before the hold ends")
	clk.Advance(time.Nanosecond)
	d := allow(t, l, r, true, "at the end of the hold")

	clk.Advance(4 * time.Second)
	if err := l.Extend(t.Context(), d.ID, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	clk.Advance(5*time.Second - time.Nanosecond)
	allow(t, l, one("c", c, 1), false, "a nanosecond before the extended hold ends")
	clk.Advance(time.Nanosecond)
	allow(t, l, one("c", c, 1), true, "at the end of the extended hold")
	if err := l.Settle(t.Context(), d.ID, nil); !errors.Is(err, ratelimit.ErrUnknownReservation) {
		t.Fatalf("Settle after the hold = %v, want ErrUnknownReservation", err)
	}
}

// TestFakeClockReservationHold: a reservation can be settled until the
// instant its Hold ends, not at it.
func TestFakeClockReservationHold(t *testing.T) {
	clk := clock.NewFake(start)
	l := ratelimit.New(memory.New(clk))
	lim := ratelimit.Limit{Kind: ratelimit.Tokens, Limit: 1000, Window: time.Hour}
	r := one("t", lim, 100)
	r.Hold = 10 * time.Second
	a := allow(t, l, r, true, "a")
	b := allow(t, l, r, true, "b")
	clk.Advance(10*time.Second - time.Nanosecond)
	if err := l.Settle(t.Context(), a.ID, []int64{10}); err != nil {
		t.Fatalf("Settle a nanosecond before the hold ends: %v", err)
	}
	clk.Advance(time.Nanosecond)
	if err := l.Settle(t.Context(), b.ID, []int64{10}); !errors.Is(err, ratelimit.ErrUnknownReservation) {
		t.Fatalf("Settle at the end of the hold = %v, want ErrUnknownReservation", err)
	}
	// a was refunded 90; b's estimate stands. 10s at 1000/h is 2.78 tokens.
	d := allow(t, l, one("t", lim, 0), true, "probe")
	if got := d.Limits[0].Remaining; got != 892 {
		t.Fatalf("Remaining = %d, want 892 (1000 - 10 - 100 + 2 refilled)", got)
	}
}

// TestFakeClockCooldownExact: RetryAfter in a cooldown is exactly the time
// left; a shorter cooldown returns the longer one's rest; it ends exactly.
func TestFakeClockCooldownExact(t *testing.T) {
	clk := clock.NewFake(start)
	l := ratelimit.New(memory.New(clk))
	ctx := t.Context()
	if left, err := l.Cooldown(ctx, "s", 5*time.Second); err != nil || left != 5*time.Second {
		t.Fatalf("Cooldown = %v, %v; want 5s", left, err)
	}
	if d := allow(t, l, one("s", rpm(10), 1), false, "in the cooldown"); d.RetryAfter != 5*time.Second {
		t.Fatalf("RetryAfter = %v, want 5s", d.RetryAfter)
	}
	clk.Advance(3 * time.Second)
	if left, err := l.Cooldown(ctx, "s", time.Second); err != nil || left != 2*time.Second {
		t.Fatalf("shorter Cooldown = %v, %v; want the 2s left of the longer one", left, err)
	}
	clk.Advance(2*time.Second - time.Nanosecond)
	if d := allow(t, l, one("s", rpm(10), 1), false, "a nanosecond before the end"); d.RetryAfter != time.Nanosecond {
		t.Fatalf("RetryAfter = %v, want 1ns", d.RetryAfter)
	}
	clk.Advance(time.Nanosecond)
	allow(t, l, one("s", rpm(10), 1), true, "at the end of the cooldown")
	if left, err := l.Cooldown(ctx, "s", 10*time.Second); err != nil || left != 10*time.Second {
		t.Fatalf("new Cooldown = %v, %v; want 10s", left, err)
	}
}

// TestFakeClockObserveExact: after Observe(0) on a 100 tokens/s bucket, 50
// tokens fit in exactly 500ms.
func TestFakeClockObserveExact(t *testing.T) {
	clk := clock.NewFake(start)
	l := ratelimit.New(memory.New(clk))
	lim := ratelimit.Limit{Kind: ratelimit.Tokens, Limit: 6000, Window: time.Minute}
	if err := l.Observe(t.Context(), "s", lim, 0); err != nil {
		t.Fatal(err)
	}
	if d := allow(t, l, one("s", lim, 50), false, "after Observe(0)"); d.RetryAfter != 500*time.Millisecond {
		t.Fatalf("RetryAfter = %v, want 500ms", d.RetryAfter)
	}
	clk.Advance(500 * time.Millisecond)
	allow(t, l, one("s", lim, 50), true, "500ms later")
}

// notifyClock is a fake clock that reports the duration of every timer set
// on it: the waiter's sleeps.
type notifyClock struct {
	*clock.Fake
	set chan time.Duration
}

func newNotifyClock() *notifyClock {
	return &notifyClock{Fake: clock.NewFake(start), set: make(chan time.Duration, 64)}
}

func (c *notifyClock) AfterFunc(d time.Duration, f func()) clock.Timer {
	t := c.Fake.AfterFunc(d, f)
	select {
	case c.set <- d:
	default:
	}
	return t
}

type waitResult struct {
	d   ratelimit.Decision
	err error
}

// driveWait advances clk through every timer the waiter sets until Wait
// returns, at most maxSteps times; it returns the result and how far the
// clock moved.
func driveWait(t *testing.T, clk *notifyClock, ch <-chan waitResult, maxSteps int) (waitResult, time.Duration) {
	t.Helper()
	var moved time.Duration
	for range maxSteps {
		select {
		case r := <-ch:
			return r, moved
		case d := <-clk.set:
			clk.Advance(d)
			moved += d
		case <-time.After(10 * time.Second):
			t.Fatalf("waiter neither returned nor set a timer within 10s")
		}
	}
	t.Fatalf("waiter not admitted after %d timers (%v of fake time)", maxSteps, moved)
	return waitResult{}, 0
}

// TestFakeClockWaiterSleepsUntilRefill: a waiter blocked on a refill sleeps
// until the refill makes room, not until its renewal, and is admitted then.
func TestFakeClockWaiterSleepsUntilRefill(t *testing.T) {
	clk := newNotifyClock()
	l := ratelimit.New(memory.New(clk), ratelimit.WithWaiterLease(30*time.Second)) // renews every 10s
	for range 60 {
		allow(t, l, one("s", rpm(60), 1), true, "drain")
	}
	ch := make(chan waitResult, 1)
	began := time.Now()
	go func() {
		d, err := l.Wait(t.Context(), one("s", rpm(60), 1))
		ch <- waitResult{d, err}
	}()
	var first time.Duration
	select {
	case first = <-clk.set:
	case <-time.After(10 * time.Second):
		t.Fatal("waiter set no timer")
	}
	// Wait turns the hint into a deadline on the real clock, so the timer
	// is the hint less the real time that passed meanwhile.
	if first > time.Second || first < time.Second-time.Since(began) {
		t.Fatalf("waiter sleeps %v, want the 1s until the refill (less the %v since Wait began)", first, time.Since(began))
	}
	clk.Advance(first)
	r, moved := driveWait(t, clk, ch, 10)
	moved += first
	if r.err != nil || !r.d.Allowed {
		t.Fatalf("Wait = %+v, %v", r.d, r.err)
	}
	// A waiter may be admitted up to MaxDefer before its token exists, told
	// to start Delay later: the start is what must be exact.
	if start := moved + r.d.Delay; start < time.Second || start > time.Second+time.Millisecond {
		t.Fatalf("admitted after %v of fake time with a delay of %v, want a start at 1s (at most one 1ms re-check late)", moved, r.d.Delay)
	}
}

// TestFakeClockWaiterWokenAtPermitExpiry: a waiter for a permit whose
// holder never settles should sleep until the permit's Hold ends, as it
// sleeps until a refill; today it sleeps until its renewal.
func TestFakeClockWaiterWokenAtPermitExpiry(t *testing.T) {
	clk := newNotifyClock()
	l := ratelimit.New(memory.New(clk), ratelimit.WithWaiterLease(30*time.Second)) // renews every 10s
	c := ratelimit.Limit{Kind: ratelimit.Concurrency, Limit: 1}
	r := one("c", c, 1)
	r.Hold = 2 * time.Second
	allow(t, l, r, true, "holder that never settles")
	ch := make(chan waitResult, 1)
	go func() {
		d, err := l.Wait(t.Context(), one("c", c, 1))
		ch <- waitResult{d, err}
	}()
	var first time.Duration
	select {
	case first = <-clk.set:
	case <-time.After(10 * time.Second):
		t.Fatal("waiter set no timer")
	}
	clk.Advance(first)
	res, moved := driveWait(t, clk, ch, 10)
	moved += first
	if res.err != nil || !res.d.Allowed {
		t.Fatalf("Wait = %+v, %v", res.d, res.err)
	}
	if moved > 2*time.Second+time.Millisecond {
		t.Errorf("waiter admitted %v (fake) after queueing behind a permit that expired at 2s: it slept %v, its renewal period, because the walk reports RetryAfter 0 (unknown) for a concurrency refusal instead of the time until the earliest permit expires", moved, first)
	}
}

// queueSpy reports each request ID whose Enqueue left it waiting: from then
// on it has a place in its lane.
type queueSpy struct {
	*memory.Backend
	queued chan string
}

func (q *queueSpy) Enqueue(ctx context.Context, r *ratelimit.Request, lease time.Duration) (ratelimit.Decision, bool, time.Duration, error) {
	d, ok, hint, err := q.Backend.Enqueue(ctx, r, lease)
	if err == nil && !ok {
		select {
		case q.queued <- r.ID:
		default:
		}
	}
	return d, ok, hint, err
}

// TestFakeClockWaitOrderAcrossRefills: five waiters for one 60 rpm bucket
// are admitted one per second of fake time, in arrival order. The order is
// read from the store, not from the waiters' goroutines (which may report
// late): after every step of the clock, the admitted waiters (those whose
// reservation Extend finds) must be a prefix of the arrival order.
func TestFakeClockWaitOrderAcrossRefills(t *testing.T) {
	clk := newNotifyClock()
	spy := &queueSpy{Backend: memory.New(clk), queued: make(chan string, 64)}
	l := ratelimit.New(spy, ratelimit.WithWaiterLease(30*time.Second))
	for range 60 {
		allow(t, l, one("s", rpm(60), 1), true, "drain")
	}
	const n = 5
	ids := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		ids[i] = fmt.Sprintf("w%d", i)
		wg.Go(func() {
			r := one("s", rpm(60), 1)
			r.ID = ids[i]
			if _, err := l.Wait(t.Context(), r); err != nil {
				t.Errorf("waiter %d: %v", i, err)
			}
		})
		// The next waiter comes once this one has its place.
		for tries := 0; ; tries++ {
			if tries > 100 {
				t.Fatalf("waiter %d not queued after 100 other Enqueues", i)
			}
			select {
			case id := <-spy.queued:
				if id == ids[i] {
					tries = -1
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("waiter %d not queued within 10s", i)
			}
			if tries < 0 {
				break
			}
		}
	}
	admitted := func() int {
		m := 0
		for i, id := range ids {
			if l.Extend(t.Context(), id, time.Hour) == nil {
				if m != i {
					t.Fatalf("at %v: waiter %d admitted while waiter %d, ahead of it, was not", clk.Now().Sub(start), i, m)
				}
				m++
			}
		}
		return m
	}
	// Step the clock 50ms at a time; after each step give the waiters whose
	// timers fired a moment to act (a new timer, or returning).
	const step = 50 * time.Millisecond
	for steps := 0; admitted() < n; steps++ {
		if steps > 400 {
			t.Fatalf("waiters not all admitted after %v of fake time (%d were)", time.Duration(steps)*step, admitted())
		}
		select {
		case <-clk.set:
		case <-time.After(2 * time.Millisecond):
		}
		clk.Advance(step)
	}
	wg.Wait()
	t.Logf("all %d admitted in order after %v of fake time (one per second from 1s)", n, clk.Now().Sub(start))
}

// ---------------------------------------------------------------------------
// Fuzzing

// FuzzLimiter drives a Limiter over the memory backend on a fake clock with
// operations decoded from the input (Allow with random limits and costs,
// Settle, Refund, Extend, Observe, Learn, Cooldown, clock steps, malformed
// requests) and checks every decision against a reference model of the
// buckets, permits, cooldowns and reservations: never a panic, never an
// admission that a bucket could not cover, never a refusal of a request
// that fits, statuses and RetryAfter as the model computes them, and a
// refused or malformed request changes nothing.
func FuzzLimiter(f *testing.F) {
	f.Add([]byte{0})
	f.Add([]byte("\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f\x10\x11\x12\x13\x14\x15"))
	f.Add([]byte("\x07\x13\x25\x01\xff\x00\x80\x42\x00\x00\x01\x01\x01\x02\x05\x03\x00\x00\x04\x01\x02\x07\x03\x06\x01\x05\x02\x09\x00\x08"))
	seed := uint64(0x9e3779b97f4a7c15)
	for range 8 {
		b := make([]byte, 200)
		for i := range b {
			seed ^= seed << 13
			seed ^= seed >> 7
			seed ^= seed << 17
			b[i] = byte(seed)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		runFuzz(t, data)
	})
}
