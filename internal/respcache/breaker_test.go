package respcache_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgate/llmgate/clock"
	"github.com/llmgate/llmgate/internal/respcache"
	"github.com/llmgate/llmgate/internal/testutil"
)

// flaky is a Store whose calls fail with err while it is set, counting the
// calls that reach it.
type flaky struct {
	respcache.Store
	err   atomic.Pointer[error]
	calls atomic.Int64
}

func (f *flaky) Get(ctx context.Context, tenant, key string) (*respcache.Entry, bool, error) {
	f.calls.Add(1)
	if p := f.err.Load(); p != nil {
		return nil, false, *p
	}
	return f.Store.Get(ctx, tenant, key)
}

func (f *flaky) Put(ctx context.Context, tenant, key string, e *respcache.Entry, ttl time.Duration) error {
	f.calls.Add(1)
	if p := f.err.Load(); p != nil {
		return *p
	}
	return f.Store.Put(ctx, tenant, key, e, ttl)
}

func TestBreaker(t *testing.T) {
	clk := clock.NewFake(epoch)
	f := &flaky{Store: respcache.NewMemory(1<<20, clk)}
	b := respcache.NewBreaker(f, 5*time.Second, clk)
	ctx := t.Context()
	e := sized(10)
	if err := b.Put(ctx, "t", "k", e, time.Hour); err != nil {
		t.Fatal(err)
	}
	// Refusals are not the store's fault.
	if err := b.Put(ctx, "t", "k", e, 0); !errors.Is(err, respcache.ErrInvalidTTL) || b.Off() || b.Failures() != 0 {
		t.Fatalf("a refused Put: %v, off %v, failures %d", err, b.Off(), b.Failures())
	}
	down := errors.New("connection refused")
	f.err.Store(&down)
	if _, _, err := b.Get(ctx, "t", "k"); !errors.Is(err, down) || !b.Off() || b.Failures() != 1 {
		t.Fatalf("a failed Get: %v, off %v, failures %d", err, b.Off(), b.Failures())
	}
	// Off: nothing reaches the store for the cool-off.
	calls := f.calls.Load()
	clk.Advance(5*time.Second - time.Nanosecond)
	if _, ok, err := b.Get(ctx, "t", "k"); ok || !errors.Is(err, respcache.ErrUnavailable) {
		t.Fatalf("Get while off = %v, %v; want ErrUnavailable", ok, err)
	}
	if err := b.Put(ctx, "t", "k", e, time.Hour); !errors.Is(err, respcache.ErrUnavailable) {
		t.Fatalf("Put while off = %v; want ErrUnavailable", err)
	}
	if f.calls.Load() != calls {
		t.Fatal("a call reached the store while off")
	}
	// Then one probe, which fails: off for another cool-off.
	clk.Advance(time.Nanosecond)
	if _, _, err := b.Get(ctx, "t", "k"); !errors.Is(err, down) || b.Failures() != 2 {
		t.Fatalf("the probe: %v, failures %d", err, b.Failures())
	}
	if _, _, err := b.Get(ctx, "t", "k"); !errors.Is(err, respcache.ErrUnavailable) {
		t.Fatalf("after a failed probe: %v; want ErrUnavailable", err)
	}
	// The store is back: the next probe turns the cache on.
	f.err.Store(nil)
	clk.Advance(5 * time.Second)
	if _, ok, err := b.Get(ctx, "t", "k"); !ok || err != nil || b.Off() {
		t.Fatalf("the probe once back: %v, %v, off %v", ok, err, b.Off())
	}
	// The caller's own cancellation says nothing about the store.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	f.err.Store(func() *error { e := error(context.Canceled); return &e }())
	if _, _, err := b.Get(cctx, "t", "k"); !errors.Is(err, context.Canceled) || b.Off() || b.Failures() != 2 {
		t.Fatalf("a cancelled Get: %v, off %v, failures %d", err, b.Off(), b.Failures())
	}
}

// TestBreakerRedisDown: a Breaker over a Redis store that was killed
// fails once, then answers ErrUnavailable without going to the network
// until its cool-off has passed; once Redis is back, a probe turns it on.
func TestBreakerRedisDown(t *testing.T) {
	r := testutil.StartRedis(t)
	clk := clock.NewFake(epoch)
	b := respcache.NewBreaker(respcache.NewRedis(r.Client(t), uniquePrefix()), time.Second, clk)
	ctx := t.Context()
	if err := b.Put(ctx, "t", "k", sized(10), time.Hour); err != nil {
		t.Fatal(err)
	}
	r.Stop()
	// rueidis redials until the deadline: a short one, as the gateway's.
	tctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if _, _, err := b.Get(tctx, "t", "k"); err == nil || errors.Is(err, respcache.ErrUnavailable) || !b.Off() {
		t.Fatalf("Get with Redis down = %v, off %v; want the store's error", err, b.Off())
	}
	for range 100 {
		if _, _, err := b.Get(ctx, "t", "k"); !errors.Is(err, respcache.ErrUnavailable) {
			t.Fatalf("Get while off = %v", err)
		}
	}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Second)
	// The client reconnects on its own; the data is gone (no persistence).
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, ok, err := b.Get(ctx, "t", "k")
		if err == nil && !ok && !b.Off() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Redis is back, the breaker still says %v (off %v)", err, b.Off())
		}
		clk.Advance(time.Second) // let the next probe through
	}
}
