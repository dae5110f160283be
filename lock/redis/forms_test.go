package redis_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/llmgate/llmgate/internal/testutil"
	"github.com/llmgate/llmgate/lock"
	"github.com/llmgate/llmgate/lock/redis"
)

// TestValueForms follows a lock through both forms of its value
// (acquire.lua): uncontended it is the bare owner token with the lease as
// the key's TTL; a waiter moves it to the long form; the hand-off to the
// last waiter moves it back; a release with nobody queued deletes it, and
// the fence counter alone remains. Fences increase all along.
func TestValueForms(t *testing.T) {
	r := testutil.StartRedis(t)
	ctx := testCtx(t, 30*time.Second)
	observer := r.Client(t)
	key := newKey(t)
	k := lockKey(defaultPrefix, key)
	a, b := newLocker(t, r), newLocker(t, r)
	opts := lock.Options{TTL: 10 * time.Second, Fair: true}

	first, err := a.TryAcquire(ctx, key, opts)
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := redisGet(t, observer, k); v != first.Token {
		t.Fatalf("uncontended value %q, want the bare owner token %q", v, first.Token)
	}
	if pttl := r.Int(t, "PTTL", k); pttl <= 0 || pttl > 10_000 {
		t.Fatalf("uncontended PTTL %d, want the lease (≤ 10000 ms)", pttl)
	}
	if f, _ := redisGet(t, observer, k+":f"); f != strconv.FormatUint(first.Fence, 10) {
		t.Fatalf("fence counter %q, want the holder's fence %d", f, first.Fence)
	}

	waiter := acquireAsync(ctx, b, key, opts)
	waitWaiters(t, ctx, b, key, 1)
	v, _ := redisGet(t, observer, k)
	parts := strings.Split(v, ":")
	if len(parts) != 5 || parts[0] != first.Token || parts[2] != strconv.FormatUint(first.Fence, 10) {
		t.Fatalf("value with a waiter %q, want %s:expires_ms:%d:granted_us:grant_ms", v, first.Token, first.Fence)
	}
	if pttl := r.Int(t, "PTTL", k); pttl < 10_000 {
		t.Fatalf("long-form PTTL %d, want the key's 7 days", pttl)
	}
	if owner, left := lockState(t, observer, k); owner != first.Token || left <= 0 || left > 10_000 {
		t.Fatalf("long form: owner %q, %d ms left; want %q with its lease", owner, left, first.Token)
	}

	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	second := receive(t, waiter, 10*time.Second, "the waiter")
	if second.lease.Fence <= first.Fence {
		t.Fatalf("hand-off fence %d, want > %d", second.lease.Fence, first.Fence)
	}
	if v, _ := redisGet(t, observer, k); v != second.lease.Token {
		t.Fatalf("after the hand-off to the last waiter: %q, want the bare token %q", v, second.lease.Token)
	}
	if err := second.lease.Extend(ctx, 5*time.Second); err != nil {
		t.Fatalf("Extend in the short form: %v", err)
	}
	if pttl := r.Int(t, "PTTL", k); pttl <= 2_000 || pttl > 5_000 {
		t.Fatalf("PTTL after Extend(5s) %d, want about 5000", pttl)
	}
	if err := second.lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if n := r.Int(t, "EXISTS", k); n != 0 {
		t.Fatalf("lock key still exists after the last release")
	}
	third, err := a.TryAcquire(ctx, key, opts)
	if err != nil {
		t.Fatal(err)
	}
	if third.Fence <= second.lease.Fence {
		t.Fatalf("fence after a deleted lock %d, want > %d", third.Fence, second.lease.Fence)
	}
	_ = third.Release(ctx)
}

