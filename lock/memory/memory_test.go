package memory_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/llmgate/llmgate/clock"

	"github.com/llmgate/llmgate/lock"
	"github.com/llmgate/llmgate/lock/locktest"
	"github.com/llmgate/llmgate/lock/memory"
)

func TestConformance(t *testing.T) {
	// One store for the whole suite: every "process" the suite asks for is
	// the same in-memory backend.
	b := memory.New(nil)
	locktest.RunSkipping(t, func(*testing.T) lock.Backend { return b }, locktest.OnFakeClock())
}

// TestConformanceFakeClock runs the suite's tests of expiry, extension and
// the watchdog on a fake clock, so that their bounds are exact on any
// machine.
func TestConformanceFakeClock(t *testing.T) {
	clk := clock.NewFake(start)
	b := memory.New(clk)
	locktest.RunFakeClock(t, clk, func(*testing.T) lock.Backend { return b })
}

var start = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

type result struct {
	lease *lock.Lease
	err   error
}

func acquireAsync(ctx context.Context, l *lock.Locker, key string, opts lock.Options) <-chan result {
	ch := make(chan result, 1)
	go func() {
		lease, err := l.Acquire(ctx, key, opts)
		ch <- result{lease, err}
	}()
	return ch
}

// waitWaiters polls b until n waiters are queued for key.
func waitWaiters(t *testing.T, b *memory.Backend, key string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := b.Waiters(t.Context(), key)
		if err != nil {
			t.Fatal(err)
		}
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Waiters(%q) = %d, want %d", key, got, n)
		}
		time.Sleep(time.Millisecond) // the waiter's goroutine has no "queued" signal
	}
}

// wantWaiters checks the queue length now. On the fake clock a hand-off
// happens synchronously inside Advance, so the count is exact right after it.
func wantWaiters(t *testing.T, b *memory.Backend, key string, n int) {
	t.Helper()
	if got, err := b.Waiters(t.Context(), key); err != nil || got != n {
		t.Fatalf("Waiters(%q) = %d, %v; want %d", key, got, err, n)
	}
}

func receive(t *testing.T, ch <-chan result) result {
	t.Helper()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("Acquire: %v", r.err)
		}
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("Acquire did not return after the hand-off")
		return result{}
	}
}

// TestFakeClockHandOffAtExpiry shows that a waiter is handed the lock at the
// exact instant the holder's lease expires: not a nanosecond before, and with
// no real time passing.
func TestFakeClockHandOffAtExpiry(t *testing.T) {
	clk := clock.NewFake(start)
	b := memory.New(clk)
	l := lock.New(b)
	ctx := t.Context()
	const key, ttl = "k", time.Second

	holder, err := l.TryAcquire(ctx, key, lock.Options{TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	if got := holder.ValidUntil(); !got.Equal(start.Add(ttl)) {
		t.Fatalf("ValidUntil = %v, want %v", got, start.Add(ttl))
	}
	if floor := uint64(start.UnixMicro()); holder.Fence < floor {
		t.Fatalf("fence %d is below the store clock in µs (%d)", holder.Fence, floor)
	}
	ch := acquireAsync(ctx, l, key, lock.Options{TTL: ttl})
	waitWaiters(t, b, key, 1)

	clk.Advance(ttl - time.Nanosecond)
	wantWaiters(t, b, key, 1) // not handed over yet
	select {
	case r := <-ch:
		t.Fatalf("waiter returned before expiry: %+v", r)
	default:
	}

	clk.Advance(time.Nanosecond)
	wantWaiters(t, b, key, 0) // handed over inside Advance, at expiry
	r := receive(t, ch)
	if got, want := r.lease.ValidUntil(), start.Add(2*ttl); !got.Equal(want) {
		t.Fatalf("waiter's ValidUntil = %v, want %v (granted exactly at the old expiry)", got, want)
	}
	if r.lease.Fence <= holder.Fence {
		t.Fatalf("waiter's fence %d, want > %d", r.lease.Fence, holder.Fence)
	}
	if err := holder.Extend(ctx, 0); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("old holder's Extend = %v, want ErrNotHeld", err)
	}
	if err := holder.Release(ctx); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("old holder's Release = %v, want ErrNotHeld", err)
	}
	if err := r.lease.Release(ctx); err != nil {
		t.Fatalf("new holder's Release: %v", err)
	}
}

// TestFakeClockExtendMovesHandOff shows that renewing a lease moves the
// waiter's hand-off to the new expiry.
func TestFakeClockExtendMovesHandOff(t *testing.T) {
	clk := clock.NewFake(start)
	b := memory.New(clk)
	l := lock.New(b)
	ctx := t.Context()
	const key, ttl = "k", time.Second

	holder, err := l.TryAcquire(ctx, key, lock.Options{TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	ch := acquireAsync(ctx, l, key, lock.Options{TTL: ttl})
	waitWaiters(t, b, key, 1)

	clk.Advance(900 * time.Millisecond)
	if err := holder.Extend(ctx, 0); err != nil {
		t.Fatalf("Extend: %v", err)
	}
	if got, want := holder.ValidUntil(), start.Add(1900*time.Millisecond); !got.Equal(want) {
		t.Fatalf("ValidUntil after Extend = %v, want %v", got, want)
	}
	clk.Advance(999*time.Millisecond + 999*time.Microsecond) // 1ms short of the new expiry; past the old one
	wantWaiters(t, b, key, 1)
	clk.Advance(time.Millisecond)
	wantWaiters(t, b, key, 0)
	r := receive(t, ch)
	if r.lease.Fence <= holder.Fence {
		t.Fatalf("waiter's fence %d, want > %d", r.lease.Fence, holder.Fence)
	}
	if err := r.lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestFakeClockTryAcquireAtExpiry shows that a lease with nobody waiting is
// free for a TryAcquire at exactly its expiry, and that fences keep rising
// while the clock stands still.
func TestFakeClockTryAcquireAtExpiry(t *testing.T) {
	clk := clock.NewFake(start)
	l := lock.New(memory.New(clk))
	ctx := t.Context()
	const key, ttl = "k", 500 * time.Millisecond

	first, err := l.TryAcquire(ctx, key, lock.Options{TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(ttl - time.Nanosecond)
	if _, err := l.TryAcquire(ctx, key, lock.Options{TTL: ttl}); !errors.Is(err, lock.ErrNotObtained) {
		t.Fatalf("TryAcquire 1ns before expiry = %v, want ErrNotObtained", err)
	}
	clk.Advance(time.Nanosecond)
	second, err := l.TryAcquire(ctx, key, lock.Options{TTL: ttl})
	if err != nil {
		t.Fatalf("TryAcquire at expiry: %v", err)
	}
	if second.Fence <= first.Fence {
		t.Fatalf("fence %d, want > %d", second.Fence, first.Fence)
	}
	// The clock does not move: fences still strictly increase.
	prev := second.Fence
	if err := second.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		lease, err := l.TryAcquire(ctx, key, lock.Options{TTL: ttl})
		if err != nil {
			t.Fatal(err)
		}
		if lease.Fence <= prev {
			t.Fatalf("acquisition %d at a frozen clock: fence %d, want > %d", i, lease.Fence, prev)
		}
		prev = lease.Fence
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
