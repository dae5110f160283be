package main

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/go-redsync/redsync/v4"
	redsyncredis "github.com/go-redsync/redsync/v4/redis"
	redsyncgoredis "github.com/go-redsync/redsync/v4/redis/goredis/v9"
	goredis "github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	"github.com/llmgate/llmgate/internal/testutil"
	"github.com/llmgate/llmgate/lock"
	"github.com/llmgate/llmgate/lock/redlock"
)

// benchRTT is the round trip the proxies add to each instance: 4ms by
// default (far above loopback's ~0.1ms, so the count of round trips shows),
// or $LLMGATE_BENCH_RTT.
func benchRTT(b *testing.B) time.Duration {
	rtt := 4 * time.Millisecond
	if v := os.Getenv("LLMGATE_BENCH_RTT"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			b.Fatalf("LLMGATE_BENCH_RTT: %v", err)
		}
		rtt = d
	}
	return rtt
}

// BenchmarkRedlockRTT times one uncontended acquire and one release of a
// Redlock over 3 independent redis-servers, each behind a DelayProxy that
// adds the same round trip, for llmgate's lock/redlock and for redsync in
// the same run. It reports each step's wall time in round trips of the
// injected RTT (acquire-RTTs, release-RTTs): with every instance asked in
// parallel, the floor is 1 each.
//
//	go test -run '^$' -bench RedlockRTT -benchtime 200x ./...
func BenchmarkRedlockRTT(b *testing.B) {
	rtt := benchRTT(b)
	addrs := make([]string, 3)
	for i := range addrs {
		r := testutil.StartRedis(b)
		addrs[i] = testutil.StartDelayProxy(b, r.Addr, rtt).Addr
	}
	ctx := b.Context()
	opts := lock.Options{TTL: 10 * time.Second}

	llmgate := func(freshKey bool) func(b *testing.B) {
		return func(b *testing.B) {
			cs := make([]rueidis.Client, len(addrs))
			for i, a := range addrs {
				c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{a}, DisableCache: true})
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(c.Close)
				cs[i] = c
			}
			be, err := redlock.New(cs, redlock.Config{})
			if err != nil {
				b.Fatal(err)
			}
			l := lock.New(be)
			run(b, rtt, func(i int) (func() error, error) {
				key := "k"
				if freshKey {
					key = fmt.Sprintf("fresh-%d-%d", b.N, i)
				}
				lease, err := l.TryAcquire(ctx, key, opts)
				if err != nil {
					return nil, err
				}
				return func() error { return lease.Release(ctx) }, nil
			})
			one, two := be.Rounds()
			b.ReportMetric(float64(two)/float64(one+two), "two-round-share")
		}
	}
	b.Run("llmgate", llmgate(false))
	b.Run("llmgate-fresh-key", llmgate(true))
	b.Run("redsync", func(b *testing.B) {
		pools := make([]redsyncredis.Pool, len(addrs))
		for i, a := range addrs {
			c := goredis.NewClient(&goredis.Options{Addr: a})
			b.Cleanup(func() { _ = c.Close() })
			if err := c.Ping(ctx).Err(); err != nil {
				b.Fatal(err)
			}
			pools[i] = redsyncgoredis.NewPool(c)
		}
		rs := redsync.New(pools...)
		run(b, rtt, func(int) (func() error, error) {
			mu := rs.NewMutex("k", redsync.WithExpiry(opts.TTL), redsync.WithTries(1))
			if err := mu.LockContext(ctx); err != nil {
				return nil, err
			}
			return func() error {
				ok, err := mu.UnlockContext(ctx)
				if err == nil && !ok {
					err = lock.ErrNotHeld
				}
				return err
			}, nil
		})
	})
}

// run times b.N acquire (take) and release pairs, after one warm-up pair
// (connections and script caches), and reports them in RTTs.
func run(b *testing.B, rtt time.Duration, take func(i int) (func() error, error)) {
	release, err := take(-1)
	if err != nil {
		b.Fatalf("warm-up acquire: %v", err)
	}
	if err := release(); err != nil {
		b.Fatalf("warm-up release: %v", err)
	}
	var acq, rel time.Duration
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		t0 := time.Now()
		release, err := take(i)
		t1 := time.Now()
		if err != nil {
			b.Fatalf("acquire %d: %v", i, err)
		}
		if err := release(); err != nil {
			b.Fatalf("release %d: %v", i, err)
		}
		acq += t1.Sub(t0)
		rel += time.Since(t1)
	}
	n := float64(b.N)
	b.ReportMetric(float64(acq)/n/float64(rtt), "acquire-RTTs")
	b.ReportMetric(float64(rel)/n/float64(rtt), "release-RTTs")
}
