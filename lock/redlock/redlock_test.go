package redlock_test

import (
	"context"
	"errors"
	"strconv"
	"time"

	"testing"

	"github.com/redis/rueidis"

	"github.com/llmgate/llmgate/internal/testutil"
	"github.com/llmgate/llmgate/lock"
	"github.com/llmgate/llmgate/lock/locktest"
	"github.com/llmgate/llmgate/lock/redlock"
)

// startInstances starts n independent redis-servers.
func startInstances(t *testing.T, n int) []*testutil.Redis {
	t.Helper()
	rs := make([]*testutil.Redis, n)
	for i := range rs {
		rs[i] = testutil.StartRedis(t)
	}
	return rs
}

// newBackend returns a Backend with its own clients (a separate "process").
func newBackend(t *testing.T, rs []*testutil.Redis, cfg redlock.Config) *redlock.Backend {
	t.Helper()
	cs := make([]rueidis.Client, len(rs))
	for i, r := range rs {
		cs[i] = r.Client(t)
	}
	b, err := redlock.New(cs, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestConformance(t *testing.T) {
	rs := startInstances(t, 3)
	locktest.RunSkipping(t, func(t *testing.T) lock.Backend {
		return newBackend(t, rs, redlock.Config{})
	}, map[string]string{
		"MixedWaiterLeasesKeepPlaces": "redlock has no wait queue: waiters poll, so a TryAcquire right after a release may win over a waiter",
	})
}

func TestNewRejectsBadConfig(t *testing.T) {
	if _, err := redlock.New(nil, redlock.Config{}); !errors.Is(err, redlock.ErrInvalidConfig) {
		t.Fatalf("New(no clients) = %v, want ErrInvalidConfig", err)
	}
	if _, err := redlock.New([]rueidis.Client{nil}, redlock.Config{}); !errors.Is(err, redlock.ErrInvalidConfig) {
		t.Fatalf("New(nil client) = %v, want ErrInvalidConfig", err)
	}
	rs := startInstances(t, 1)
	if _, err := redlock.New([]rueidis.Client{rs[0].Client(t)}, redlock.Config{RetryDelay: -1}); !errors.Is(err, redlock.ErrInvalidConfig) {
		t.Fatalf("New(negative delay) = %v, want ErrInvalidConfig", err)
	}
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// TestOneRoundWhenCountersAgree: the acquisition floor (above every
// counter) and releases keep the instances' answers equal, so uncontended
// acquisitions, of a new key too, need one round.
func TestOneRoundWhenCountersAgree(t *testing.T) {
	ctx := testCtx(t)
	rs := startInstances(t, 3)
	b := newBackend(t, rs, redlock.Config{})
	l := lock.New(b)
	var last uint64
	for i := range 20 {
		lease, err := l.TryAcquire(ctx, "k", lock.Options{TTL: 5 * time.Second})
		if err != nil {
			t.Fatalf("acquisition %d: %v", i, err)
		}
		if lease.Fence <= last {
			t.Fatalf("fence %d after %d", lease.Fence, last)
		}
		last = lease.Fence
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if one, two := b.Rounds(); two != 0 || one != 20 {
		t.Fatalf("rounds: %d with one, %d with two; want 20 and 0", one, two)
	}
}

// TestFenceSurvivesLosingTheHighInstance: when the quorum's counters
// disagree, the second round raises them, so a later holder whose quorum
// leaves out the instance with the highest counter still gets a larger
// fence.
func TestFenceSurvivesLosingTheHighInstance(t *testing.T) {
	ctx := testCtx(t)
	rs := startInstances(t, 3)
	b := newBackend(t, rs, redlock.Config{CallTimeout: 500 * time.Millisecond})
	// Instance 0's counter is far ahead of the others' clocks.
	high := uint64(time.Now().Add(24 * time.Hour).UnixMicro())
	if _, err := rs[0].Do(ctx, "SET", b.Key("k")+":f", strconv.FormatUint(high, 10)); err != nil {
		t.Fatal(err)
	}
	// Another process, which will have seen no fence.
	other := lock.New(newBackend(t, rs, redlock.Config{CallTimeout: 500 * time.Millisecond}))
	// Instance 2 is down: the quorum is {0, 1}.
	rs[2].Stop()
	l := lock.New(b)
	a, err := l.TryAcquire(ctx, "k", lock.Options{TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if a.Fence != high+1 {
		t.Fatalf("fence %d, want %d (the highest answer)", a.Fence, high+1)
	}
	if _, two := b.Rounds(); two != 1 {
		t.Fatalf("the quorum disagreed but %d acquisitions took two rounds", two)
	}
	// The holder crashes (its lease expires), instance 0 goes away and
	// instance 2 comes back empty: the next quorum is {1, 2}, and only the
	// second round told instance 1 about the high fence.
	rs[0].Stop()
	if err := rs[2].Start(); err != nil {
		t.Fatal(err)
	}
	if _, err := rs[1].Do(ctx, "DEL", b.Key("k")); err != nil {
		t.Fatal(err)
	}
	// Acquire retries the first call to instance 2, which meets the
	// connection its restart broke.
	next, err := other.Acquire(ctx, "k", lock.Options{TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if next.Fence <= a.Fence {
		t.Fatalf("later holder's fence %d, want > %d", next.Fence, a.Fence)
	}
	_ = next.Release(ctx)
}

// TestMinorityIsUndone: an attempt that takes the key on a minority only
// deletes it there, and reports ErrNotObtained.
func TestMinorityIsUndone(t *testing.T) {
	ctx := testCtx(t)
	rs := startInstances(t, 3)
	b := newBackend(t, rs, redlock.Config{})
	for _, r := range rs[:2] {
		if _, err := r.Do(ctx, "SET", b.Key("k"), "someone-else", "PX", "60000"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := lock.New(b).TryAcquire(ctx, "k", lock.Options{TTL: 30 * time.Second}); !errors.Is(err, lock.ErrNotObtained) {
		t.Fatalf("TryAcquire = %v, want ErrNotObtained", err)
	}
	if n := rs[2].Int(t, "EXISTS", b.Key("k")); n != 0 {
		t.Fatalf("the minority's key is still there")
	}
}

// TestQuorumSurvivesOneInstanceDown: with one of three instances down,
// locks work; with two down, acquisition fails with the instances' errors
// (not ErrNotObtained: nobody holds the lock).
func TestQuorumSurvivesOneInstanceDown(t *testing.T) {
	ctx := testCtx(t)
	rs := startInstances(t, 3)
	b := newBackend(t, rs, redlock.Config{CallTimeout: 500 * time.Millisecond})
	l := lock.New(b)
	rs[0].Stop()
	lease, err := l.TryAcquire(ctx, "k", lock.Options{TTL: 5 * time.Second})
	if err != nil {
		t.Fatalf("one instance down: %v", err)
	}
	if err := lease.Extend(ctx, 0); err != nil {
		t.Fatalf("extend with one instance down: %v", err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatalf("release with one instance down: %v", err)
	}
	rs[1].Stop()
	_, err = l.TryAcquire(ctx, "k", lock.Options{TTL: 5 * time.Second})
	if err == nil || errors.Is(err, lock.ErrNotObtained) {
		t.Fatalf("two instances down: TryAcquire = %v, want a connection error", err)
	}
}

// TestRestartWithoutPersistence: an instance that loses its data (keys and
// counters) does not make fences go backwards: its counter restarts from
// its clock.
func TestRestartWithoutPersistence(t *testing.T) {
	ctx := testCtx(t)
	rs := startInstances(t, 3)
	cfg := redlock.Config{CallTimeout: 500 * time.Millisecond}
	ls := []*lock.Locker{lock.New(newBackend(t, rs, cfg)), lock.New(newBackend(t, rs, cfg))}
	var last uint64
	for i := range 12 {
		if i%4 == 3 {
			if err := rs[i%3].Restart(); err != nil {
				t.Fatal(err)
			}
		}
		lease, err := ls[i%2].Acquire(ctx, "k", lock.Options{TTL: 5 * time.Second})
		if err != nil {
			t.Fatalf("acquisition %d: %v", i, err)
		}
		if lease.Fence <= last {
			t.Fatalf("acquisition %d: fence %d after %d", i, lease.Fence, last)
		}
		last = lease.Fence
		if err := lease.Release(ctx); err != nil {
			t.Fatalf("release %d: %v", i, err)
		}
	}
}

// TestEarlierAttemptKeyIsOurs: a key left by an earlier attempt of the same
// acquisition (its answer lost, or its undo missed) does not block a retry,
// and releasing by token deletes it; another token's key is not touched.
func TestEarlierAttemptKeyIsOurs(t *testing.T) {
	ctx := testCtx(t)
	rs := startInstances(t, 3)
	b := newBackend(t, rs, redlock.Config{})
	token := lock.NewToken()
	for _, r := range rs[:2] {
		if _, err := r.Do(ctx, "SET", b.Key("k"), token+":old", "PX", "60000"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := rs[2].Do(ctx, "SET", b.Key("k"), "other:1", "PX", "60000"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.TryAcquire(ctx, "k", token, lock.Options{TTL: 5 * time.Second}); err != nil {
		t.Fatalf("retry over our own earlier attempt's keys: %v", err)
	}
	if err := b.Release(ctx, "k", token); err != nil {
		t.Fatalf("release: %v", err)
	}
	for i, r := range rs {
		want := int64(0)
		if i == 2 {
			want = 1 // the other owner's key stays
		}
		if n := r.Int(t, "EXISTS", b.Key("k")); n != want {
			t.Fatalf("instance %d: EXISTS = %d after the release, want %d", i, n, want)
		}
	}
}
