package main

import (
	"errors"
	"fmt"
	"os"
	"strconv"
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
// injected RTT (acquire-RTTs, release-RTTs), and in parallel PINGs to the
// three instances timed between the pairs (acquire-pings, release-pings),
// which also pay the proxy's and client's overhead: with every instance
// asked in parallel, one round trip is 1 PING.
//
//	go test -run '^$' -bench RedlockRTT -benchtime 200x ./...
func BenchmarkRedlockRTT(b *testing.B) {
	rtt := benchRTT(b)
	addrs := make([]string, 3)
	servers := make([]*testutil.Redis, 3)
	for i := range addrs {
		servers[i] = testutil.StartRedis(b)
		addrs[i] = testutil.StartDelayProxy(b, servers[i].Addr, rtt).Addr
	}
	ctx := b.Context()
	opts := lock.Options{TTL: 10 * time.Second}

	// llmgate runs lock/redlock: on one key, on a new key each time, or
	// (twoRounds) on one key whose counters are first set apart on every
	// instance, directly and untimed, so that every quorum disagrees and
	// pays the second round.
	llmgate := func(freshKey, twoRounds bool) func(b *testing.B) {
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
			ping := func() error {
				return fanPing(len(cs), func(i int) error { return cs[i].Do(ctx, cs[i].B().Ping().Build()).Error() })
			}
			var prep func(i int)
			if twoRounds {
				base := time.Now().Add(time.Hour).UnixMicro()
				prep = func(i int) {
					for j, r := range servers {
						v := strconv.FormatInt(base+int64(i+2)*10+int64(j), 10)
						if _, err := r.Do(ctx, "SET", be.Key("k")+":f", v); err != nil {
							b.Fatal(err)
						}
					}
				}
			}
			run(b, rtt, ping, prep, func(i int) (func() error, error) {
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
	b.Run("llmgate", llmgate(false, false))
	b.Run("llmgate-fresh-key", llmgate(true, false))
	b.Run("llmgate-two-rounds", llmgate(false, true))
	b.Run("redsync", func(b *testing.B) {
		pools := make([]redsyncredis.Pool, len(addrs))
		cs := make([]*goredis.Client, len(addrs))
		for i, a := range addrs {
			c := goredis.NewClient(&goredis.Options{Addr: a})
			b.Cleanup(func() { _ = c.Close() })
			if err := c.Ping(ctx).Err(); err != nil {
				b.Fatal(err)
			}
			pools[i] = redsyncgoredis.NewPool(c)
			cs[i] = c
		}
		rs := redsync.New(pools...)
		ping := func() error {
			return fanPing(len(cs), func(i int) error { return cs[i].Ping(ctx).Err() })
		}
		run(b, rtt, ping, nil, func(int) (func() error, error) {
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

// BenchmarkRedlockHandOff times how long a waiter blocked in Acquire takes
// to get the lock after the holder's release returned, over the same 3
// delayed instances: handoff-RTTs. Neither Redlock queues waiters: both
// poll, llmgate every 25–50 ms (Config.RetryDelay), redsync with its
// default 50–250 ms random delay.
//
//	go test -run '^$' -bench RedlockHandOff -benchtime 50x ./...
func BenchmarkRedlockHandOff(b *testing.B) {
	rtt := benchRTT(b)
	addrs := make([]string, 3)
	for i := range addrs {
		r := testutil.StartRedis(b)
		addrs[i] = testutil.StartDelayProxy(b, r.Addr, rtt).Addr
	}
	ctx := b.Context()
	opts := lock.Options{TTL: 10 * time.Second}
	b.Run("llmgate", func(b *testing.B) {
		mk := func() *lock.Locker {
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
			return lock.New(be)
		}
		holder, waiter := mk(), mk()
		handOff(b, rtt, func() (func() error, error) {
			l, err := holder.TryAcquire(ctx, "k", opts)
			if err != nil {
				return nil, err
			}
			return func() error { return l.Release(ctx) }, nil
		}, func() (func() error, error) {
			l, err := waiter.Acquire(ctx, "k", opts)
			if err != nil {
				return nil, err
			}
			return func() error { return l.Release(ctx) }, nil
		})
	})
	b.Run("redsync", func(b *testing.B) {
		mk := func() *redsync.Redsync {
			pools := make([]redsyncredis.Pool, len(addrs))
			for i, a := range addrs {
				c := goredis.NewClient(&goredis.Options{Addr: a})
				b.Cleanup(func() { _ = c.Close() })
				if err := c.Ping(ctx).Err(); err != nil {
					b.Fatal(err)
				}
				pools[i] = redsyncgoredis.NewPool(c)
			}
			return redsync.New(pools...)
		}
		holder, waiter := mk(), mk()
		take := func(rs *redsync.Redsync, tries int) func() (func() error, error) {
			return func() (func() error, error) {
				mu := rs.NewMutex("k", redsync.WithExpiry(opts.TTL), redsync.WithTries(tries))
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
			}
		}
		handOff(b, rtt, take(holder, 1), take(waiter, 1000))
	})
}

// handOff runs b.N hand-offs: the holder takes the lock, the waiter starts
// waiting, and once the waiter has waited a while the holder releases.
func handOff(b *testing.B, rtt time.Duration, hold, wait func() (func() error, error)) {
	var total time.Duration
	for i := 0; b.Loop(); i++ {
		release, err := hold()
		if err != nil {
			b.Fatalf("holder %d: %v", i, err)
		}
		type got struct {
			release func() error
			at      time.Time
			err     error
		}
		ch := make(chan got, 1)
		go func() {
			r, err := wait()
			ch <- got{r, time.Now(), err}
		}()
		<-time.After(20 * rtt) // the waiter is mid-wait: the state under test
		if err := release(); err != nil {
			b.Fatalf("holder release %d: %v", i, err)
		}
		released := time.Now()
		g := <-ch
		if g.err != nil {
			b.Fatalf("waiter %d: %v", i, g.err)
		}
		total += g.at.Sub(released)
		if err := g.release(); err != nil {
			b.Fatalf("waiter release %d: %v", i, err)
		}
	}
	b.ReportMetric(float64(total)/float64(b.N)/float64(rtt), "handoff-RTTs")
}

// fanPing sends a PING to each of n instances in parallel and waits for
// all: one round trip of wall time through the same proxies, the unit that
// acquire-pings and release-pings count in.
func fanPing(n int, ping func(i int) error) error {
	errs := make(chan error, n)
	for i := range n {
		go func() { errs <- ping(i) }()
	}
	var err error
	for range n {
		err = errors.Join(err, <-errs)
	}
	return err
}

// run times b.N acquire (take) and release pairs, after one warm-up pair
// (connections and script caches), and reports them in RTTs of the
// injected delay and in parallel PINGs timed between the pairs (which also
// pay the proxy's and the client's own overhead).
// prep, if not nil, runs untimed before each acquisition.
func run(b *testing.B, rtt time.Duration, ping func() error, prep func(i int), take func(i int) (func() error, error)) {
	if prep != nil {
		prep(-1)
	}
	release, err := take(-1)
	if err != nil {
		b.Fatalf("warm-up acquire: %v", err)
	}
	if err := release(); err != nil {
		b.Fatalf("warm-up release: %v", err)
	}
	var acq, rel, pings time.Duration
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		if prep != nil {
			prep(i)
		}
		t0 := time.Now()
		release, err := take(i)
		t1 := time.Now()
		if err != nil {
			b.Fatalf("acquire %d: %v", i, err)
		}
		if err := release(); err != nil {
			b.Fatalf("release %d: %v", i, err)
		}
		t2 := time.Now()
		if err := ping(); err != nil {
			b.Fatalf("ping %d: %v", i, err)
		}
		acq += t1.Sub(t0)
		rel += t2.Sub(t1)
		pings += time.Since(t2)
	}
	n := float64(b.N)
	b.ReportMetric(float64(acq)/n/float64(rtt), "acquire-RTTs")
	b.ReportMetric(float64(rel)/n/float64(rtt), "release-RTTs")
	b.ReportMetric(float64(acq)/float64(pings), "acquire-pings")
	b.ReportMetric(float64(rel)/float64(pings), "release-pings")
}