// TestFenceAboveCounterAfterClockStep: should the server clock fall behind
// the last fence (it stepped back), fences count on from the counter.
func TestFenceAboveCounterAfterClockStep(t *testing.T) {
	r := testutil.StartRedis(t)
	ctx := testCtx(t, 30*time.Second)
	key := newKey(t)
	ahead := uint64(time.Now().Add(24 * time.Hour).UnixMicro()) // a fence minted by a clock a day ahead
	if _, err := r.Do(ctx, "SET", lockKey(defaultPrefix, key)+":f", strconv.FormatUint(ahead, 10)); err != nil {
		t.Fatal(err)
	}
	l := newLocker(t, r)
	for i := range 3 {
		lease, err := l.TryAcquire(ctx, key, lock.Options{TTL: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if want := ahead + uint64(i) + 1; lease.Fence != want {
			t.Fatalf("acquisition %d: fence %d, want %d", i, lease.Fence, want)
		}
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// TestAcquireAgainWithOwnToken is what happens when an Acquire's reply is
// lost and the call is retried: the retry finds the lock already its own,
// in either form, and returns the same fence with a valid lease instead of
// queueing behind itself.
func TestAcquireAgainWithOwnToken(t *testing.T) {
	r := testutil.StartRedis(t)
	ctx := testCtx(t, 30*time.Second)
	b := redis.New(r.Client(t), redis.Config{})
	other := newLocker(t, r)
	opts := lock.Options{TTL: 10 * time.Second, Fair: true}.WithDefaults()
	for _, contended := range []bool{false, true} {
		key := newKey(t)
		token := lock.NewToken()
		g, err := b.TryAcquire(ctx, key, token, opts)
		if err != nil {
			t.Fatal(err)
		}
		var waiter <-chan acquired
		if contended {
			waiter = acquireAsync(ctx, other, key, opts) // moves the value to the long form
			waitWaiters(t, ctx, other, key, 1)
		}
		again, err := b.Acquire(ctx, key, token, opts)
		if err != nil {
			t.Fatalf("contended=%v: Acquire with the holder's own token: %v", contended, err)
		}
		if again.Fence != g.Fence {
			t.Fatalf("contended=%v: fence %d on the retry, want the original %d", contended, again.Fence, g.Fence)
		}
		if left := time.Until(again.ValidUntil); left < 8*time.Second || left > 10*time.Second {
			t.Fatalf("contended=%v: retry valid for %v, want about the 10s lease", contended, left)
		}
		if err := b.Release(ctx, key, token); err != nil {
			t.Fatal(err)
		}
		if contended {
			w := receive(t, waiter, 10*time.Second, "the waiter")
			if w.lease.Fence <= g.Fence {
				t.Fatalf("waiter's fence %d, want > %d", w.lease.Fence, g.Fence)
			}
			_ = w.lease.Release(ctx)
		}
	}
}

// TestWaiterTakesVanishedLockAndLeavesQueue: if the lock key disappears
// under a queued waiter (an eviction, an outside DEL), the waiter takes the
// free lock and leaves no entry behind to be handed the lock later.
func TestWaiterTakesVanishedLockAndLeavesQueue(t *testing.T) {
	r := testutil.StartRedis(t)
	ctx := testCtx(t, 30*time.Second)
	key := newKey(t)
	holder, w := newLocker(t, r), newLocker(t, r)
	opts := lock.Options{TTL: 10 * time.Second, Fair: true, WaiterLease: 300 * time.Millisecond}
	lease, err := holder.TryAcquire(ctx, key, opts)
	if err != nil {
		t.Fatal(err)
	}
	waiter := acquireAsync(ctx, w, key, opts)
	waitWaiters(t, ctx, w, key, 1)
	if n := r.Int(t, "DEL", lockKey(defaultPrefix, key)); n != 1 {
		t.Fatalf("DEL = %d", n)
	}
	// The waiter renews its place every WaiterLease/3 and so finds the lock free.
	got := receive(t, waiter, 10*time.Second, "the waiter")
	if got.lease.Fence <= lease.Fence {
		t.Fatalf("fence %d, want > %d", got.lease.Fence, lease.Fence)
	}
	if n := r.Int(t, "ZCARD", queueKey(defaultPrefix, key)); n != 0 {
		t.Fatalf("%d entries left in the queue, want 0", n)
	}
	_ = got.lease.Release(ctx)
}
