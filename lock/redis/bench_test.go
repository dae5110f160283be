package redis_test

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/redis/rueidis"

	"github.com/llmgate/llmgate/internal/testutil"
	"github.com/llmgate/llmgate/lock"
	"github.com/llmgate/llmgate/lock/redis"
)

// Figures and the commands that produce them are in BENCHMARKS.md; the
// `llmgate bench lock` command measures the same things with hand-off
// latency and fairness on top.

// BenchmarkPing is the unit for the others: one PING round trip on the same
// kind of client.
func BenchmarkPing(b *testing.B) { testutil.BenchPing(b) }

// BenchmarkUncontendedSerial is one goroutine taking and releasing a lock
// nobody else wants: the floor cost of an acquire+release pair.
func BenchmarkUncontendedSerial(b *testing.B) {
	c := testutil.StartRedis(b).Client(b)
	l := lock.New(redis.New(c, redis.Config{}))
	ctx := context.Background()
	for b.Loop() {
		lease, err := l.Acquire(ctx, "serial", lock.Options{})
		if err != nil {
			b.Fatal(err)
		}
		if err := lease.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkUncontended is 16 goroutines (on any GOMAXPROCS) sharing one
// client, each taking and releasing its own key: how well acquire+release
// pairs pipeline.
func BenchmarkUncontended(b *testing.B) {
	c := testutil.StartRedis(b).Client(b)
	l := lock.New(redis.New(c, redis.Config{}))
	ctx := context.Background()
	var next atomic.Int64
	b.SetParallelism(max(1, 16/runtime.GOMAXPROCS(0)))
	b.RunParallel(func(pb *testing.PB) {
		key := fmt.Sprintf("uncontended-%d", next.Add(1))
		for pb.Next() {
			lease, err := l.Acquire(ctx, key, lock.Options{})
			if err != nil {
				b.Error(err)
				return
			}
			if err := lease.Release(ctx); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkContended32 is 32 workers, each with its own client (as 32
// processes would have), on one key; one op is one critical section, so
// ns/op is the time per hand-off.
func BenchmarkContended32(b *testing.B) {
	r := testutil.StartRedis(b)
	for _, fair := range []bool{true, false} {
		name := "fair"
		if !fair {
			name = "nonfair"
		}
		b.Run(name, func(b *testing.B) {
			const workers = 32
			lockers := make([]*lock.Locker, workers)
			for i := range lockers {
				c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{r.Addr}, DisableCache: true})
				if err != nil {
					b.Fatal(err)
				}
				defer c.Close()
				lockers[i] = lock.New(redis.New(c, redis.Config{}))
			}
			ctx := context.Background()
			opts := lock.Options{Fair: fair}
			var (
				left   atomic.Int64
				inside atomic.Int32
				wg     sync.WaitGroup
			)
			left.Store(int64(b.N))
			b.ResetTimer()
			for _, l := range lockers {
				wg.Go(func() {
					for left.Add(-1) >= 0 {
						lease, err := l.Acquire(ctx, "contended", opts)
						if err != nil {
							b.Error(err)
							return
						}
						if inside.Add(1) != 1 {
							b.Error("two holders at once")
						}
						inside.Add(-1)
						if err := lease.Release(ctx); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
		})
	}
}
