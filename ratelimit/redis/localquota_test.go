package redis_test

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgate/llmgate/internal/testutil"
	"github.com/llmgate/llmgate/ratelimit"
	"github.com/llmgate/llmgate/ratelimit/redis"
)

// replicas returns n Limiters with local quotas on one real Redis, each
// with its own client, as n gateway replicas would be.
func replicas(t *testing.T, n int, q ratelimit.LocalQuota) []*ratelimit.Limiter {
	t.Helper()
	r := testutil.StartRedis(t)
	out := make([]*ratelimit.Limiter, n)
	for i := range out {
		out[i] = ratelimit.New(redis.New(r.Client(t), redis.Config{}), ratelimit.WithLocalQuota(q))
	}
	return out
}

// slowLimits refill less than one unit during these tests, so what Redis
// has left shows exactly what was charged.
func slowLimits(requests, tokens, cost int64) ratelimit.Request {
	const window = 1_000_000 * time.Hour // tokens: 1e9 of them refill 0.28 a second
	return ratelimit.Request{Charges: []ratelimit.Charge{
		{Scope: "deployment:k/m", Limit: ratelimit.Limit{Kind: ratelimit.Requests, Limit: requests, Window: window}},
		{Scope: "deployment:k/m", Limit: ratelimit.Limit{Kind: ratelimit.Tokens, Limit: tokens, Window: window}, Cost: cost},
		{Scope: "tenant:a", Limit: ratelimit.Limit{Kind: ratelimit.Requests, Limit: requests, Window: window}},
	}}
}

// TestLocalQuotaAcrossReplicas: three replicas admit 3×8×150 requests
// concurrently, mostly from local blocks, and settle each with fewer tokens
// than estimated; once they close, Redis holds exactly what per-request
// settles would have left.
func TestLocalQuotaAcrossReplicas(t *testing.T) {
	ctx := context.Background()
	ls := replicas(t, 3, ratelimit.LocalQuota{})
	const workers, each, est, used = 8, 150, 500, 123
	const requests, tokens = 1_000_000, 1_000_000_000
	var wg sync.WaitGroup
	for _, l := range ls {
		for range workers {
			wg.Go(func() {
				for range each {
					d, err := l.Wait(ctx, slowLimits(requests, tokens, est))
					if err != nil || !d.Allowed || d.Degraded {
						t.Errorf("Wait = %+v, %v", d, err)
						return
					}
					if err := l.Settle(ctx, d.ID, []int64{1, used, 1}); err != nil {
						t.Errorf("Settle: %v", err)
						return
					}
				}
			})
		}
	}
	wg.Wait()
	var local int64
	for _, l := range ls {
		if err := l.Close(ctx); err != nil {
			t.Fatal(err)
		}
		local += l.Stats().Local
	}
	const n = 3 * workers * each
	if local < n/2 {
		t.Errorf("%d of %d requests admitted locally", local, n)
	}
	probe := slowLimits(requests, tokens, 0)
	probe.ID = "probe" // its own ID: decided by Redis
	d, err := ls[0].Allow(ctx, probe)
	if err != nil || !d.Allowed {
		t.Fatalf("probe: %+v, %v", d, err)
	}
	// The probe itself counts one request on the requests limits.
	want := []int64{requests - n - 1, tokens - n*used, requests - n - 1}
	for i, s := range d.Limits {
		if s.Remaining < want[i] || s.Remaining > want[i]+1 {
			t.Errorf("limit %d (%s %s): Redis has %d left, want %d", i, s.Scope, s.Kind, s.Remaining, want[i])
		}
	}
}

// TestLocalQuotaNeverExceedsAcrossReplicas: three replicas asking as fast
// as they can, never settling, get exactly the limit between them.
func TestLocalQuotaNeverExceedsAcrossReplicas(t *testing.T) {
	ctx := context.Background()
	// Unsettled requests keep their block's unused part until they settle;
	// a long window makes blocks end only when used up, so all of the
	// limit is handed out.
	ls := replicas(t, 3, ratelimit.LocalQuota{Window: time.Hour})
	const limit = 3000
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for _, l := range ls {
		for range 8 {
			wg.Go(func() {
				for range limit {
					d, err := l.Allow(ctx, slowLimits(limit, 100*limit, 100))
					if err != nil || d.Degraded {
						t.Errorf("Allow = %+v, %v", d, err)
						return
					}
					if !d.Allowed {
						return
					}
					admitted.Add(1)
				}
			})
		}
	}
	wg.Wait()
	if got := admitted.Load(); got != limit {
		t.Errorf("admitted %d, want exactly %d", got, limit)
	}
	var local int64
	for _, l := range ls {
		local += l.Stats().Local
	}
	if local == 0 {
		t.Error("no request was admitted from a local block")
	}
}

// BenchmarkAllow3LimitsLocal is BenchmarkAllow3Limits with a local quota:
// most decisions are made from blocks, without a round trip. Each op is an
// Allow and its Settle (blocks go back to Redis only once their requests
// have settled).
func BenchmarkAllow3LimitsLocal(b *testing.B) {
	r := testutil.StartRedis(b)
	l := ratelimit.New(redis.New(r.Client(b), redis.Config{}), ratelimit.WithLocalQuota(ratelimit.LocalQuota{}))
	ctx := context.Background()
	actual := []int64{1, 900, 1}
	b.Cleanup(func() { _ = l.Close(ctx) })
	// localShare reports the share of admissions made locally during f.
	localShare := func(b *testing.B, f func()) {
		before := l.Stats()
		f()
		after := l.Stats()
		b.ReportMetric(float64(after.Local-before.Local)/float64(max(after.Admitted-before.Admitted, 1)), "local/op")
	}
	b.Run("serial", func(b *testing.B) {
		localShare(b, func() {
			for b.Loop() {
				d, err := l.Allow(ctx, threeLimits())
				if err != nil || !d.Allowed || d.Degraded {
					b.Fatalf("Allow = %+v, %v", d, err)
				}
				if err := l.Settle(ctx, d.ID, actual); err != nil {
					b.Fatal(err)
				}
			}
		})
	})
	b.Run("parallel16", func(b *testing.B) {
		b.SetParallelism(max(1, 16/runtime.GOMAXPROCS(0)))
		localShare(b, func() {
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					d, err := l.Allow(ctx, threeLimits())
					if err != nil || !d.Allowed || d.Degraded {
						b.Errorf("Allow = %+v, %v", d, err)
						return
					}
					if err := l.Settle(ctx, d.ID, actual); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	})
}
